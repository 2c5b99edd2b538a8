"""The optimizer state align convert carries over: which checkpoint keys are an optimizer's, which class wrote them,
the hyperparameters a conversion needs, and which pairs of classes compute the same update.

What each class is (slots, scalars, arguments, legacy notes) is the catalogue's (mappings/optimizers.yaml, read by
aligner.mapping.optimizers): a MindSpore optimizer keeps one tensor per parameter and slot, named `PREFIX.PARAM`
(`moments.fc.weight`), plus a few scalars (`global_step`, `learning_rate`, ...); a torch optimizer keys its state by
the parameter's position.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.words import words
from aligner.mapping.optimizers import OptimizerKind, catalogue
from aligner.pipelines.convert.says import Say


def _ms_kinds() -> list[OptimizerKind]:
    return [k for k in OptimizerKind if not k.is_torch]


@functools.cache
def _optimizer_prefixes() -> frozenset[str]:
    """Prefixes of MindSpore optimizer keys: the converted classes' slots, and every class's amsgrad maximum."""
    slots = {prefix for k in _ms_kinds() for prefix in k.spec.state.slots.values()}
    return frozenset(slots | {c.state.amsgrad for c in catalogue().classes
                              if c.state.amsgrad and c.framework is Framework.MINDSPORE})


@functools.cache
def _optimizer_scalars() -> frozenset[str]:
    return frozenset(s for k in _ms_kinds() for s in k.spec.state.scalars)


def is_optimizer_key(name: str) -> bool:
    """Whether a MindSpore checkpoint key belongs to an optimizer (a known slot prefix or scalar)."""
    return name in _optimizer_scalars() or name.partition(".")[0] in _optimizer_prefixes() and "." in name


def detect_ms_kind(names: list[str] | set[str], path: str) -> OptimizerKind | None:
    """The MindSpore optimizer whose keys `names` holds (None: no optimizer keys); classes that keep the same keys
    (mint Adam and AdamW) are an error asking for --from-optimizer."""
    heads = {n.partition(".")[0] for n in names if "." in n} | set(names)
    found = [k for k in _ms_kinds() if set(k.spec.state.slots.values()) <= heads
             and set(k.spec.state.scalars) <= set(names)]
    if len(found) > 1:
        keys = "/".join([*found[0].spec.state.slots.values(), *found[0].spec.state.scalars])
        raise AlignerError(f"{path}: holds {' or '.join(k.python_class for k in found)} state ({keys}: they keep the "
                           f"same keys, and may count their step differently): pass --from-optimizer "
                           f"{' or '.join(k.value for k in found)}")
    return found[0] if found else None


@dataclasses.dataclass
class Hyper:
    """The hyperparameters a conversion needs or records (None: not known); torch keeps them in param_groups."""

    lr: float | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    dampening: float | None = None
    nesterov: bool | None = None
    amsgrad: bool | None = None
    maximize: bool | None = None

    def merged(self, other: "Hyper") -> "Hyper":
        """These values, with `other`'s where this one has none (options win over what a file records)."""
        return Hyper(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(other, f.name)
                        for f in dataclasses.fields(self)})

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
                if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hyper:
        """The values `to_dict` gave, back (the ones it left out are None)."""
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)


def check_pair(src: OptimizerKind, dst: OptimizerKind, hyper: Hyper) -> list[str]:
    """Refuse (AlignerError naming the missing term) a pair whose state or update has no exact equivalent; return
    the notes of an allowed pair that is not exact (a legacy MindSpore cell on either side)."""
    refusal = f"cannot convert {src} state into {dst}"
    if src.layout != dst.layout and dst.layout == "adam":
        raise AlignerError(f"{refusal}: {src} keeps no second moment (exp_avg_sq) or bias-correction step, which "
                           f"{dst} needs: the two update rules differ, so no equivalent state exists")
    if src.layout != dst.layout:
        raise AlignerError(f"{refusal}: {src} keeps two moments (exp_avg, exp_avg_sq), {dst} one momentum buffer: "
                           "the two update rules differ, so no equivalent state exists")
    if hyper.amsgrad:
        raise AlignerError(f"{refusal}: amsgrad (max_exp_avg_sq) is not converted: no MindSpore optimizer cell here "
                           "keeps it in torch's form")
    if hyper.maximize and not all(k.spec.argument("maximize") for k in (src, dst)):
        raise AlignerError(f"{refusal}: maximize=True has no counterpart in the MindSpore nn cells")
    if src.layout == "momentum":
        lacking = [k for k in (src, dst) if not k.spec.argument("dampening")]
        if hyper.dampening and lacking:
            raise AlignerError(f"{refusal}: dampening={hyper.dampening}: {lacking[0].python_class} has no dampening "
                               "term (torch SGD with dampening 0 or mindspore.mint.optim.SGD are its equivalents)")
        return []
    if hyper.weight_decay and src.decoupled != dst.decoupled:
        how = {True: "decoupled (w -= lr*wd*w)", False: "L2 (wd*w added to the gradient)"}
        raise AlignerError(f"{refusal}: weight_decay={hyper.weight_decay}: {src} decays {how[src.decoupled]}, {dst} "
                           f"{how[dst.decoupled]}")
    return [words(Say.LEGACY, why=k.spec.why) for k in (src, dst) if k.legacy]
