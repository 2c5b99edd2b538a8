"""Probe a layer pair: run both layers on one input (the same parameter values on both sides, put back afterwards) and
compare the outputs. It checks what no rule can read (a third-party class taken by its name, such as timm's `GELU`, a
plain nn.Module calling F.gelu) and what a subclass's own forward does, and it verifies a fix: a framework layer of
the kind that reproduces the reference's outputs (mappings/audit_layers.yaml `probe_fixes`).

torch and MindSpore are imported inside the functions that need them (`align --help` stays fast).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any

import numpy as np

from aligner.core.frameworks import Framework
from aligner.core.words import Text, words
from aligner.pipelines.audit.layers import Layer
from aligner.pipelines.audit.rules import ProbeFix, RuleBook, short_class
from aligner.pipelines.audit.says import Say

PT, MS = Framework.PYTORCH, Framework.MINDSPORE
SCALE = 3.0          # standard normal x 3: reaches the range where activation variants part (GELU tanh vs erf)
SEED = 0


@dataclasses.dataclass(frozen=True)
class Probe:
    """What running both layers on one input showed: ran or why not, the input shapes, the largest difference, and
    a verified fix (a framework layer call reproducing the reference), when the outputs differ and one was found."""

    ran: bool
    equal: bool = False
    max_diff: float = math.nan
    shapes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    why: Text = ""
    fix: str = ""


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _candidate_shapes(layer: Layer) -> list[tuple[int, ...]]:
    """Input shapes to try when example inputs did not run: from the weight's shape, else a small image batch."""
    weight = layer.params.get("weight")
    if weight is None:
        return [(2, 3, 5, 5)]
    if weight.ndim == 1:
        c = weight.shape[0]
        return [(2, c), (2, c, 5, 5), (2, 5, 5, c)]
    if weight.ndim == 2:
        return [(2, weight.shape[1])]
    groups = int(getattr(layer.module, "groups", getattr(layer.module, "group", 1)) or 1)
    return [(1, weight.shape[1] * groups, *(9,) * (weight.ndim - 2))]


def _shape_pairs(pair_t: Layer, pair_m: Layer) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], Text]:
    """(each side's input shape, to try in turn; why none when empty). The traced shapes when known: equal, or equal
    but for size-1 axes (one array, reshaped; a transposed layout is not guessed), or equal but for the first axis
    (a batch or token count, such as the tokens an MoE router sent to an expert: each side's shape on both in turn)."""
    t, m = pair_t.input_shape, pair_m.input_shape
    if t is not None and m is not None:
        if t == m or _squeezed(t) == _squeezed(m):
            return [(t, m)], ""
        if len(t) == len(m) > 1 and t[1:] == m[1:]:
            return [(t, t), (m, m)], ""
        return [], words(Say.SHAPES_DIFFER, torch=t, ms=m)
    if t is not None or m is not None:
        known = t if t is not None else m
        assert known is not None
        return [(known, known)], ""
    return [(s, s) for s in _candidate_shapes(pair_t)], ""


def _run(module: Any, framework: Framework, x: np.ndarray) -> np.ndarray:
    if framework == PT:
        import torch

        with torch.no_grad():
            out = module(torch.from_numpy(np.ascontiguousarray(x)))
    else:
        import mindspore as ms

        out = module(ms.Tensor(np.ascontiguousarray(x)))
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "detach"):
        return out.detach().float().numpy()
    return out.asnumpy().astype(np.float32)


def _set(tensor: Any, framework: Framework, values: np.ndarray) -> None:
    if framework == PT:
        import torch

        with torch.no_grad():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(values)).to(tensor.dtype))
    else:
        import mindspore as ms

        tensor.set_data(ms.Tensor(np.ascontiguousarray(values)).astype(tensor.dtype))


def _outputs(sides: dict[Framework, Layer], shapes: tuple[tuple[int, ...], tuple[int, ...]],
             x: np.ndarray) -> dict[Framework, np.ndarray]:
    return {PT: _run(sides[PT].module, PT, x.reshape(shapes[0])), MS: _run(sides[MS].module, MS, x.reshape(shapes[1]))}


def _close(a: np.ndarray, b: np.ndarray, book: RuleBook) -> tuple[bool, float]:
    if a.size != b.size:
        return False, math.inf
    a, b = a.ravel(), b.ravel()
    diff = np.abs(a.astype(np.float64) - b)
    return bool(np.all(diff <= book.probe_atol + book.probe_rtol * np.abs(a))), float(diff.max(initial=0.0))


def _build(fix: ProbeFix) -> Any:
    module_name, _, cls_name = fix.cls.rpartition(".")
    cell = getattr(importlib.import_module(module_name), cls_name)(**fix.args)
    if hasattr(cell, "set_train"):
        cell.set_train(False)
    elif hasattr(cell, "eval"):
        cell.eval()
    return cell


def _fix_text(fix: ProbeFix) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in fix.args.items())
    return f"{short_class(fix.cls)}({args})"


def _verified_fix(kind: str, migrated: Framework, reference_out: np.ndarray, x: np.ndarray,
                  shape: tuple[int, ...], book: RuleBook) -> str:
    """The first framework layer of `probe_fixes` that reproduces the reference's outputs on the probe's input."""
    for fix in book.probe_fixes.get(kind, {}).get(migrated, ()):
        out = _run(_build(fix), migrated, x.reshape(shape))
        if _close(reference_out, out, book)[0]:
            return _fix_text(fix)
    return ""


def probe(torch_layer: Layer, ms_layer: Layer, reference: Framework, book: RuleBook) -> Probe:
    """Run both layers on one input with the reference side's parameter values on both (put back afterwards)."""
    sides = {PT: torch_layer, MS: ms_layer}
    if set(torch_layer.params) != set(ms_layer.params):
        return Probe(False, why=words(Say.PARAMS_DIFFER, torch=tuple(sorted(torch_layer.leaves.values())),
                                      ms=tuple(sorted(ms_layer.leaves.values()))))
    ref, mig = sides[reference], sides[reference.other]
    if any(ref.params[k].shape != mig.params[k].shape for k in ref.params):
        return Probe(False, why=words(Say.PARAM_SHAPES_DIFFER))
    candidates, why = _shape_pairs(torch_layer, ms_layer)
    if not candidates:
        return Probe(False, why=why)
    for leaf, values in ref.params.items():
        _set(mig.tensors[leaf], reference.other, values)
    failures: list[tuple[tuple[int, ...], str]] = []
    try:
        for shapes in candidates:
            x = (np.random.default_rng(SEED).standard_normal(int(np.prod(shapes[0]))) * SCALE).astype(np.float32)
            try:
                outs = _outputs(sides, shapes, x)
            except Exception as exc:  # the layer's own error for this shape: try the next one
                failures.append((shapes[0], type(exc).__name__))
                continue
            equal, diff = _close(outs[PT], outs[MS], book)
            fix = "" if equal or mig.params else \
                _verified_fix(torch_layer.kind, reference.other, outs[reference], x,
                              shapes[0 if reference.other == PT else 1], book)
            return Probe(True, equal, diff, shapes, fix=fix)
    finally:
        for leaf, values in mig.params.items():
            _set(mig.tensors[leaf], reference.other, values)
    return Probe(False, why=words(Say.NONE_RAN, failures=tuple(failures)))
