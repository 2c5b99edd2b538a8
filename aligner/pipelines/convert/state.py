"""Optimizer state in one neutral form ({parameter name: {slot: array}} + step + hyperparameters), read from and
written to torch's `optimizer.state_dict()` and MindSpore's flat checkpoint keys.

Slots are `momentum`, `exp_avg` and `exp_avg_sq`; where each class keeps them, which scalars it saves and how its step
key counts (mint AdamW's `state_step` is one less than the updates taken: its kernel adds the 1) is the catalogue's,
mappings/optimizers.yaml (`state:` of each class).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.words import words
from aligner.mapping.optimizers import Family, convertible
from aligner.pipelines.convert.kinds import Hyper, OptimizerKind
from aligner.pipelines.convert.says import Say

TORCH_HYPER = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize")
STATE_HYPER = ("betas", "momentum", "dampening", "nesterov", "amsgrad", "maximize")  # must agree across groups


@dataclasses.dataclass
class OptimizerState:
    """An optimizer's state keyed by parameter name (in the optimizer's order), its step count and hyperparameters."""

    kind: OptimizerKind
    slots: dict[str, dict[str, np.ndarray]]
    step: int | None = None
    hyper: Hyper = dataclasses.field(default_factory=Hyper)
    notes: list[str] = dataclasses.field(default_factory=list)
    powers: tuple[float, float] | None = None   # nn.Adam's beta1_power/beta2_power as read

    @property
    def names(self) -> list[str]:
        return list(self.slots)


def _number(value: Any, what: str) -> float:
    """A float from a torch/numpy scalar or a Python number found in an untrusted file."""
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise AlignerError(f"{what}: expected one number, got shape {value.shape}")
        value = value.reshape(-1)[0]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise AlignerError(f"{what}: expected a number, got {type(value).__name__}")
    # a float32 read from MindSpore: its shortest spelling (0.1, not 0.10000000149011612)
    number = float(str(value)) if isinstance(value, np.float32) else float(value)
    if not math.isfinite(number):
        raise AlignerError(f"{what}: not a finite number ({number})")
    return number


def torch_kind(groups: list[dict[str, Any]], hint: OptimizerKind | None, path: str) -> OptimizerKind:
    """torch:SGD / Adam / AdamW from a param_groups record (`decoupled_weight_decay`, else the hint or weight decay
    0, where the two are the same)."""
    if hint is not None:
        if not hint.is_torch:
            raise AlignerError(f"--from-optimizer {hint}: {path} holds a torch optimizer state")
        return hint
    group = groups[0]
    if "momentum" in group and "betas" not in group:
        return convertible(Framework.PYTORCH, Family.SGD)
    if "betas" not in group:
        raise AlignerError(f"{path}: optimizer param_groups hold neither momentum nor betas (keys: "
                           f"{', '.join(sorted(map(str, group))[:12])}): unknown optimizer class (supported: torch "
                           "SGD, Adam, AdamW); pass --from-optimizer if it is one of them")
    if "decoupled_weight_decay" in group:
        return convertible(Framework.PYTORCH, Family.ADAMW if group["decoupled_weight_decay"] else Family.ADAM)
    if not group.get("weight_decay"):
        return convertible(Framework.PYTORCH, Family.ADAM)
    raise AlignerError(f"{path}: cannot tell torch Adam from AdamW (weight_decay {group.get('weight_decay')}, no "
                       "decoupled_weight_decay record): pass --from-optimizer torch:Adam or torch:AdamW")


def _torch_hyper(groups: list[dict[str, Any]], path: str) -> tuple[Hyper, list[str]]:
    """The first group's hyperparameters; groups disagreeing on a state-relevant one are an error, on others a note."""
    notes: list[str] = []
    values: dict[str, Any] = {}
    for key in TORCH_HYPER:
        seen = [g[key] for g in groups if key in g]
        if not seen:
            continue
        if any(s != seen[0] for s in seen):
            if key in STATE_HYPER:
                raise AlignerError(f"{path}: the optimizer's {len(groups)} param groups have different {key} "
                                   f"({', '.join(map(str, seen[:4]))}): convert one group at a time")
            notes.append(words(Say.GROUPS_DIFFER, key=key, values=tuple(seen[:4])))
        value = seen[0]
        if key == "betas":
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise AlignerError(f"{path}: optimizer betas {str(value)[:40]} is not a pair")
            value = (_number(value[0], f"{path}: betas"), _number(value[1], f"{path}: betas"))
        elif key in ("nesterov", "amsgrad", "maximize"):
            value = bool(value)
        elif value is not None:
            value = _number(value, f"{path}: optimizer {key}")
        if value is not None:
            values[key] = value
    return Hyper(**values), notes


def from_torch(optimizer: dict[str, Any], params: list[tuple[str, tuple[int, ...]]], path: str,
               hint: OptimizerKind | None = None) -> OptimizerState:
    """Name a torch optimizer.state_dict() ({"state": {index: {slot: array}}, "param_groups": [...]}, tensors
    already numpy) by the model's parameters in named_parameters() order, `params` [(name, shape)]."""
    groups = optimizer["param_groups"]
    order = [i for g in groups for i in g["params"]]
    if len(order) != len(params):
        raise AlignerError(f"{path}: the optimizer state covers {len(order)} parameters, the model has "
                           f"{len(params)} (its state_dict minus buffers): cannot tell which state is whose")
    kind = torch_kind(groups, hint, path)
    hyper, notes = _torch_hyper(groups, path)
    slots: dict[str, dict[str, np.ndarray]] = {}
    steps = set()
    for index, (name, shape) in zip(order, params):
        record = optimizer["state"].get(index, {})
        slots[name] = {}
        if kind.spec.state.amsgrad in record:
            hyper.amsgrad = True
        for neutral, slot in kind.spec.state.slots.items():
            value = record.get(slot)
            if value is None:
                continue
            if not isinstance(value, np.ndarray):
                raise AlignerError(f"{path}: optimizer state {index}.{slot} is a {type(value).__name__}, not a tensor")
            if tuple(value.shape) != tuple(shape):
                raise AlignerError(f"{path}: optimizer state {index}.{slot} has shape {tuple(value.shape)}, parameter "
                                   f"{name!r} (position {len(slots) - 1} of named_parameters) has {tuple(shape)}: "
                                   "the optimizer's parameter order is not the model's")
            slots[name][neutral] = value
        if "step" in record:
            steps.add(int(_number(record["step"], f"{path}: optimizer state {index}.step")))
    if len(steps) > 1:
        notes.append(words(Say.STEPS_DIFFER, steps=tuple(sorted(steps)[:4])))
    empty = [n for n, s in slots.items() if not s]
    if empty and len(empty) < len(slots):
        notes.append(words(Say.NO_STATE_YET, count=len(empty), names=tuple(empty[:5])))
    return OptimizerState(kind, slots, max(steps) if steps else None, hyper, notes)


def _owner(key: str, model: list[str]) -> str | None:
    """The model parameter a slot's suffix names: itself, else the one parameter it ends (MindSpore prefixes model
    names with the wrapper cell's attribute, `n.fc.weight`, but not the optimizer's copies, `moments.fc.weight`)."""
    if key in model:
        return key
    found = [m for m in model if m.endswith("." + key)]
    return found[0] if len(found) == 1 else None


def from_mindspore(arrays: dict[str, np.ndarray], kind: OptimizerKind, model: list[str], path: str) -> OptimizerState:
    """Read a MindSpore optimizer's keys out of a flat checkpoint: slots named after the model's parameters."""
    slots: dict[str, dict[str, np.ndarray]] = {}
    state_spec = kind.spec.state
    for slot, prefix in state_spec.slots.items():
        for key, value in arrays.items():
            if not key.startswith(prefix + "."):
                continue
            owner = _owner(key[len(prefix) + 1:], model)
            if owner is None:
                raise AlignerError(f"{path}: optimizer key {key!r} names no model parameter of the checkpoint")
            slots.setdefault(owner, {})[slot] = value
    missing = sorted(set(state_spec.scalars) - set(arrays))
    if missing:
        raise AlignerError(f"{path}: {kind} state lacks {', '.join(missing)}")
    ordered = {m: slots[m] for m in model if m in slots}
    hyper = Hyper()
    notes: list[str] = []
    step_key = state_spec.step
    assert step_key is not None   # every converted MindSpore class counts its steps (tests/mapping/test_optimizers)
    step = int(_number(arrays[step_key], f"{path}: {step_key}")) - state_spec.step_offset
    if "learning_rate" in arrays:
        lr = arrays["learning_rate"]
        if lr.size > 1:  # a per-step schedule
            notes.append(words(Say.LR_SCHEDULE, size=lr.size, step=step))
            lr = lr.reshape(-1)[min(step, lr.size - 1)]
        hyper.lr = _number(lr, f"{path}: learning_rate")
    if "momentum" in arrays:
        hyper.momentum = _number(arrays["momentum"], f"{path}: momentum")
    state = OptimizerState(kind, ordered, step, hyper, notes)
    if "beta1_power" in state_spec.scalars:
        state.powers = (_number(arrays["beta1_power"], f"{path}: beta1_power"),
                        _number(arrays["beta2_power"], f"{path}: beta2_power"))
    return state


def check_powers(state: OptimizerState, betas: tuple[float, float], path: str) -> None:
    """nn.Adam's beta powers must be betas**step: else the betas (or the step) are not those it trained with."""
    powers = state.powers
    if powers is None or state.step is None:
        return
    for i, (have, beta) in enumerate(zip(powers, betas), 1):
        want = beta ** state.step
        if not math.isclose(have, want, rel_tol=1e-4, abs_tol=1e-30):
            raise AlignerError(f"{path}: beta{i}_power {have:.6g} is not beta{i}**global_step = {beta}**{state.step} "
                               f"= {want:.6g}: pass the betas it trained with (--betas B1,B2)")


def to_mindspore(slots: dict[str, dict[str, np.ndarray]], kind: OptimizerKind, step: int,
                 hyper: Hyper) -> list[tuple[str, np.ndarray]]:
    """The MindSpore optimizer's keys, in the order MindSpore saves them: scalars, then one prefix after another."""
    scalars: dict[str, np.ndarray] = {
        "global_step": np.array([step], np.int32),
        "state_step": np.array([step + kind.spec.state.step_offset], np.float32),
        "step_t": np.array(step, np.int32),
    }
    if hyper.lr is not None:
        scalars["learning_rate"] = np.array(hyper.lr, np.float32)
    if hyper.momentum is not None:
        scalars["momentum"] = np.array(hyper.momentum, np.float32)
    if hyper.betas is not None:
        scalars["beta1_power"] = np.array(hyper.betas[0] ** step, np.float32)
        scalars["beta2_power"] = np.array(hyper.betas[1] ** step, np.float32)
    out = [(name, scalars[name]) for name in kind.spec.state.scalars]
    for slot, prefix in kind.spec.state.slots.items():
        out += [(f"{prefix}.{name}", held[slot]) for name, held in slots.items()]
    return out


def to_torch(slots: dict[str, dict[str, np.ndarray]], kind: OptimizerKind, step: int,
             group: dict[str, Any], fresh: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """A torch optimizer.state_dict(): positions in the order of `slots`, one param group `group` (hyperparameters);
    parameters in `fresh` (never updated) get no state, as in torch."""
    state: dict[int, dict[str, Any]] = {}
    for index, (name, held) in enumerate(slots.items()):
        if name in fresh:
            continue
        spec = kind.spec.state
        state[index] = {spec.step: np.array(float(step), np.float32)} if spec.step else {}
        state[index].update({key: held[neutral] for neutral, key in spec.slots.items()})
    return {"state": state, "param_groups": [dict(group, params=list(range(len(slots))))]}
