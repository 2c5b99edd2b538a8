"""`align diff --grads` / `aligner.explain_updates`: read both sides' checkpoints after k steps, the weights before
step 1 and the gradient dumps, fit each side's update rule (side.py, fit.py) and say which term differs (explain.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from aligner.core.buffers import is_buffer
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.findings import Finding, Severity
from aligner.core.result import PassedByExitCode, number, typed
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.read.source import Item, TensorError, load_tensor, read_source
from aligner.io import TensorSource, open_checkpoint
from aligner.mapping.plan import EntryStatus
from aligner.pipelines.convert.checkpoint import plan_conversion
from aligner.pipelines.diff.checkpoints import DiffResult
from aligner.pipelines.diff.explain import compare_sides, loss_scale
from aligner.pipelines.diff.rules import MIN_STEPS
from aligner.pipelines.diff.side import SideFit, fit_side


@dataclasses.dataclass(frozen=True)
class UpdateReport(PassedByExitCode):
    """Both sides' fitted update rules, the parameter pairs compared, and the findings (B is the reference); a
    `Result`: `passed` when no term differs."""

    a: SideFit
    b: SideFit
    pairs: list[tuple[str, str]]
    loss_scale: float
    findings: list[Finding]

    @property
    def differences(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FOUND if self.differences else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "pairs": [list(p) for p in self.pairs],
                "loss_scale": self.loss_scale, "findings": [f.to_dict() for f in self.findings],
                "agree": not self.differences}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UpdateReport:
        """The report `to_dict` gave, back (`agree` is derived again)."""
        pairs = [(str(a), str(b)) for a, b in data["pairs"]]
        return cls(SideFit.from_dict(data["a"]), SideFit.from_dict(data["b"]), pairs,
                   typed(number(data["loss_scale"]), float, "loss_scale"),
                   [Finding.from_dict(f) for f in data["findings"]])


@dataclasses.dataclass(frozen=True)
class DiffUpdates(PassedByExitCode):
    """`align diff --grads`: the checkpoint diff and, beside it, the update-rule report (its JSON is the diff's, with
    the report under "update_rule"); a `Result` whose exit code is the worse of the two."""

    diff: DiffResult
    updates: UpdateReport

    @property
    def exit_code(self) -> ExitCode:
        return max(self.diff.exit_code, self.updates.exit_code)

    def to_dict(self) -> dict[str, Any]:
        return self.diff.to_dict() | {"update_rule": self.updates.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiffUpdates:
        """The pair `to_dict` gave, back."""
        return cls(DiffResult.from_dict({k: v for k, v in data.items() if k != "update_rule"}),
                   UpdateReport.from_dict(data["update_rule"]))


@dataclasses.dataclass
class DumpedSteps:
    """What a dump directory holds for fitting: gradients per parameter per step, and per-step values if dumped."""

    framework: str
    steps: list[int]
    grads: dict[str, list[np.ndarray]]
    values: dict[str, list[np.ndarray]]     # name -> values at the start of each step (empty: not dumped)


def read_dump(path: str) -> DumpedSteps:
    """Read the param_grad (and param value) records of an aligner dump; refuse gaps and duplicates."""
    source = read_source(path)
    grads: dict[str, dict[int, Any]] = {}
    values: dict[str, dict[int, Any]] = {}
    for item in [*source.items, *source.params.values()]:  # per-step values: Source.params (dump(params=True))
        rec = item.record
        if rec.kind == Kind.PARAM_GRAD:
            target = grads
        elif rec.kind == Kind.PARAM and rec.io == Io.VALUE:
            target = values
        else:
            continue
        if item.path is None:
            raise AlignerError(f"{path}: {rec.kind} record of {rec.module} at step {rec.step} has no tensor file "
                               f"(a stats-mode dump? fitting needs full tensors)")
        if rec.step in target.setdefault(rec.module, {}):
            raise AlignerError(f"{path}: two {rec.kind} records of {rec.module} at step {rec.step} (gradient "
                               f"accumulation? dump one backward per step)")
        target[rec.module][rec.step] = item
    if not grads:
        raise AlignerError(f"{path}: no parameter gradients (records of kind param_grad) in this dump")
    steps = sorted({s for per in grads.values() for s in per})
    for name, per in grads.items():
        missing = [s for s in steps if s not in per]
        if missing:
            raise AlignerError(f"{path}: no gradient of {name} at step(s) {', '.join(map(str, missing))}")

    def load(item: Item) -> np.ndarray:  # the hardened reader: header checked against the manifest, no pickle
        try:
            return load_tensor(item)
        except (TensorError, OSError) as exc:
            raise AlignerError(f"{path}: {item.record.kind} record of {item.record.module} at step "
                               f"{item.record.step}: {exc}") from None

    out_values = {n: [load(per[s]) for s in steps] for n, per in values.items() if all(s in per for s in steps)}
    return DumpedSteps(source.framework, steps, {n: [load(per[s]) for s in steps] for n, per in grads.items()},
                       out_values)


def _in_names_of(init: TensorSource, like: TensorSource, map_path: str | None) -> dict[str, np.ndarray]:
    """The init checkpoint's tensors under `like`'s names (mapped when the frameworks differ)."""
    if init.framework == like.framework or init.framework is None:
        return {n: init.get(n) for n in init.infos}
    plan = plan_conversion(init, like=like, map_path=map_path)
    return dict(plan.tensors(init))


def _weights(dump: DumpedSteps, ckpt: TensorSource, init: dict[str, np.ndarray] | None, label: str, path: str,
             ) -> dict[str, list[np.ndarray]]:
    """[w0, w_k] or [w0, ..., w_k] per parameter with gradients; refuse parameters missing from the checkpoint."""
    out = {}
    for name in dump.grads:
        if name not in ckpt.infos:
            raise AlignerError(f"{path}: no parameter {name} (side {label}'s dump has its gradients)")
        final = np.asarray(ckpt.get(name))
        if name in dump.values:
            out[name] = [*dump.values[name], final]
        elif init is not None and name in init:
            out[name] = [np.asarray(init[name]).reshape(final.shape), final]
        else:
            raise AlignerError(f"side {label}: no initial value of {name}: pass the weights before step 1 "
                               f"(--init), or dump with params=True")
    moved_without_grads = [n for n in ckpt.infos if init is not None and n in init and n not in dump.grads
                           and ckpt.infos[n].dtype.startswith("float") and not is_buffer(n)
                           and not np.array_equal(np.asarray(init[n]).reshape(-1),
                                                  np.asarray(ckpt.get(n)).reshape(-1))]
    if moved_without_grads:
        raise AlignerError(f"side {label}: {moved_without_grads[0]} changed from init but its gradients are "
                           f"missing from the dump" + (f" (and {len(moved_without_grads) - 1} more)"
                                                       if len(moved_without_grads) > 1 else ""))
    return out


def _pairs(a: TensorSource, b: TensorSource, map_path: str | None, names_a: set[str],
           names_b: set[str]) -> list[tuple[str, str]]:
    """(A name, B name) of parameters fitted on both sides, paired by the conversion plan of A onto B."""
    plan = plan_conversion(a, like=b, map_path=map_path)
    out = []
    for entry in plan.entries:
        if entry.target is None or len(entry.sources) != 1 or entry.status in (
                EntryStatus.MISSING, EntryStatus.UNEXPECTED, EntryStatus.SHAPE_MISMATCH, EntryStatus.AMBIGUOUS):
            continue
        if entry.sources[0] in names_a and entry.target in names_b:
            out.append((entry.sources[0], entry.target))
    return out


def explain_updates(path_a: str, path_b: str, grads_a: str, grads_b: str, *, init_a: str | None = None,
                    init_b: str | None = None, map_path: str | None = None,
                    trust_pickle: bool = False) -> UpdateReport:
    """Fit each side's update rule over the dumped steps and explain how they differ (B is the reference).

    `init_a` holds A's weights before step 1 and `init_b` B's; with only `init_a`, both sides start from it (mapped
    onto B's names: converted weights are equal). Not needed when the dumps hold per-step values (params=True).
    """
    dump_a, dump_b = read_dump(grads_a), read_dump(grads_b)
    for dump, path in ((dump_a, grads_a), (dump_b, grads_b)):
        if len(dump.steps) < MIN_STEPS:
            raise AlignerError(f"{path}: gradients of {len(dump.steps)} step(s) ({', '.join(map(str, dump.steps))});"
                               f" at least {MIN_STEPS} are needed to tell update rules apart (one step cannot "
                               f"separate SGD momentum from the learning rate, nor Adam's betas)")
    with open_checkpoint(path_a, allow_pickle=trust_pickle) as a, \
            open_checkpoint(path_b, allow_pickle=trust_pickle) as b:
        inits: dict[str, dict[str, np.ndarray] | None] = {"A": None, "B": None}
        for label, like in (("A", a), ("B", b)):
            init_path = init_a if label == "A" or init_b is None else init_b
            if init_path is not None:
                with open_checkpoint(init_path, allow_pickle=trust_pickle) as init:
                    inits[label] = _in_names_of(init, like, map_path if init.framework == a.framework else None)
        weights_a = _weights(dump_a, a, inits["A"], "A", path_a)
        weights_b = _weights(dump_b, b, inits["B"], "B", path_b)
        pairs = _pairs(a, b, map_path, set(dump_a.grads), set(dump_b.grads))
        shapes_b = {n: tuple(b.infos[n].shape) for n in dump_b.grads}
    if not pairs:
        raise AlignerError(f"no parameter of {path_a} pairs with one of {path_b} (different models? pass --map)")
    scale = loss_scale(dump_a.grads, dump_b.grads, pairs)
    side_a = fit_side(weights_a, dump_a.grads, label="A", framework=a.framework or dump_a.framework,
                      grad_scale=max(scale, 1.0))
    side_b = fit_side(weights_b, dump_b.grads, label="B", framework=b.framework or dump_b.framework,
                      grad_scale=max(1 / scale, 1.0))
    findings = compare_sides(side_a, side_b, pairs, scale, shapes_b)
    return UpdateReport(side_a, side_b, pairs, scale, findings)
