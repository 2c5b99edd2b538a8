"""The optimizers whose state aligner converts, how each names its state, and which pairs compute the same update.

Key layouts were read from checkpoints the installed frameworks write (mindspore 2.10, torch 2.13): a MindSpore
optimizer keeps one tensor per parameter and slot, named `PREFIX.PARAM` (`moments.fc.weight`), plus a few scalars
(`global_step`, `learning_rate`, ...); a torch optimizer keys its state by the parameter's position.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from aligner.core.errors import AlignerError


class OptimizerKind(str, enum.Enum):
    """One optimizer class, spelled `framework:Class` (a str enum: compares equal to its spelling)."""

    TORCH_SGD = "torch:SGD"
    TORCH_ADAM = "torch:Adam"
    TORCH_ADAMW = "torch:AdamW"
    MS_MOMENTUM = "ms:Momentum"
    MS_ADAM = "ms:Adam"
    MS_ADAMWEIGHTDECAY = "ms:AdamWeightDecay"
    MINT_SGD = "mint:SGD"
    MINT_ADAM = "mint:Adam"
    MINT_ADAMW = "mint:AdamW"

    def __str__(self) -> str:
        return self.value

    @property
    def is_torch(self) -> bool:
        return self.value.startswith("torch:")

    @property
    def family(self) -> str:
        """'momentum' (one buffer per parameter) or 'adam' (first and second moments)."""
        return "momentum" if self in MOMENTUM_FAMILY else "adam"

    @property
    def legacy(self) -> bool:
        """A MindSpore nn cell whose update is not torch's (see LEGACY_NOTES)."""
        return self in LEGACY_NOTES

    @property
    def decoupled(self) -> bool:
        """Whether weight decay shrinks the weights directly (AdamW) rather than being added to the gradient (L2)."""
        return self in (OptimizerKind.TORCH_ADAMW, OptimizerKind.MS_ADAMWEIGHTDECAY, OptimizerKind.MINT_ADAMW)

    @property
    def python_class(self) -> str:
        """The class a user constructs: torch.optim.SGD, mindspore.nn.Momentum, mindspore.mint.optim.AdamW."""
        side, name = self.value.split(":")
        return {"torch": "torch.optim", "ms": "mindspore.nn", "mint": "mindspore.mint.optim"}[side] + "." + name

    @classmethod
    def parse(cls, text: str, option: str = "--optimizer") -> "OptimizerKind":
        """From `ms:Adam`, `mindspore.nn.Adam`, `torch.optim.SGD` (case-insensitive); one error naming the choices."""
        key = text.strip().lower().replace("mindspore.mint.optim.", "mint:").replace("mindspore.nn.", "ms:") \
            .replace("torch.optim.", "torch:").replace("nn.", "ms:").replace("mindspore:", "ms:")
        for kind in cls:
            if kind.value.lower() == key:
                return kind
        raise AlignerError(f"{option}: unknown optimizer {text!r} (supported: {', '.join(k.value for k in cls)})")


MOMENTUM_FAMILY = (OptimizerKind.TORCH_SGD, OptimizerKind.MS_MOMENTUM, OptimizerKind.MINT_SGD)

LEGACY_NOTES = {
    OptimizerKind.MS_ADAM: "mindspore.nn.Adam adds eps to the uncorrected sqrt(v) (update lr*sqrt(1-beta2^t)/"
                           "(1-beta1^t) * m/(sqrt(v)+eps)), torch to the corrected one (m_hat/(sqrt(v_hat)+eps)): "
                           "its updates differ from torch's by the eps term (relatively most where sqrt(v) is near "
                           "eps); use mint.optim.Adam for torch's update",
    OptimizerKind.MS_ADAMWEIGHTDECAY: "mindspore.nn.AdamWeightDecay has no bias correction (update lr*m/(sqrt(v)+eps)"
                                      " + lr*weight_decay*w): its updates differ from torch AdamW's by the factors "
                                      "1/(1-beta1^t) and sqrt(1-beta2^t), largest in early steps; use "
                                      "mint.optim.AdamW for torch's update",
}

# MindSpore key layout: slot -> prefix of the per-parameter tensors, and the scalars the checkpoint holds
PREFIXES: dict[OptimizerKind, dict[str, str]] = {
    OptimizerKind.MS_MOMENTUM: {"momentum": "moments"},
    OptimizerKind.MINT_SGD: {"momentum": "momentum_buf"},
    OptimizerKind.MS_ADAM: {"exp_avg": "moment1", "exp_avg_sq": "moment2"},
    OptimizerKind.MS_ADAMWEIGHTDECAY: {"exp_avg": "adam_m", "exp_avg_sq": "adam_v"},
    OptimizerKind.MINT_ADAM: {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
    OptimizerKind.MINT_ADAMW: {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
}
SCALARS: dict[OptimizerKind, tuple[str, ...]] = {
    OptimizerKind.MS_MOMENTUM: ("global_step", "learning_rate", "momentum"),
    OptimizerKind.MINT_SGD: ("step_t",),
    OptimizerKind.MS_ADAM: ("global_step", "learning_rate", "beta1_power", "beta2_power"),
    OptimizerKind.MS_ADAMWEIGHTDECAY: ("global_step", "learning_rate"),
    OptimizerKind.MINT_ADAM: ("state_step",),
    OptimizerKind.MINT_ADAMW: ("state_step",),
}
ALL_PREFIXES = frozenset(p for slots in PREFIXES.values() for p in slots.values()) | {"max_exp_avg_sq"}
ALL_SCALARS = frozenset(s for names in SCALARS.values() for s in names)
# torch slot names per family (state[i][slot])
TORCH_SLOTS = {"momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}


def is_optimizer_key(name: str) -> bool:
    """Whether a MindSpore checkpoint key belongs to an optimizer (a known slot prefix or scalar)."""
    return name in ALL_SCALARS or name.partition(".")[0] in ALL_PREFIXES and "." in name


def detect_ms_kind(names: list[str] | set[str], path: str) -> OptimizerKind | None:
    """The MindSpore optimizer whose keys `names` holds (None: no optimizer keys); mint Adam and AdamW keep the same
    keys, so that pair is an error asking for --from-optimizer."""
    heads = {n.partition(".")[0] for n in names if "." in n} | set(names)
    found = [k for k, slots in PREFIXES.items() if set(slots.values()) <= heads and set(SCALARS[k]) <= set(names)]
    if OptimizerKind.MINT_ADAM in found:
        raise AlignerError(f"{path}: holds mindspore.mint.optim Adam or AdamW state (exp_avg/exp_avg_sq/state_step: "
                           "the two keep the same keys, and count state_step differently): pass --from-optimizer "
                           "mint:Adam or mint:AdamW")
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


def check_pair(src: OptimizerKind, dst: OptimizerKind, hyper: Hyper) -> list[str]:
    """Refuse (AlignerError naming the missing term) a pair whose state or update has no exact equivalent; return
    the notes of an allowed pair that is not exact (a legacy MindSpore cell on either side)."""
    def refuse(term: str) -> AlignerError:
        return AlignerError(f"cannot convert {src} state into {dst}: {term}")

    if src.family != dst.family:
        why = (f"{src} keeps no second moment (exp_avg_sq) or bias-correction step, which {dst} needs"
               if dst.family == "adam" else
               f"{src} keeps two moments (exp_avg, exp_avg_sq), {dst} one momentum buffer")
        raise refuse(f"{why}: the two update rules differ, so no equivalent state exists")
    if hyper.amsgrad:
        raise refuse("amsgrad (max_exp_avg_sq) is not converted: no MindSpore optimizer cell here keeps it in "
                     "torch's form")
    if hyper.maximize and (src.legacy or dst.legacy or OptimizerKind.MS_MOMENTUM in (src, dst)):
        raise refuse("maximize=True has no counterpart in the MindSpore nn cells")
    if src.family == "momentum":
        if hyper.dampening and OptimizerKind.MS_MOMENTUM in (src, dst):
            raise refuse(f"dampening={hyper.dampening}: mindspore.nn.Momentum has no dampening term (torch SGD "
                         "with dampening 0 or mindspore.mint.optim.SGD are its equivalents)")
        return []
    if hyper.weight_decay and src.decoupled != dst.decoupled:
        how = {True: "decoupled (w -= lr*wd*w)", False: "L2 (wd*w added to the gradient)"}
        raise refuse(f"weight_decay={hyper.weight_decay}: {src} decays {how[src.decoupled]}, {dst} "
                     f"{how[dst.decoupled]}")
    return [f"legacy optimizer: {LEGACY_NOTES[k]}" for k in (src, dst) if k.legacy]
