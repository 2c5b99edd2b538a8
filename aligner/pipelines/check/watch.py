"""`aligner.watch`: `align check`'s health rules on a live training run, at the end of every watched step.

    with aligner.watch(model, every=1, on_finding="raise") as w:   # torch.nn.Module or MindSpore nn.Cell
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            w.step()                       # MindSpore: loss, grads = grad_fn(x, y); opt(grads); w.step()

Each watched step records, in memory and as statistics only (no file), what the enabled rules read: module forward
outputs, module gradients, parameter gradients, parameter values at the step's start and end (update ratios) and
`aligner.save` probes ("loss", ...). Hooks only keep float32/float64 CPU tensors (a copy of a torch forward output or
probe, which a later in-place op could change; gradients and MindSpore tensors by reference); `step()` computes their
statistics in one batch (segment reductions over one concatenation; one wait for MindSpore's queued ops instead of one
per tensor), the rules' extrema only for module gradients and for forward outputs no activation rule judges. A float
tensor on a GPU is reduced there by one queued kernel launch (`fstats.StatsStage.reduce`, where Triton runs) and read
back in `step()`; other tensors (16-bit floats on the CPU, accelerators without Triton) get theirs at once where they
live. `step()` then runs the rules over the last
few steps' records and, at the first step where a rule fires at a place, logs the finding (logger "aligner") or, with
on_finding="raise", raises `WatchError` carrying it (error severity; warnings are logged).
Steps that are not watched (`every`) run with no hook installed at all.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
from types import TracebackType
from typing import Any, Mapping

import numpy as np

from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.core.findings import Finding, Severity
from aligner.core.frameworks import Framework
from aligner.core.words import Words, words
from aligner.dumping import session as dump_session
from aligner.dumping.fstats import Staged, StatsStage, by_kernel, stats_of, torch_watch_stats
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.options import Options
from aligner.dumping.session import Session, Sink, activate
from aligner.dumping.tensors import model_framework, shape_of
from aligner.metrics.stats import SMALL, Stats, batch_extrema, batch_stats, watch_stats
from aligner.pipelines.check.config import RuleConfig
from aligner.pipelines.check.rules import Evaluation, evaluate
from aligner.pipelines.check.says import Say

__all__ = ["watch", "Watch", "WatchError"]

log = logging.getLogger("aligner")

# What each rule reads: "forward" module outputs, "backward" module gradients, "param_grad" parameter gradients,
# "param" parameter values, "probe" aligner.save values. A rule not listed here gets everything.
NEEDS: dict[str, frozenset[Kind]] = {
    "nonfinite": frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.PARAM_GRAD}),
    "fp16-overflow": frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.PARAM_GRAD}),
    "fp16-underflow": frozenset({Kind.PARAM_GRAD}),
    "vanishing-gradients": frozenset({Kind.PARAM_GRAD}),
    "exploding-gradients": frozenset({Kind.PARAM_GRAD}),
    "frozen-weights": frozenset({Kind.PARAM, Kind.PARAM_GRAD}),
    "update-ratio": frozenset({Kind.PARAM, Kind.PARAM_GRAD}),
    "dead-relu": frozenset({Kind.FORWARD}),
    "saturated-activations": frozenset({Kind.FORWARD}),
    "constant-activations": frozenset({Kind.FORWARD}),
    "loss-scale-overflow": frozenset({Kind.PARAM_GRAD, Kind.PROBE}),
    "clip-before-unscale": frozenset({Kind.PARAM_GRAD, Kind.PROBE}),
    "grads-not-unscaled": frozenset({Kind.PARAM_GRAD, Kind.PROBE}),
    "loss-trend": frozenset({Kind.PROBE}),
    "gradient-trend": frozenset({Kind.PARAM_GRAD}),
}
_EVERYTHING = frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.PARAM_GRAD, Kind.PARAM, Kind.PROBE})
# Rules that compare steps (thresholds min_steps/growth_steps) run over the kept history, on its parameter gradients
# and probes only; every other rule reads one step (and the parameter values where the next one starts).
_TREND_KINDS = frozenset({Kind.PARAM_GRAD, Kind.PROBE})
ON_FINDING = ("log", "raise")
GRADS = ("hooks", "step")  # where parameter gradients come from: a hook on each parameter, or w.step(grads)


class WatchError(AlignerError):
    """A health rule fired during `aligner.watch(..., on_finding="raise")`; `.finding` is what it found."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(describe(finding))
        self.finding = finding


def describe(finding: Finding) -> Words:
    """One line: the step, the rule (symptom), the layer, what was seen, and the fix."""
    return words(Say.WATCH, rule=finding.rule, severity=finding.severity, step=finding.step, where=finding.where,
                 message=finding.message, fix=finding.fix)


class _Records(Sink):
    """The in-memory sink of a watch: records with their statistics, never tensors."""

    host_arrays = False

    def __init__(self) -> None:
        self.records: list[Record] = []

    def put(self, record: Record, array: Any) -> None:
        if record.stats is not None and record.kind != Kind.BUFFER:
            self.records.append(record)

    def close(self) -> None:
        """Nothing to flush."""


class _Deferred(Session):
    """A session whose CPU float32/float64 records get their statistics once per step, in one batch (`flush`): a hook
    only keeps the tensor (a copy of a forward output, which a later in-place op could change; a gradient itself, which
    autograd then no longer reuses in place); other tensors get theirs at once, where they live. Normalisation buffers
    (no rule reads them) are numbered, not recorded. Every record keeps its own statistics: no links by memory
    (reading a MindSpore tensor's address would wait for its op in every hook)."""

    link_views = False

    def __init__(self, sink: _Records, step: int, counted: frozenset[str]) -> None:
        super().__init__(sink, step)
        self.records = sink
        self.counted = counted  # forward outputs of these module types get every statistic; others their extrema
        self.pending: list[tuple[Record, Any]] = []
        self._ms_cpu: bool | None = None
        self._stage = StatsStage()  # accelerator tensors' statistics, queued by the GPU kernel (fstats)
        self._staged_bytes = 0

    def emit(self, module: str, type_: str, kind: Kind, io: Io, index: int, tensor: Any, *,
             call: int | None = None, parent: str | None = None, source: str | None = None,
             arg: str | None = None, scope: str | None = None, stats_only: bool = False) -> int:
        """Number the record; keep the tensor for `flush` (or compute its statistics now; the watch keeps no
        `scope`: its rules read each record alone)."""
        if kind == Kind.BUFFER:
            with self._lock:
                self.seq += 1
                return self.seq - 1
        dtype = tensor.dtype  # read once: a MindSpore tensor's dtype costs tens of microseconds
        stats: Stats | None
        # a large CPU torch tensor: at once, in the fewest passes, no copy (torch_watch_stats); small ones are cheaper
        # in the step's batch (per-tensor op dispatch outweighs their few elements)
        kernel = False
        if self._torch_cpu(tensor, dtype) and tensor.numel() >= SMALL:
            held, stats = None, torch_watch_stats(tensor, full=not self._light_kind(kind, type_))
        elif kernel := by_kernel(tensor):  # on a GPU: queued there below, under the lock (the stage is shared)
            held, stats = None, None
        else:
            held = self._hold(tensor, kind, dtype)
            stats = None if held is not None else stats_of(tensor)
        with self._lock:
            if kernel:  # read back at `flush`; a kernel that fails leaves the tensor to be reduced at once
                held = self._stage.reduce(tensor)
                if held is None:
                    stats = stats_of(tensor)
                else:
                    self._staged_bytes += held.table_bytes
            seq = self.seq
            self.seq += 1
            record = Record(seq=seq, module=module, type=type_, kind=kind, io=io, index=index, dtype=canonical(dtype),
                            shape=shape_of(tensor), step=self.step, stats=stats, call=call, parent=parent,
                            source=source, arg=arg)
            self.pending.append((record, held))
            if self._staged_bytes >= dump_session.DEFER_BYTES:  # the kernel rows bounded as a dump bounds them
                self._read_stage()
        return seq

    def _read_stage(self) -> None:
        """The statistics of the records queued on accelerators (one transfer per device), into their records."""
        self._staged_bytes = 0
        if not any(isinstance(held, Staged) for _, held in self.pending):
            return
        read = self._stage.read()
        for i, (record, held) in enumerate(self.pending):
            if isinstance(held, Staged):
                record.stats = read[held.key][held.index]
                self.pending[i] = (record, None)

    @staticmethod
    def _torch_cpu(tensor: Any, dtype: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and \
            tensor.layout == torch.strided and dtype in (torch.float32, torch.float64)

    def _hold(self, tensor: Any, kind: Kind, dtype: Any) -> Any:
        """What `flush` reads for this tensor, or None to compute its statistics now."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(tensor, torch.Tensor):
            if tensor.device.type != "cpu" or tensor.layout != torch.strided or \
                    dtype not in (torch.float32, torch.float64):
                return None
            if kind in (Kind.BACKWARD, Kind.PARAM_GRAD) and tensor._base is None and not tensor.requires_grad:
                return tensor  # held: autograd's use count check then copies instead of stealing it
            return tensor.detach() if kind == Kind.PARAM else tensor.detach().clone()  # params: flushed at once
        ms = sys.modules.get("mindspore")
        if ms is not None and isinstance(tensor, ms.Tensor) and dtype in (ms.float32, ms.float64):
            if self._ms_cpu is None:  # the context's target, not tensor.device (which waits for every queued op)
                self._ms_cpu = str(ms.get_context("device_target")).upper().startswith("CPU")
            return tensor if self._ms_cpu else None  # MindSpore ops return new tensors: a reference is enough
        return None

    def observe(self, module: str, type_: str, io: Io, index: int, tensor: Any, *, call: int | None,
                parent: str | None, arg: str | None = None) -> None:
        """Nothing: the watch's rules read leaf records, and a block's statistics would only slow each step."""

    def flush(self) -> None:
        """Compute the statistics of every kept tensor in one batch and hand the records to the sink, in order."""
        self._read_stage()
        pending, self.pending = self.pending, []
        for record, tensor in pending:  # a large one: its own few passes beat copying it into the batch
            if tensor is not None and math.prod(record.shape) >= SMALL:
                record.stats = watch_stats(_host_view(tensor), full=not self._light(record))
        pending_small = [(r, None if math.prod(r.shape) >= SMALL else t) for r, t in pending]
        for light, compute in ((False, batch_stats), (True, batch_extrema)):
            held = [(r, t) for r, t in pending_small if t is not None and self._light(r) == light]
            if held:
                for (record, _), stats in zip(held, compute([_host_view(t) for _, t in held])):
                    record.stats = stats
        self.records.records.extend(record for record, _ in pending)


    def _light(self, record: Record) -> bool:
        return self._light_kind(record.kind, record.type)

    def _light_kind(self, kind: Kind, type_: str) -> bool:
        """Whether the rules read only a record's extrema and NaN/Inf counts: module gradients (nonfinite,
        fp16-overflow) and forward outputs but those of the activations dead-relu/saturated-activations judge."""
        return kind == Kind.BACKWARD or (kind == Kind.FORWARD and type_ not in self.counted)


def _nonfinite(records: list[Record], step: int) -> bool:
    """Whether a record of `step` holds NaN or Inf."""
    return any(r.step == step and r.stats and (r.stats.nan or r.stats.inf) for r in records)


def _host_view(tensor: Any) -> np.ndarray:
    """A CPU tensor's data as numpy, without a copy."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if hasattr(tensor, "asnumpy"):
        return tensor.asnumpy()  # the first one waits for MindSpore's queued ops; the rest are views
    return tensor.detach().numpy()


class Watch:
    """A live health check: a context manager around the training loop; call `step()` once at the end of each step."""

    def __init__(self, model: Any, rules: Mapping[str, Any] | None = None, every: int = 1,
                 on_finding: str = "log", grads: str = "hooks") -> None:
        if rules is not None and not isinstance(rules, Mapping):
            raise AlignerError(f"aligner.watch rules must be a dict of {{'rule.key': value}}, got "
                               f"{type(rules).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise AlignerError(f"aligner.watch every must be a whole number >= 1 (watch every Nth step), got {every!r}")
        if on_finding not in ON_FINDING:
            raise AlignerError(f"aligner.watch on_finding must be 'log' or 'raise', got {on_finding!r}")
        if grads not in GRADS:
            raise AlignerError(f"aligner.watch grads must be 'hooks' (a hook on each parameter) or 'step' (you pass "
                               f"the gradients to w.step(grads)), got {grads!r}")
        self.given = grads == "step"
        self.config = RuleConfig.load(rules)
        self.framework = model_framework(model)
        self.model, self.every, self.on_finding = model, every, on_finding
        enabled = [name for name in self.config.names if self.config.enabled(name)]
        self.needs: frozenset[Kind] = frozenset().union(*(NEEDS.get(n, _EVERYTHING) for n in enabled))
        # Module gradients (every module's grad_input/grad_output: as many tensors as the forward, and in MindSpore a
        # cell backward hook each, measured 1.78x of a resnet18 step against 0.85-1.0x without them) feed only the
        # backward half of nonfinite/fp16-overflow: they are recorded from the step after the first non-finite value
        # (an escalation: the watch then names the module that first produced it in backward).
        self.options = Options(leaves_only=True, forward=Kind.FORWARD in self.needs,
                               backward=bool({Kind.BACKWARD, Kind.PARAM_GRAD} & self.needs), inputs=False,
                               module_backward=False, param_grads=not self.given)
        self._detailed = dataclasses.replace(self.options, module_backward=True) if Kind.BACKWARD in self.needs \
            else None
        # the steps a trend rule compares, plus the one being judged
        trend = {rule for rule in self.config.names if {"min_steps", "growth_steps"} & set(self.config.rules[rule])}
        longest = [int(v) for rule in trend for key, v in self.config.rules[rule].items()
                   if key in ("min_steps", "growth_steps")]
        self.history = max([2, *longest]) + 1
        off = {f"{rule}.enabled": False for rule in trend}
        self._split = (self._only(rules, off), self._only(rules, {f"{rule}.enabled": False for rule in
                                                                 self.config.names if rule not in trend}))
        self._disabled_by_split = (set(trend), set(self.config.names) - trend)
        self.step_number = 0
        self.findings: list[Finding] = []   # every finding reported so far, once per (rule, where)
        self.evaluation: Evaluation | None = None  # the last evaluation (skipped rules and why, series)
        self._seen: set[tuple[str, tuple[str | None, ...]]] = set()
        self._sink = _Records()
        self._session: _Deferred | None = None
        self._handles: list[Any] = []
        self._previous: Session | None = None

    @staticmethod
    def _only(rules: Mapping[str, Any] | None, off: dict[str, bool]) -> RuleConfig:
        """The user's configuration with the rules in `off` disabled (as long as the user had them on)."""
        return RuleConfig.load({**dict(rules or {}), **off})

    # -- context ----------------------------------------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        if self._session is not None:
            raise AlignerError("aligner.watch is already active; enter it once around the training loop")
        if self.framework == Framework.MINDSPORE:
            from aligner.dumping.mindspore_hooks import check_pynative

            check_pynative()
        counted = frozenset(t for rule, keys in (("dead-relu", ("types",)), ("saturated-activations", (
            "sigmoid", "tanh"))) for key in keys for t in self.config(rule, key))
        self._session = _Deferred(self._sink, self.step_number, counted)
        self._previous = activate(self._session)  # aligner.save probes ("loss", ...) reach the watch
        if self.watched(self.step_number):
            self._params(self.step_number)
            self._session.flush()
            self._install()
        else:
            self._session.close()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Remove every hook and stop recording (what leaving the `with` block does)."""
        self._remove()
        if self._session is not None:
            self._session.close()
            activate(self._previous)
            self._session = None

    def watched(self, step: int) -> bool:
        """Whether `step` (counted from 0 by `step()` calls) is recorded and checked."""
        return step % self.every == 0

    # -- one step ---------------------------------------------------------------------------------------------------
    def step(self, grads: Any = None) -> list[Finding]:
        """End of a training step (after the optimizer update): check it if it was watched, and return the findings
        new at this step (each logged, or the first error raised as WatchError with on_finding="raise").

        grads (a watch made with grads="step"): this step's parameter gradients as the training loop has them: a
        sequence in the order of the model's trainable parameters (MindSpore's `value_and_grad(..., weights=
        model.trainable_params())` or an optimizer's `parameters`), or a {name: gradient} mapping."""
        session = self._session
        if session is None:
            raise AlignerError("aligner.watch(...).step() outside its context: use `with aligner.watch(model) as w:` "
                               "around the training loop and call w.step() at the end of each step")
        current, following = self.step_number, self.step_number + 1
        checked = self.watched(current)
        wanted = self.given and checked and Kind.PARAM_GRAD in self.needs
        if grads is not None and not self.given:
            raise AlignerError("w.step(grads) needs aligner.watch(model, grads='step') (a watch with grads='hooks' "
                               "records the gradients itself)")
        if wanted and grads is None:
            raise AlignerError("this aligner.watch was made with grads='step': pass the step's gradients, "
                               "w.step(grads)")
        if wanted:
            self._given(grads)
        session.next_step(following)
        if checked or self.watched(following):
            session.open = True
            self._params(following)  # the values after this update: where the next step starts
        session.flush()
        self.step_number = following
        if self._detailed is not None and _nonfinite(self._sink.records, current):
            self.options, self._detailed = self._detailed, None  # from now on, with module gradients
            self._remove()
        if self.watched(following):
            self._install()
        else:
            self._remove()
            session.close()
        return self._check(current) if checked else []

    def _check(self, step: int) -> list[Finding]:
        """Evaluate the rules over the kept history; report findings not reported before, at most once each."""
        records = self._sink.records
        oldest = step - self.every * (self.history - 1)
        if records and records[0].step < oldest:
            self._sink.records = records = [r for r in records if r.step >= oldest]
        framework = self.framework.value
        now = [r for r in records if r.step == step or (r.step == step + 1 and r.kind == Kind.PARAM)]
        history = [r for r in records if r.kind in _TREND_KINDS]
        parts = (evaluate(now, self._split[0], framework=framework),
                 evaluate(history, self._split[1], framework=framework))
        self.evaluation = merged = Evaluation(steps=sorted({*parts[0].steps, *parts[1].steps}))
        for part, split_off in zip(parts, self._disabled_by_split):
            merged.findings.extend(part.findings)
            merged.checked.extend(part.checked)
            merged.notes.extend(part.notes)
            merged.skipped.update({k: v for k, v in part.skipped.items() if k not in split_off})
        merged.grad_norms, merged.update_ratios, merged.loss = parts[1].grad_norms, parts[0].update_ratios, \
            parts[1].loss
        new = []
        for finding in self.evaluation.findings:
            key = (finding.rule, finding.where)
            if key not in self._seen:
                self._seen.add(key)
                new.append(finding)
        self.findings.extend(new)
        for finding in new:
            if self.on_finding == "raise" and finding.severity == Severity.ERROR:
                raise WatchError(finding)
        for finding in new:
            level = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING}.get(finding.severity,
                                                                                       logging.INFO)
            log.log(level, describe(finding))
        return new

    # -- recording --------------------------------------------------------------------------------------------------
    def _hooks(self) -> Any:
        if self.framework == Framework.MINDSPORE:
            from aligner.dumping import mindspore_hooks as hooks
        else:
            from aligner.dumping import torch_hooks as hooks  # type: ignore[no-redef]
        return hooks

    def _install(self) -> None:
        if self._handles or self._session is None or not (self.options.forward or self.options.backward):
            return
        try:
            self._hooks().install(self.model, self._session, self.options, self._handles)
        except BaseException:
            self._remove()
            raise

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _given(self, grads: Any) -> None:
        """Record the gradients handed to step(), in backward order (the reverse of the parameters'), as parameter
        hooks would have: `align check`'s depth order reads it."""
        session = self._session
        trainable = [n for n, type_, p in self._hooks().state(self.model)
                     if type_ == "Parameter" and getattr(p, "requires_grad", True)]
        selected = {n for n in trainable if self.options.selects_name(n)}
        if isinstance(grads, Mapping):
            pairs = [(n, g) for n, g in grads.items() if n in selected]
        else:
            try:
                given = list(grads)
            except TypeError:
                raise AlignerError(f"w.step(grads): expected a sequence or mapping of gradients, got "
                                   f"{type(grads).__name__}") from None
            if len(given) != len(trainable):
                raise AlignerError(f"w.step(grads): {len(given)} gradients for {len(trainable)} trainable parameters; "
                                   "pass them in the order of the model's trainable parameters, or as {name: grad}")
            pairs = [(n, g) for n, g in zip(trainable, given) if n in selected]
        for name, grad in reversed(pairs):
            if grad is not None and session is not None:
                session.emit(name, "Parameter", Kind.PARAM_GRAD, Io.GRAD, 0, grad)

    def _params(self, step: int) -> None:
        """Record every trainable parameter's value as `step` starts (what update ratios and frozen weights read)."""
        session = self._session
        if Kind.PARAM not in self.needs or session is None:
            return
        for name, type_, value in self._hooks().state(self.model):
            if type_ == "Parameter" and getattr(value, "requires_grad", True) and self.options.selects_name(name):
                session.emit(name, type_, Kind.PARAM, Io.VALUE, 0, value)


def watch(model: Any, rules: Mapping[str, Any] | None = None, every: int = 1, on_finding: str = "log",
          grads: str = "hooks") -> Watch:
    """Check `model`'s training live with `align check`'s rules (`rules` overrides thresholds as {"rule.key": value};
    {"rule.enabled": False} turns one off): enter it around the loop and call `.step()` after each optimizer update.

    Every `every`th step is recorded as in-memory statistics (no tensor copies, no files) and checked; at the first
    step where a rule fires at a layer the finding is logged (logger "aligner"), or raised as WatchError with
    on_finding="raise" when its severity is error. `.findings` lists everything reported so far. grads="step": no
    parameter hooks; the loop passes each step's gradients to `.step(grads)` (in MindSpore, hooks on Parameters slow
    its backward down; the loop has the gradients anyway).
    """
    return Watch(model, rules, every, on_finding, grads)
