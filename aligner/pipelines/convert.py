"""Checkpoint conversion as a library call: read -> plan names -> stream tensors into the output format."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import yaml

from aligner.core.atomic import atomic_open, check_output
from aligner.core.errors import AlignerError
from aligner.io import TensorInfo, TensorSource, detect_format, open_checkpoint, write_checkpoint
from aligner.io.base import ArraySource
from aligner.mapping import Plan, build_plan, load_user_map
from aligner.mapping.rules import FRAMEWORKS, group_names, load_rules

FORMAT_FRAMEWORK = {"pytorch": "pytorch", "mindspore": "mindspore"}


def guess_framework(infos: dict[str, TensorInfo]) -> str | None:
    """The naming convention of a name set, from leaves that only one framework's rules use (None if no clue)."""
    votes = {fw: 0 for fw in FRAMEWORKS}
    for rule in load_rules():
        ms_only = set(rule.rename.values()) - set(rule.rename)
        pt_only = set(rule.rename) - set(rule.rename.values())
        for leaves in group_names(infos).values():
            votes["mindspore"] += len(ms_only & set(leaves))
            votes["pytorch"] += len(pt_only & set(leaves) - {"weight", "bias"})
    if votes["mindspore"] == votes["pytorch"]:
        return None
    return max(votes, key=votes.get)


def source_framework(source: TensorSource, declared: str | None = None) -> str | None:
    """The naming convention of a checkpoint: declared by the user, known from its format, or guessed from names."""
    return declared or source.framework or guess_framework(source.infos)


def plan_conversion(source: TensorSource, dst: str | None = None, src: str | None = None,
                    map_path: str | None = None, like: TensorSource | None = None) -> Plan:
    """Plan how `source` becomes a checkpoint in framework `dst` (default: the target's, else the other one)."""
    src = source_framework(source, src)
    if dst is None and like is not None:
        dst = source_framework(like)
    if src is None and dst is None:
        raise AlignerError(f"{source.path}: cannot tell which framework's names it uses: pass --from")
    src = src or dst
    dst = dst or ("mindspore" if src == "pytorch" else "pytorch")
    user = load_user_map(map_path) if map_path else None
    plan = build_plan(source.infos, src, dst, user, like.infos if like is not None else None, source.tied)
    if user and like is not None:
        unknown = sorted({t for ts in user.rename.values() for t in ts} - set(like.infos))
        if unknown:
            raise AlignerError(f"{map_path}: rename target(s) not in {like.path}: {', '.join(unknown[:5])}")
    plan.notes.extend(source.notes)
    return plan


def convert(src_path: str, out_path: str, *, like_path: str | None = None, map_path: str | None = None,
            to: str | None = None, src: str | None = None, force: bool = False, allow_incomplete: bool = False,
            allow_pickle: bool = False, save_map: str | None = None) -> Plan:
    """Convert a checkpoint file; raises AlignerError (nothing written) when the plan has failures, unless allowed."""
    out_fmt = detect_format(out_path, for_output=True)
    check_output(out_path, force)
    if save_map:
        check_output(save_map, force)
    with open_checkpoint(src_path, allow_pickle=allow_pickle) as source:
        like = open_checkpoint(like_path, allow_pickle=allow_pickle) if like_path else None
        try:
            dst = to or FORMAT_FRAMEWORK.get(out_fmt)
            if dst is None and like is None:  # safetensors output: keep the source's names unless told otherwise
                dst = source_framework(source, src)
            plan = plan_conversion(source, dst, src, map_path, like)
        finally:
            if like is not None:
                like.close()
        if plan.failures and not allow_incomplete:
            return plan
        if save_map:
            write_map(plan, save_map)
        write_checkpoint(out_path, out_fmt, plan.tensors(source), plan.output_infos(), plan.dst_framework)
    return plan


def resolved_map(plan: Plan) -> dict[str, Any]:
    """The plan as a user mapping file (exact renames, drops, transforms) that reproduces it with --map."""
    rename: dict[str, list[str]] = {}
    drop: list[str] = []
    transforms: list[dict[str, Any]] = []
    splits: dict[tuple, dict[int, str]] = {}
    for e in plan.entries:
        ops = [o for o in e.ops if o["op"] != "cast"]  # casts come from the target, not from the map
        if e.status in ("dropped", "unexpected") and e.sources:
            drop.append(f"^{re.escape(e.sources[0])}$")
        elif e.target is None or not e.sources or e.status in ("missing", "ambiguous", "shape mismatch"):
            continue
        elif not ops:
            rename.setdefault(e.sources[0], []).append(e.target)
        elif ops[0]["op"] == "split":
            key = (e.sources[0], ops[0]["axis"], ops[0]["parts"])
            splits.setdefault(key, {})[ops[0]["index"]] = e.target
        elif ops[0]["op"] == "concat":
            transforms.append({"op": "concat", "sources": list(e.sources), "axis": ops[0]["axis"],
                               "target": e.target})
        elif ops[0]["op"] == "transpose" and len(ops) == 1:
            transforms.append({"op": "transpose", "source": e.sources[0], "perm": list(ops[0]["perm"]),
                               "target": e.target})
        else:  # unsqueeze/squeeze/reshape chains: the resulting shape says it all
            transforms.append({"op": "reshape", "source": e.sources[0], "shape": list(e.info.shape),
                               "target": e.target})
    for (source, axis, parts), targets in splits.items():
        transforms.append({"op": "split", "source": source, "axis": axis,
                           "targets": [targets[i] for i in range(parts)]})
    return {"rename": {k: v[0] if len(v) == 1 else v for k, v in rename.items()}, "drop": drop,
            "transforms": transforms}


def write_map(plan: Plan, path: str) -> None:
    """Write the resolved mapping for review and reuse (atomic)."""
    header = f"# resolved by align convert: {plan.src_framework} -> {plan.dst_framework}; reuse with --map\n"
    with atomic_open(path, "w") as fh:
        fh.write(header + yaml.safe_dump(resolved_map(plan), sort_keys=False))


def state_dict_to(framework: str, state: dict[str, np.ndarray], src: str) -> dict[str, np.ndarray]:
    """In-memory conversion of a {name: array} dict between frameworks' names (for tests and scripts)."""
    source = ArraySource("<memory>", src, state)
    plan = build_plan(source.infos, src, framework)
    if plan.failures:
        raise AlignerError("cannot convert: " + "; ".join(f"{e.target}: {e.reason}" for e in plan.failures))
    return dict(plan.tensors(source))
