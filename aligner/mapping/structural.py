"""Match parameters the rules could not place, by structure: same layout, order within module groups, name similarity.

Used only with a target (`--like`): each leftover module group is summarised by its signature (leaves named the
framework-neutral way, shapes without unit axes). Groups with the same signature are paired in order when both sides
have the same number of them; otherwise by path similarity, and a near tie is reported as ambiguous, never guessed.
Tensors still left over are paired one by one only when their shape is unique among the leftovers on both sides and
their leaf names share a word stem (`cls_token` -> `embeddings.cls_token`, `pos_embed` -> `position_embeddings`).
Last, by position (`by_position`): within two modules that are twins (every tensor paired into the target module came
from the source module, and none of the source module's went elsewhere), a leftover that is the only unplaced
tensor of its shape on both sides is paired, and the plan says so (ConvNeXt's layer scale `stages.0.blocks.0.gamma`
-> `feature.1.0.gamma_`).
"""
from __future__ import annotations

import difflib
import functools
import re
from collections import Counter
from typing import Iterable, Iterator

from aligner.io.base import TensorInfo
from aligner.mapping.rules import load_layer_rules, split_name

MIN_SIMILARITY = 0.5
MIN_MARGIN = 0.15


@functools.cache
def _neutral_leaves() -> dict[str, str]:
    return {ms: pt for rule in load_layer_rules() for pt, ms in rule.rename.items()}


@functools.cache
def _optional_leaves() -> frozenset[str]:
    """Leaves only one side keeps (num_batches_tracked): they may be absent in a group of the same layout."""
    return frozenset(leaf for rule in load_layer_rules() for leaf in rule.pytorch_only)


def neutral_leaf(leaf: str) -> str:
    """A leaf name in PyTorch spelling, whichever framework it comes from (gamma -> weight, moving_mean ->
    running_mean)."""
    return _neutral_leaves().get(leaf, leaf)


def squeeze_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _groups(items: dict[str, tuple[int, ...]]) -> dict[str, dict[str, str]]:
    """prefix -> {neutral leaf: full name}, in first-seen order."""
    groups: dict[str, dict[str, str]] = {}
    for name in items:
        prefix, leaf = split_name(name)
        groups.setdefault(prefix, {})[neutral_leaf(leaf)] = name
    return groups


def _signature(group: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> tuple:
    return tuple(sorted((leaf, squeeze_shape(shapes[name])) for leaf, name in group.items()
                        if leaf not in _optional_leaves()))


def _norm(path: str) -> str:
    return path.lower().replace("_", "").replace("-", "")


def match(sources: dict[str, tuple[int, ...]], targets: dict[str, TensorInfo]
          ) -> tuple[list[tuple[str, str, str]], dict[str, list[str]]]:
    """Pair leftover sources (name as the rules would call it -> shape) with leftover target names.

    Returns ([(source name, target name, reason)], {target name: [ambiguous source candidates]}).
    """
    tshapes = {name: info.shape for name, info in targets.items()}
    sgroups, tgroups = _groups(sources), _groups(tshapes)
    by_sig: dict[tuple, tuple[list[str], list[str]]] = {}
    for prefix, group in sgroups.items():
        by_sig.setdefault(_signature(group, sources), ([], []))[0].append(prefix)
    for prefix, group in tgroups.items():
        by_sig.setdefault(_signature(group, tshapes), ([], []))[1].append(prefix)

    pairs: list[tuple[str, str, str]] = []
    ambiguous: dict[str, list[str]] = {}
    for s_prefixes, t_prefixes in by_sig.values():
        if not s_prefixes or not t_prefixes:
            continue
        if len(s_prefixes) == len(t_prefixes):
            n = len(t_prefixes)
            chosen = [(s, t, f"structural: same layout, group {i + 1} of {n} in order")
                      for i, (s, t) in enumerate(zip(s_prefixes, t_prefixes))]
        else:
            chosen = []
            free = list(s_prefixes)
            for t in t_prefixes:
                scored = sorted(((difflib.SequenceMatcher(None, _norm(s), _norm(t)).ratio(), s) for s in free),
                                reverse=True)
                best = scored[0] if scored else (0.0, "")
                second = scored[1][0] if len(scored) > 1 else 0.0
                if best[0] >= MIN_SIMILARITY and best[0] - second >= MIN_MARGIN:
                    chosen.append((best[1], t, f"structural: same layout, name similarity {best[0]:.2f}"))
                    free.remove(best[1])
                else:
                    for leaf, leaf_name in tgroups[t].items():
                        candidates = [sgroups[s][leaf] for _, s in scored[:3] if leaf in sgroups[s]]
                        if candidates:
                            ambiguous[leaf_name] = candidates
        for s, t, reason in chosen:
            for leaf, tname in tgroups[t].items():
                if leaf in sgroups[s]:  # an optional leaf only the target has stays unfilled (reported missing)
                    pairs.append((sgroups[s][leaf], tname, reason))
    return pairs + _lone(sources, tshapes, pairs, ambiguous), ambiguous


def _stems(name: str) -> set[str]:
    return {t for t in re.split(r"[._\d]+", split_name(name)[1].lower()) if len(t) >= 3}


def _lone(sources: dict[str, tuple[int, ...]], targets: dict[str, tuple[int, ...]], pairs: list[tuple[str, str, str]],
          ambiguous: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """Leftover tensors whose exact shape no other leftover has, on either side, and whose leaf names share a word
    stem (one word a prefix of the other): paired one to one."""
    used_s = {s for s, _, _ in pairs} | {c for cs in ambiguous.values() for c in cs}
    used_t = {t for _, t, _ in pairs} | set(ambiguous)
    free_s = {n: sh for n, sh in sources.items() if n not in used_s}
    free_t = {n: sh for n, sh in targets.items() if n not in used_t}
    by_shape: dict[tuple[int, ...], tuple[list[str], list[str]]] = {}
    for side, free in enumerate((free_s, free_t)):
        for name, shape in free.items():
            by_shape.setdefault(shape, ([], []))[side].append(name)
    out = []
    for shape, (same_s, same_t) in by_shape.items():
        if len(same_s) != 1 or len(same_t) != 1:
            continue
        sname, tname = same_s[0], same_t[0]
        if any(a.startswith(b) or b.startswith(a) for a in _stems(sname) for b in _stems(tname)):
            out.append((sname, tname, f"structural: the only leftover of shape {list(shape)} on both sides, "
                                      f"names alike ({split_name(sname)[1]} ~ {split_name(tname)[1]})"))
    return out



def _modules(name: str) -> Iterator[str]:
    """The modules holding a tensor name, innermost first, the root ("") excluded."""
    scope = split_name(name)[0]
    while scope:
        yield scope
        scope = split_name(scope)[0]


def _common_module(names: Iterable[str]) -> str:
    """The deepest module holding every one of these tensor names ("" when only the root does)."""
    paths = [split_name(n)[0].split(".") for n in names]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _by_module(names: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """{module: the `value`s of every (key, value) whose key name it holds}, every module above each key."""
    out: dict[str, list[str]] = {}
    for key, value in names:
        for scope in _modules(key):
            out.setdefault(scope, []).append(value)
    return out


def by_position(placed: list[tuple[str, str]], sources: dict[str, tuple[int, ...]],
                targets: dict[str, tuple[int, ...]]) -> list[tuple[str, str, str]]:
    """Pair the leftovers that are the only unplaced tensor of their shape (unit axes aside) inside twin modules.

    The twin of a leftover target's nearest module holding paired tensors (`placed`: (source, target) names) is the
    module holding all their sources, provided every tensor paired from it went into that target module (the two are
    one block). A layer-scale `gamma` left over beside a block's paired convs and norms is placed; two leftovers of
    one shape in a block stay unplaced (no guess). Returns [(source, target, reason)], each name at most once.
    """
    sources_in = _by_module((t, s) for s, t in placed)        # target module -> sources paired into it
    targets_of = _by_module(placed)                            # source module -> targets its tensors went to
    left_s = _by_module((s, s) for s in sources)
    left_t = _by_module((t, t) for t in targets)
    found: dict[str, tuple[str, str]] = {}
    for target, shape in targets.items():
        t_scope = next((m for m in _modules(target) if m in sources_in), None)
        if t_scope is None:
            continue
        s_scope = _common_module(sources_in[t_scope])
        if not s_scope or not all(t == t_scope or t.startswith(t_scope + ".") for t in targets_of[s_scope]):
            continue
        want = squeeze_shape(shape)
        same_t = [t for t in left_t[t_scope] if squeeze_shape(targets[t]) == want]
        same_s = [s for s in left_s.get(s_scope, []) if squeeze_shape(sources[s]) == want]
        if len(same_t) == 1 and len(same_s) == 1:
            found[target] = (same_s[0], f"by position: the only unplaced tensor of shape {list(want)} in "
                                        f"{s_scope} and in its twin {t_scope}")
    taken = Counter(s for s, _ in found.values())
    return [(s, t, why) for t, (s, why) in found.items() if taken[s] == 1]
