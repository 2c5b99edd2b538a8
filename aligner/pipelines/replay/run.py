"""Replay: call every module of one side on the reference side's recorded inputs and compare with the reference's
recorded outputs. A module that still differs makes its own error; one that agrees only inherited its run's error.

`replay_dumps` works from two dump directories and the live model of the side to re-run; `replay` dumps two live
models into a temporary directory first; `assert_close` raises a torch.testing-style AssertionError for test suites.
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework, Reference, reference_index
from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.core.words import Text, Words, words
from aligner.dumping.context import dump
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import compile_pattern
from aligner.dumping.pair.matching import Pair
from aligner.dumping.pair.paired import read_pair
from aligner.dumping.read.source import Item, Source, TensorError, load_tensor
from aligner.dumping.signature import MalformedCallError, restore
from aligner.dumping.tensors import model_framework, tensors_in, to_host
from aligner.metrics.measure import Metrics, compare_arrays
from aligner.pipelines.compare.evaluate import evaluate
from aligner.pipelines.compare.verdict import Culprit, Phase, judge
from aligner.pipelines.replay.result import ReplayResult, ReplayRow, ReplayVerdict
from aligner.pipelines.replay.runner import Runner, put_back, runner
from aligner.pipelines.replay.says import Say


@dataclasses.dataclass
class _Call:
    """One module call on one side: its records grouped."""

    module: str
    type: str
    step: int
    call: int
    signature: Any = None                                   # the call record (None: not recorded)
    inputs: dict[int, Item] = dataclasses.field(default_factory=dict)
    outputs: dict[int, Item] = dataclasses.field(default_factory=dict)
    buffers: dict[str, Item] = dataclasses.field(default_factory=dict)   # after a training-mode call, torch names


def _calls(source: Source) -> dict[tuple[int, int], _Call]:
    """The module calls of one side, in execution order, keyed by (step, call id)."""
    out: dict[tuple[int, int], _Call] = {}
    for item in source.items:
        rec = item.record
        if rec.kind not in (Kind.FORWARD, Kind.BUFFER) or rec.call is None:
            continue
        call = out.setdefault((rec.step, rec.call), _Call(rec.module, rec.type, rec.step, rec.call,
                                                           source.calls.get((rec.step, rec.call))))
        if rec.kind == Kind.BUFFER:
            call.buffers[rec.io] = item
        else:
            (call.inputs if rec.io == Io.INPUT else call.outputs)[rec.index] = item
    return out


def _backward(source: Source) -> dict[tuple[int, str], dict[str, dict[int, Item]]]:
    """Backward records by (step, module) -> io -> index."""
    out: dict[tuple[int, str], dict[str, dict[int, Item]]] = collections.defaultdict(
        lambda: collections.defaultdict(dict))
    for item in source.items:
        rec = item.record
        if rec.kind == Kind.BACKWARD:
            out[(rec.step, rec.module)][rec.io].setdefault(rec.index, item)
    return out


def _check_inputs(source: Source) -> None:
    """Refuse a reference dump that cannot feed a replay, saying which dump call records what it needs."""
    if source.mode == "stats":
        raise AlignerError(f"{source.root} is a statistics-only dump: a replay feeds modules the reference's tensors; "
                           "record it with aligner.dump(model, dir) without stats_only=True")
    if not any(it.record.kind == Kind.FORWARD and it.record.io == Io.INPUT and it.record.call is not None
               for it in source.items):
        raise AlignerError(f"{source.root} holds no module inputs: a replay feeds each module the reference's "
                           "inputs; record it with aligner.dump(model, dir, inputs=True) (the default records them "
                           "too; inputs=False leaves them out)")


def _nearest(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f" (nearest: {', '.join(repr(c) for c in close)})" if close else ""


def _check_model(model_modules: dict[str, Any], paths: Iterable[str], params: Sequence[str], model_params: set[str],
                 root: Path) -> None:
    """The model to re-run must be the model the dump recorded: every recorded module path and parameter name."""
    for path in paths:
        if path not in model_modules:
            raise AlignerError(f"the model to re-run has no module {path!r}, which {root} records"
                               f"{_nearest(path, model_modules)}: build the model that was dumped")
    for name in params:
        if name not in model_params:
            raise AlignerError(f"the model to re-run has no parameter {name!r}, which {root} records"
                               f"{_nearest(name, model_params)}: build the model that was dumped")


def _array(item: Item | None) -> np.ndarray | None:
    if item is None:
        return None
    try:
        return load_tensor(item)
    except (TensorError, OSError):
        return None


def _arrays(items: Mapping[Any, Item]) -> dict[Any, np.ndarray | None]:
    return {k: _array(it) for k, it in items.items()}


def _worst(metrics: Iterable[Metrics | None]) -> Metrics | None:
    """The metrics with the largest error against what its tolerance allows (a divergence first)."""
    scored = [(m.diverged, (m.max_abs_err or 0.0) / max(m.atol + m.rtol, 1e-30), i, m)
              for i, m in enumerate(metrics) if m is not None]
    return max(scored)[3] if scored else None


def _compare(a: Mapping[Any, np.ndarray | None], b: Mapping[Any, np.ndarray | None], tol: Tolerance
             ) -> Metrics | None:
    return _worst(compare_arrays(a[i], b[i], tol) for i in sorted(a.keys() & b.keys())
                  if a[i] is not None and b[i] is not None)


def _tolerance(spec: ToleranceSpec, module: str, items: Iterable[Item]) -> Tolerance:
    dtypes = [it.record.dtype for it in items if it.record.dtype]
    return spec.resolve(module, *dtypes)


def _pair_inputs(ref: _Call, other: _Call) -> dict[int, int] | Words:
    """The other side's input index -> the reference's input index, or why they cannot be paired."""
    if len(ref.inputs) == len(other.inputs):
        return {j: i for j, i in zip(sorted(other.inputs), sorted(ref.inputs))}
    by_shape = {}
    for j, item in other.inputs.items():
        same = [i for i, r in ref.inputs.items() if r.record.shape == item.record.shape]
        if len(same) != 1:
            break
        by_shape[j] = same[0]
    else:
        return by_shape
    return words(Say.UNPAIRED_INPUTS, reference=len(ref.inputs), other=len(other.inputs))


class _Damaged(str):
    """Why a call was not replayed, when the reason is a damaged dump (unreadable tensor, malformed signature)."""


def _damaged(why: Text) -> bool:
    """Whether the reason a call was not replayed is a damaged dump (not the replay's own limits)."""
    return isinstance(why, _Damaged) or (isinstance(why, Words) and why.code is Say.INPUT_UNREADABLE)


def _arguments(run: Runner, ref: _Call, other: _Call, ref_inputs: dict[int, np.ndarray | None]
               ) -> tuple[list[Any], dict[str, Any]] | Text:
    """The other side's call, with its own signature and the reference's input tensors (or why not: `_damaged`
    when the dump is at fault)."""
    pairing = _pair_inputs(ref, other)
    if isinstance(pairing, Words):
        return pairing
    tensors = []
    for j in range(len(other.inputs)):
        if j not in pairing or ref_inputs.get(pairing[j]) is None:
            return words(Say.INPUT_UNREADABLE, index=pairing.get(j, j))
        dtype = other.inputs[j].record.dtype if j in other.inputs else ref.inputs[pairing[j]].record.dtype
        tensors.append(run.tensor(ref_inputs[pairing[j]], dtype))  # type: ignore[arg-type]
    if other.signature is None or other.signature.args is None:
        return tensors, {}  # no call record (an older dump): positional, in order
    try:
        return restore(other.signature.args, tensors, run.dtype)
    except MalformedCallError as exc:
        return _Damaged(str(exc))
    except AlignerError as exc:  # a value the dump kept only as its repr: not replayable, by design
        return str(exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def replay_dumps(dumps_a: str | Path, dumps_b: str | Path, model: Any, *, ref: str | None = None,
                 modules: str | None = None, backward: bool = False, map_file: str | None = None,
                 tolerance: ToleranceSpec | None = None, label: str | None = None,
                 step: int | None = None) -> ReplayResult:
    """Re-run each module of `model` (the live model of the non-reference side) on the reference dump's recorded
    inputs and compare with the reference's recorded outputs (and, with `backward`, its recorded gradients).

    One step is replayed (`step`, default the first the reference dump holds): `model` must hold the weights that
    step started from. Each module runs in the training/eval mode its own side recorded. `modules` is a regex
    searched in either side's module paths. Raises AlignerError when the dumps cannot feed a replay or the model is
    not the one the other dump recorded."""
    pattern = compile_pattern(modules, "modules")
    paired = read_pair(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance)
    reference, other, pairs, tolerance = paired.reference, paired.migrated, paired.pairs, paired.tolerance
    framework = model_framework(model)
    if framework != other.framework:
        raise AlignerError(f"the model to re-run is a {framework.value} model, but the side to re-run "
                           f"({other.root}) was dumped by {other.framework}; the reference is {reference.root} "
                           f"({reference.framework})")
    _check_inputs(reference)
    ref_calls, other_calls = _calls(reference), _calls(other)
    steps = sorted({c.step for c in ref_calls.values()})
    if step is None:
        step = steps[0] if steps else 0
    elif step not in steps:
        raise AlignerError(f"step {step} is not in {reference.root} (its steps: {', '.join(map(str, steps))})")
    ref_calls = {k: c for k, c in ref_calls.items() if c.step == step}
    twins: dict[tuple[int, int], tuple[int, int]] = {}
    for p in pairs:
        if p.a is not None and p.b is not None and p.b.record.kind == Kind.FORWARD and p.b.record.io == Io.OUTPUT \
                and p.a.record.call is not None and p.b.record.call is not None:
            twins.setdefault((p.b.record.step, p.b.record.call), (p.a.record.step, p.a.record.call))
    run = runner(other.framework)
    model_modules = run.modules(model)
    _check_model(model_modules, (other_calls[k].module for k in twins.values() if k in other_calls),
                 sorted({name for _, name in other.params}), _state_names(model, framework), other.root)
    modes = {(c.step, c.module): c.signature.attrs["training"] for c in other_calls.values()
             if c.signature is not None and c.signature.attrs
             and isinstance(c.signature.attrs.get("training"), bool)}  # anything else: as the module is
    rows = []
    saved = run.state(model)  # a training-mode replay moves running statistics: the model is left as it was found
    try:
        for key, ref_call in ref_calls.items():
            if key not in twins or twins[key] not in other_calls:
                continue
            other_call = other_calls[twins[key]]
            if pattern is not None and not (pattern.search(ref_call.module) or pattern.search(other_call.module)):
                continue
            rows.append(_forward_row(run, model_modules[other_call.module], ref_call, other_call, tolerance,
                                     modes.get((other_call.step, other_call.module))))
            put_back(run, saved)
        if backward:
            rows += _backward_rows(run, model_modules, reference, other, ref_calls, other_calls, twins, pattern,
                                   tolerance, modes)
    finally:
        put_back(run, saved)
    if pattern is not None and not rows:
        paths = sorted({c.module for c in ref_calls.values()} | {c.module for c in other_calls.values()})
        raise AlignerError(f"no recorded module call matches modules={modules!r}{_nearest(modules or '', paths)}")
    result = ReplayResult(f"{reference.root} ({reference.framework})",
                          label or f"{other.root} ({other.framework}), re-run live", rows, tolerance, step, steps,
                          reference.problems + other.problems)
    if result.verdict is ReplayVerdict.PARENT_CODE and result.parent_code is not None:
        scope = _computing_scope(pairs, tolerance, rows)
        result = dataclasses.replace(result, scope=scope)
    return result


def _computing_scope(pairs: Sequence[Pair], tolerance: ToleranceSpec, rows: Sequence[ReplayRow]) -> str | None:
    """The module whose code computed the input that first differs, from compare's verdict over the pairs already
    read (it reads where each side computed each tensor, the block records and the call arguments): its blame when it
    blames code rather than a module's own computation, or a module no replayed call is (a block whose own code, a
    missing residual at its tail, is what differs); None where it blames a replayed call (the first differing call's
    parent stands)."""
    verdict = judge([evaluate(p, tolerance) for p in pairs])
    found = [f for f in verdict.findings if f.phase is Phase.FORWARD]
    if not found:
        return None
    f = found[0]
    if f.culprit is not Culprit.MODULE or f.blame and f.blame not in {r.module for r in rows}:
        return f.blame
    return None


def _state_names(model: Any, framework: Framework) -> set[str]:
    if framework == Framework.PYTORCH:
        return set(model.state_dict().keys())
    return {name for name, _ in model.parameters_and_names()}


def _forward_row(run: Runner, module: Any, ref: _Call, other: _Call, spec: ToleranceSpec,
                 training: bool | None) -> ReplayRow:
    """Replay one call on the reference's inputs, in the mode its own side recorded (`training`, None: as the
    module is); its inherited and total errors from the two dumps."""
    row = ReplayRow(ref.module, other.module, ref.type, other.type, ref.step, ref.call,
                    parent=ref.signature.parent if ref.signature is not None else None)
    row.tolerance = tol = _tolerance(spec, ref.module, [*ref.outputs.values(), *other.outputs.values()])
    ref_in = {i: _array(it) for i, it in ref.inputs.items()}
    ref_out = {i: _array(it) for i, it in ref.outputs.items()}
    pairing = _pair_inputs(ref, other)
    if not isinstance(pairing, Words):
        own_in = {pairing[j]: _array(it) for j, it in other.inputs.items() if j in pairing}
        row.inherited = _compare(own_in, ref_in, tol)
    row.total = _worst([_compare({i: _array(it) for i, it in other.outputs.items()}, ref_out, tol),
                        _compare(_arrays(other.buffers), _arrays(ref.buffers), tol)])
    call = _arguments(run, ref, other, ref_in)
    if isinstance(call, (str, Words)):
        row.reason, row.damaged = call, _damaged(call)
        return row
    previous = run.set_training(module, training) if training is not None else None
    try:
        outputs = run.forward(module, *call)
        # a training-mode call also moves running statistics (BatchNorm momentum shows only there)
        after = {name: to_host(t) for name, t in run.buffers(module).items()} if ref.buffers else {}
    except Exception as exc:  # the user's module may fail any way on these inputs: the row says how
        row.reason = words(Say.FORWARD_RAISED, error=_one_line(exc))
        return row
    finally:
        if previous is not None:
            run.set_training(module, previous)
    row.local = _worst([_compare(dict(enumerate(outputs)), ref_out, tol),
                        _compare(after, _arrays(ref.buffers), tol)])
    if row.local is None:
        row.damaged = any(it.error for it in ref.outputs.values())
        row.reason = words(Say.OUTPUT_UNREADABLE if row.damaged else Say.NO_OUTPUT_PAIRS)
    return row


def _backward_rows(run: Runner, model_modules: dict[str, Any], reference: Source, other: Source,
                   ref_calls: dict[tuple[int, int], _Call], other_calls: dict[tuple[int, int], _Call],
                   twins: dict[tuple[int, int], tuple[int, int]], pattern: re.Pattern[str] | None,
                   spec: ToleranceSpec, modes: dict[tuple[int, str], bool]) -> list[ReplayRow]:
    """Replay each module's backward: the reference's grad_outputs pulled back through the module on the reference's
    inputs, compared with the reference's grad_inputs. Only modules called once per step (backward records carry
    no call id to tell several calls apart)."""
    ref_grads, other_grads = _backward(reference), _backward(other)
    per_module = collections.Counter((c.step, c.module) for c in ref_calls.values())
    rows = []
    for key, ref_call in reversed(list(ref_calls.items())):  # backward runs in reverse order
        if key not in twins or twins[key] not in other_calls:
            continue
        other_call = other_calls[twins[key]]
        if pattern is not None and not (pattern.search(ref_call.module) or pattern.search(other_call.module)):
            continue
        grads = ref_grads.get((ref_call.step, ref_call.module))
        if not grads or not grads.get(Io.GRAD_INPUT):
            continue
        row = ReplayRow(ref_call.module, other_call.module, ref_call.type, other_call.type, ref_call.step,
                        ref_call.call, phase="backward")
        rows.append(row)
        if per_module[(ref_call.step, ref_call.module)] > 1:
            row.reason = words(Say.CALLED_TWICE)
            continue
        row.tolerance = tol = _tolerance(spec, ref_call.module, grads[Io.GRAD_INPUT].values())
        own = other_grads.get((other_call.step, other_call.module), {})
        g_out = {i: _array(it) for i, it in grads.get(Io.GRAD_OUTPUT, {}).items()}
        g_in = {i: _array(it) for i, it in grads[Io.GRAD_INPUT].items()}
        row.inherited = _compare({i: _array(it) for i, it in own.get(Io.GRAD_OUTPUT, {}).items()}, g_out, tol)
        row.total = _compare({i: _array(it) for i, it in own.get(Io.GRAD_INPUT, {}).items()}, g_in, tol)
        call = _arguments(run, ref_call, other_call, {i: _array(it) for i, it in ref_call.inputs.items()})
        if isinstance(call, (str, Words)):
            row.reason, row.damaged = call, _damaged(call)
            continue
        module = model_modules[other_call.module]
        training = modes.get((other_call.step, other_call.module))
        previous = run.set_training(module, training) if training is not None else None
        try:
            got = run.backward(module, *call, list(g_in), [g_out.get(i) for i in range(max(g_out, default=-1) + 1)])
        except Exception as exc:  # as in forward: the row says how it failed
            row.reason = words(Say.BACKWARD_RAISED, error=_one_line(exc))
            continue
        finally:
            if previous is not None:
                run.set_training(module, previous)
        row.local = _compare(got, g_in, tol)
        if row.local is None:
            row.reason = words(Say.NO_GRADIENT_PAIRS)
    return rows


# -- live models ------------------------------------------------------------------------------------------------------

def _as_arrays(inputs: Any) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """(positional, keyword) host arrays from a tensor/array, a tuple/list of them, or a dict of keyword ones."""
    def host(value: Any) -> np.ndarray:
        return value if isinstance(value, np.ndarray) else to_host(value)

    if isinstance(inputs, dict):
        return [], {str(k): host(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return [host(v) for v in inputs], {}
    return [host(inputs)], {}


def _run_live(model: Any, directory: Path, args: list[np.ndarray], kwargs: dict[str, np.ndarray],
              backward: bool) -> None:
    """One forward (and backward of the sum of the outputs) of `model` under a dump; running statistics are put
    back afterwards, so the replay starts where the recorded step started and the model is left as found."""
    framework = model_framework(model)
    run = runner(framework)
    saved = run.state(model)
    # torch accumulates into .grad: the user's gradients are put back as they were (MindSpore returns its own)
    grads = [(p, p.grad) for p in model.parameters()] if framework == Framework.PYTORCH and backward else []
    for p, _ in grads:
        p.grad = None
    try:
        _forward_live(model, framework, run, directory, args, kwargs, backward)
    finally:
        put_back(run, saved)
        for p, grad in grads:
            p.grad = grad


def _forward_live(model: Any, framework: Framework, run: Runner, directory: Path, args: list[np.ndarray],
                  kwargs: dict[str, np.ndarray], backward: bool) -> None:
    targs = [run.tensor(a, str(a.dtype)) for a in args]
    tkwargs = {k: run.tensor(v, str(v.dtype)) for k, v in kwargs.items()}
    with dump(model, directory, backward=backward):
        if framework == Framework.PYTORCH:
            import torch

            with torch.set_grad_enabled(backward):
                out = model(*targs, **tkwargs)
                if backward:
                    sum(o.float().sum() for o in tensors_in(out) if o.is_floating_point()).backward()
        elif backward:
            import mindspore as ms

            def loss(*xs: Any) -> Any:
                return sum(o.astype(ms.float32).sum() for o in tensors_in(model(*xs, **tkwargs))
                           if o.is_floating_point())

            ms.value_and_grad(loss, None, model.trainable_params())(*targs)
        else:
            model(*targs, **tkwargs)


def replay(model_a: Any, model_b: Any, inputs: Any, *, modules: str | None = None, backward: bool = False,
           ref: str | None = None, tolerance: ToleranceSpec | None = None) -> ReplayResult:
    """Run both live models once on `inputs` (a tensor or array, a tuple of them, or a dict of keyword ones), then
    replay every module of the non-reference side (MindSpore unless `ref` says otherwise) on the reference's inputs.

    With `backward`, both sides also pull the gradient of the sum of their outputs back, and each module's backward
    is replayed on the reference's grad_outputs."""
    args, kwargs = _as_arrays(inputs)
    frameworks = (model_framework(model_a), model_framework(model_b))
    r = reference_index(ref, frameworks)
    with tempfile.TemporaryDirectory(prefix="aligner-replay-") as tmp:
        dirs = (Path(tmp) / "a", Path(tmp) / "b")
        for model, directory in zip((model_a, model_b), dirs):
            _run_live(model, directory, args, kwargs, backward)
        result = replay_dumps(dirs[0], dirs[1], (model_a, model_b)[1 - r], ref=(Reference.FIRST, Reference.SECOND)[r],
                              modules=modules, backward=backward, tolerance=tolerance)
    names = [f"{type(m).__name__} ({fw.value})" for m, fw in zip((model_a, model_b), frameworks)]
    return dataclasses.replace(result, reference=names[r], replayed=f"{names[1 - r]}, re-run live")
