"""From per-row metrics to answers: first divergence per phase, where the error is introduced, first NaN/Inf, bisect.

Data flow between records is recovered from the reference side. Version 2 dumps say it: a call's inputs carry its
call id, and each input is either a link to the record that returned that very tensor (`same_as`) or data that code
between module calls computed (the parent's own code: a residual add, an attention scale, a functional softmax), so
an input that differs while everything before it matched blames that parent's code, not the next module. In version 1
dumps a forward output's inputs are the input records of the same call, and an input record is produced by the
latest earlier output with the same content (digest file, or the same statistics); backward works the same way with
grad_output -> grad_input. Without any of that a record's input is the record before it (a sequential model).
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Hashable, NamedTuple, Sequence

from aligner.core.words import Text, Words, words
from aligner.dumping.manifest import INPUTS, Io, Kind, Record
from aligner.dumping.pair.matching import MatchedBy
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.says import Say

if TYPE_CHECKING:  # compare/settings.py loads the audit's rules: only for a finding with call records
    from aligner.pipelines.compare.settings import SettingDiff

AMPLIFICATION = 10.0  # an error this many times its inputs' error is new here, not carried from upstream
FORWARD = (Kind.FORWARD, Kind.PROBE, Kind.OP, Kind.BUFFER, Kind.BLOCK)
BACKWARD = (Kind.BACKWARD, Kind.PARAM_GRAD)


class Phase(str, enum.Enum):
    """Forward records (and probes) or backward ones (gradients)."""

    FORWARD = "forward"
    BACKWARD = "backward"

    def __str__(self) -> str:
        return self.value


class Label(str, enum.Enum):
    """Whether a divergent row makes its own error or carries its inputs' error."""

    INTRODUCED = "introduced"
    INHERITED = "inherited"

    def __str__(self) -> str:
        return self.value


class Culprit(str, enum.Enum):
    """What the origin row says is at fault."""

    MODULE = "module"              # the module's own computation (its inputs matched, or were not recorded)
    PARENT_CODE = "parent_code"    # code in the parent's forward between module calls computed a differing input
    OP = "op"                      # one tensor operation of an op-level dump (its inputs matched)
    MODEL_INPUT = "model_input"    # the data given to the model differs
    WIRING = "wiring"              # the parent's forward hands a call another recorded output (gate and up swapped)
    ARGUMENT = "argument"          # the parent's forward passes a call a tensor argument on one side only (a mask)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class OneSided:
    """A tensor argument that one side's caller passes to a call and the other side's does not (a window attention
    called without its mask): the callee's own code, or its caller's, is what differs."""

    callee: str                # the called module (reference path)
    name: str                  # the argument as recorded ("mask", or its position)
    side: str                  # "a" | "b": the side that passes it


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first divergent row of a phase, the row before it, and the row where its error was introduced."""

    phase: Phase
    first: int                 # row index of the first divergent record in execution order
    previous: int | None       # the matched row just before it
    origin: int                # the row that introduces the error (== first unless it accumulated)
    reason: Text               # why `origin` is where the error starts (Words; text when read back)
    culprit: Culprit = Culprit.MODULE
    blame: str = ""            # the module (reference path) whose code is at fault: see `culprit`
    source: str | None = None  # file:line of the op at fault (op-level dumps)
    blame_other: str | None = None  # the blamed module's path on the other side, where it is known and differs
    op: str | None = None      # culprit OP: the op as called ("Tensor.__mul__"), where it is not the origin record's
    argument: OneSided | None = None  # culprit ARGUMENT: what the caller (`blame`) passes on one side only
    above_noise: float | None = None  # the origin's error over its reference's own float64 noise (--calibrate)
    # culprit MODULE: the blamed module's settings that differ between the sides; culprit OP: the op call's plain
    # arguments that differ (compare/settings.py fills them)
    settings: tuple[SettingDiff, ...] = ()


@dataclasses.dataclass(frozen=True)
class NanFinding:
    """The first row whose inputs are finite on a side but whose output is not."""

    row: int
    side: str                  # "a" | "b"
    count: int


@dataclasses.dataclass(frozen=True)
class Verdict:
    findings: tuple[Divergence, ...]
    nan_origin: NanFinding | None
    labels: dict[int, Label]   # row index -> introduced | inherited, for divergent rows (and origins)
    bisect_reads: int | None = None
    bisect_confirmed: bool | None = None  # every record before each answer was read (so it is the first divergence)
    bisect_unread: int | None = None      # records before the answers that bisect did not read
    immaterial: tuple[int, ...] = ()  # divergent inputs of calls whose outputs agree


def phase_of(row: Row) -> Phase:
    return Phase.FORWARD if row.pair.ref.record.kind in FORWARD else Phase.BACKWARD


def error_level(row: Row) -> float:
    """Relative L2 error of a row (0 when it matched without one, inf when it diverged with none measurable)."""
    m = row.metrics
    if m is None:
        return 0.0
    if m.rel_l2_err is not None and math.isfinite(m.rel_l2_err) and m.method != "none":
        return m.rel_l2_err if (m.rel_l2_err or not m.diverged) else math.inf
    return math.inf if m.diverged else 0.0


class Flow(dict):
    """Row index -> indices of the rows holding its inputs; `inferred` lists the rows whose inputs were not recorded
    (their "input" is only the record before them, so nothing proves what entered the call); `computed` lists input
    rows that code between calls computed (no recorded call returned that tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.inferred: set[int] = set()
        self.computed: set[int] = set()
        self.untwinned: dict[int, int] = {}  # input row -> the producer row that has no twin on the other side


_CALL_KINDS = (Kind.FORWARD, Kind.OP, Kind.BUFFER, Kind.BLOCK)
_CONSUMERS = {(Kind.FORWARD, Io.INPUT), (Kind.BACKWARD, Io.GRAD_OUTPUT)}  # records whose producer dataflow() looks up
# a module call's own inputs and outputs (a leaf's, or a block's statistics)
_MODULE_RECORDS = (Kind.FORWARD, Kind.BLOCK)


def _call_flow(rows: Sequence[Row]) -> Flow:
    """Data flow of version 2 records from their call ids and links (reference side only; other rows: none)."""
    flow = Flow()
    by_seq: dict[tuple[int, int], int] = {}
    call_inputs: dict[tuple[int, int], list[int]] = defaultdict(list)
    made_inside: dict[tuple[int, str], list[int]] = defaultdict(list)  # (step, parent) -> its children's outputs
    for i, row in enumerate(rows):
        b = row.pair.b
        call = b.record.call if b is not None else None
        if b is None or call is None or b.record.kind not in _CALL_KINDS:
            continue
        rec = b.record
        by_seq[(rec.step, rec.seq)] = i
        if rec.io == Io.OUTPUT and rec.parent is not None and rec.kind in _MODULE_RECORDS:
            made_inside[(rec.step, rec.parent)].append(i)
        if rec.io == Io.OUTPUT and rec.kind == Kind.BLOCK:
            # a block computes its output from its inputs and what its children returned (the record it hands back)
            inside = made_inside.pop((rec.step, rec.module), [])
            linked = by_seq.get((rec.step, rec.same_as)) if rec.same_as is not None else None
            flow[i] = [linked] if linked is not None else call_inputs.get((rec.step, call), []) + inside
        elif rec.io == Io.INPUT:
            call_inputs[(rec.step, call)].append(i)
            producer = by_seq.get((rec.step, rec.same_as)) if rec.same_as is not None else None
            while producer is not None and rows[producer].pair.matched_by == MatchedBy.FOLDED:
                # a pass-through call with no twin (an Identity): look through it to what it was given
                folded_call = rows[producer].pair.ref.record.call
                given = call_inputs.get((rec.step, folded_call if folded_call is not None else -1))
                if not given or given[0] in flow.computed:
                    producer = None
                    break
                producer = (flow.get(given[0]) or [None])[0]
            flow[i] = [] if producer is None else [producer]
            if rec.same_as is None or not flow[i]:
                flow.computed.add(i)
            elif producer is not None and rows[producer].pair.a is None:
                flow.untwinned[i] = producer
        else:
            ups = call_inputs.get((rec.step, call))
            if ups:
                flow[i] = list(ups)
    return flow


def dataflow(rows: Sequence[Row]) -> Flow:
    """Row index -> indices of the rows holding its inputs (see module docstring)."""
    inputs = _call_flow(rows)
    refs = [row.pair.ref for row in rows]
    open_calls: dict[str, list[list[int]]] = defaultdict(list)   # module -> stack of input groups
    closed: dict[str, list[int]] = {}                             # module -> inputs of its last finished call
    producers: dict[tuple[Phase, Hashable], int] = {}                  # (phase, content link) -> latest producing row
    last_bwd: dict[str, list[int]] = {}                           # module -> grad_output rows of its latest call
    prev_in_phase: dict[Phase, int] = {}
    # Producers are looked up only for the inputs that no call id links (forward inputs, grad_outputs): without
    # any, content links (a tuple of statistics per record) are not worth making.
    linked = any(i not in inputs and (ref.record.kind, ref.record.io) in _CONSUMERS for i, ref in enumerate(refs))
    prev: Record | None = None
    for i, item in enumerate(refs):
        rec = item.record
        phase = Phase.FORWARD if rec.kind in FORWARD else Phase.BACKWARD
        link = item.link if linked else None
        if i in inputs:  # known from call ids and links
            if link is not None and rec.io not in INPUTS:
                producers[(phase, link)] = i
            prev_in_phase[phase] = i
            prev = rec
            continue
        ups: list[int] | None = None
        if rec.kind == Kind.FORWARD and rec.io == Io.INPUT:
            same_call = prev is not None and prev.kind == Kind.FORWARD and prev.io == Io.INPUT and \
                prev.module == rec.module and rec.index > 0 and bool(open_calls[rec.module])
            if same_call:  # (not when the input before it was linked by call ids: a row one side holds alone)
                open_calls[rec.module][-1].append(i)
            else:
                open_calls[rec.module].append([i])
            produced = producers.get((phase, link)) if link is not None else None  # the row that made this input
            ups = [] if produced is None else [produced]
        elif rec.kind == Kind.FORWARD:
            stack = open_calls.get(rec.module)
            if rec.index == 0 and stack:
                closed[rec.module] = stack.pop()
            ups = closed.get(rec.module)
        elif rec.kind == Kind.BACKWARD and rec.io == Io.GRAD_OUTPUT:
            if prev is None or prev.kind != Kind.BACKWARD or prev.module != rec.module:
                last_bwd[rec.module] = []
            last_bwd[rec.module].append(i)
            produced = producers.get((phase, link)) if link is not None else None
            ups = [] if produced is None else [produced]
        elif rec.kind == Kind.BACKWARD:
            ups = last_bwd.get(rec.module)
        elif rec.kind == Kind.PARAM_GRAD:
            ups = last_bwd.get(rec.module.rpartition(".")[0], [])
        if ups is None:  # no call structure known: assume a sequential model
            inputs[i] = [prev_in_phase[phase]] if phase in prev_in_phase else []
            inputs.inferred.add(i)
        else:
            inputs[i] = list(ups)
        if link is not None and rec.io not in INPUTS:
            producers[(phase, link)] = i
        prev_in_phase[phase] = i
        prev = rec
    return inputs


def evident(i: int, rows: Sequence[Row], inputs: Flow) -> bool:
    """Whether divergent row i can start a divergence: it was set side by side, or its shapes differ where the call
    itself made them (an output whose inputs compared: a pooling's ceil_mode). An input in a shape nothing relates
    (mindone's mask [2, 1, 12, 13], transformers' [2, 1, 12, 12]; tokens routed to an expert), and an output that
    only carries such an input's shape on, says where shapes part, not where numbers do: what comes after does."""
    row = rows[i]
    if row.metrics is None or row.metrics.method != "none":
        return True
    if row.pair.ref.record.io in INPUTS:
        return False
    return all(_comparable(rows[j]) for j in inputs.get(i, []))


def _reordered(row: Row) -> bool:
    """Whether a divergent row holds the same rows as the reference in another order (an MoE expert's tokens sorted
    stably on one side only): a divergence only where something computed from it differs too."""
    return row.metrics is not None and row.metrics.reordered


def _comparable(row: Row) -> bool:
    """Whether a row's numbers were set side by side (an input whose shapes nothing relates is evidence of nothing)."""
    return row.metrics is not None and row.metrics.method != "none"


def _floor(row: Row) -> float:
    """Error level below which a row only carries float noise: its relative tolerance."""
    return row.metrics.rtol if row.metrics is not None else 0.0


def classify(i: int, rows: Sequence[Row], inputs: Flow) -> tuple[Label, Words]:
    """("introduced" | "inherited", the reason) for row i: new error, or error its inputs already carried."""
    label, reason = _classified(i, rows, inputs)
    return label, reason()


def _classified(i: int, rows: Sequence[Row], inputs: Flow) -> tuple[Label, Callable[[], Words]]:
    """`classify`'s label, and its reason worded only when asked: `judge` labels every diverged row (100,000 at a
    million records), and only the findings' reasons are read."""
    ups = [j for j in inputs.get(i, []) if _comparable(rows[j])]
    e_out = error_level(rows[i])
    if i in inputs.computed:
        return Label.INTRODUCED, lambda: _computed(rows[i], e_out)
    if i in inputs.untwinned:
        x, rec = rows[inputs.untwinned[i]].pair.ref.record, rows[i].pair.ref.record
        other = rows[i].pair.a
        where = other.record.parent if other is not None else None
        return Label.INTRODUCED, lambda: words(Say.UNTWINNED, index=rec.index, module=rec.module, error=e_out,
                                               op=(x.type, x.source) if x.kind == Kind.OP else None,
                                               producer=x.module, where=where)
    if not ups:
        return Label.INTRODUCED, lambda: words(Say.NO_UPSTREAM)
    handed = _handed_other(i, rows, inputs)
    if handed is not None:
        why = handed[2]
        return Label.INTRODUCED, lambda: why
    worst = max(ups, key=lambda j: error_level(rows[j]))
    e_in = error_level(rows[worst])
    if e_in <= _floor(rows[worst]) and not rows[worst].diverged:
        if i in inputs.inferred:
            return Label.INTRODUCED, lambda: _between(rows[worst], rows[i], e_in, e_out)
        return Label.INTRODUCED, lambda: words(Say.INPUTS_MATCHED, inputs=len(ups), e_in=e_in, e_out=e_out)
    if e_out > AMPLIFICATION * max(e_in, _floor(rows[i])):
        return Label.INTRODUCED, lambda: words(Say.AMPLIFIED, inputs=len(ups), e_in=e_in, e_out=e_out)
    return Label.INHERITED, lambda: words(Say.CARRIED, module=rows[worst].pair.ref.record.module, e_in=e_in)


def parent_of(a: str, b: str) -> str:
    """The deepest module containing both paths ('' for the root)."""
    pa, pb = a.split("."), b.split(".")
    common = []
    for x, y in zip(pa[:-1], pb[:-1]):
        if x != y:
            break
        common.append(x)
    return ".".join(common)


def _between(before: Row, row: Row, e_in: float, e_out: float) -> Words:
    """What is known when a call's input was not recorded: where the numbers part, and who may be at fault."""
    x, y = before.pair.ref.record.module, row.pair.ref.record.module
    return words(Say.BETWEEN, before=x, after=y, e_in=e_in, e_out=e_out, parent=parent_of(x, y))


def _computed(row: Row, e_out: float) -> Words:
    """Why an input computed between calls is where the numbers part."""
    rec = row.pair.ref.record
    if rec.kind == Kind.OP:
        return words(Say.COMPUTED_OP, index=rec.index, type=rec.type, source=rec.source, error=e_out)
    if rec.parent is None:
        return words(Say.MODEL_INPUT, index=rec.index, error=e_out)
    scope, _, note = computing_scope(row)
    return words(Say.COMPUTED, index=rec.index, module=rec.module, error=e_out, scope=scope, note=note)


def _scope(rec: Record) -> str | None:
    """The module whose code computed an input with data: the one the dump noted (`scope`), else its parent."""
    return rec.scope if rec.scope is not None else rec.parent


def _levels(rec: Record, scope: str | None) -> int | None:
    """How many levels above `rec`'s module `scope` is, when it is an ancestor of it (None: it is not: the tensor was
    computed before the call chain it enters, e.g. by the tail of the block before)."""
    if scope is None:
        return None
    parts = rec.module.split(".") if rec.module else []
    above = scope.split(".") if scope else []
    return len(parts) - len(above) if parts[:len(above)] == above and len(above) < len(parts) else None


def _ancestor(path: str, levels: int) -> str:
    """The module `levels` above `path` ("" the model)."""
    parts = path.split(".") if path else []
    return ".".join(parts[:max(0, len(parts) - levels)])


def computing_scope(row: Row) -> tuple[str, str | None, Words | None]:
    """(reference path of the module whose code computed this input, its path on the other side (None: not known),
    a note on how that is known). Each side's dump
    says where its tensor was computed (`scope`, else the caller). Where the sides agree, or neither place is on the
    call chain the tensor enters, the reference's answer stands; where one side computes it inside that chain (a
    block's own code) and the other passes it through from further out, the deeper of the two is the code that
    differs (mapped onto the reference's path by its depth)."""
    b, a = row.pair.ref.record, row.pair.a.record if row.pair.a is not None else None
    scope_b = _scope(b) or ""
    if a is None or b.parent is None:
        return scope_b, None, None
    level_b = _levels(b, scope_b)
    level_a = 1 if a.same_as is not None else _levels(a, _scope(a))  # a link: the caller chose what to hand over
    if level_a is not None and (level_b is None or level_a < level_b):
        inside = _ancestor(a.module, level_a)
        return _ancestor(b.module, level_a), inside, words(Say.NOTE_INSIDE, inside=inside, arrives=scope_b)
    there = _ancestor(a.module, level_b) if level_b is not None else _scope(a) if a.same_as is None else None
    if b.scope is not None:
        return scope_b, there, words(Say.NOTE_UNCHANGED, parent=b.parent)
    return scope_b, there, None


def _handed_other(i: int, rows: Sequence[Row], inputs: Flow) -> tuple[str, str | None, Words, bool] | None:
    """(reference path of the caller, its path on the other side, why, whether the other side hands over another
    recorded output: wiring) when a call's input differs though the
    record the reference side links it to (the call that returned it there) matched: the two sides' callers hand the
    call different tensors, a wiring difference in the caller's code (gate and up projections swapped), not the
    callee's."""
    rec = rows[i].pair.ref.record
    ups = inputs.get(i, [])
    if rec.kind not in (Kind.FORWARD, Kind.OP, Kind.BLOCK) or rec.io != Io.INPUT or rec.same_as is None or \
            len(ups) != 1 or i in inputs.computed:
        return None
    producer, other_side = rows[ups[0]], rows[i].pair.a
    if producer.metrics is None or producer.diverged or not rows[i].diverged or other_side is None:
        return None
    a = other_side.record
    made = producer.pair.ref.record.module or "(root)"
    caller = rec.parent or ""
    here = {"index": rec.index, "module": rec.module, "error": error_level(rows[i])}
    if a.same_as is not None:
        linked = _row_of_a(rows, a.step, a.same_as)
        twin = linked.pair.ref.record.module if linked is not None else None
        if twin is not None:
            return caller, a.parent, words(Say.WIRED, **here, twin=twin, made=made, caller=caller), True
    scope, there, note = computing_scope(rows[i])
    held = _same_numbers(rows, i)
    return scope, there, words(Say.HANDED, **here, held=held, where=scope, note=note, made=made), held is not None


def _extra_op(rows: Sequence[Row], i: int) -> Record | None:
    """The op record of side A that returned row i's A input when that op has no twin on the reference side (the
    other side scales a block's input where the reference passes it on)."""
    a = rows[i].pair.a
    if a is None or a.record.same_as is None:
        return None
    linked = _row_of_a(rows, a.record.step, a.record.same_as)
    return linked.pair.a.record if linked is not None and linked.pair.a is not None and linked.pair.b is None and \
        linked.pair.a.record.kind == Kind.OP else None


def _row_of_a(rows: Sequence[Row], step: int, seq: int) -> Row | None:
    """The row holding side A's record `seq` of `step` (what an A-side link names)."""
    return next((r for r in rows if r.pair.a is not None and r.pair.a.record.seq == seq and
                 r.pair.a.record.step == step), None)


def _same_numbers(rows: Sequence[Row], i: int) -> str | None:
    """The reference path of the record whose output, on side A, holds exactly the numbers row i's A input holds (the
    same content-addressed file): what the caller really handed over there."""
    a = rows[i].pair.a
    if a is None or a.path is None:
        return None
    return next((r.pair.ref.record.module or "(root)" for r in rows if r.pair.a is not None and
                 r.pair.a.record.io == Io.OUTPUT and r.pair.a.path == a.path), None)


class Fault(NamedTuple):
    """Who a finding blames (the Divergence fields of the same names)."""

    culprit: Culprit
    blame: str
    source: str | None = None
    blame_other: str | None = None
    op: str | None = None
    argument: OneSided | None = None


def one_sided(rows: Sequence[Row], i: int, callee: str) -> OneSided | None:
    """The first tensor argument of `callee`'s latest call before row i that one side records and the other does not
    (an input record left without a twin), when both sides recorded that call's inputs."""
    step = rows[i].pair.ref.record.step
    paired = next((r for r in reversed(rows[:i + 1]) if r.pair.a is not None and r.pair.b is not None and
                   r.pair.b.record.module == callee and r.pair.b.record.step == step and
                   r.pair.b.record.io == Io.INPUT and r.pair.b.record.kind in _MODULE_RECORDS), None)
    if paired is None or paired.pair.a is None or paired.pair.b is None:
        return None
    a, b = paired.pair.a.record, paired.pair.b.record
    for r in rows:
        only = r.pair.b if r.pair.a is None else r.pair.a if r.pair.b is None else None
        if only is None:
            continue
        side, rec, twin = ("b", only.record, b) if r.pair.a is None else ("a", only.record, a)
        if rec.io == Io.INPUT and rec.kind in _MODULE_RECORDS and \
                (rec.module, rec.call, rec.step) == (twin.module, twin.call, twin.step):
            return OneSided(callee, rec.arg if rec.arg is not None else str(rec.index), side)
    return None


def _caller_passes(rows: Sequence[Row], i: int, callee: str) -> Fault | None:
    """Blame on `callee`'s caller when that call received a tensor argument on one side only: the code that differs
    is the caller's call or the callee's use of it; the widest of the two is named (the text names both)."""
    if not callee:
        return None
    extra = one_sided(rows, i, callee)
    if extra is None:
        return None
    caller = _ancestor(callee, 1)
    return Fault(Culprit.ARGUMENT, caller, argument=extra)


def blame(i: int, rows: Sequence[Row], inputs: Flow) -> Fault:
    """What is at fault for origin row i: the culprit, the reference module path whose code it is, the op's source
    line, that module's path on the other side where the verdict knows it, and the op where it is another record."""
    rec = rows[i].pair.ref.record
    if i in inputs.untwinned:
        producer = rows[inputs.untwinned[i]].pair.ref.record
        if producer.kind == Kind.OP:  # an op the other side does not run (a missing residual add)
            return Fault(Culprit.OP, producer.parent or "", producer.source, op=producer.type)
        return Fault(Culprit.MODULE, producer.module)
    if i in inputs.computed:
        if rec.kind == Kind.OP:
            return Fault(Culprit.OP, rec.parent or "", rec.source)
        if rec.parent is None:
            return Fault(Culprit.MODEL_INPUT, "")
        scope, there, _ = computing_scope(rows[i])
        op = _extra_op(rows, i)
        if op is not None:  # the other side computes it with an op this side does not run: that op is the code
            return Fault(Culprit.OP, scope, op.source, op.parent, op.type)
        return _caller_passes(rows, i, scope) or Fault(Culprit.PARENT_CODE, scope, rec.source, there)
    handed = _handed_other(i, rows, inputs)
    if handed is not None and rec.kind == Kind.OP:  # the op called on another op's output: its call is the code
        return Fault(Culprit.OP, rec.parent or "", rec.source)
    if handed is not None:
        return Fault(Culprit.WIRING if handed[3] else Culprit.PARENT_CODE, handed[0], blame_other=handed[1])
    if rec.kind == Kind.OP:
        return Fault(Culprit.OP, rec.parent or "", rec.source)
    if rec.kind == Kind.PROBE and rec.parent is None and _before_model(i, rows):
        return Fault(Culprit.MODEL_INPUT, rec.module)  # aligner.save("batch", x) before the model ran: the data
    if rec.kind == Kind.PARAM_GRAD:
        return Fault(Culprit.MODULE, rec.module.rpartition(".")[0])
    if rec.kind in _MODULE_RECORDS and rec.io == Io.OUTPUT:
        return _caller_passes(rows, i, rec.module) or Fault(Culprit.MODULE, rec.module)
    return Fault(Culprit.MODULE, rec.module)


def _before_model(i: int, rows: Sequence[Row]) -> bool:
    """Whether row i was recorded before any module of its step ran (a probe of the data: aligner.save("batch", x))."""
    step = rows[i].pair.ref.record.step
    return not any(r.pair.ref.record.kind == Kind.FORWARD and r.pair.ref.record.step == step for r in rows[:i])


def trace_origin(first: int, rows: Sequence[Row], inputs: dict[int, list[int]],
                 read: Callable[[int], object] | None = None) -> int:
    """Walk upstream from `first` while its inputs already carried a comparable, above-noise error (`read`: reads a
    row not evaluated yet, for bisect)."""
    cur, seen = first, {first}
    while True:
        if read is not None:
            for j in inputs.get(cur, []):
                read(j)
        ups = [j for j in inputs.get(cur, []) if _comparable(rows[j]) and j not in seen]
        if not ups:
            return cur
        j = max(ups, key=lambda k: error_level(rows[k]))
        e_in, e_cur = error_level(rows[j]), error_level(rows[cur])
        if e_in <= _floor(rows[j]) or e_cur > AMPLIFICATION * e_in:
            return cur
        cur = j
        seen.add(j)


def _previous(i: int, rows: Sequence[Row], phase: Phase) -> int | None:
    for j in range(i - 1, -1, -1):
        if phase_of(rows[j]) == phase and rows[j].metrics is not None:
            return j
    return None


def find(rows: Sequence[Row], inputs: Flow, phase: Phase, diverged: Sequence[int]) -> Divergence | None:
    """The first divergent row of a phase (`diverged`: the divergent rows, in order), traced back to where its error
    is introduced."""
    in_phase = [i for i in diverged if phase_of(rows[i]) == phase]
    if not in_phase:
        return None
    first = next((i for i in in_phase if evident(i, rows, inputs)), in_phase[0])
    origin = trace_origin(first, rows, inputs)
    return Divergence(phase, first, _previous(first, rows, phase), origin, classify(origin, rows, inputs)[1],
                      **blame(origin, rows, inputs)._asdict(), above_noise=rows[origin].above_noise)


def nan_origin(rows: Sequence[Row], inputs: dict[int, list[int]]) -> NanFinding | None:
    """The first row, on either side, with NaN/Inf in its output while its inputs were finite."""
    def bad(j: int, side: str) -> int:
        m = rows[j].metrics
        return 0 if m is None else (m.nan_a + m.inf_a if side == "a" else m.nan_b + m.inf_b)

    for i, row in enumerate(rows):
        m = row.metrics
        if m is None or not (m.nan_a or m.inf_a or m.nan_b or m.inf_b):  # finite on both sides
            continue
        if row.pair.ref.record.io in INPUTS and inputs.get(i):
            continue  # an input record with a producer repeats that producer's output
        for side in ("b", "a"):
            count = bad(i, side)
            if count and not any(bad(j, side) for j in inputs.get(i, [])):
                return NanFinding(i, side, count)
    return None


def call_outputs(rows: Sequence[Row]) -> dict[tuple[int, int], list[int]]:
    """(step, call id) -> the rows of that module call's outputs (a leaf's or a block's)."""
    made: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, row in enumerate(rows):
        rec = row.pair.ref.record
        if rec.kind in _MODULE_RECORDS and rec.io == Io.OUTPUT and rec.call is not None:
            made[(rec.step, rec.call)].append(k)
    return made


def immaterial(rows: Sequence[Row], candidates: Sequence[int],
               outputs: dict[tuple[int, int], list[int]] | None = None) -> set[int]:
    """The divergent call inputs among `candidates` whose call's outputs were all compared and all agree (a mask
    mindone builds [2, 1, 12, 13] where transformers builds [2, 1, 12, 12], a table in another form: no number the
    call computes changes), and containers' outputs that end at another point (`_boundary`): no divergence of what
    the model computes. The report lists them apart."""
    outputs = call_outputs(rows) if outputs is None else outputs
    out = set()
    for i in candidates:
        rec = rows[i].pair.ref.record
        made = outputs.get((rec.step, rec.call)) if rec.kind in _MODULE_RECORDS and rec.io == Io.INPUT and \
            rec.call is not None else None
        if made and all(rows[k].metrics is not None and not rows[k].diverged for k in made):
            out.add(i)
        elif _boundary(rows, i):
            out.add(i)
    return out


def _boundary(rows: Sequence[Row], i: int) -> bool:
    """Whether row i is a container's output whose shapes cannot be compared while everything recorded inside it
    agrees: the two zoos end the block at another point (timm merges a Swin stage's patches at its start, mindcv at
    its end), so its outputs are different tensors, not different numbers for one tensor."""
    row = rows[i]
    rec = row.pair.ref.record
    if row.metrics is None or row.metrics.method != "none" or rec.kind not in _MODULE_RECORDS or rec.io != Io.OUTPUT:
        return False
    inside = [r for r in rows if r.pair.ref.record.step == rec.step and r.metrics is not None and
              r.pair.ref.record.kind in _MODULE_RECORDS and r.pair.ref.record.module.startswith(rec.module + ".")]
    return bool(inside) and not any(r.diverged for r in inside)


def judge(rows: Sequence[Row]) -> Verdict:
    """All verdicts over fully evaluated rows."""
    inputs = dataflow(rows)
    diverged = [i for i, r in enumerate(rows) if r.diverged]
    harmless = immaterial(rows, diverged)
    diverged = [i for i in diverged if i not in harmless]
    if all(_reordered(rows[i]) for i in diverged):  # an order-only difference no computed number carries on
        diverged = []
    labels = {i: _classified(i, rows, inputs)[0] for i in diverged}
    findings = [f for f in (find(rows, inputs, p, diverged) for p in Phase) if f is not None]
    if len(findings) == 2:
        findings[1] = dataclasses.replace(findings[1], reason=words(Say.AFTER_FORWARD, reason=findings[1].reason))
    for f in findings:
        labels[f.origin] = Label.INTRODUCED
    return Verdict(tuple(findings), nan_origin(rows, inputs), labels, immaterial=tuple(sorted(harmless)))


def _evidence(row: Row) -> bool:
    """Whether agreement at this row says anything about the rows before it: a paired tensor, not a probe or a
    reduced scalar (a loss within tolerance does not prove every layer before it agrees)."""
    rec = row.pair.ref.record
    return row.pair.a is not None and row.pair.b is not None and rec.kind != Kind.PROBE and math.prod(rec.shape) > 1


def _search(cand: list[int], diverged: Callable[[int], bool]) -> int | None:
    """Position in `cand` of a divergent row at a boundary (the row before it matched), or None: binary search when
    the last row diverges; otherwise evenly spaced samples (about sqrt(n)) find a divergence that did not persist
    to the end (a GELU difference a later normalisation evens out), then binary search below that sample."""
    if not cand:
        return None
    lo, hi = 0, len(cand) - 1
    if not diverged(cand[hi]):
        step = max(1, math.isqrt(len(cand)))
        hit = next((k for k in range(0, len(cand) - 1, step) if diverged(cand[k])), None)
        if hit is None:
            return None
        lo, hi = max(0, hit - step + 1), hit
    while lo < hi:
        mid = (lo + hi) // 2
        if diverged(cand[mid]):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _earliest(cand: list[int], found: int, diverged: Callable[[int], bool]) -> int:
    """Move a bisect answer to an earlier divergence that did not last until it (an encoder that diverged while the
    first decoder records, which do not read it, still match): sample the rows before it (about sqrt(n), as
    `_search` does) until every sample matches."""
    while found > 0:
        earlier = _search(cand[:found], diverged)
        if earlier is None:
            return found
        found = earlier
    return found


def _evident_from(cand: list[int], found: int, rows: Sequence[Row], inputs: Flow, diverged: Callable[[int], bool],
                  evaluated: Callable[[int], Row]) -> int:
    """The first divergent row at or after position `found` that can start a divergence (`evident`: where shapes
    part, what follows tells where numbers do), reading forward; `found` itself when none does."""
    for k in range(found, len(cand)):
        i = cand[k]
        if diverged(i):
            for j in inputs.get(i, []):
                evaluated(j)
            if evident(i, rows, inputs):
                return k
    return found


def bisect(rows: list[Row], evaluate: Callable[[int], Row]) -> Verdict:
    """Find each phase's first divergent row reading O(log n + sqrt n) pairs, and say what the reads prove.

    `evaluate(i)` reads pair i and returns its Row (stored into `rows`). A matching record is evidence only for what
    it depends on, and an error may fall back under tolerance, so no record before an answer is assumed to match:
    the search finds a boundary; samples before it look for an earlier divergence that did not last; the answer's
    inputs are read along the data flow to where the error is introduced (an encoder's output read by a later
    decoder record); a tensor computed by code between calls may depend on anything before it, so the stretch before
    such an answer is read whole. Every BatchNorm buffer row is read (small, and a momentum bug shows nowhere else).
    The answer is the first divergence (`bisect_confirmed`) only when every record before it was read.
    """
    read: set[int] = set()
    made = call_outputs(rows)  # built once: `diverged` asks of every input it reads

    def evaluated(i: int) -> Row:
        if i not in read:
            rows[i] = evaluate(i)
            read.add(i)
        return rows[i]

    def diverged(i: int) -> bool:
        if not evaluated(i).diverged:
            return False
        rec = rows[i].pair.ref.record
        if rec.kind not in _MODULE_RECORDS or rec.io != Io.INPUT:
            return True
        for k in made.get((rec.step, rec.call or -1), []):  # an input whose call's outputs all agree: immaterial
            evaluated(k)
        return not immaterial(rows, [i], made)

    inputs = dataflow(rows)
    findings: list[Divergence] = []
    unread = 0
    for phase in Phase:
        cand = [i for i, r in enumerate(rows) if phase_of(r) == phase and _evidence(r)]
        found = _search(cand, diverged)
        buffers = [k for k, i in enumerate(cand) if rows[i].pair.ref.record.kind == Kind.BUFFER and diverged(i)]
        if buffers and (found is None or buffers[0] < found):
            found = buffers[0]
        if found is None:
            continue
        while True:
            found = _evident_from(cand, _earliest(cand, found, diverged), rows, inputs, diverged, evaluated)
            origin = trace_origin(cand[found], rows, inputs, diverged)
            if origin in inputs.computed or origin in inputs.untwinned or _handed_other(origin, rows, inputs):
                # a computed input may depend on anything before it: the whole stretch is read
                before = [k for k, i in enumerate(cand[:found]) if i < origin and diverged(i) and
                          _evident_from(cand, k, rows, inputs, diverged, evaluated) == k]
                if before:
                    found = before[0]
                    continue
            break
        first = cand[found]
        unread += sum(1 for i in cand if i < min(first, origin) and i not in read)
        findings.append(Divergence(phase, first, _previous(first, rows, phase), origin,
                                   classify(origin, rows, inputs)[1], **blame(origin, rows, inputs)._asdict(),
                                   above_noise=rows[origin].above_noise))
    if findings and all(_reordered(rows[f.first]) for f in findings):  # order-only so far: what follows decides
        for i in range(len(rows)):
            evaluated(i)
        return dataclasses.replace(judge(rows), bisect_reads=len(read), bisect_confirmed=True, bisect_unread=0)
    labels = {f.origin: Label.INTRODUCED for f in findings}
    return Verdict(tuple(findings), None, labels, bisect_reads=len(read),
                   bisect_confirmed=not unread if findings else None, bisect_unread=unread)
