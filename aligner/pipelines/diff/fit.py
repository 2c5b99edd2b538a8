"""Fit one parameter's update rule from arrays: its start value, observed later values and per-step gradients.

A rule fits when simulating it from w0 with the dumped gradients reproduces the observed values within
`FIT_RTOL` of the distance travelled plus `FLOOR_ULPS` times the float32 rounding of the observed values. A fit is
then simplified (a hyperparameter the data cannot see is set to 0, numbers rounded to few digits) only while it
still fits, so the rule reported is the simplest one the data supports.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from aligner.core.result import number, typed
from aligner.core.words import Text, words
from aligner.pipelines.diff.rules import MIN_STEPS, Family, UpdateRule, simulate
from aligner.pipelines.diff.says import Say

# A fitted rule must reproduce the observed values within this fraction of the distance they travelled from init.
# Correct rules land near 1e-5 (float32 rounding of the optimizer's arithmetic); a rule that is wrong in any term
# a 3-step run can see (lr, momentum, nesterov, dampening, betas, weight decay, eps, bias correction, clipping) is
# off by more than 1e-2.
FIT_RTOL = 1e-3
FLOOR_ULPS = 8.0          # ... plus this many times the float32 rounding of the observed values
RESOLVE_ULPS = 1000.0     # a parameter must travel this many times its float32 rounding for its rule to be resolved
MAX_SAMPLE = 4096
# A parameter fits a family's full set of hyperparameters (4 for SGD, 5 for Adam) alone only with this many seen
# values per unknown; a smaller one (a 3-element bias seen at the end only) may only refit lr and weight decay of a
# rule a larger parameter established, the two settings parameter groups usually change.
VALUES_PER_UNKNOWN = 4         # least squares runs on at most this many elements of a tensor (the check uses all)

_FAMILY_ORDER = (Family.SGD, Family.ADAM, Family.ADAMW, Family.MS_ADAM, Family.MS_ADAM_WEIGHT_DECAY)


@dataclasses.dataclass
class Observed:
    """One parameter's data, flattened to float64: w0, gradients g_1..g_k, and the values seen after some steps."""

    w0: np.ndarray
    grads: list[np.ndarray]
    seen: dict[int, np.ndarray]     # step (1-based) -> value after that step
    floor: float                    # norm of the float32 rounding of the seen values
    travel: float                   # norm of (seen - w0), all seen steps together

    @classmethod
    def of(cls, weights: Sequence[np.ndarray], grads: Sequence[np.ndarray]) -> "Observed":
        """`weights` is [w0, w_k] (endpoints) or [w0, w1, ..., w_k] (the trajectory); `grads` is [g_1, ..., g_k]."""
        k = len(grads)
        flat = [np.asarray(w, np.float64).ravel() for w in weights]
        steps = range(1, k + 1) if len(flat) == k + 1 else [k]
        seen = dict(zip(steps, flat[1:]))
        floor = math.sqrt(sum(float(np.sum(np.spacing(v.astype(np.float32)).astype(np.float64) ** 2))
                              for v in seen.values()))
        travel = math.sqrt(sum(float(np.sum((v - flat[0]) ** 2)) for v in seen.values()))
        return cls(flat[0], [np.asarray(g, np.float64).ravel() for g in grads], seen, floor, travel)

    @property
    def steps(self) -> int:
        return len(self.grads)

    @property
    def moved(self) -> bool:
        """Whether the parameter moved more than rounding."""
        return self.travel > FLOOR_ULPS * self.floor

    @property
    def resolvable(self) -> bool:
        """Whether it moved far enough above rounding for a fit to tell rules apart (FLOOR_ULPS stays under 1%)."""
        return self.travel > RESOLVE_ULPS * self.floor

    def sample(self) -> "Observed":
        """The same data on at most MAX_SAMPLE evenly spaced elements (for the least-squares search)."""
        n = self.w0.size
        if n <= MAX_SAMPLE:
            return self
        idx = np.linspace(0, n - 1, MAX_SAMPLE).astype(np.int64)
        sub = Observed(self.w0[idx], [g[idx] for g in self.grads], {t: v[idx] for t, v in self.seen.items()}, 0.0,
                       0.0)
        sub.travel = math.sqrt(sum(float(np.sum((v - sub.w0) ** 2)) for v in sub.seen.values()))
        return sub


def misfit(rule: UpdateRule, obs: Observed, factors: np.ndarray) -> float:
    """Norm of (simulated - seen) over the seen steps (inf when the simulation overflows)."""
    with np.errstate(all="ignore"):
        sim = simulate(rule, obs.w0, obs.grads, factors)
        total = sum(float(np.sum((sim[t - 1] - v) ** 2)) for t, v in obs.seen.items())
    return math.sqrt(total) if math.isfinite(total) else math.inf


def relative_misfit(rule: UpdateRule, obs: Observed, factors: np.ndarray) -> float:
    """misfit as a fraction of the distance travelled."""
    return misfit(rule, obs, factors) / max(obs.travel, 1e-300)


def fits(rule: UpdateRule, obs: Observed, factors: np.ndarray, rtol: float = FIT_RTOL) -> bool:
    """Whether `rule` reproduces the seen values within `rtol` of the travel plus the rounding floor."""
    return misfit(rule, obs, factors) <= rtol * obs.travel + FLOOR_ULPS * obs.floor


def _decode(family: Family, x: np.ndarray, nesterov: bool) -> UpdateRule:
    if family is Family.SGD:
        return UpdateRule(family, math.exp(x[0]), weight_decay=float(x[3]), momentum=float(x[1]),
                          dampening=float(x[2]), nesterov=nesterov)
    return UpdateRule(family, math.exp(x[0]), weight_decay=float(x[4]), beta1=float(x[1]),
                      beta2=1 - 10 ** float(x[2]), eps=10 ** float(x[3]))


def _starts(family: Family, obs: Observed, factors: np.ndarray) -> tuple[list[np.ndarray], tuple[list, list]]:
    """Starting points and bounds of the least-squares search for one family."""
    last = max(obs.seen)
    travel = float(np.linalg.norm(obs.seen[last] - obs.w0))
    if family is Family.SGD:
        pushed = float(np.linalg.norm(sum(f * g for f, g in zip(factors[:last], obs.grads[:last]))))
        lr0 = math.log(max(travel / max(pushed, 1e-300), 1e-30))
        # from the endpoints of 3 steps, dampening and nesterov are not separable: dampening is held at 0 there
        damp_max = 1.0 if len(obs.seen) > 1 or obs.steps > MIN_STEPS else 1e-12
        bounds = ([-70.0, 0.0, 0.0, 0.0], [10.0, 0.9999, damp_max, 10.0])
        return [np.array([lr0, 0.0, 0.0, 0.0]), np.array([lr0 - math.log(3), 0.9, 0.0, 0.0])], bounds
    lr0 = math.log(max(travel / (last * math.sqrt(obs.w0.size)), 1e-30))
    bounds = ([-70.0, 0.0, -6.0, -16.0, 0.0], [10.0, 0.9999, -0.01, -1.0, 10.0])
    return [np.array([lr0, 0.9, -3.0, -8.0, 0.0]), np.array([lr0, 0.5, -1.5, -8.0, 0.0])], bounds


def _search(family: Family, nesterov: bool, obs: Observed, factors: np.ndarray) -> UpdateRule | None:
    """The least-squares best rule of one family on a sample of the elements (None when nothing converges)."""
    from scipy.optimize import least_squares  # scipy comes with mindspore; imported on use (slow to import)

    sample = obs.sample()
    scale = max(sample.travel, 1e-300)
    steps = sorted(sample.seen)

    def residuals(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            sim = simulate(_decode(family, x, nesterov), sample.w0, sample.grads, factors)
            out = np.concatenate([(sim[t - 1] - sample.seen[t]) / scale for t in steps])
        return np.where(np.isfinite(out), out, 1e6)

    best: tuple[float, UpdateRule] | None = None
    starts, bounds = _starts(family, sample, factors)
    for x0 in starts:
        x0 = np.clip(x0, bounds[0], bounds[1])
        try:
            res = least_squares(residuals, x0, bounds=bounds, x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12,
                                max_nfev=200)
        except (ValueError, FloatingPointError):
            continue
        rule = _decode(family, res.x, nesterov)
        cost = misfit(rule, obs, factors)
        if best is None or cost < best[0]:
            best = (cost, rule)
        if fits(rule, obs, factors):
            break
    return None if best is None else best[1]


ROUNDING = 1e-4   # a fitted number is shown rounded only when rounding moves it less than this (fitting noise)


def _rounded(value: float) -> Iterable[float]:
    """`value` at 1, 2 or 3 significant digits, where that is within ROUNDING of it (0.0100003 -> 0.01)."""
    if value == 0 or not math.isfinite(value):
        return []
    return [r for r in (float(f"{value:.{d}g}") for d in (1, 2, 3)) if abs(r - value) <= ROUNDING * abs(value)]


def _first_fitting(rule: UpdateRule, candidates: Iterable[dict], obs: Observed, factors: np.ndarray) -> UpdateRule:
    for change in candidates:
        trial = dataclasses.replace(rule, **change)
        if fits(trial, obs, factors):
            return trial
    return rule


def simplify(rule: UpdateRule, obs: Observed, factors: np.ndarray) -> UpdateRule:
    """The simplest rule that still fits: invisible terms at 0, numbers at the fewest significant digits."""
    if rule.family is Family.SGD:
        rule = _first_fitting(rule, [{"momentum": 0.0, "dampening": 0.0, "nesterov": False}], obs, factors)
        rule = _first_fitting(rule, [{"dampening": 0.0}], obs, factors)
    rule = _first_fitting(rule, [{"weight_decay": 0.0}], obs, factors)
    if rule.family.adaptive:
        rule = _first_fitting(rule, [{"beta1": 0.9, "beta2": 0.999}], obs, factors)
        # 1 - beta2 is what matters: round it, not beta2 itself
        rule = _first_fitting(rule, [{"beta2": 1 - r} for r in _rounded(1 - rule.beta2)], obs, factors)
        rule = _first_fitting(rule, [{"beta1": r} for r in _rounded(rule.beta1)], obs, factors)
        rule = _eps_resolution(rule, obs, factors)
    names = ["lr", "weight_decay"] + (["momentum", "dampening"] if rule.family is Family.SGD else [])
    for name in names:
        rule = _first_fitting(rule, [{name: r} for r in _rounded(getattr(rule, name))], obs, factors)
    return rule


def _eps_resolution(rule: UpdateRule, obs: Observed, factors: np.ndarray) -> UpdateRule:
    """Round a visible eps; when a tiny eps fits as well (gradients far above it), keep the largest that fits."""
    if not fits(dataclasses.replace(rule, eps=1e-16), obs, factors):
        return _first_fitting(rule, [{"eps": r} for r in _rounded(rule.eps)], obs, factors)
    largest = 1e-16
    for exponent in range(-15, 0):
        if not fits(dataclasses.replace(rule, eps=10.0 ** exponent), obs, factors):
            break
        largest = 10.0 ** exponent
    return dataclasses.replace(rule, eps=min(largest, 1e-8), eps_max=largest)


@dataclasses.dataclass
class ParamFit:
    """One parameter's fitted rule (None: no rule fits), how far off it is (relative to the travel), and why not."""

    name: str
    rule: UpdateRule | None
    misfit: float
    reason: Text = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "rule": self.rule.to_dict() if self.rule else None, "misfit": self.misfit,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamFit:
        rule = data["rule"]
        return cls(typed(data["name"], str, "name"), None if rule is None else UpdateRule.from_dict(rule),
                   typed(number(data["misfit"]), float, "misfit"), typed(data["reason"], str, "reason"))


def refit_group_settings(rule: UpdateRule, obs: Observed, factors: np.ndarray) -> UpdateRule | None:
    """`rule` with lr and weight decay refitted to `obs` (a parameter group's own settings), if that fits."""
    from scipy.optimize import least_squares

    if obs.w0.size * len(obs.seen) <= 2:
        return None
    scale = max(obs.travel, 1e-300)
    steps = sorted(obs.seen)

    def decode(x: np.ndarray) -> UpdateRule:
        return dataclasses.replace(rule, lr=math.exp(x[0]), weight_decay=float(x[1]))

    def residuals(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            sim = simulate(decode(x), obs.w0, obs.grads, factors)
            out = np.concatenate([(sim[t - 1] - obs.seen[t]) / scale for t in steps])
        return np.where(np.isfinite(out), out, 1e6)

    x0 = np.array([math.log(rule.lr), rule.weight_decay])
    try:
        res = least_squares(residuals, x0, bounds=([-70.0, 0.0], [10.0, 10.0]), x_scale="jac", max_nfev=100)
    except (ValueError, FloatingPointError):
        return None
    trial = decode(res.x)
    return simplify(trial, obs, factors) if fits(trial, obs, factors) else None


def fit_param(name: str, obs: Observed, factors: np.ndarray,
              families: Sequence[Family] = _FAMILY_ORDER) -> ParamFit:
    """The first family (SGD, Adam, AdamW, MindSpore nn.Adam, nn.AdamWeightDecay) whose best rule fits, among
    those with enough seen values to pin their hyperparameters down."""
    best: tuple[float, UpdateRule | None] = (math.inf, None)
    values = obs.w0.size * len(obs.seen)
    families = [f for f in families if values >= VALUES_PER_UNKNOWN * (4 if f is Family.SGD else 5)]
    if not families:
        return ParamFit(name, None, math.inf, words(Say.TOO_FEW_VALUES, values=values))
    for family in families:
        for nesterov in ((False, True) if family is Family.SGD else (False,)):
            rule = _search(family, nesterov, obs, factors)
            if rule is None:
                continue
            if fits(rule, obs, factors):
                return ParamFit(name, simplify(rule, obs, factors), relative_misfit(rule, obs, factors))
            off = relative_misfit(rule, obs, factors)
            if off < best[0]:
                best = (off, rule)
    closest = (best[1].describe(), best[0]) if best[1] else None
    return ParamFit(name, None, best[0], words(Say.NO_RULE_REPRODUCES, closest=closest))
