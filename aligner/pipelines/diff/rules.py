"""The optimizer update rules aligner can fit, simulated exactly as each framework computes them (in float64).

Every rule maps one parameter's start value w0 and its dumped gradients g_1..g_k (times a per-step factor shared by
all parameters of a side: 1, or a global-norm clipping factor) to the values w_1..w_k. Formulas were checked
against torch 2.x `torch.optim` and the MindSpore 2.10 sources (`mindspore/nn/optim/momentum.py`, `adam.py`):

* SGD (torch.optim.SGD, mint.optim.SGD; nn.Momentum is dampening 0): g' = g + wd*w; buf = g' at step 1, else
  mu*buf + (1-dampening)*g'; w -= lr * (g' + mu*buf if nesterov else buf).
* Adam (torch / mint Adam): g' = g + wd*w (L2); m, v moving averages; w -= lr * m_hat / (sqrt(v_hat) + eps).
* AdamW (torch / mint AdamW): w *= 1 - lr*wd (decoupled); then Adam's step on the raw gradient.
* MindSpore nn.Adam: L2 as Adam, but eps is added to the uncorrected sqrt(v) and lr_t = lr*sqrt(1-b2^t)/(1-b1^t).
* MindSpore nn.AdamWeightDecay: no bias correction at all: w -= lr * (m / (sqrt(v) + eps) + wd*w).

`Family` names these formulas; what else is known of each (state layout, decoupled decay, how MindSpore's own differ
from torch's) is the optimizer catalogue's (mappings/optimizers.yaml, aligner.mapping.optimizers).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from aligner.core.result import number
from aligner.core.text import short_number as _g
from aligner.mapping.optimizers import Family

# Steps needed before the fitted numbers mean anything. Step 1 of SGD gives only lr*(g + wd*w): momentum is
# invisible until step 2 and dampening / nesterov until step 3; step 1 of every Adam variant is lr*sign(g)
# (eps aside): beta1 and beta2 need steps 2 and 3. Three steps is the minimum for every family.
MIN_STEPS = 3


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """One fitted rule. `eps_max` set: eps could not be resolved (gradients far above it): any eps up to it fits."""

    family: Family
    lr: float
    weight_decay: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    beta1: float = 0.0
    beta2: float = 0.0
    eps: float = 0.0
    eps_max: float | None = None

    def describe(self) -> str:
        """One line in the optimizer's own words."""
        parts = [f"lr {_g(self.lr)}"]
        if self.family is Family.SGD:
            if self.momentum:
                parts.append(f"momentum {_g(self.momentum)}")
                if self.dampening:
                    parts.append(f"dampening {_g(self.dampening)}")
                if self.nesterov:
                    parts.append("nesterov")
        else:
            parts.append(f"betas ({_g(self.beta1)}, {_g(self.beta2)})")
            parts.append(f"eps <= {_g(self.eps_max)} (not resolved)" if self.eps_max is not None
                         else f"eps {_g(self.eps)}")
        parts.append(f"weight decay {_g(self.weight_decay)}" if self.weight_decay else "no weight decay")
        return f"{self.family.value}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["family"] = self.family.value
        out["description"] = self.describe()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UpdateRule:
        """The rule `to_dict` gave, back (its description is derived again)."""
        values: dict[str, Any] = {f.name: number(data[f.name]) if isinstance(data[f.name], str) else data[f.name]
                                  for f in dataclasses.fields(cls) if f.name != "family"}
        return cls(Family(data["family"]), **values)


def simulate(rule: UpdateRule, w0: np.ndarray, grads: Sequence[np.ndarray], factors: np.ndarray) -> list[np.ndarray]:
    """w_1..w_k from w0 under `rule`, the gradients multiplied by the per-step `factors` first (float64)."""
    w = w0.astype(np.float64, copy=True)
    out: list[np.ndarray] = []
    wd, lr = rule.weight_decay, rule.lr
    if rule.family is Family.SGD:
        buf: np.ndarray | None = None
        for t, g in enumerate(grads):
            g2 = factors[t] * g + wd * w if wd else factors[t] * g
            buf = g2 if buf is None else rule.momentum * buf + (1 - rule.dampening) * g2
            w = w - lr * (g2 + rule.momentum * buf if rule.nesterov else buf)
            out.append(w)
        return out
    b1, b2, eps = rule.beta1, rule.beta2, rule.eps
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    decoupled = rule.family in (Family.ADAMW, Family.MS_ADAM_WEIGHT_DECAY)
    for t, g in enumerate(grads, start=1):
        g2 = factors[t - 1] * g
        if wd and not decoupled:
            g2 = g2 + wd * w
        m = b1 * m + (1 - b1) * g2
        v = b2 * v + (1 - b2) * g2 * g2
        if rule.family in (Family.ADAM, Family.ADAMW):
            step = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        elif rule.family is Family.MS_ADAM:
            step = math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
        else:
            step = m / (np.sqrt(v) + eps)
        if decoupled and wd:
            step = step + wd * w
        w = w - lr * step
        out.append(w)
    return out


def first_update_ratio(rule: UpdateRule) -> float:
    """How much larger MindSpore nn.AdamWeightDecay's (uncorrected) first update is than AdamW's: (1-b1)/sqrt(1-b2)."""
    return (1 - rule.beta1) / math.sqrt(max(1 - rule.beta2, 1e-30))
