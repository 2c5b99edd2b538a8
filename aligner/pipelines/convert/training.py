"""Full training checkpoints across frameworks: the model through the weight conversion plan, the optimizer's
state renamed parameter by parameter with the same plan, its step and bias-correction state filled.

`convert_training_state(...)` works on files and `convert_state_dicts(...)` on arrays; both return a typed result
and print nothing. A torch optimizer numbers its parameters by position in `named_parameters()`, which is the
model state_dict's order minus its buffers (and minus tied duplicates): that is the order used to name them.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import Any, Iterable, Mapping

import numpy as np

from aligner.core.atomic import atomic_open, check_output
from aligner.core.buffers import is_buffer
from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Framework
from aligner.core.result import PassedByExitCode, typed
from aligner.core.words import words
from aligner.io import detect_format, open_checkpoint, write_checkpoint
from aligner.io.base import ArraySource, TensorInfo, TensorSource
from aligner.io.pytorch_pth import OPTIMIZER_KEYS, TorchSource, write_training_pth
from aligner.mapping import Plan
from aligner.mapping.optimizers import same_state
from aligner.mapping.transforms import Cast, apply_ops
from aligner.pipelines.convert.checkpoint import ConvertResult, plan_conversion
from aligner.pipelines.convert.kinds import Hyper, OptimizerKind, check_pair, detect_ms_kind, is_optimizer_key
from aligner.pipelines.convert.says import Say
from aligner.pipelines.convert.state import (
    OptimizerState,
    check_powers,
    from_mindspore,
    from_torch,
    to_mindspore,
    to_torch,
    torch_kind,
)


class Exactness(str, enum.Enum):
    """Whether the target optimizer computes the source's update from the converted state."""

    EXACT = "exact"
    LEGACY = "legacy"     # a MindSpore nn cell on one side: the state is copied, the updates differ (see notes)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class OptimizerConversion:
    """The optimizer part of a conversion: which classes, the step, the target's keys, and what the user should
    know (legacy updates, hyperparameters taken from defaults, the order assumption)."""

    source_kind: OptimizerKind
    target_kind: OptimizerKind
    exactness: Exactness
    step: int
    hyper: Hyper
    params: dict[str, str]               # source parameter -> target parameter whose state it carries
    keys: list[str]                      # target keys written (MindSpore) or 'state.N.slot' (torch)
    missing: list[str] = dataclasses.field(default_factory=list)     # --like keys nothing fills
    unexpected: list[str] = dataclasses.field(default_factory=list)  # produced keys the --like target lacks
    notes: list[str] = dataclasses.field(default_factory=list)
    mindspore: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)  # MindSpore target keys
    torch: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)     # torch optimizer.state_dict()

    def to_dict(self) -> dict[str, Any]:
        return {"source_optimizer": self.source_kind.value, "target_optimizer": self.target_kind.value,
                "exactness": self.exactness.value, "step": self.step, "hyperparameters": self.hyper.to_dict(),
                "parameters": dict(self.params), "keys": list(self.keys), "missing": list(self.missing),
                "unexpected": list(self.unexpected), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizerConversion:
        """The conversion `to_dict` gave, back, without the state arrays (never saved)."""
        return cls(OptimizerKind(data["source_optimizer"]), OptimizerKind(data["target_optimizer"]),
                   Exactness(data["exactness"]), typed(data["step"], int, "step"),
                   Hyper.from_dict(data["hyperparameters"]), {str(k): str(v) for k, v in data["parameters"].items()},
                   [str(k) for k in data["keys"]], [str(k) for k in data["missing"]],
                   [str(k) for k in data["unexpected"]], [str(n) for n in data["notes"]])


@dataclasses.dataclass(frozen=True)
class TrainingConvertResult(PassedByExitCode):
    """`align convert --optimizer`: the model's conversion (its plan) and the optimizer's, and whether written (a
    `Result`: `passed` when it was)."""

    model: ConvertResult
    optimizer: OptimizerConversion
    written: bool

    @property
    def source(self) -> str:
        return self.model.source

    @property
    def output(self) -> str:
        return self.model.output

    @property
    def failures(self) -> list[str]:
        return [e.target or e.sources[0] for e in self.model.failures] + self.optimizer.missing

    @property
    def exit_code(self) -> ExitCode:
        """FOUND when a target key stayed unfilled and nothing was written."""
        return ExitCode.OK if self.written else ExitCode.FOUND

    def to_dict(self) -> dict[str, Any]:
        return {**self.model.to_dict(), "written": self.written, "optimizer": self.optimizer.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingConvertResult:
        """The result `to_dict` gave (as --json saved it), back."""
        return cls(ConvertResult.from_dict(data), OptimizerConversion.from_dict(data["optimizer"]),
                   typed(data["written"], bool, "written"))


@dataclasses.dataclass
class StateDicts:
    """An in-memory conversion's output: the model {name: array}, the optimizer in the target's form (MindSpore:
    {key: array}; torch: an optimizer.state_dict() with numpy arrays) and what happened."""

    model: dict[str, np.ndarray]
    optimizer: dict[str, Any]
    conversion: OptimizerConversion
    plan: Plan


class _Subset(TensorSource):
    """Some of another source's tensors (a checkpoint's model part, without its optimizer keys)."""

    def __init__(self, inner: TensorSource, names: Iterable[str]) -> None:
        super().__init__(inner.path, inner.framework)
        self.format = inner.format
        self._inner = inner
        self.infos = {n: inner.infos[n] for n in names}
        self.notes = list(inner.notes)
        self.tied = {a: b for a, b in inner.tied.items() if a in self.infos}
        self.file_backed = inner.file_backed

    def _load(self, name: str) -> np.ndarray:
        return self._inner.get(name)


@dataclasses.dataclass
class _Side:
    """One checkpoint split into its model part and its optimizer part."""

    model: TensorSource
    framework: str
    state: OptimizerState | None = None            # read state (the source)
    kind: OptimizerKind | None = None              # the optimizer class it holds
    opt_infos: dict[str, TensorInfo] = dataclasses.field(default_factory=dict)   # MindSpore optimizer keys
    torch_params: int | None = None                # a torch --like: parameters its optimizer holds
    step: int | None = None                        # a counter saved beside a torch model
    notes: list[str] = dataclasses.field(default_factory=list)


def parameters(source: TensorSource) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a torch state_dict's parameters in named_parameters() order: minus buffers, minus tied
    duplicates (named_parameters lists a shared parameter once)."""
    return [(n, i.shape) for n, i in source.infos.items() if not is_buffer(n) and n not in source.tied]


def _read_side(path: str, trust_pickle: bool, model_key: str | None, optimizer_key: str | None,
               hint: OptimizerKind | None, need_state: bool) -> tuple[TensorSource, _Side]:
    """Open a checkpoint and split it; with `need_state`, read its optimizer state (an error if it has none)."""
    fmt = detect_format(path)
    if fmt == "pytorch":
        torch_src = TorchSource(path, allow_pickle=trust_pickle, model_key=model_key)
        try:
            side = _Side(torch_src, Framework.PYTORCH)
            found = torch_src.optimizer_state(optimizer_key)
            counters = torch_src.numbers()
            side.step = next((counters[k] for k in ("step", "global_step", "iteration", "iter") if k in counters), None)
            side.notes += [words(Say.SCHEDULER_KEPT_OUT, key=k) for k in torch_src.scheduler_keys()]
            if found is None:
                if need_state:
                    raise AlignerError(f"{path}: holds a model but no optimizer state (looked under "
                                       f"{', '.join(OPTIMIZER_KEYS)}; --optimizer-key names another key)")
                return torch_src, side
            key, optimizer = found
            if need_state:
                side.state = from_torch(optimizer, parameters(torch_src), path, hint)
                side.kind = side.state.kind
                side.notes.append(words(Say.STATE_READ_FROM, key=key))
            else:
                side.kind = torch_kind(optimizer["param_groups"], None, path)
                side.torch_params = sum(len(g["params"]) for g in optimizer["param_groups"])
            return torch_src, side
        except BaseException:
            torch_src.close()
            raise
    source = open_checkpoint(path, allow_pickle=trust_pickle, fmt=fmt)
    try:
        opt_names = [n for n in source.infos if is_optimizer_key(n)]
        model_names = [n for n in source.infos if n not in set(opt_names)]
        side = _Side(_Subset(source, model_names), source.framework or Framework.MINDSPORE)
        side.opt_infos = {n: source.infos[n] for n in opt_names}
        if hint is not None and hint.is_torch:
            raise AlignerError(f"--from-optimizer {hint}: {path} is not a torch checkpoint")
        kind = hint or (detect_ms_kind(opt_names, path) if opt_names else None)
        if kind is None:
            if need_state:
                raise AlignerError(f"{path}: holds a model but no optimizer state (no moments./moment1./adam_m./"
                                   "exp_avg./momentum_buf. keys)")
            return source, side
        side.kind = kind
        if need_state:
            arrays = {n: source.get(n) for n in opt_names}
            side.state = from_mindspore(arrays, kind, model_names, path)
        return source, side
    except BaseException:
        source.close()
        raise


def _target_group(kind: OptimizerKind, hyper: Hyper) -> tuple[dict[str, Any], list[str]]:
    """A torch param group for `kind`: torch's defaults (read from the installed torch) overridden by what is known;
    also the names that kept torch's default, since torch's load_state_dict replaces the optimizer's own values."""
    import torch

    cls = getattr(torch.optim, kind.python_class.rpartition(".")[2])
    group = cls([torch.nn.Parameter(torch.zeros(1))], lr=0.0).state_dict()["param_groups"][0]
    del group["params"]
    defaulted = []
    for key in kind.spec.args:   # a torch class's arguments are its group keys, in torch's names
        value = getattr(hyper, key)
        if value is not None:
            group[key] = tuple(value) if key == "betas" else value
        elif key == "lr":
            raise AlignerError(f"the source records no learning rate for {kind}: pass --lr")
        else:
            defaulted.append(f"{key}={group[key]}")
    return group, defaulted


def _infer_betas(state: OptimizerState) -> tuple[float, float] | None:
    """nn.Adam's betas read back from beta1_power/beta2_power and the step (6 significant digits)."""
    if state.powers is None or not state.step:
        return None
    b1, b2 = (float(f"{p ** (1.0 / state.step):.6g}") for p in state.powers)
    return b1, b2


def _map_slots(plan: Plan, state: OptimizerState) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str],
                                                          set[str], list[str]]:
    """The state renamed (and reshaped, split, joined) with the model's plan: {target param: {slot: array}} in the
    plan's output order (a slot the source has not made yet as the optimizer's initial zeros), the source -> target
    names, the targets whose source had no state yet, and notes on parameters whose state has no place."""
    slot_names = tuple(state.kind.spec.state.slots)
    fresh = set()
    out: dict[str, dict[str, np.ndarray]] = {}
    names: dict[str, str] = {}
    used = set()
    for entry in plan.outputs:
        if not entry.sources or not all(s in state.slots for s in entry.sources):
            continue
        target, info = entry.written_as()
        ops = [op for op in entry.ops if not isinstance(op, Cast)]
        held: dict[str, np.ndarray] = {}
        for slot in slot_names:
            if all(slot in state.slots[s] for s in entry.sources):
                held[slot] = apply_ops([state.slots[s][slot] for s in entry.sources], ops)
            else:   # never updated yet: the optimizer's initial zeros
                held[slot] = np.zeros(info.shape, np.float32)
                fresh.add(target)
        out[target] = held
        names.update({s: target for s in entry.sources})
        used.update(entry.sources)
    notes: list[str] = []
    lost = [n for n in state.slots if n not in used]
    if lost:
        notes.append(words(Say.STATE_DROPPED, count=len(lost), names=tuple(lost[:5])))
    return out, names, fresh, notes


def _mindspore_keys(slots: dict[str, dict[str, np.ndarray]], kind: OptimizerKind, step: int, hyper: Hyper,
                    like: _Side | None) -> tuple[list[tuple[str, np.ndarray]], list[str], list[str]]:
    """The target's optimizer keys; with a MindSpore --like, exactly its keys (shape checked, dtype cast), and the
    like keys nothing fills and the produced keys it lacks."""
    produced = to_mindspore(slots, kind, step, hyper)
    if like is None or not like.opt_infos:
        return produced, [], []
    by_key = dict(produced)
    model = list(like.model.infos)
    items: list[tuple[str, np.ndarray]] = []
    missing = []
    taken = set()
    for key, info in like.opt_infos.items():
        value = by_key.get(key)
        if value is None and key not in kind.spec.state.scalars:
            prefix, _, rest = key.partition(".")
            owner = rest if rest in slots else next((m for m in model if m.endswith("." + rest) and m in slots), None)
            value = by_key.get(f"{prefix}.{owner}") if owner else None
            if value is not None:
                taken.add(f"{prefix}.{owner}")
        else:
            taken.add(key)
        if value is None or tuple(value.shape) != info.shape:
            missing.append(key if value is None else f"{key} (shape {tuple(value.shape)} vs {info.shape})")
            continue
        items.append((key, value.astype(np.dtype(info.dtype)) if str(value.dtype) != info.dtype else value))
    unexpected = [k for k, _ in produced if k not in taken]
    return items, missing, unexpected


def _check_kind(target: OptimizerKind | None, like: _Side | None, out_framework: str) -> OptimizerKind:
    """The target optimizer: --optimizer, else the --like checkpoint's; it must be of the output's framework."""
    like_kind = like.kind if like is not None else None
    if target is None:
        if like_kind is None:
            raise AlignerError("no target optimizer: pass --optimizer (supported: "
                               f"{', '.join(k.value for k in OptimizerKind)}) or --like a checkpoint holding one")
        target = like_kind
    elif like_kind is not None and like_kind != target and not same_state(like_kind, target):
        raise AlignerError(f"--optimizer {target} disagrees with the --like checkpoint, which holds {like_kind}")
    if target.is_torch != (out_framework == Framework.PYTORCH):
        raise AlignerError(f"--optimizer {target} is not a {out_framework} optimizer (the output format's framework)")
    return target


def _convert(side: _Side, like: _Side | None, target: OptimizerKind, options: Hyper, step: int | None,
             map_path: str | None, dst: str) -> tuple[Plan, OptimizerConversion, list[tuple[str, np.ndarray]]]:
    """Plan the model, then carry the optimizer state over with that plan: (plan, conversion, MindSpore keys)."""
    state = side.state
    assert state is not None
    hyper = options.merged(state.hyper)
    notes = list(side.notes) + list(state.notes)
    if hyper.betas is None and state.powers is not None:
        hyper.betas = _infer_betas(state)
        notes.append(words(Say.BETAS_READ, betas=hyper.betas))
    notes += check_pair(state.kind, target, hyper)
    if hyper.betas is not None:
        check_powers(state, hyper.betas, side.model.path)
    step = step if step is not None else state.step if state.step is not None else side.step
    if step is None:
        raise AlignerError(f"{side.model.path}: records no step count ({state.kind} state has none, and no 'step' "
                           "beside the model): pass --step N, the number of updates taken")
    if state.step is not None and side.step is not None and side.step != state.step:
        notes.append(words(Say.STEP_DIFFERS, checkpoint=side.step, optimizer=state.step, used=step))
    plan = plan_conversion(side.model, dst, side.framework, map_path, like.model if like is not None else None)
    slots, names, fresh, lost = _map_slots(plan, state)
    notes += lost
    if like is not None and like.torch_params is not None and like.torch_params != len(slots):
        raise AlignerError(f"{like.model.path}: its optimizer state covers {like.torch_params} parameters, the "
                           f"converted model has {len(slots)}")
    conv = OptimizerConversion(state.kind, target, Exactness.LEGACY if state.kind.legacy or target.legacy
                               else Exactness.EXACT, step, hyper, names, [])
    items: list[tuple[str, np.ndarray]] = []
    if target.is_torch:
        group, defaulted = _target_group(target, hyper)
        conv.torch = to_torch(slots, target, step, group, fresh)
        conv.keys = [f"state.{i}.{s}" for i, rec in conv.torch["state"].items() for s in rec]
        if defaulted:
            notes.append(words(Say.TORCH_DEFAULTS, names=tuple(defaulted)))
        notes.append(words(Say.TORCH_ORDER, count=len(slots)))
    else:
        scalars = target.spec.state.scalars
        if "learning_rate" in scalars and hyper.lr is None:
            raise AlignerError(f"{target} keeps learning_rate in its checkpoint and the source records none: "
                               "pass --lr")
        if "momentum" in scalars and hyper.momentum is None:
            raise AlignerError(f"{target} keeps momentum in its checkpoint and the source records none: "
                               "pass --momentum")
        if "beta1_power" in scalars and hyper.betas is None:
            raise AlignerError(f"{target} keeps beta1_power/beta2_power and the source records no betas: "
                               "pass --betas B1,B2")
        fill = Hyper(lr=hyper.lr if "learning_rate" in scalars else None,
                     momentum=hyper.momentum if "momentum" in scalars else None,
                     betas=hyper.betas if "beta1_power" in scalars else None)
        items, conv.missing, conv.unexpected = _mindspore_keys(slots, target, step, fill, like)
        conv.keys = [k for k, _ in items]
        conv.mindspore = dict(items)
        if not target.legacy:   # hyperparameters are constructor arguments: say which
            args = {k: v for k, v in hyper.to_dict().items() if k in ("lr", "betas", "eps", "weight_decay",
                                                                      "momentum", "dampening", "nesterov")}
            notes.append(words(Say.CONSTRUCT, cls=target.python_class, args=args))
    conv.notes = notes
    return plan, conv, items


def convert_state_dicts(model: dict[str, np.ndarray], optimizer: dict[str, Any], *, src: str,
                        target: OptimizerKind | str, hyper: Hyper | None = None, step: int | None = None,
                        from_optimizer: OptimizerKind | str | None = None) -> StateDicts:
    """Convert in memory: `model` {name: array} in framework `src`'s names and its optimizer (torch: a
    state_dict with numpy arrays, positions in `model`'s order minus buffers; MindSpore: its {key: array}).
    Returns the target model, the target optimizer (MindSpore keys, or a torch state_dict) and the conversion."""
    target = OptimizerKind.parse(target) if isinstance(target, str) else target
    hint = OptimizerKind.parse(from_optimizer, "--from-optimizer") if isinstance(from_optimizer, str) \
        else from_optimizer
    if src == Framework.PYTORCH:
        source: TensorSource = ArraySource("<memory>", src, model)
        side = _Side(source, src)
        side.state = from_torch(optimizer, parameters(source), "<memory>", hint)
    else:
        source = ArraySource("<memory>", src, {k: v for k, v in model.items() if not is_optimizer_key(k)})
        side = _Side(source, src)
        kind = hint or detect_ms_kind(list(optimizer), "<memory>")
        if kind is None:
            raise AlignerError("<memory>: the optimizer dict holds no MindSpore optimizer keys")
        side.state = from_mindspore(optimizer, kind, list(source.infos), "<memory>")
    dst = Framework.PYTORCH if target.is_torch else Framework.MINDSPORE
    plan, conv, items = _convert(side, None, target, hyper or Hyper(), step, None, dst)
    if plan.failures:
        raise AlignerError("cannot convert: " + "; ".join(f"{e.target}: {e.reason}" for e in plan.failures))
    return StateDicts(dict(plan.tensors(source)), conv.torch if target.is_torch else dict(items), conv, plan)


def convert_training_state(src_path: str, out_path: str, *, optimizer: OptimizerKind | str | None = None,
                           like_path: str | None = None, map_path: str | None = None,
                           hyper: Hyper | None = None, step: int | None = None,
                           from_optimizer: OptimizerKind | str | None = None, model_key: str | None = None,
                           optimizer_key: str | None = None, force: bool = False, allow_incomplete: bool = False,
                           trust_pickle: bool = False) -> TrainingConvertResult:
    """Convert a full training checkpoint (model + optimizer) file into `out_path` (.ckpt or .pth). Nothing is
    written when a --like key stays unfilled (exit 1) unless `allow_incomplete`; bad input raises AlignerError
    before anything is written, and the output is written atomically (never a partly converted optimizer)."""
    target = OptimizerKind.parse(optimizer) if isinstance(optimizer, str) else optimizer
    hint = OptimizerKind.parse(from_optimizer, "--from-optimizer") if isinstance(from_optimizer, str) \
        else from_optimizer
    out_fmt = detect_format(out_path, for_output=True)
    if out_fmt not in ("pytorch", "mindspore"):
        raise AlignerError(f"{out_path}: a training checkpoint is written as .ckpt or .pth, not {out_fmt}")
    dst = Framework.PYTORCH if out_fmt == "pytorch" else Framework.MINDSPORE
    check_output(out_path, force)
    handle, side = _read_side(src_path, trust_pickle, model_key, optimizer_key, hint, need_state=True)
    like_handle: TensorSource | None = None
    try:
        like = None
        if like_path:
            like_handle, like = _read_side(like_path, trust_pickle, None, None, None, need_state=False)
        target = _check_kind(target, like, dst)
        plan, conv, items = _convert(side, like, target, hyper or Hyper(), step, map_path, dst)

        def result(written: bool) -> TrainingConvertResult:
            return TrainingConvertResult(ConvertResult(src_path, out_path, plan, written, like_path), conv, written)

        if (plan.failures or conv.missing) and not allow_incomplete:
            return result(written=False)
        if target.is_torch:
            extras = {"step": conv.step}
            try:
                with atomic_open(out_path) as fh:
                    write_training_pth(fh, plan.tensors(side.model), conv.torch, extras)
            except OSError as exc:
                raise AlignerError(f"cannot write {out_path}: {exc.strerror or exc}") from None
        else:
            infos = plan.output_infos() | {k: TensorInfo(tuple(v.shape), canonical(v.dtype)) for k, v in items}
            write_checkpoint(out_path, "mindspore", itertools.chain(plan.tensors(side.model), items), infos, dst)
        return result(written=True)
    finally:
        handle.close()
        if like_handle is not None:
            like_handle.close()


def like_holds_optimizer(like_path: str | None, trust_pickle: bool = False) -> bool:
    """Whether a --like checkpoint holds optimizer state (then `align convert` converts the training state)."""
    if not like_path:
        return False
    handle, side = _read_side(like_path, trust_pickle, None, None, None, need_state=False)
    handle.close()
    return side.kind is not None


__all__ = ["Exactness", "OptimizerConversion", "StateDicts", "TrainingConvertResult", "convert_state_dicts",
           "convert_training_state", "like_holds_optimizer", "parameters"]
