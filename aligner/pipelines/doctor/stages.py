"""The doctor's stages, each a thin call of the library function that does that step by hand; each returns its
status and its frozen outcome, or raises AlignerError (bad input: the run stops at this stage)."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Framework
from aligner.core.progress import SILENT, Progress
from aligner.core.tolerance import Tolerance
from aligner.dumping.context import dump, save
from aligner.dumping.determinism import check_determinism
from aligner.dumping.randomness import disable_dropout, pinned
from aligner.dumping.tensors import tensors_in, to_host
from aligner.io.base import TensorInfo
from aligner.io.formats import open_checkpoint, write_checkpoint
from aligner.pipelines.audit import audit
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.run import compare
from aligner.pipelines.compare.verdict import Culprit
from aligner.pipelines.convert.checkpoint import convert
from aligner.pipelines.diff import MIN_STEPS, explain_updates
from aligner.pipelines.doctor.result import (
    DeterminismOutcome,
    ForwardOutcome,
    Outcome,
    ReproOutcome,
    SkipReason,
    Stage,
    Status,
    TrainOutcome,
    WeightsOutcome,
)
from aligner.pipelines.doctor.sides import Side, run_model, tensors
from aligner.pipelines.replay.run import replay_dumps
from aligner.pipelines.repro.run import repro

Inputs = tuple[list[np.ndarray], dict[str, np.ndarray]]
# compare's verdict is already the answer: nothing to zoom into
NO_ZOOM = (Culprit.MODEL_INPUT, Culprit.WIRING, Culprit.ARGUMENT)


class SkipStage(Exception):  # noqa: N818 (not an error: a stage with nothing to do)
    """A stage that finds it has nothing to do (not an error): the reason, as data."""

    def __init__(self, reason: SkipReason, outcome: Outcome | None = None) -> None:
        super().__init__(reason.value)
        self.reason, self.outcome = reason, outcome


@dataclasses.dataclass
class Context:
    """What the stages share: the two live sides, the inputs, the folder, the options, earlier stages' outcomes."""

    sides: tuple[Side, Side]                  # (torch, MindSpore)
    inputs: Inputs | None
    out: Path
    weights: str | None = None
    map_path: str | None = None
    steps: int | None = None
    seed: int = 0
    progress: Progress = SILENT
    outcomes: dict[Stage, Outcome] = dataclasses.field(default_factory=dict)
    statuses: dict[Stage, Status] = dataclasses.field(default_factory=dict)
    dropout: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    def folder(self, name: str) -> Path:
        path = self.out / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def need_inputs(self) -> Inputs:
        if self.inputs is None:
            raise AlignerError("needs example inputs: give --input-shape or --input FILE.npz (example_inputs=)")
        return self.inputs


# -- weights on disk and back ---------------------------------------------------------------------------------------

def _state(side: Side) -> dict[str, Any]:
    """The model's tensors by checkpoint name (torch state_dict; MindSpore parameter names, as its .ckpt has them)."""
    if side.framework is Framework.PYTORCH:
        return dict(side.model.state_dict())
    return {p.name: p for p in side.model.get_parameters()}


def _save(side: Side, path: Path) -> Path:
    """The model's weights as a checkpoint of its own framework (written atomically)."""
    arrays = {name: to_host(t) for name, t in _state(side).items()}
    infos = {name: TensorInfo(tuple(a.shape), a.dtype.name) for name, a in arrays.items()}
    fmt = "pytorch" if side.framework is Framework.PYTORCH else "mindspore"
    write_checkpoint(str(path), fmt, iter(arrays.items()), infos, side.framework.value)
    return path


def _load(side: Side, path: str) -> None:
    """Every tensor of the model set from a checkpoint in its own names (read through the hardened readers)."""
    state = _state(side)
    with open_checkpoint(path) as source:
        missing = sorted(set(state) - set(source.names))
        if missing:
            raise AlignerError(f"{path} has no {missing[0]!r} (and {len(missing) - 1} more of the "
                               f"{side.framework.value} model's {len(state)} tensors)" if len(missing) > 1 else
                               f"{path} has no {missing[0]!r} of the {side.framework.value} model")
        arrays = {name: np.asarray(source.get(name)) for name in state}
    for name, target in state.items():
        array = arrays[name]
        if tuple(array.shape) != tuple(target.shape):
            raise AlignerError(f"{path}: {name} has shape {list(array.shape)}, the {side.framework.value} model's "
                               f"{list(target.shape)}")
        if side.framework is Framework.PYTORCH:
            import torch

            with torch.no_grad():
                target.copy_(torch.from_numpy(np.ascontiguousarray(array)).to(target.dtype))
        else:
            import mindspore as ms

            target.set_data(ms.Tensor(np.ascontiguousarray(array), dtype=target.dtype))


def _snapshot(side: Side) -> tuple[dict[str, np.ndarray], bool]:
    """The model's tensors and training flag, to put back after a stage that runs it."""
    training = side.model.training if side.framework is Framework.PYTORCH else bool(side.model.training)
    return {name: to_host(t) for name, t in _state(side).items()}, training


def _put_back(side: Side, saved: tuple[dict[str, np.ndarray], bool]) -> None:
    arrays, training = saved
    for name, target in _state(side).items():
        if side.framework is Framework.PYTORCH:
            import torch

            with torch.no_grad():
                target.copy_(torch.from_numpy(arrays[name]))
        else:
            import mindspore as ms

            target.set_data(ms.Tensor(arrays[name], dtype=target.dtype))
    if side.framework is Framework.PYTORCH:
        side.model.train(training)
    else:
        side.model.set_train(training)


def _elements(side: Side) -> tuple[int, int]:
    """(elements, tensors) in the model's checkpoint (torch's num_batches_tracked counters aside: no MindSpore
    twin)."""
    state = {n: t for n, t in _state(side).items() if not n.endswith("num_batches_tracked")}
    if side.framework is Framework.PYTORCH:  # a tied weight is one tensor under several names (MindSpore: one name)
        state = {(t.data_ptr(), tuple(t.shape)): t for t in state.values()}  # type: ignore[misc]
    return sum(int(np.prod(t.shape)) for t in state.values()), len(state)


# -- the stages -----------------------------------------------------------------------------------------------------

def run_audit(ctx: Context) -> tuple[Status, Outcome]:
    """`align audit`: layer settings, init laws, optimizers and schedules, on the freshly built models."""
    pt, ms = ctx.sides
    example: Any = None
    if ctx.inputs is not None:
        example = ctx.inputs[1] or ctx.inputs[0]
    report = audit(pt.model, ms.model, example_inputs=example, optimizers=(pt.optimizer, ms.optimizer),
                   schedulers=(pt.scheduler, ms.scheduler))
    return (Status.PASSED if report.exit_code is ExitCode.OK else Status.FAILED), report


def run_weights(ctx: Context) -> tuple[Status, Outcome]:
    """`align convert TORCH -o CONVERTED --like MS_INIT`, then the converted weights loaded into the MindSpore model."""
    pt, ms = ctx.sides
    folder = ctx.folder("weights")
    if ctx.weights is not None:
        _load(pt, ctx.weights)
    (n_pt, k_pt), (n_ms, k_ms) = _elements(pt), _elements(ms)
    if n_pt != n_ms:
        raise AlignerError(f"the models' parameter counts differ: torch {n_pt:,} elements in {k_pt} tensors, "
                           f"MindSpore {n_ms:,} in {k_ms}: not the same architecture (check the two constructors' "
                           "configurations)")
    torch_weights = Path(ctx.weights) if ctx.weights is not None else _save(pt, folder / "torch.pth")
    ms_init = _save(ms, folder / "mindspore_init.ckpt")
    converted = folder / "converted.ckpt"
    result = convert(str(torch_weights), str(converted), like_path=str(ms_init), map_path=ctx.map_path,
                     progress=ctx.progress)
    if not result.written:
        bad = result.failures
        names = ", ".join(f"{e.target or e.sources[0]} ({e.status})" for e in bad[:4])
        raise AlignerError(f"the torch weights do not fill the MindSpore model: {len(bad)} keys left unfilled or "
                           f"mismatched: {names}{', ...' if len(bad) > 4 else ''} (give --map FILE for renames "
                           "convert cannot infer)")
    _load(ms, str(converted))
    return Status.PASSED, WeightsOutcome(result, torch_weights, ms_init, converted)


def _dropout_off(ctx: Context) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every dropout of both models off (functional dropout too) for the rest of the run."""
    off = [ctx.dropout.enter_context(disable_dropout(side.model)) for side in ctx.sides]
    return tuple(off[0]), tuple(off[1])


def _determinism(side: Side, inputs: Inputs) -> Any:
    """Two runs' outputs compared bitwise; only when they differ, two more with every module's output recorded (in
    memory, the costly part: 4x the time on ResNet-50) to say where it starts. The model is left as it was."""
    saved = _snapshot(side)
    try:
        report = check_determinism(functools.partial(run_model, side, inputs))
        if not report.deterministic:
            _put_back(side, saved)
            report = check_determinism(functools.partial(run_model, side, inputs), model=side.model)
    finally:
        _put_back(side, saved)
    return report


def run_determinism(ctx: Context) -> tuple[Status, Outcome]:
    """Randomness was pinned before the models were built; dropout off; each side run twice: bitwise identical?"""
    inputs = ctx.need_inputs()
    off = _dropout_off(ctx)
    reports = tuple(_determinism(side, inputs) for side in ctx.sides)
    outcome = DeterminismOutcome(ctx.seed, pinned() or {}, off, (reports[0], reports[1]))
    return (Status.PASSED if outcome.deterministic else Status.FAILED), outcome


def _dump(side: Side, directory: Path, inputs: Inputs, progress: Progress, **options: Any) -> Path:
    saved = _snapshot(side)
    try:
        with dump(side.model, directory, progress=progress, **options):
            run_model(side, inputs)
    finally:
        _put_back(side, saved)
    return directory


def _zoom_scopes(result: CompareResult) -> tuple[str, str]:
    """(torch, MindSpore) module whose forward the zoom-in records ops of: the scopes align compare's zoom-in prints
    (compare(MindSpore, torch): the migrated side is MindSpore's)."""
    ms_scope, torch_scope = result.zoom_scopes(result.verdict.findings[0])
    return torch_scope, ms_scope


def _subtree(scopes: tuple[str, str]) -> str | None:
    """The regex replay's `modules` takes for the blamed scope and everything inside it, on either side (None: the
    whole model, when the model's own forward is blamed). Replaying only there keeps a ResNet-50 replay to seconds."""
    if not all(scopes):
        return None
    return "^(?:" + "|".join(re.escape(p) for p in sorted(set(scopes))) + r")(?:\.|$)"


def run_forward(ctx: Context) -> tuple[Status, Outcome]:
    """Dump both forwards, compare (torch the reference); when they part, zoom in on the blamed scope with an
    op-level dump and replay the MindSpore modules on torch's recorded inputs (own error vs inherited)."""
    inputs = ctx.need_inputs()
    pt, ms = ctx.sides
    folder = ctx.folder("forward")
    dumps = (folder / "pytorch", folder / "mindspore")
    for side, directory in zip(ctx.sides, dumps):
        _dump(side, directory, inputs, ctx.progress, params=True)
    result = compare(str(dumps[1]), str(dumps[0]), map_file=ctx.map_path, progress=ctx.progress)
    if result.exit_code is ExitCode.USAGE:
        raise AlignerError(f"compare could not read every record of {folder}: {'; '.join(result.problems[:2])}")
    if result.passed:
        return Status.PASSED, ForwardOutcome(dumps, result)
    outcome = ForwardOutcome(dumps, result)
    findings = result.verdict.findings
    if findings and findings[0].culprit not in NO_ZOOM:
        scopes = _zoom_scopes(result)
        zoom_dumps = (folder / "zoom_pytorch", folder / "zoom_mindspore")
        try:
            for side, directory, scope in zip(ctx.sides, zoom_dumps, scopes):
                _dump(side, directory, inputs, ctx.progress, ops=True, scope=scope or None)
            zoom = compare(str(zoom_dumps[1]), str(zoom_dumps[0]), map_file=ctx.map_path, progress=ctx.progress)
            outcome = dataclasses.replace(outcome, zoom_dumps=zoom_dumps, zoom_scopes=scopes, zoom=zoom)
        except AlignerError as exc:  # e.g. a @jit construct: the module-level verdict stands; say why no zoom-in
            outcome = dataclasses.replace(outcome, zoom_scopes=scopes, zoom_error=str(exc))
    if findings:
        modules = _subtree(_zoom_scopes(result))
        outcome = dataclasses.replace(outcome, replay_modules=modules)
        try:
            outcome = dataclasses.replace(outcome, replay=replay_dumps(dumps[1], dumps[0], ms.model, modules=modules))
        except AlignerError as exc:
            outcome = dataclasses.replace(outcome, replay_error=str(exc))
    return Status.FAILED, outcome


def _default_loss(framework: Framework) -> Callable[[Any], Any]:
    """Without a loss_fn: the mean square of every float output, summed (its gradient depends on the weights, so the
    update rule can be fitted)."""
    if framework is Framework.PYTORCH:
        def loss_pt(out: Any) -> Any:
            return sum((o.float() ** 2).mean() for o in tensors_in(out) if o.is_floating_point())
        return loss_pt

    def loss_ms(out: Any) -> Any:
        import mindspore as ms

        return sum((o.astype(ms.float32) ** 2).mean() for o in tensors_in(out) if o.is_floating_point())
    return loss_ms


def _user(side: Side, what: str, fn: Callable[[], Any]) -> Any:
    """Run the user's model, loss or optimizer: an exception is one line naming the side and what was running."""
    try:
        return fn()
    except AlignerError:
        raise
    except Exception as exc:
        raise AlignerError(f"the {side.framework.value} {what} raised {type(exc).__name__}: {exc}") from None


def _train_torch(side: Side, directory: Path, inputs: Inputs, steps: int) -> list[float]:
    args, kwargs = tensors(side.framework, inputs)
    loss_fn = side.loss_fn or _default_loss(side.framework)
    side.model.train()
    losses = []
    for step in range(1, steps + 1):
        side.optimizer.zero_grad(set_to_none=True)
        with dump(side.model, directory, step=step, params=True):
            loss = _user(side, "model and loss", lambda: loss_fn(side.model(*args, **kwargs)))
            save("loss", loss)
            _user(side, "backward", loss.backward)
        _user(side, "optimizer", side.optimizer.step)
        if side.scheduler is not None:
            _user(side, "scheduler", side.scheduler.step)
        losses.append(float(loss.detach()))
    return losses


def _train_mindspore(side: Side, directory: Path, inputs: Inputs, steps: int) -> list[float]:
    import mindspore as ms

    args, kwargs = tensors(side.framework, inputs)
    loss_fn = side.loss_fn or _default_loss(side.framework)
    side.model.set_train(True)

    def forward(*xs: Any) -> Any:
        return loss_fn(side.model(*xs, **kwargs))

    grad_fn = ms.value_and_grad(forward, None, side.optimizer.parameters)
    losses = []
    for step in range(1, steps + 1):
        with dump(side.model, directory, step=step, params=True):
            loss, grads = _user(side, "model and loss", lambda: grad_fn(*args))
            save("loss", loss)
        _user(side, "optimizer", functools.partial(side.optimizer, grads))
        if side.scheduler is not None:
            _user(side, "scheduler", side.scheduler.step)
        losses.append(float(loss.asnumpy()))
    return losses


def run_train(ctx: Context) -> tuple[Status, Outcome]:
    """N steps on both sides from the same weights and batch: losses, gradients and weights compared, and the
    optimizer's update rule fitted on each side (`align diff --grads`)."""
    pt, ms = ctx.sides
    if pt.optimizer is None or ms.optimizer is None:
        raise SkipStage(SkipReason.NO_OPTIMIZER)
    if ctx.steps == 0:
        raise SkipStage(SkipReason.NO_STEPS)
    if ctx.statuses.get(Stage.FORWARD) is Status.FAILED:
        raise SkipStage(SkipReason.FORWARD_DIFFERS)
    inputs = ctx.need_inputs()
    steps = ctx.steps or MIN_STEPS
    _dropout_off(ctx)
    folder = ctx.folder("train")
    dumps = (folder / "pytorch", folder / "mindspore")
    saved = [_snapshot(side) for side in ctx.sides]
    try:
        losses = (_train_torch(pt, dumps[0], inputs, steps), _train_mindspore(ms, dumps[1], inputs, steps))
        checkpoints = (_save(pt, folder / f"pytorch_step{steps}.pth"),
                       _save(ms, folder / f"mindspore_step{steps}.ckpt"))
    finally:
        for side, state in zip(ctx.sides, saved):
            _put_back(side, state)
    tolerance = Tolerance.for_dtype("float32")
    first = next((i + 1 for i, (a, b) in enumerate(zip(*losses))
                  if not abs(b - a) <= tolerance.atol + tolerance.rtol * abs(a)), None)
    result = compare(str(dumps[1]), str(dumps[0]), map_file=ctx.map_path, progress=ctx.progress)
    update = update_error = None
    try:
        update = explain_updates(str(checkpoints[1]), str(checkpoints[0]), str(dumps[1]), str(dumps[0]),
                                 map_path=ctx.map_path)
    except AlignerError as exc:
        update_error = str(exc)
    outcome = TrainOutcome(steps, (tuple(losses[0]), tuple(losses[1])), first, dumps, checkpoints, result, update,
                           update_error)
    differs = first is not None or not result.passed or (update is not None and update.exit_code is not ExitCode.OK)
    return (Status.FAILED if differs else Status.PASSED), outcome


def run_repro(ctx: Context) -> tuple[Status, Outcome]:
    """`align repro` of the module the forward stage blamed: a standalone script in both frameworks."""
    forward = ctx.outcomes.get(Stage.FORWARD)
    if not isinstance(forward, ForwardOutcome):
        raise SkipStage(SkipReason.NEEDS_FORWARD)
    findings = forward.compare.verdict.findings
    if not findings or findings[0].culprit is Culprit.MODEL_INPUT or not findings[0].blame:
        raise SkipStage(SkipReason.NOTHING_TO_REPRO)
    module = findings[0].blame
    pt, ms = ctx.sides
    try:
        result = repro(forward.dumps[1], forward.dumps[0], module, ctx.out / "repro", factory_a=ms.spec,
                       factory_b=pt.spec)
    except AlignerError as exc:  # a layer repro cannot pack without a factory: the verdict stands, say why
        raise SkipStage(SkipReason.REPRO_REFUSED, ReproOutcome(module, refused=str(exc))) from None
    return Status.PASSED, ReproOutcome(module, result)
