"""Pair the two models' layers: the parameter-name plan of `align convert` first (rules, then structural matching
against the other side's names and shapes), then, for layers without parameters (pools, activations, dropout) and
any left over, the order of the two layer sequences between those anchors (call order when example inputs ran, one
entry per call; definition order otherwise), aligned by kind, and last, layers left on both sides at one path and of
one kind. Whatever none of these places is listed as unpaired, never guessed.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from typing import Any

from aligner.core.dtypes import canonical
from aligner.core.frameworks import Framework
from aligner.core.sequences import longest_increasing
from aligner.io.base import TensorInfo
from aligner.mapping import build_plan
from aligner.mapping.plan import FAILING, EntryStatus
from aligner.mapping.rules import split_name
from aligner.pipelines.audit.layers import Layer, per_call


@dataclasses.dataclass(frozen=True)
class LayerPair:
    """A PyTorch layer and the MindSpore layer it was paired with, and how."""

    torch: Layer
    ms: Layer
    how: str             # "names", "structure" (plan), "order" or "path"

    def to_dict(self) -> dict[str, Any]:
        return {"torch": self.torch.path, "mindspore": self.ms.path, "kind": self.torch.kind, "how": self.how}


def _infos(layers: list[Layer]) -> dict[str, TensorInfo]:
    return {f"{layer.path}.{layer.leaves[leaf]}" if layer.path else layer.leaves[leaf]:
            TensorInfo(tuple(values.shape), canonical(values.dtype))
            for layer in layers for leaf, values in layer.params.items()}


def _plan_anchors(torch_layers: list[Layer], ms_layers: list[Layer]) -> dict[tuple[str, str], str]:
    """(torch path, MindSpore path) -> how, for layers whose parameters the conversion plan maps onto each other: one
    MindSpore layer per torch layer, or each of several when the plan splits one torch parameter between them (a
    fused qkv into q, k and v)."""
    t_infos, m_infos = _infos(torch_layers), _infos(ms_layers)
    if not t_infos or not m_infos:
        return {}
    plan = build_plan(t_infos, Framework.PYTORCH, Framework.MINDSPORE, like=m_infos)
    m_paths = {layer.path for layer in ms_layers}
    votes: Counter[tuple[str, str, str]] = Counter()
    spread: dict[str, set[str]] = {}     # torch parameter -> the MindSpore layers it is written into
    for entry in plan.entries:
        if entry.target is None or entry.status in FAILING or len(entry.sources) != 1:
            continue
        t_path, m_path = split_name(entry.sources[0])[0], split_name(entry.target)[0]
        while m_path and m_path not in m_paths:    # a parameter in a child cell (BatchNorm3d's bn2d)
            m_path = split_name(m_path)[0]
        how = "structure" if entry.status == EntryStatus.STRUCTURAL else "names"
        votes[(t_path, m_path, how)] += 1
        spread.setdefault(entry.sources[0], set()).add(m_path)
    best: dict[str, list[tuple[str, str]]] = {}
    for (t_path, m_path, how), _ in votes.most_common():
        best.setdefault(t_path, [(m_path, how)])
    for source, targets in spread.items():
        t_path = split_name(source)[0]
        if len(targets) > 1:
            best[t_path] = [(m, best[t_path][0][1]) for m in sorted(targets)]
    claimed = Counter(m for targets in best.values() for m, _ in targets)
    return {(t, m): how for t, targets in best.items() for m, how in targets if claimed[m] == 1}


def pair_layers(torch_layers: list[Layer], ms_layers: list[Layer]
                ) -> tuple[list[LayerPair], list[Layer], list[Layer]]:
    """(pairs, unpaired torch layers, unpaired MindSpore layers); both lists in the sides' layer order. A layer called
    several times takes part once per call (`per_call`), so a stateless layer one side reuses (mindcv's one `relu`
    after every conv) pairs with one layer of the other side per call; the same two layers met at several calls (both
    sides reuse them) are one pair; a call left over is listed unpaired with its call number."""
    ts = sorted((c for x in torch_layers for c in per_call(x)), key=lambda x: x.order)
    ms = sorted((c for x in ms_layers for c in per_call(x)), key=lambda x: x.order)
    t_index: dict[str, list[int]] = {}
    m_index: dict[str, list[int]] = {}
    for side, index in ((ts, t_index), (ms, m_index)):
        for i, layer in enumerate(side):
            index.setdefault(layer.path, []).append(i)
    anchors = _plan_anchors(torch_layers, ms_layers)
    candidates = sorted((i, j) for t, m in anchors if t in t_index and m in m_index
                        for i, j in zip(t_index[t], m_index[m]) if ts[i].kind == ms[j].kind)
    chain = longest_increasing(candidates)
    pairs = [LayerPair(ts[i], ms[j], anchors[(ts[i].path, ms[j].path)]) for i, j in chain]
    bounds = [(-1, -1), *chain, (len(ts), len(ms))]
    for (i0, j0), (i1, j1) in zip(bounds, bounds[1:]):
        seg_t, seg_m = ts[i0 + 1:i1], ms[j0 + 1:j1]
        matcher = difflib.SequenceMatcher(None, [x.kind for x in seg_t], [x.kind for x in seg_m], autojunk=False)
        for block in matcher.get_matching_blocks():
            pairs.extend(LayerPair(seg_t[block.a + k], seg_m[block.b + k], "order") for k in range(block.size))
    paired_t = {id(p.torch) for p in pairs}
    paired_m = {id(p.ms) for p in pairs}
    # left on both sides at one path, of one kind: a module one side calls and the other only reads its settings from
    # (transformers' attention dropout: its p is passed to a function, the module itself never runs)
    same_path: dict[tuple[str, str], Layer] = {}
    for x in ms:
        if id(x) not in paired_m:
            same_path.setdefault((x.path, x.kind), x)
    for x in ts:
        twin = same_path.pop((x.path, x.kind), None) if id(x) not in paired_t else None
        if twin is not None:
            pairs.append(LayerPair(x, twin, "path"))
            paired_t.add(id(x))
            paired_m.add(id(twin))
    pairs.sort(key=lambda p: p.torch.order)
    once: dict[tuple[str, str], LayerPair] = {}
    for p in pairs:
        once.setdefault((p.torch.path, p.ms.path), p)
    return list(once.values()), [x for x in ts if id(x) not in paired_t], [x for x in ms if id(x) not in paired_m]
