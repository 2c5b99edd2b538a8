"""Name the law a freshly initialised parameter was drawn from, and decide whether two sides' laws differ beyond
sampling error.

The name does not depend on the draw: a family is named only where the sample rules the other one out, else the law is
"not identified" (its moments are still compared). Uniform: every |x| <= sqrt(3) std, so a value beyond sqrt(3) x the
sample std, allowing 5 standard errors of that std (sqrt(0.2 / n) for a uniform draw), rules it out; normal: n normal
values all within r sample stds has probability (2 Phi(r') - 1)^n, r' = r widened by 5 standard errors of the std
(1 / sqrt(2n)), and below 1e-6 that rules it out (a 96-value bias is too small to tell; from about 400 values a uniform
draw is named). Within the family, the scale is matched to the nearest of the named laws of mappings/audit_init.yaml
within 5 standard errors of the sample std, else reported as a free law with two significant digits (normal(0, 0.02)).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from aligner.core.frameworks import Framework
from aligner.core.rules import ListOf, OneOf, load_rules
from aligner.core.words import Words, words
from aligner.pipelines.audit.says import Say

LAWS_FILE = "audit_init.yaml"
Z = 5.0                 # standard errors: a sampling tolerance with negligible false alarms over thousands of tensors
MIN_FAMILY = 30         # fewer values: no family is named, only the moments compared
NORMAL_MISS = 1e-6      # a normal draw is ruled out when all its values lying that close to the mean is this unlikely
MIN_COMPARE_FAMILY = 256   # two sides' families are compared only from this many values; below it only the moments are


_LINES = {"pytorch": str, "mindspore": str}   # the line that initialises a parameter with the law, per side
SCHEMA = {"scaled": ListOf({"name": str, "family": OneOf("uniform", "normal"), "numerator": float, "fan": str,
                           **_LINES}),
          "free": {family: {"name": str, **_LINES} for family in ("uniform", "normal", "constant")}}


def _laws() -> dict[str, Any]:
    return load_rules(LAWS_FILE, SCHEMA)


@dataclasses.dataclass(frozen=True)
class Law:
    """A fitted law: its name and family, the sample's moments and bounds, and how to write it on each side."""

    name: str
    family: str                       # uniform, normal, constant, unknown
    n: int
    mean: float
    std: float
    low: float
    high: float
    lines: dict[str, str]             # framework -> initializer line template ({param}, {shape})

    def evidence(self) -> Words:
        """The name, the sample's std and size (the size says how sure the name is), to be worded."""
        return words(Say.LAW, name=self.name, std=self.std, n=self.n, constant=self.family == "constant")


def family(x: np.ndarray, std: float) -> str:
    """uniform, normal, or unknown when the sample does not rule either out (module docstring: the confidence)."""
    n = x.size
    ratio = float(np.abs(x - x.mean()).max()) / std
    if ratio > math.sqrt(3) / max(1 - Z * math.sqrt(0.2 / n), 1e-9):
        return "normal"
    widened = ratio * (1 + Z / math.sqrt(2 * n))
    inside = math.erf(widened / math.sqrt(2))          # P(|x| < widened std) for one normal value
    if n * math.log(max(inside, 1e-300)) < math.log(NORMAL_MISS):
        return "uniform"
    return "unknown"


def fans(shape: tuple[int, ...], weight_shape: tuple[int, ...] | None = None) -> tuple[int, int]:
    """PyTorch's (fan_in, fan_out); a 1-D tensor (a bias) takes its module's weight's fan_in."""
    ref = weight_shape if len(shape) < 2 and weight_shape is not None and len(weight_shape) >= 2 else shape
    if len(ref) < 2:
        return max(ref[0] if ref else 1, 1), max(ref[0] if ref else 1, 1)
    receptive = int(np.prod(ref[2:], dtype=np.int64)) if len(ref) > 2 else 1
    return ref[1] * receptive, ref[0] * receptive


def _short(x: float, n: int = 0) -> str:
    """x with one significant digit when that is within sampling error (0.01 for a drawn 0.0099), else two."""
    one = float(f"{x:.1g}")
    return f"{one:g}" if n and abs(one - x) <= Z * x / math.sqrt(2 * n) else f"{x:.2g}"


def fit(values: np.ndarray, weight_shape: tuple[int, ...] | None = None) -> Law:
    """The law `values` (a parameter as freshly built) follows, named where one of the table's laws fits."""
    x = np.asarray(values, dtype=np.float64).ravel()
    n = x.size
    mean, std = (float(x.mean()), float(x.std())) if n else (0.0, 0.0)
    low, high = (float(x.min()), float(x.max())) if n else (0.0, 0.0)
    table = _laws()
    if n and std == 0.0:
        free = table["free"]["constant"]
        value = _short(mean) if mean not in (0.0, 1.0) else str(int(mean))
        name = {"0": "zeros", "1": "ones"}.get(value, free["name"].format(value=value))
        return Law(name, "constant", n, mean, std, low, high, _lines(free, value))
    kind = family(x, std) if n >= MIN_FAMILY else "unknown"
    if kind == "unknown":
        return Law("law not identified", "unknown", n, mean, std, low, high, {})
    fan_in, fan_out = fans(values.shape, weight_shape)
    tol = Z / math.sqrt(2 * n)
    if abs(mean) <= Z * std / math.sqrt(n):
        fitting = []
        for law in table["scaled"]:
            if law["family"] != kind:
                continue
            scale = math.sqrt(law["numerator"] / (fan_in if law["fan"] == "in" else fan_in + fan_out))
            expected = scale / math.sqrt(3) if kind == "uniform" else scale
            if abs(std - expected) <= tol * expected:
                fitting.append((abs(std - expected) / expected, law))
        if fitting:
            law = min(fitting, key=lambda t: t[0])[1]
            return Law(law["name"], kind, n, mean, std, low, high, _lines(law, None))
    free = table["free"][kind]
    value = _short(std * math.sqrt(3) if kind == "uniform" else std, n)  # a drawn 0.0099 of Normal(0.01) is 0.01
    name = free["name"].format(value=value) + (f" + {mean:.2g}" if abs(mean) > Z * std / math.sqrt(n) else "")
    return Law(name, kind, n, mean, std, low, high, _lines(free, value))


def _lines(entry: dict[str, Any], value: str | None) -> dict[str, str]:
    return {fw.value: entry[fw.value].replace("{value}", value or "") for fw in (Framework.PYTORCH,
                                                                                 Framework.MINDSPORE)}


def differ(a: Law, b: Law) -> bool:
    """Whether two sides' laws differ beyond sampling error: another family, scale or mean."""
    if "constant" in (a.family, b.family):
        return a.family != b.family or not math.isclose(a.mean, b.mean, rel_tol=1e-6, abs_tol=1e-12)
    if a.family != b.family and "unknown" not in (a.family, b.family) and min(a.n, b.n) >= MIN_COMPARE_FAMILY:
        return True
    scale = max(a.std, b.std)
    na, nb = max(a.n, 1), max(b.n, 1)
    if abs(a.std - b.std) > Z * scale * math.sqrt(1 / (2 * na) + 1 / (2 * nb)):
        return True
    return abs(a.mean - b.mean) > Z * scale * math.sqrt(1 / na + 1 / nb)
