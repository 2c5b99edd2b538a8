"""Compare two loss curves step by step against float32 noise and a tolerance; diagnose where they part.

The rule (docs/losses.md): at step k, with d = |A-B|, v = half the last printed digit of each log, summed
over the two logs and halved (`(res_A + res_B) / 2`), and sigma_k the noise of step k:

* d > atol + rtol*max(|A|,|B|) + v              -> DIFFERS      (beyond the tolerance: a hard limit)
* d > REAL_FACTOR * sigma_k + v                  -> ABOVE_NOISE  (within the tolerance, but a likely real difference)
* v > REAL_FACTOR * sigma_k (and d within both)  -> UNRESOLVED   (the print rounding hides noise-sized differences)
* otherwise                                      -> OK

sigma_k is, in order of preference: measured from a repeat of one side (the running maximum of |A_j - A'_j| over
j <= k, never below the float32 estimate), given by the user (`noise`, an absolute loss difference), or estimated as
NOISE_ROUNDINGS * eps32 * max(|A|,|B|). The curves part at the first DIFFERS or ABOVE_NOISE step; with none, they
agree, unless a step is UNRESOLVED: then the data cannot decide.

Measured margins (tests/pipelines/losses/test_calibration.py trains the twin block; scripts/demo_models.py gave the
rest), in units of eps32 * |loss|: clean torch/MindSpore pairs differ by 0-2.1 (twin block, 6 seeds x 20 steps) and
0-7.8 (demo net with conv, BatchNorm, attention and cross-entropy, 4 seeds x 20 steps); the real-difference bound is
REAL_FACTOR * NOISE_ROUNDINGS = 16, twice the worst clean step. MindSpore's tanh-GELU against torch's erf-GELU moves
step 1 by 2.8-57 (block) and 8.4-35 (demo), and by 145 or more within 20 steps: caught at step 1 in 8 of those 10
runs, at step 2 or 3 in the others.

The report holds evidence, not sentences: the verdict, a finer `Cause`, the step it is about, the next command as an
argv, and the warnings as `LossWarning`s; aligner/render/losses.py words all of them.
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.result import PassedByExitCode, check_schema, number, required_number, typed
from aligner.core.text import span
from aligner.core.tolerance import Tolerance
from aligner.pipelines.losses.parse import LossCurve, read_losses

# The tolerance is the largest difference accepted whatever the noise; the noise bound below is what usually decides.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6
DEFAULT_TOLERANCE = Tolerance(DEFAULT_RTOL, DEFAULT_ATOL, symmetric=True)
FLOAT32_EPS = float(np.finfo(np.float32).eps)  # 2**-23 = 1.19e-7: one rounding of a float32 number near 1
NOISE_ROUNDINGS = 4.0   # estimated noise sigma = 4 float32 roundings of the loss (clean step 1: 0-3.4 of them)
REAL_FACTOR = 4.0       # a difference above 4 sigma (+ the print rounding) is called real
JUMP_FACTOR = 10.0      # parting later at 10x its bound or more is a jump at that step; less, accumulated drift


class Verdict(str, enum.Enum):
    """What the comparison concludes; the string values are the JSON `verdict`."""

    AGREE = "agree"           # every step within the noise bound and the tolerance
    FORWARD = "forward"       # step 1 differs
    UPDATE = "update"         # step 1 agrees, step 2 differs
    LATER = "later"           # the curves part at a later step
    UNSTABLE = "unstable"     # agree where both are logged, but a loss becomes NaN/inf
    UNDECIDED = "undecided"   # nothing beyond the bounds, but the logs are printed too coarsely to tell


class StepStatus(str, enum.Enum):
    """One common step."""

    OK = "ok"
    UNRESOLVED = "unresolved"     # within the bounds, but the print rounding is larger than the noise bound
    ABOVE_NOISE = "above_noise"   # within the tolerance, above REAL_FACTOR x the noise: a likely real difference
    DIFFERS = "differs"           # beyond the tolerance, or NaN/inf on one side only


class Cause(str, enum.Enum):
    """The explanation the evidence supports, one finer than the Verdict (render/losses.py words each)."""

    WITHIN_BOUNDS = "within_bounds"              # AGREE
    NONFINITE_SAME_STEP = "nonfinite_same_step"  # UNSTABLE: both sides reach NaN/inf at the same step
    NONFINITE_BEYOND = "nonfinite_beyond"        # UNSTABLE: the first NaN/inf lies beyond the other log's last step
    ROUNDING = "rounding"                        # UNDECIDED: the logs' rounding hides noise-sized differences
    FORWARD = "forward"                          # FORWARD
    UPDATE = "update"                            # UPDATE: step 1 within the noise bound
    UPDATE_OR_HIDDEN = "update_or_hidden"        # UPDATE: step 1 only within the rounding (a forward difference hides)
    NONFINITE = "nonfinite"                      # LATER: a loss becomes NaN/inf at the parting step
    EPOCH_START = "epoch_start"                  # LATER: the parting step starts an epoch on one side
    DRIFT = "drift"                              # LATER: under JUMP_FACTOR x the bound: accumulated rounding?
    JUMP = "jump"                                # LATER: JUMP_FACTOR x the bound or more: something changes there


class NextAction(str, enum.Enum):
    """What to run next to find the cause."""

    COMPARE_DUMPS = "compare_dumps"   # dump the step on both sides and compare the dumps (align compare)
    DIFF_WEIGHTS = "diff_weights"     # save the weights after the step on both sides and diff them (align diff)


class Side(str, enum.Enum):
    """RUN_A or RUN_B."""

    A = "A"
    B = "B"


class WarningKind(str, enum.Enum):
    """Something the comparison could only partly see."""

    LONG_LINES = "long_lines"              # a side's log has lines over MAX_LINE characters, skipped unread
    LENGTHS_DIFFER = "lengths_differ"      # the sides log different steps: only the common ones are compared
    COARSE_PRINT = "coarse_print"          # a side prints losses more coarsely than the typical noise bound
    REPEAT_IDENTICAL = "repeat_identical"  # a side's repeat equals it on every common step: it measured no noise


class NoiseSource(str, enum.Enum):
    """Where the noise sigma comes from."""

    FLOAT32 = "float32"   # NOISE_ROUNDINGS * eps32 * |loss|
    GIVEN = "given"       # --noise X
    REPEAT = "repeat"     # measured from a second run of one side (--repeat-a / --repeat-b)


@dataclasses.dataclass(frozen=True)
class NoiseEstimate:
    """How the per-step noise was obtained (the per-step values are in `StepRow.noise`)."""

    source: NoiseSource
    factor: float = REAL_FACTOR          # a difference above factor * noise (+ rounding) is real
    given: float | None = None           # the --noise value
    repeats: tuple[str, ...] = ()        # the repeat logs measured

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "factor": self.factor, "given": self.given, "repeats": list(self.repeats)}


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One common step: both losses, their difference and the two bounds it was held to."""

    step: int
    a: float
    b: float
    abs_diff: float          # |a - b|
    rel_diff: float          # |a - b| / max(|a|, |b|)
    noise: float             # sigma at this step
    noise_bound: float       # factor * sigma + rounding
    tolerance_bound: float   # atol + rtol * max(|a|, |b|) + rounding
    status: StepStatus

    @property
    def close(self) -> bool:
        """Within both bounds (an UNRESOLVED step is close, only not provably so)."""
        return self.status in (StepStatus.OK, StepStatus.UNRESOLVED)

    @property
    def noise_ratio(self) -> float:
        """|A-B| in units of the noise sigma."""
        return self.abs_diff / self.noise if self.noise > 0 else (0.0 if self.abs_diff == 0 else float("inf"))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["close"] = self.close
        return out


@dataclasses.dataclass(frozen=True)
class NextCommand:
    """The command that looks further: `action` at `step` (the files it names are the user's to write)."""

    action: NextAction
    step: int   # COMPARE_DUMPS: the step to dump; DIFF_WEIGHTS: the step after which to save the weights

    @property
    def argv(self) -> tuple[str, ...]:
        """The command line, word by word."""
        if self.action is NextAction.COMPARE_DUMPS:
            return ("align", "compare", "dumps_ms/", "dumps_pt/")
        return ("align", "diff", f"step{self.step}_ms.ckpt", f"step{self.step}_pt.pth")

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "step": self.step, "argv": list(self.argv)}


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Why the verdict, as data: the cause, the common step it is about (its numbers are that `StepRow`'s) and what
    to run next."""

    cause: Cause
    step: int    # the parting step; UNSTABLE: the first NaN/inf step (maybe beyond the common steps); UNDECIDED: the
    #              first UNRESOLVED step; AGREE: the step closest to its noise bound
    before: int | None = None   # UPDATE/LATER: the last common step before `step`, else `step` - 1
    next_command: NextCommand | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "step": self.step, "before": self.before,
                "next_command": self.next_command.to_dict() if self.next_command else None}


@dataclasses.dataclass(frozen=True)
class LossWarning:
    """What the comparison could only partly see, on `side` (the numbers are in the report's curves and rows)."""

    kind: WarningKind
    side: Side | None = None    # None: LENGTHS_DIFFER, about both
    repeat: str | None = None   # REPEAT_IDENTICAL: the repeat's path

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "side": self.side, "repeat": self.repeat}


@dataclasses.dataclass(frozen=True)
class LossReport(PassedByExitCode):
    """Everything `align losses` reports, as data: no sentences, no printing, no files (render/losses.py words it).
    `passed` and `bool(report)` are True when the curves agree."""

    a: LossCurve
    b: LossCurve
    tolerance: Tolerance
    noise: NoiseEstimate
    steps: tuple[StepRow, ...]
    first_part: int | None     # first common step that is ABOVE_NOISE or DIFFERS
    first_nan_a: int | None    # first step whose loss is NaN/inf, over the whole curve
    first_nan_b: int | None
    verdict: Verdict
    diagnosis: Diagnosis
    warnings: tuple[LossWarning, ...]

    @property
    def exit_code(self) -> ExitCode:
        """0 when the curves agree; 1 when they part, a loss is NaN/inf, or the data cannot decide."""
        return ExitCode.OK if self.verdict is Verdict.AGREE else ExitCode.FOUND

    def to_dict(self) -> dict[str, Any]:
        """Plain data (floats may be NaN/inf), both curves whole; `--json` writes render.losses.report_json's words of
        the diagnosis and warnings in their place (and this data under `evidence`)."""
        return {
            "a": _curve_dict(self.a, self.first_nan_a),
            "b": _curve_dict(self.b, self.first_nan_b),
            "tolerance": self.tolerance.to_dict(),
            "noise": self.noise.to_dict(),
            "common_steps": len(self.steps),
            "first_part": self.first_part,
            "verdict": self.verdict,
            "diagnosis": self.diagnosis.to_dict(),
            "warnings": [warning.to_dict() for warning in self.warnings],
            "exit_code": int(self.exit_code),
            "steps": [row.to_dict() for row in self.steps],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LossReport:
        """The report `to_dict` gave, or `align losses --json` wrote (its diagnosis and warnings read from `evidence`);
        ValueError, KeyError or TypeError for data that is not one."""
        data = check_schema(data, "losses", SAVED_KEYS)
        evidence = typed(data.get("evidence", data), dict, "evidence")
        noise, diagnosis = typed(data["noise"], dict, "noise"), typed(evidence["diagnosis"], dict, "diagnosis")
        following = diagnosis["next_command"]
        a, first_nan_a = _curve_from(typed(data["a"], dict, "a"))
        b, first_nan_b = _curve_from(typed(data["b"], dict, "b"))
        return cls(a, b, Tolerance(**typed(data["tolerance"], dict, "tolerance")),
                   NoiseEstimate(NoiseSource(noise["source"]), _float(noise["factor"]), number(noise["given"]),
                                 tuple(typed(r, str, "repeat") for r in noise["repeats"])),
                   tuple(_row_from(typed(r, dict, "step")) for r in typed(data["steps"], list, "steps")),
                   _int_or_none(data["first_part"]), first_nan_a, first_nan_b, Verdict(data["verdict"]),
                   Diagnosis(Cause(diagnosis["cause"]), typed(diagnosis["step"], int, "step"),
                             _int_or_none(diagnosis["before"]),
                             None if following is None else NextCommand(NextAction(following["action"]),
                                                                         typed(following["step"], int, "step"))),
                   tuple(LossWarning(WarningKind(w["kind"]), None if w["side"] is None else Side(w["side"]),
                                     None if w["repeat"] is None else typed(w["repeat"], str, "repeat"))
                         for w in typed(evidence["warnings"], list, "warnings")))


# the keys every saved losses report holds (how `align report` tells one)
SAVED_KEYS = ("a", "b", "tolerance", "noise", "common_steps", "verdict", "steps")


def compare_losses(run_a: str | Path, run_b: str | Path, *, tolerance: Tolerance | None = None,
                   noise: float | None = None, repeat_a: str | Path | None = None, repeat_b: str | Path | None = None,
                   pattern: str | None = None, pattern_a: str | None = None,
                   pattern_b: str | None = None) -> LossReport:
    """Read two runs' logs (and optional repeats of either side) and compare them: the library form of the command.

    `pattern` applies to text logs (ignored by a CSV/JSON side); `pattern_a`/`pattern_b` override it for one side
    and must fit a text log. A repeat is read with its side's pattern.
    """
    def read(path: str | Path, own: str | None, option: str) -> LossCurve:
        return read_losses(path, own or pattern, option if own else "--pattern", require_text=own is not None)

    curve_a, curve_b = read(run_a, pattern_a, "--pattern-a"), read(run_b, pattern_b, "--pattern-b")
    if pattern is not None and "text" not in (curve_a.format, curve_b.format):
        raise AlignerError("--pattern applies to text logs, but neither RUN_A nor RUN_B is a text log")
    rep_a = read(repeat_a, pattern_a, "--pattern-a") if repeat_a is not None else None
    rep_b = read(repeat_b, pattern_b, "--pattern-b") if repeat_b is not None else None
    return compare_curves(curve_a, curve_b, tolerance, noise=noise, repeat_a=rep_a, repeat_b=rep_b)


def compare_curves(a: LossCurve, b: LossCurve, tolerance: Tolerance | None = None, *, noise: float | None = None,
                   repeat_a: LossCurve | None = None, repeat_b: LossCurve | None = None) -> LossReport:
    """Align two curves on the global steps they share, hold each step to the noise bound and the tolerance."""
    tolerance = tolerance or DEFAULT_TOLERANCE
    if noise is not None and (repeat_a is not None or repeat_b is not None):
        raise AlignerError("give --noise or --repeat-a/--repeat-b, not both: a repeat measures the noise")
    if noise is not None and not (np.isfinite(noise) and noise >= 0):
        raise AlignerError(f"--noise must be a finite number >= 0, got {noise!r}")
    steps, ia, ib = np.intersect1d(np.asarray(a.steps), np.asarray(b.steps), assume_unique=True, return_indices=True)
    if steps.size == 0:
        raise AlignerError(f"no common steps: {a.path} has steps {span(a.steps)}, {b.path} has steps {span(b.steps)}")
    la, lb = np.asarray(a.losses)[ia], np.asarray(b.losses)[ib]
    scale = np.maximum(np.abs(la), np.abs(lb))
    warnings: list[LossWarning] = []
    sigma, estimate = _noise(steps, scale, noise, ((Side.A, a, repeat_a), (Side.B, b, repeat_b)), warnings)
    rounding = (a.resolution + b.resolution) / 2
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # +-1e308 logged: |A-B| is inf
        abs_diff = np.abs(la - lb)
        rel_diff = abs_diff / np.where(scale > 0, scale, 1.0)  # 0/0 -> 0, anything with NaN -> NaN
        base = scale if tolerance.symmetric else np.abs(lb)
        tol_bound = tolerance.atol + tolerance.rtol * base + rounding
        noise_bound = estimate.factor * sigma + rounding
        same_nonfinite = ~np.isfinite(la) & ((la == lb) | (np.isnan(la) & np.isnan(lb)))
    status = [_status(d, nb, tb, rounding > estimate.factor * s, same)
              for d, nb, tb, s, same in zip(abs_diff, noise_bound, tol_bound, sigma, same_nonfinite)]
    rows = tuple(StepRow(int(s), float(x), float(y), float(d), float(r), float(n), float(nb), float(tb), st)
                 for s, x, y, d, r, n, nb, tb, st in zip(steps, la, lb, abs_diff, rel_diff, sigma, noise_bound,
                                                         tol_bound, status))
    parted = [row.step for row in rows if not row.close]
    warnings = _warnings(a, b, rows, estimate) + warnings
    return _diagnose(a, b, tolerance, estimate, rows, parted[0] if parted else None, tuple(warnings))


def _status(diff: float, noise_bound: float, tol_bound: float, hidden: bool, same_nonfinite: bool) -> StepStatus:
    """The module docstring's rule for one step (NaN differences fail every comparison: DIFFERS)."""
    if same_nonfinite:
        return StepStatus.OK
    if not diff <= tol_bound:
        return StepStatus.DIFFERS
    if diff > noise_bound:
        return StepStatus.ABOVE_NOISE
    return StepStatus.UNRESOLVED if hidden else StepStatus.OK


def _noise(steps: np.ndarray, scale: np.ndarray, given: float | None,
           sides: tuple[tuple[Side, LossCurve, LossCurve | None], ...],
           warnings: list[LossWarning]) -> tuple[np.ndarray, NoiseEstimate]:
    """Per-step sigma on the common steps, and how it was obtained."""
    with np.errstate(invalid="ignore"):
        estimate = NOISE_ROUNDINGS * FLOAT32_EPS * np.where(np.isfinite(scale), scale, 0.0)
    if given is not None:
        return np.full(steps.shape, float(given)), NoiseEstimate(NoiseSource.GIVEN, given=float(given))
    measured, paths = [], []
    for side, curve, repeat in sides:
        if repeat is None:
            continue
        paths.append(repeat.path)
        running = _repeat_noise(side, curve, repeat, steps)
        if not np.any(running > 0):  # a deterministic rerun: the float32 estimate stands
            warnings.append(LossWarning(WarningKind.REPEAT_IDENTICAL, side, repeat.path))
        measured.append(running)
    if not paths:
        return estimate, NoiseEstimate(NoiseSource.FLOAT32)
    return np.maximum(estimate, np.max(measured, axis=0)), NoiseEstimate(NoiseSource.REPEAT, repeats=tuple(paths))


def _repeat_noise(side: Side, curve: LossCurve, repeat: LossCurve, steps: np.ndarray) -> np.ndarray:
    """Running max of |X - X'| over the steps X and its repeat share, carried onto `steps` (0 before the first)."""
    shared, ic, ir = np.intersect1d(np.asarray(curve.steps), np.asarray(repeat.steps), assume_unique=True,
                                    return_indices=True)
    if shared.size == 0:
        raise AlignerError(f"--repeat-{side.value.lower()}: {repeat.path} shares no step with {curve.path}")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(np.asarray(curve.losses)[ic] - np.asarray(repeat.losses)[ir])
    running = np.maximum.accumulate(np.where(np.isfinite(diff), diff, 0.0))
    where = np.searchsorted(shared, steps, side="right") - 1  # last shared step at or before each step
    return np.where(where >= 0, running[np.clip(where, 0, None)], 0.0)


def _diagnose(a: LossCurve, b: LossCurve, tolerance: Tolerance, noise: NoiseEstimate, rows: tuple[StepRow, ...],
              k: int | None, warnings: tuple[LossWarning, ...]) -> LossReport:
    """Apply the migration guide's rule: step 1 differs -> forward; step 2 -> backward/optimizer; later -> where."""
    first_nan_a, first_nan_b = _first_nonfinite(a), _first_nonfinite(b)

    def report(verdict: Verdict, diagnosis: Diagnosis) -> LossReport:
        return LossReport(a, b, tolerance, noise, rows, k, first_nan_a, first_nan_b, verdict, diagnosis, warnings)

    if k is None:
        nan_steps = [step for step in (first_nan_a, first_nan_b) if step is not None]
        if nan_steps:
            cause = Cause.NONFINITE_SAME_STEP if first_nan_a == first_nan_b else Cause.NONFINITE_BEYOND
            step = min(nan_steps)
            return report(Verdict.UNSTABLE, Diagnosis(cause, step, None, NextCommand(NextAction.COMPARE_DUMPS, step)))
        hidden = next((row.step for row in rows if row.status is StepStatus.UNRESOLVED), None)
        if hidden is not None:
            return report(Verdict.UNDECIDED, Diagnosis(Cause.ROUNDING, hidden))
        worst = max(rows, key=lambda row: row.noise_ratio if np.isfinite(row.abs_diff) else -1.0)
        return report(Verdict.AGREE, Diagnosis(Cause.WITHIN_BOUNDS, worst.step))
    i = next(n for n, row in enumerate(rows) if row.step == k)
    if k == 1:
        return report(Verdict.FORWARD, Diagnosis(Cause.FORWARD, 1, None, NextCommand(NextAction.COMPARE_DUMPS, 1)))
    if k == 2 and rows[0].step == 1:
        cause = Cause.UPDATE_OR_HIDDEN if rows[0].status is StepStatus.UNRESOLVED else Cause.UPDATE
        return report(Verdict.UPDATE, Diagnosis(cause, 2, 1, NextCommand(NextAction.DIFF_WEIGHTS, 1)))
    row, before = rows[i], rows[i - 1].step if i else k - 1
    if not (np.isfinite(row.a) and np.isfinite(row.b)):
        return report(Verdict.LATER, Diagnosis(Cause.NONFINITE, k, before, NextCommand(NextAction.COMPARE_DUMPS, k)))
    bound = min(row.noise_bound, row.tolerance_bound)
    if k in a.epoch_starts or k in b.epoch_starts:
        cause = Cause.EPOCH_START
    elif bound > 0 and row.abs_diff / bound < JUMP_FACTOR:
        cause = Cause.DRIFT
    else:
        cause = Cause.JUMP
    return report(Verdict.LATER, Diagnosis(cause, k, before, NextCommand(NextAction.DIFF_WEIGHTS, before)))


def _warnings(a: LossCurve, b: LossCurve, rows: tuple[StepRow, ...], noise: NoiseEstimate) -> list[LossWarning]:
    """Lines too long to read, different step counts (only common steps are compared), and logs printed too coarsely
    for the noise bound."""
    sides = ((Side.A, a), (Side.B, b))
    warnings = [LossWarning(WarningKind.LONG_LINES, side) for side, curve in sides if curve.long_lines]
    if len(a.steps) != len(rows) or len(b.steps) != len(rows):
        warnings.append(LossWarning(WarningKind.LENGTHS_DIFFER))
    finite = [row.noise for row in rows if np.isfinite(row.noise)]
    typical = noise.factor * float(np.median(finite)) if finite else 0.0
    warnings += [LossWarning(WarningKind.COARSE_PRINT, side) for side, curve in sides if curve.resolution / 2 > typical]
    return warnings


def _curve_dict(curve: LossCurve, first_nan: int | None) -> dict[str, Any]:
    """The source of one side, and its whole curve (`steps`, `values`: what `align report` reads back)."""
    return {"path": curve.path, "format": curve.format, "pattern": curve.pattern, "losses": len(curve.losses),
            "first_step": curve.steps[0], "last_step": curve.steps[-1], "resolution": curve.resolution,
            "first_nan": first_nan, "long_lines_skipped": curve.long_lines, "pattern_name": curve.pattern_name,
            "first_long_line": curve.first_long_line, "epoch_starts": sorted(curve.epoch_starts),
            "steps": list(curve.steps), "values": list(curve.losses)}


def _curve_from(d: Mapping[str, Any]) -> tuple[LossCurve, int | None]:
    """A curve and its first NaN/inf step from `_curve_dict`'s dict."""
    steps = tuple(typed(s, int, "step") for s in typed(d["steps"], list, "steps"))
    values = tuple(_float(v) for v in typed(d["values"], list, "values"))
    if not steps or len(steps) != len(values):
        raise ValueError(f"a curve of {len(steps)} steps and {len(values)} losses")
    pattern, name = d["pattern"], d["pattern_name"]
    return LossCurve(typed(d["path"], str, "path"), typed(d["format"], str, "format"), steps, values,
                     _float(d["resolution"]), frozenset(typed(s, int, "epoch start") for s in d["epoch_starts"]),
                     None if pattern is None else typed(pattern, str, "pattern"),
                     None if name is None else typed(name, str, "pattern_name"),
                     typed(d["long_lines_skipped"], int, "long_lines_skipped"),
                     _int_or_none(d["first_long_line"])), _int_or_none(d["first_nan"])


def _row_from(d: Mapping[str, Any]) -> StepRow:
    """A StepRow from its dict (`close` is derived)."""
    return StepRow(typed(d["step"], int, "step"), _float(d["a"]), _float(d["b"]), _float(d["abs_diff"]),
                   _float(d["rel_diff"]), _float(d["noise"]), _float(d["noise_bound"]), _float(d["tolerance_bound"]),
                   StepStatus(d["status"]))


def _float(value: Any) -> float:
    """A float a saved report holds (NaN/inf as the strings --json writes); ValueError for anything else."""
    return required_number(value, "a number")


def _int_or_none(value: Any) -> int | None:
    return None if value is None else typed(value, int, "step")


def _first_nonfinite(curve: LossCurve) -> int | None:
    """The first global step whose loss is NaN or inf."""
    return next((step for step, loss in zip(curve.steps, curve.losses) if not np.isfinite(loss)), None)

