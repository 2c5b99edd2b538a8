"""Fit every parameter of one side, under one gradient-clipping hypothesis for the whole side, and group the fits.

Clipping by global norm multiplies every gradient of step t by min(1, max_norm / ||g_t||) (the norm over all
parameters). Three hypotheses are tried, the simplest first, and the one that fits the most parameters wins: no
clipping; every step clipped (then only lr * max_norm is identifiable and is what the rule's lr holds); the
largest-norm steps clipped, with max_norm fitted between the step norms.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.result import number, typed
from aligner.pipelines.diff.fit import (
    Observed,
    ParamFit,
    _search,
    fit_param,
    fits,
    refit_group_settings,
    relative_misfit,
)
from aligner.pipelines.diff.rules import MIN_STEPS, Family, UpdateRule


class ClipKind(str, enum.Enum):
    """Which steps' gradients were clipped by global norm."""

    NONE = "none"
    SOME = "some steps"
    EVERY = "every step"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Clipping:
    """The side's clipping: the global gradient norm of each step and the threshold (None: every step clipped, so
    only lr * max_norm is known, unless `assumed` from the other side's learning rate)."""

    kind: ClipKind
    norms: tuple[float, ...]
    max_norm: float | None = None
    assumed: bool = False

    def factors(self) -> np.ndarray:
        """The per-step factor the optimizer saw on top of the dumped gradients."""
        norms = np.array(self.norms)
        if self.kind is ClipKind.NONE:
            return np.ones_like(norms)
        if self.max_norm is None:
            return 1.0 / norms
        return np.minimum(1.0, self.max_norm / norms)

    @property
    def clipped_steps(self) -> list[int]:
        """1-based steps whose gradients were scaled down."""
        return [t + 1 for t, f in enumerate(self.factors()) if f < 1.0 - 1e-9] if self.max_norm is not None \
            else list(range(1, len(self.norms) + 1)) if self.kind is ClipKind.EVERY else []

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "norms": list(self.norms), "max_norm": self.max_norm,
                "assumed": self.assumed, "clipped_steps": self.clipped_steps}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Clipping:
        """The clipping `to_dict` gave, back (its clipped steps are derived again)."""
        norms = tuple(typed(number(n), float, "norms") for n in data["norms"])
        return cls(ClipKind(data["kind"]), norms, number(data["max_norm"]), typed(data["assumed"], bool, "assumed"))


@dataclasses.dataclass
class RuleGroup:
    """Parameters of one side that one rule explains, described by what they are."""

    rule: UpdateRule
    names: list[str]
    description: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.to_dict(), "names": list(self.names), "description": self.description}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleGroup:
        return cls(UpdateRule.from_dict(data["rule"]), [str(n) for n in data["names"]],
                   typed(data["description"], str, "description"))


@dataclasses.dataclass
class SideFit:
    """One side's fitted update: the clipping, each parameter's rule and the groups sharing a rule."""

    label: str
    framework: str | None
    steps: int
    trajectory: bool                     # per-step values were available (dump(params=True)), not only endpoints
    clipping: Clipping
    params: list[ParamFit]
    groups: list[RuleGroup]
    still: list[str]                     # parameters that did not move (frozen): not fitted
    too_small: list[str] = dataclasses.field(default_factory=list)  # moved, but too close to float32 rounding
    grad_scale: float = 1.0              # the dumped gradients were divided by this (a loss scale) before fitting
    data: dict[str, Observed] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def unfitted(self) -> list[ParamFit]:
        return [p for p in self.params if p.rule is None]

    def rule_of(self, name: str) -> UpdateRule | None:
        return next((p.rule for p in self.params if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "framework": self.framework, "steps": self.steps,
                "trajectory": self.trajectory, "grad_scale": self.grad_scale, "clipping": self.clipping.to_dict(),
                "groups": [g.to_dict() for g in self.groups], "params": [p.to_dict() for p in self.params],
                "unfitted": [p.name for p in self.unfitted], "still": list(self.still),
                "too_small": list(self.too_small)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SideFit:
        """The fit `to_dict` gave, back, without the observed arrays (never saved)."""
        framework = data["framework"]
        return cls(typed(data["label"], str, "label"), framework if framework is None else str(framework),
                   typed(data["steps"], int, "steps"), typed(data["trajectory"], bool, "trajectory"),
                   Clipping.from_dict(data["clipping"]), [ParamFit.from_dict(p) for p in data["params"]],
                   [RuleGroup.from_dict(g) for g in data["groups"]], [str(n) for n in data["still"]],
                   [str(n) for n in data["too_small"]], typed(number(data["grad_scale"]), float, "grad_scale"))


_NORM = re.compile(r"(^|[._])(bn\d*|batchnorm\w*|norm\w*|ln\w*|layer_?norm\w*|gn\d*|\w*_norm\d*)(\.|$)", re.I)


def category(name: str, shape: tuple[int, ...]) -> str:
    """What a parameter is, from its name and shape (either framework's names)."""
    module, _, leaf = name.rpartition(".")
    if leaf in ("gamma", "beta") or _NORM.search(module + "."):
        return "norm weights/biases"
    if leaf == "bias":
        return "biases"
    if len(shape) >= 2:
        return "conv/linear weights"
    return "other parameters"


def describe(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]], limit: int = 6) -> str:
    """'biases and norm weights/biases: fc1.bias, bn.gamma, ...' for a group of parameter names."""
    cats: list[str] = []
    for n in names:
        c = category(n, shapes.get(n, ()))
        if c not in cats:
            cats.append(c)
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{' and '.join(cats)} ({shown})"


def global_norms(grads: Mapping[str, Sequence[np.ndarray]], steps: int) -> tuple[float, ...]:
    """The global gradient norm of each step over all parameters (what clip_grad_norm_ / clip_by_global_norm use)."""
    return tuple(math.sqrt(sum(float(np.sum(np.asarray(g[t], np.float64) ** 2)) for g in grads.values()))
                 for t in range(steps))


def _fit_all(data: Mapping[str, Observed], clipping: Clipping) -> list[ParamFit]:
    """Fit every parameter under one clipping hypothesis, largest first: a parameter first tries the rules already
    found (a 3-element bias cannot pin five hyperparameters down alone, but can confirm a rule), then its own fit."""
    out = []
    factors = clipping.factors()
    found: list[UpdateRule] = []
    for name in sorted(data, key=lambda n: -data[n].w0.size):
        obs = data[name]
        known = next((r for r in found if fits(r, obs, factors)), None)
        if known is None:
            known = next((r for r in map(lambda r: refit_group_settings(r, obs, factors), found) if r), None)
        fit = ParamFit(name, known, relative_misfit(known, obs, factors)) if known else fit_param(name, obs, factors)
        if fit.rule is not None and known is None:
            found.append(fit.rule)
        out.append(fit)
    order = {n: i for i, n in enumerate(data)}
    return sorted(out, key=lambda p: order[p.name])


def _best_max_norm(obs: Observed, norms: tuple[float, ...], low: float, high: float) -> float | None:
    """max_norm in [low, high] that lets some rule fit `obs` best (golden-section on log max_norm)."""
    def cost(log_m: float) -> float:
        clip = Clipping(ClipKind.SOME, norms, math.exp(log_m))
        factors = clip.factors()
        best = math.inf
        for family in (Family.SGD, Family.ADAM):
            for nesterov in ((False, True) if family is Family.SGD else (False,)):
                rule = _search(family, nesterov, obs, factors)
                if rule is not None:
                    best = min(best, relative_misfit(rule, obs, factors))
        return best

    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = cost(c), cost(d)
    for _ in range(10):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = cost(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = cost(d)
    return math.exp(c if fc < fd else d)


def _hypotheses(norms: tuple[float, ...], probe: Observed) -> list[Clipping]:
    """Clipping hypotheses after 'none': every step, then the j largest-norm steps (max_norm fitted on `probe`)."""
    out = [Clipping(ClipKind.EVERY, norms)]
    ordered = sorted(norms)
    for j in range(1, len(norms)):
        low, high = ordered[len(norms) - j - 1], ordered[len(norms) - j]
        if high > low * (1 + 1e-6):
            m = _best_max_norm(probe, norms, low * (1 + 1e-9), high * (1 - 1e-9))
            if m is not None:
                out.append(Clipping(ClipKind.SOME, norms, m))
    return out


def group_fits(fits_: list[ParamFit], data: Mapping[str, Observed], clipping: Clipping,
               shapes: Mapping[str, tuple[int, ...]]) -> list[RuleGroup]:
    """Greedy: a parameter joins the first group whose rule also reproduces its values, else starts a group."""
    factors = clipping.factors()
    groups: list[tuple[UpdateRule, list[str]]] = []
    for fit in fits_:
        if fit.rule is None:
            continue
        for rule, names in groups:
            if rule.family is fit.rule.family and fits(rule, data[fit.name], factors):
                names.append(fit.name)
                break
        else:
            groups.append((fit.rule, [fit.name]))
    return [RuleGroup(rule, names, describe(names, shapes)) for rule, names in groups]


def fit_side(weights: Mapping[str, Sequence[np.ndarray]], grads: Mapping[str, Sequence[np.ndarray]], *,
             label: str = "A", framework: str | None = None, grad_scale: float = 1.0) -> SideFit:
    """Fit the rule each parameter of one side followed.

    weights[name] is [w0, w_k] (endpoints) or [w0, w1, ..., w_k] (per-step values); grads[name] is [g_1, ..., g_k],
    as dumped (divided by `grad_scale` here: a loss scale found by comparing with the other side).
    """
    if not grads:
        raise AlignerError(f"side {label}: no parameter gradients to fit")
    steps = {len(g) for g in grads.values()}
    if len(steps) != 1:
        raise AlignerError(f"side {label}: parameters have gradients for different numbers of steps "
                           f"({sorted(steps)})")
    k = steps.pop()
    if k < MIN_STEPS:
        raise AlignerError(f"side {label}: gradients of {k} step(s); at least {MIN_STEPS} are needed to tell update "
                           f"rules apart (one step cannot separate SGD momentum from the learning rate, nor Adam's "
                           f"betas)")
    scaled = {n: [np.asarray(x, np.float64) / grad_scale for x in g] for n, g in grads.items()}
    norms = global_norms(scaled, k)
    data: dict[str, Observed] = {}
    still: list[str] = []
    too_small: list[str] = []
    for name, g in scaled.items():
        if name not in weights:
            raise AlignerError(f"side {label}: gradients of {name} but no weights for it")
        obs = Observed.of(weights[name], g)
        if obs.resolvable:
            data[name] = obs
        else:
            (too_small if obs.moved else still).append(name)
    trajectory = any(len(o.seen) > 1 for o in data.values())
    shapes = {n: tuple(np.shape(w[0])) for n, w in weights.items()}
    # the clipping hypothesis is chosen on the parameter that travelled furthest, then every parameter is fitted
    clipping = Clipping(ClipKind.NONE, norms)
    if data:
        probe = data[max(data, key=lambda n: data[n].travel)]
        first = fit_param("probe", probe, clipping.factors())
        if first.rule is None:
            for hypothesis in _hypotheses(norms, probe):
                if fit_param("probe", probe, hypothesis.factors()).rule is not None:
                    clipping = hypothesis
                    break
    params = _fit_all(data, clipping)
    groups = group_fits(params, data, clipping, shapes)
    return SideFit(label, framework, k, trajectory, clipping, params, groups, still, too_small, grad_scale, data)
