"""One dump's records indexed for the health rules: per step, forward outputs, gradients, parameter values, probes."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from aligner.dumping.manifest import Io, Kind, Record
from aligner.metrics.stats import Stats, known

ArrayLoader = Callable[[Record], "np.ndarray | None"]
# the probe names users save with aligner.save (docs/check.md)
LOSS, LOSS_SCALE, GRAD_NORM, GRAD_NORM_CLIPPED = "loss", "loss_scale", "grad_norm", "grad_norm_clipped"


class SkipError(Exception):
    """A rule cannot be evaluated on this dump; the message says why."""


def numel(rec: Record) -> int:
    return math.prod(rec.shape) if rec.shape else 1


def nonfinite(stats: Stats | None) -> bool:
    """Whether a record's statistics count NaN or Inf elements."""
    return stats is not None and bool((stats.nan or 0) + (stats.inf or 0))


def max_abs(stats: Stats | None) -> float | None:
    """The largest finite magnitude, from min and max."""
    low, high = (known(stats.min), known(stats.max)) if stats else (None, None)
    if low is None or high is None:
        return None
    return max(abs(float(low)), abs(float(high)))


@dataclasses.dataclass
class Step:
    """One step's records."""

    records: list[Record] = dataclasses.field(default_factory=list)          # everything but params, seq order
    outputs: list[Record] = dataclasses.field(default_factory=list)          # forward outputs
    grads: dict[str, Record] = dataclasses.field(default_factory=dict)       # param_grad by name, backward order
    params: dict[str, Record] = dataclasses.field(default_factory=dict)      # param values at the step's start
    probes: dict[str, float] = dataclasses.field(default_factory=dict)       # first value of each probe name


class DumpView:
    """Records of one dump (or of a live run) by step, with `stats` resolved through `same_as` links."""

    def __init__(self, records: Sequence[Record], arrays: ArrayLoader | None = None) -> None:
        self.arrays = arrays
        by_seq = {r.seq: r for r in records}
        self._stats: dict[int, Stats | None] = {}
        self.steps: dict[int, Step] = {}
        first_forward: dict[str, int] = {}
        for rec in sorted(records, key=lambda r: (r.step, r.seq)):
            if rec.kind == Kind.CALL:
                continue
            stats = rec.stats
            if stats is None and rec.same_as is not None and rec.same_as in by_seq:
                stats = by_seq[rec.same_as].stats
            self._stats[id(rec)] = stats
            step = self.steps.setdefault(rec.step, Step())
            if rec.kind == Kind.PARAM:
                step.params[rec.module] = rec
                continue
            step.records.append(rec)
            if rec.kind == Kind.FORWARD and rec.io == Io.OUTPUT:
                step.outputs.append(rec)
                first_forward.setdefault(rec.module, len(first_forward))
            elif rec.kind == Kind.PARAM_GRAD:
                step.grads.setdefault(rec.module, rec)
            elif rec.kind == Kind.PROBE and rec.module not in step.probes and stats and numel(rec) >= 1:
                value = known(stats.mean if numel(rec) == 1 else stats.l2)
                inf = stats.inf or 0
                if value is None or nonfinite(stats):
                    value = math.inf if inf and not stats.nan else math.nan
                step.probes[rec.module] = float(value)
        self.order = sorted(self.steps)
        self._depth = first_forward

    def stats(self, rec: Record) -> Stats | None:
        return self._stats.get(id(rec), rec.stats)

    def weights(self, step: Step) -> list[str]:
        """Parameter names with 2+ dimensions that got a gradient, from the input side to the output side: by their
        module's first forward call, else the reverse of backward order."""
        names = [n for n, r in step.grads.items() if len(r.shape) >= 2]
        backward = {n: i for i, n in enumerate(reversed(list(step.grads)))}

        def key(name: str) -> tuple[int, int]:
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            return (self._depth.get(owner, len(self._depth)), backward[name])
        return sorted(names, key=key)

    def grad_norm(self, rec: Record) -> float | None:
        """A gradient's L2 norm; inf when it holds NaN/Inf."""
        stats = self.stats(rec)
        if not stats:
            return None
        if nonfinite(stats):
            return math.inf
        l2 = known(stats.l2)
        return None if l2 is None else float(l2)

    def global_norm(self, step: Step) -> float | None:
        """The norm over every parameter gradient of a step (what clip_grad_norm_ computes); inf on NaN/Inf."""
        norms = [self.grad_norm(r) for r in step.grads.values()]
        if not norms or any(n is None for n in norms):
            return None
        return math.sqrt(sum(n * n for n in norms if n is not None)) if all(
            n is not None and math.isfinite(n) for n in norms) else math.inf

    def consecutive(self) -> list[tuple[int, int]]:
        """(t, t + 1) pairs of dumped steps that both recorded parameter values."""
        return [(t, t + 1) for t in self.order if t + 1 in self.steps
                and self.steps[t].params and self.steps[t + 1].params]

    def load(self, rec: Record) -> np.ndarray | None:
        """The record's full tensor as float64, or None (stats-only dump, or a file that cannot be read)."""
        if self.arrays is None:
            return None
        try:
            array = self.arrays(rec)
        except Exception:  # an unreadable file: the rule falls back on statistics
            return None
        return None if array is None else np.asarray(array, dtype=np.float64)
