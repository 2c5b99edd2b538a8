"""One tolerance type for every command, with torch.testing's rules.

`rtol` and `atol` come together or not at all (a lone `atol=0` would silently keep a loose `rtol`); without them the
defaults come from a per-dtype table, the looser of two dtypes winning, integers and bool exact. Per-name overrides
follow Polygraphy's `--atol 1e-5 'layer1.*:1e-3'`: a bare value is the default, `PATTERN:VALUE` applies to names
matching the glob, the last matching pattern wins. A spec may also carry per-record tolerances calibrated against
a float64 run (`align compare --calibrate`): they replace the per-dtype defaults of those records, never the user's.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from typing import Any, Hashable, Iterable, Mapping, Sequence

from aligner.core.dtypes import FLOATING, canonical
from aligner.core.errors import AlignerError

# torch.testing.assert_close defaults: canonical dtype -> (rtol, atol); integers and bool must match exactly
DTYPE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7),
}
# A calibrated tolerance is this many times the reference's own error against float64 by default (compare
# --calibrate): torch._dynamo's minifier accepts a result within 3x the float64 reference's error of the original.
CALIBRATION_K = 3.0


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """`|a - b| <= atol + rtol * |b|` (b the reference), or with `symmetric`, `atol + rtol * max(|a|, |b|)`."""

    rtol: float
    atol: float
    symmetric: bool = False

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise AlignerError(f"{name} must be a finite number >= 0, got {value!r}")

    @classmethod
    @functools.lru_cache(maxsize=256)  # asked per record by compare; a Tolerance is frozen, so one is shared
    def for_dtype(cls, *dtypes: str) -> "Tolerance":
        """torch.testing's default for these dtypes: the loosest of them; (0, 0) for integers, bool and unknowns."""
        tols = [DTYPE_DEFAULTS.get(canonical(d), (0.0, 0.0)) for d in dtypes] or [(0.0, 0.0)]
        return cls(max(t[0] for t in tols), max(t[1] for t in tols))

    @classmethod
    def of(cls, rtol: float | None, atol: float | None, *, symmetric: bool = False) -> "Tolerance | None":
        """Both or neither, as torch.testing: None when neither is given (the per-dtype defaults apply)."""
        if (rtol is None) != (atol is None):
            given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
            raise AlignerError(f"{given} was given without {missing}: give both or neither "
                               f"(a lone {given} would silently pair with the default {missing})")
        return None if rtol is None or atol is None else cls(float(rtol), float(atol), symmetric)

    def raised(self, rtol: float, atol: float) -> "Tolerance":
        """This tolerance, each of rtol and atol raised to at least the given value (never lowered)."""
        return Tolerance(max(self.rtol, rtol), max(self.atol, atol), self.symmetric)

    def bound(self, a: float, b: float) -> float:
        """The largest |a - b| allowed for this pair of values."""
        return self.atol + self.rtol * (max(abs(a), abs(b)) if self.symmetric else abs(b))

    def allows(self, a: float, b: float) -> bool:
        """Whether a and b agree (NaN never does)."""
        return abs(a - b) <= self.bound(a, b)

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}" + (" (symmetric)" if self.symmetric else "")

    def to_dict(self) -> dict[str, float | bool]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ToleranceSpec:
    """A default Tolerance (None: per dtype) and per-name overrides {glob: Tolerance}, the last matching one winning."""

    default: Tolerance | None = None
    overrides: tuple[tuple[str, Tolerance], ...] = ()
    # the least the per-dtype defaults of floating dtypes may be, and why (compare sets it for dumps of a
    # training-mode forward through BatchNorm, whose batch statistics amplify rounding); never applies to a user's
    # own tolerance
    floor: Tolerance | None = None
    floor_reason: str = ""
    # per-record tolerances measured against a float64 run of the reference model (compare --calibrate), keyed by
    # the reference record's (step, seq): k times that record's own error, never below its per-dtype default
    calibrated: Mapping[Hashable, Tolerance] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    calibrated_from: str = ""
    calibration_k: float | None = None

    def explicit(self, name: str) -> Tolerance | None:
        """The user's tolerance for this name (the last matching override, else the default); None: per dtype."""
        for pattern, tol in reversed(self.overrides):
            if fnmatch.fnmatchcase(name, pattern):
                return tol
        return self.default

    def chosen(self, name: str, record: Hashable | None = None) -> Tolerance | None:
        """The user's tolerance for this name, else the record's calibrated one; None: the per-dtype default."""
        explicit = self.explicit(name) if self.overrides else self.default  # (asked once per compared record)
        return explicit if explicit is not None or record is None or not self.calibrated else \
            self.calibrated.get(record)

    def resolve(self, name: str, *dtypes: str) -> Tolerance:
        """The tolerance for one named tensor of these dtypes."""
        return self.explicit(name) or self.for_dtype(*dtypes)

    def for_dtype(self, *dtypes: str) -> Tolerance:
        """The per-dtype default, raised to `floor` for floating dtypes."""
        tol = Tolerance.for_dtype(*dtypes)
        if self.floor is None or not any(canonical(d) in FLOATING for d in dtypes):
            return tol
        return tol.raised(self.floor.rtol, self.floor.atol)

    @property
    def is_default(self) -> bool:
        return self.default is None and not self.overrides

    def describe(self) -> str:
        """In words, for reports: what the verdicts used."""
        text = str(self.default) if self.default else "per dtype, as torch.testing (float32: rtol=1.3e-06, atol=1e-05)"
        if self.default is None and self.floor is not None:
            text += f", at least {self.floor} ({self.floor_reason})"
        if self.calibration_k is not None:
            text += (f"; {'measured, but overridden by --rtol/--atol: ' if self.default else ''}calibrated per record "
                     f"to {self.calibration_k:g}x the reference's own error against its float64 run "
                     f"{self.calibrated_from} where that is larger ({len(self.calibrated)} records)")
        return text + "".join(f"; {p}: {t}" for p, t in self.overrides)

    def to_dict(self) -> dict[str, object]:
        return {"default": self.default.to_dict() if self.default else None,
                "overrides": {p: t.to_dict() for p, t in self.overrides},
                "floor": self.floor.to_dict() if self.floor else None, "floor_reason": self.floor_reason or None,
                "calibration": {"from": self.calibrated_from, "k": self.calibration_k, "records": len(self.calibrated)}
                if self.calibration_k is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToleranceSpec:
        """The spec `to_dict` gave (a calibrated one refused: its per-record tolerances are not in it); ValueError,
        KeyError or TypeError for data that is not one."""
        if data["calibration"] is not None:
            raise ValueError("calibrated tolerances (compare --calibrate) are not saved per record")
        default, floor, reason = data["default"], data["floor"], data["floor_reason"]
        return cls(None if default is None else Tolerance(**default),
                   tuple((str(p), Tolerance(**t)) for p, t in data["overrides"].items()),
                   None if floor is None else Tolerance(**floor), "" if reason is None else str(reason))

    @classmethod
    def parse(cls, rtol: Sequence[str] | str | None, atol: Sequence[str] | str | None, *,
              symmetric: bool = False) -> "ToleranceSpec":
        """From `--rtol`/`--atol` texts ('1e-5', 'conv*:1e-3', several per option, space- or comma-separated).

        Every name (and the default) needs both an rtol and an atol, as in torch.testing.
        """
        rtols, atols = _entries("--rtol", rtol), _entries("--atol", atol)
        for key in sorted(rtols.keys() ^ atols.keys()):
            given, missing = ("--rtol", "--atol") if key in rtols else ("--atol", "--rtol")
            what = f"for {key!r} " if key else ""
            raise AlignerError(f"{given} {what}was given without {missing}: give both or neither, as torch.testing "
                               f"does (a lone one would silently pair with a default)")
        default = Tolerance(rtols[""], atols[""], symmetric) if "" in rtols else None
        return cls(default, tuple((k, Tolerance(rtols[k], atols[k], symmetric)) for k in rtols if k))


def _entries(option: str, texts: Sequence[str] | str | None) -> dict[str, float]:
    """{pattern or '': value} from one option's texts; one clear error per bad entry."""
    if texts is None:
        return {}
    items: Iterable[str] = [texts] if isinstance(texts, str) else texts
    out: dict[str, float] = {}
    for text in items:
        for entry in text.replace(",", " ").split():
            pattern, _, value = entry.rpartition(":")
            out[pattern] = parse_nonnegative(option if not pattern else f"{option} {pattern}", value)
    return out


def parse_nonnegative(option: str, text: str) -> float:
    """A finite float >= 0 from an option's text."""
    try:
        value = float(text)
    except ValueError:
        raise AlignerError(f"{option} must be a number, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise AlignerError(f"{option} must be a finite number >= 0, got {text!r}")
    return value
