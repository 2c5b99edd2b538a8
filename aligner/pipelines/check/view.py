"""One dump's records as the health rules read them, added in execution order: what the rules reading every record
take as it passes, and per step the gradients, parameter values and probes the others read."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import msgspec
import numpy as np
from msgspec import UNSET

from aligner.dumping.manifest import Io, Kind, Record
from aligner.metrics.stats import Stats, known
from aligner.pipelines.check.config import RuleConfig

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


@dataclasses.dataclass
class Step:
    """What the rules read of one step once the dump is read: its parameter gradients and values, its probes."""

    grads: dict[str, Record] = dataclasses.field(default_factory=dict)       # param_grad by name, backward order
    params: dict[str, Record] = dataclasses.field(default_factory=dict)      # param values at the step's start
    probes: dict[str, float] = dataclasses.field(default_factory=dict)       # first value of each probe name


@dataclasses.dataclass
class Outputs:
    """Forward outputs of some module types as they passed: whether there were any, which statistics some of them
    lacked, and per module its first output (execution order) a rule's threshold flags, with the value flagged."""

    seen: bool = False
    lacking: set[str] = dataclasses.field(default_factory=set)
    hits: dict[str, tuple[Record, float]] = dataclasses.field(default_factory=dict)

    def saw(self, stats: Stats, *keys: str) -> None:
        """One more such output, with these statistics (those of `keys` it lacks are noted)."""
        self.seen = True
        self.lacking.update(key for key in keys if not stats.has(key))


class Passing:
    """What the rules reading every record (nonfinite, fp16-overflow, dead-relu, saturated-activations,
    constant-activations) take of each record as it passes in execution order: per step the first record holding
    NaN/Inf, at the first step with any the first overflowing forward output and gradient (and how many), and per
    activation rule and module the first output it flags. A record is kept only where it is one of these."""

    def __init__(self, config: RuleConfig) -> None:
        self.nonfinite: dict[int, Record] = {}  # step -> its first record holding NaN/Inf
        # "forward" | "gradient" -> [first record, its magnitude, how many] at the first step any reaches max_abs
        self.overflow: dict[str, list] = {}
        self.overflow_step: int | None = None
        self.relu, self.saturated, self.sigmoid, self.constant = Outputs(), Outputs(), Outputs(), Outputs()
        self.max_abs = config("fp16-overflow", "max_abs")
        self.zeros, self.relu_types = config("dead-relu", "zeros"), frozenset(config("dead-relu", "types"))
        self.relu_judged = config.enabled("dead-relu")
        self.fraction = config("saturated-activations", "fraction")
        self.sigmoid_types = frozenset(config("saturated-activations", "sigmoid"))
        self.tanh_types = frozenset(config("saturated-activations", "tanh"))
        self.least = config("constant-activations", "min_numel")

    def add(self, rec: Record) -> None:
        """One record (no parameter value, no call), after every record before it in execution order (the loop every
        record goes through: nonfinite() and max_abs() inlined)."""
        stats = rec.stats
        if stats is None:
            stats = _NOTHING
        elif (stats.nan or 0) + (stats.inf or 0) and rec.step not in self.nonfinite:
            self.nonfinite[rec.step] = rec
        kind = rec.kind
        if kind in _MAGNITUDES and rec.io != INPUT and rec.dtype != "bfloat16" \
                and (self.overflow_step is None or self.overflow_step == rec.step):
            low, high = stats.min, stats.max
            if low is not None and high is not None and low is not UNSET and high is not UNSET \
                    and (value := max(abs(float(low)), abs(float(high)))) >= self.max_abs:
                self.overflow_step = rec.step
                group = self.overflow.get("forward" if kind == FORWARD else "gradient")
                if group is None:
                    self.overflow["forward" if kind == FORWARD else "gradient"] = [rec, value, 1]
                else:
                    group[2] += 1
        if kind == FORWARD and rec.io == OUTPUT:
            self._output(rec, stats)

    def _output(self, rec: Record, st: Stats) -> None:
        kind, module = rec.type, rec.module
        if kind in self.relu_types:
            self.relu.saw(st, "zeros")
            zeros = float(st.zeros or 0.0)
            if zeros >= self.zeros and module not in self.relu.hits:
                self.relu.hits[module] = (rec, zeros)
        sigmoid = kind in self.sigmoid_types
        if sigmoid or kind in self.tanh_types:
            self.saturated.saw(st, "near_one")
            if sigmoid:
                self.sigmoid.saw(st, "near_zero")
            share = float(st.near_one or 0.0) + (float(st.near_zero or 0.0) if sigmoid else 0.0)
            if share >= self.fraction and module not in self.saturated.hits:
                self.saturated.hits[module] = (rec, share)
        if (math.prod(rec.shape) if rec.shape else 1) >= self.least:  # numel(rec)
            self.constant.seen = True
            low = st.min
            if low is not None and low is not UNSET and low == st.max and module not in self.constant.hits \
                    and not nonfinite(st) and not (kind in self.relu_types and self.relu_judged and st.has("zeros")):
                self.constant.hits[module] = (rec, low)  # (dead-relu reports a ReLU's)


# the enum members the loop every record goes through compares with, bound once (Kind.CALL is a 0.2 us lookup)
CALL, PARAM, FORWARD, PARAM_GRAD, PROBE = Kind.CALL, Kind.PARAM, Kind.FORWARD, Kind.PARAM_GRAD, Kind.PROBE
INPUT, OUTPUT = Io.INPUT, Io.OUTPUT
_MAGNITUDES = frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.PARAM_GRAD})  # the records fp16-overflow judges
_NOTHING = Stats()  # the statistics of a record without any


class DumpView:
    """One dump's records (or a live run's) as the rules read them, added one at a time in execution order. The
    rules that read every record take what they need as it passes (`Passing`); kept are the parameter gradients,
    parameter values and probes of each step, and one entry per module with forward outputs (`weights` orders the
    gradients by them). Memory therefore grows with the model (its modules, and its parameters per dumped step), not
    with the number of records: a stream of records of any length is checked in bounded memory."""

    def __init__(self, config: RuleConfig, arrays: ArrayLoader | None = None) -> None:
        self.arrays = arrays
        self.steps: dict[int, Step] = {}
        self.passing = Passing(config)
        self._depth: dict[str, int] = {}  # module -> the order of its first forward output

    @classmethod
    def of(cls, records: Sequence[Record], config: RuleConfig, arrays: ArrayLoader | None = None) -> DumpView:
        """The view of records held in memory, in any order; a link (`same_as`, no statistics of its own) takes the
        statistics of the record with that seq."""
        by_seq = {r.seq: r for r in records}
        view = cls(config, arrays)
        for rec in sorted(records, key=lambda r: (r.step, r.seq)):
            if rec.stats is None and rec.same_as is not None and rec.same_as in by_seq:
                rec = msgspec.structs.replace(rec, stats=by_seq[rec.same_as].stats)
            view.add(rec)
        return view

    def add(self, rec: Record) -> None:
        """One record, after every record before it in execution order ((step, seq))."""
        kind = rec.kind
        if kind == CALL:
            return
        step = self.steps.get(rec.step)
        if step is None:
            step = self.steps[rec.step] = Step()
        if kind == PARAM:
            step.params.pop(rec.module, None)  # the last value read of a parameter, in its place
            step.params[rec.module] = rec
            return
        self.passing.add(rec)
        if kind == FORWARD:
            if rec.io == OUTPUT:
                self._depth.setdefault(rec.module, len(self._depth))
        elif kind == PARAM_GRAD:
            step.grads.setdefault(rec.module, rec)
        elif kind == PROBE and rec.module not in step.probes and rec.stats and numel(rec) >= 1:
            stats = rec.stats
            value = known(stats.mean if numel(rec) == 1 else stats.l2)
            inf = stats.inf or 0
            if value is None or nonfinite(stats):
                value = math.inf if inf and not stats.nan else math.nan
            step.probes[rec.module] = float(value)

    @property
    def order(self) -> list[int]:
        """The dumped steps, in order."""
        return sorted(self.steps)

    def stats(self, rec: Record) -> Stats | None:
        """A record's statistics as the rules read them (a link's: its producer's, resolved before it was added)."""
        return rec.stats

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
