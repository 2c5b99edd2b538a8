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

Measured margins (tests/test_losses_calibration.py trains the twin block; scripts/demo_models.py gave the rest), in
units of eps32 * |loss|: clean torch/MindSpore pairs differ by 0-2.1 (twin block, 6 seeds x 20 steps) and 0-7.8
(demo net with conv, BatchNorm, attention and cross-entropy, 4 seeds x 20 steps); the real-difference bound is
REAL_FACTOR * NOISE_ROUNDINGS = 16, twice the worst clean step. MindSpore's tanh-GELU against torch's erf-GELU moves
step 1 by 2.8-57 (block) and 8.4-35 (demo), and by 145 or more within 20 steps: caught at step 1 in 8 of those 10
runs, at step 2 or 3 in the others.
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.tolerance import Tolerance
from aligner.pipelines.losses.parse import MAX_LINE, LossCurve, read_losses

# The tolerance is the largest difference accepted whatever the noise; the noise bound below is what usually decides.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6
DEFAULT_TOLERANCE = Tolerance(DEFAULT_RTOL, DEFAULT_ATOL, symmetric=True)
FLOAT32_EPS = float(np.finfo(np.float32).eps)  # 2**-23 = 1.19e-7: one rounding of a float32 number near 1
NOISE_ROUNDINGS = 4.0   # estimated noise sigma = 4 float32 roundings of the loss (clean step 1: 0-3.4 of them)
REAL_FACTOR = 4.0       # a difference above 4 sigma (+ the print rounding) is called real


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

    @property
    def name(self) -> str:
        """In words, for messages: 'estimated float32 noise', 'given noise', 'measured run-to-run noise'."""
        return {NoiseSource.FLOAT32: "estimated float32 noise", NoiseSource.GIVEN: "given noise (--noise)",
                NoiseSource.REPEAT: "measured run-to-run noise"}[self.source]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "factor": self.factor, "given": self.given, "repeats": list(self.repeats),
                "rule": _NOISE_RULES[self.source]}


_NOISE_RULES = {
    NoiseSource.FLOAT32: f"{NOISE_ROUNDINGS:g} * eps32 * max(|A|,|B|)",
    NoiseSource.GIVEN: "the --noise value at every step",
    NoiseSource.REPEAT: "running max of |X - repeat of X| up to the step, at least the float32 estimate",
}


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
class LossReport:
    """Everything `align losses` reports; no printing, no files. `bool(report)` is True when the curves agree."""

    a: LossCurve
    b: LossCurve
    tolerance: Tolerance
    noise: NoiseEstimate
    steps: tuple[StepRow, ...]
    first_part: int | None     # first common step that is ABOVE_NOISE or DIFFERS
    first_nan_a: int | None    # first step whose loss is NaN/inf, over the whole curve
    first_nan_b: int | None
    verdict: Verdict
    summary: str               # one sentence
    advice: str                # why, and what to look at
    next_command: str | None
    warnings: tuple[str, ...]

    @property
    def exit_code(self) -> ExitCode:
        """0 when the curves agree; 1 when they part, a loss is NaN/inf, or the data cannot decide."""
        return ExitCode.OK if self.verdict is Verdict.AGREE else ExitCode.FOUND

    def __bool__(self) -> bool:
        return self.verdict is Verdict.AGREE

    def to_dict(self) -> dict[str, Any]:
        """Plain data (floats may be NaN/inf: write it with render.jsonout, which makes them strings)."""
        return {
            "a": _curve_dict(self.a, self.first_nan_a),
            "b": _curve_dict(self.b, self.first_nan_b),
            "tolerance": self.tolerance.to_dict(),
            "noise": self.noise.to_dict(),
            "common_steps": len(self.steps),
            "first_part": self.first_part,
            "verdict": self.verdict,
            "summary": self.summary,
            "advice": self.advice,
            "next_command": self.next_command,
            "warnings": list(self.warnings),
            "exit_code": int(self.exit_code),
            "steps": [row.to_dict() for row in self.steps],
        }


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
        raise AlignerError(f"no common steps: {a.path} has steps {_span(a.steps)}, {b.path} has steps {_span(b.steps)}")
    la, lb = np.asarray(a.losses)[ia], np.asarray(b.losses)[ib]
    scale = np.maximum(np.abs(la), np.abs(lb))
    warnings: list[str] = []
    sigma, estimate = _noise(steps, scale, noise, (("A", a, repeat_a), ("B", b, repeat_b)), warnings)
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
           sides: tuple[tuple[str, LossCurve, LossCurve | None], ...],
           warnings: list[str]) -> tuple[np.ndarray, NoiseEstimate]:
    """Per-step sigma on the common steps, and how it was obtained."""
    with np.errstate(invalid="ignore"):
        estimate = NOISE_ROUNDINGS * FLOAT32_EPS * np.where(np.isfinite(scale), scale, 0.0)
    if given is not None:
        return np.full(steps.shape, float(given)), NoiseEstimate(NoiseSource.GIVEN, given=float(given))
    measured, paths = [], []
    for label, curve, repeat in sides:
        if repeat is None:
            continue
        paths.append(repeat.path)
        running = _repeat_noise(label, curve, repeat, steps)
        if not np.any(running > 0):
            warnings.append(f"the repeat of {label} ({repeat.path}) is identical to {label} on every common step: "
                            "a deterministic rerun measures no noise, so the float32 estimate is used (a rerun with "
                            "another thread count, device or kernel choice measures it)")
        measured.append(running)
    if not paths:
        return estimate, NoiseEstimate(NoiseSource.FLOAT32)
    return np.maximum(estimate, np.max(measured, axis=0)), NoiseEstimate(NoiseSource.REPEAT, repeats=tuple(paths))


def _repeat_noise(label: str, curve: LossCurve, repeat: LossCurve, steps: np.ndarray) -> np.ndarray:
    """Running max of |X - X'| over the steps X and its repeat share, carried onto `steps` (0 before the first)."""
    shared, ic, ir = np.intersect1d(np.asarray(curve.steps), np.asarray(repeat.steps), assume_unique=True,
                                    return_indices=True)
    if shared.size == 0:
        raise AlignerError(f"--repeat-{label.lower()}: {repeat.path} shares no step with {curve.path}")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(np.asarray(curve.losses)[ic] - np.asarray(repeat.losses)[ir])
    running = np.maximum.accumulate(np.where(np.isfinite(diff), diff, 0.0))
    where = np.searchsorted(shared, steps, side="right") - 1  # last shared step at or before each step
    return np.where(where >= 0, running[np.clip(where, 0, None)], 0.0)


def _diagnose(a: LossCurve, b: LossCurve, tolerance: Tolerance, noise: NoiseEstimate, rows: tuple[StepRow, ...],
              k: int | None, warnings: tuple[str, ...]) -> LossReport:
    """Apply the migration guide's rule: step 1 differs -> forward; step 2 -> backward/optimizer; later -> where."""
    first_nan_a, first_nan_b = _first_nonfinite(a), _first_nonfinite(b)
    nan_note = _nan_note(first_nan_a, first_nan_b)

    def report(verdict: Verdict, summary: str, advice: str, next_command: str | None) -> LossReport:
        return LossReport(a, b, tolerance, noise, rows, k, first_nan_a, first_nan_b, verdict, summary, advice,
                          next_command, warnings)

    if k is None:
        if nan_note:
            step = min(s for s in (first_nan_a, first_nan_b) if s is not None)
            if first_nan_a == first_nan_b:
                why = ("Both runs reach NaN/inf at the same step: the migration reproduces an unstable training "
                       "(learning rate, loss scaling, bad data), it does not cause it.")
            else:
                why = (f"Step {step} lies beyond the other log's last step ({rows[-1].step}): log that run "
                       "further to see whether it blows up too.")
            return report(Verdict.UNSTABLE, f"The curves agree where both are logged, but {nan_note}.",
                          f"{why} To find the first non-finite tensor, dump step {step} on both sides and compare:",
                          "align compare dumps_ms/ dumps_pt/")
        hidden = [row for row in rows if row.status is StepStatus.UNRESOLVED]
        if hidden:
            return report(Verdict.UNDECIDED, _undecided_summary(a, b, noise, rows, hidden),
                          "No step differs by more than the rounding of the logs, but the rounding is larger than "
                          "the smallest difference that would be a real one, so a small bug (an approximate GELU, a "
                          "LayerNorm epsilon, a small weight decay) would look the same. Log the loss with more "
                          "digits (Python's repr of the float, or '%.8g'); if you know the noise is larger than "
                          "the float32 estimate, pass --noise or a rerun of one side with --repeat-a.", None)
        worst = max(rows, key=lambda row: row.noise_ratio if np.isfinite(row.abs_diff) else -1.0)
        return report(Verdict.AGREE, f"The curves agree on all {len(rows)} common steps (max relative difference "
                      f"{_fmt(np.nanmax([row.rel_diff for row in rows]))}, at most {_fmt(worst.noise_ratio)}x the "
                      f"{noise.name}).", "Forward, backward and optimizer match to within "
                      f"{noise.factor:g}x the {noise.name} and the tolerance, {tolerance}.", None)
    i = next(n for n, row in enumerate(rows) if row.step == k)
    first = rows[0].step
    tail = f" {_evidence(rows[i], tolerance, noise)}" + (f" Note: {nan_note}." if nan_note else "")
    if k == 1:
        return report(Verdict.FORWARD, f"Step 1 differs: the forward pass differs.{tail}",
                      "Before the first update both runs hold the same weights, so a different step-1 loss means "
                      "the forward computation differs (or the inputs, the initial weights or the loss function). "
                      "Dump the forward pass of step 1 on both sides and find the first layer that differs:",
                      "align compare dumps_ms/ dumps_pt/")
    if k == 2 and first == 1:
        if rows[0].status is StepStatus.UNRESOLVED:
            head = ("Step 1 is within the rounding of the logs, step 2 differs: the backward pass or the optimizer "
                    "update differs, or the forward pass by less than the rounding lets step 1 show.")
        else:
            head = "Step 1 agrees, step 2 differs: the backward pass or the optimizer update differs."
        return report(Verdict.UPDATE, f"{head}{tail}",
                      "The forward pass matches but the first update does not: compare gradients and the optimizer "
                      "(learning rate and its schedule, weight decay, momentum/betas/eps, a parameter missing from "
                      "the optimizer or frozen on one side, gradient clipping, loss scaling). Save the weights after "
                      "step 1 on both sides and diff them; the parameters that differ point at the cause:",
                      "align diff step1_ms.ckpt step1_pt.pth")
    last_good = rows[i - 1].step if i else k - 1
    agreed = f"Steps {first}-{last_good} agree" if last_good > first else f"Step {first} agrees"
    if i == 0:
        agreed = f"The first common step ({first}) already differs"
    row = rows[i]
    blows_up = not (np.isfinite(row.a) and np.isfinite(row.b))
    return report(Verdict.LATER, f"{agreed}; the curves part at step {k}.{tail}",
                  _later_advice(a, b, rows, i, noise),
                  "align compare dumps_ms/ dumps_pt/" if blows_up
                  else f"align diff step{last_good}_ms.ckpt step{last_good}_pt.pth")


def _evidence(row: StepRow, tolerance: Tolerance, noise: NoiseEstimate) -> str:
    """'The difference at step 1 is 1.2e-05, 47x the estimated float32 noise of 2.6e-07: likely a real ...'."""
    if not (np.isfinite(row.a) and np.isfinite(row.b)):
        return ""
    ratio = f"{_fmt(row.noise_ratio)}x the {noise.name} of {_fmt(row.noise)}"
    if row.status is StepStatus.ABOVE_NOISE:
        return (f"The difference at step {row.step} is {_fmt(row.abs_diff)}, {ratio}: likely a real difference, "
                f"although within the tolerance, {tolerance}.")
    return (f"The difference at step {row.step} is {_fmt(row.abs_diff)} ({_fmt(row.rel_diff)} relative, {ratio}), "
            f"beyond the tolerance, {tolerance}.")


def _undecided_summary(a: LossCurve, b: LossCurve, noise: NoiseEstimate, rows: tuple[StepRow, ...],
                       hidden: list[StepRow]) -> str:
    """'Cannot decide: B prints 4 decimals, so differences below 5e-05 are invisible ...'."""
    coarse = [f"{label} prints losses rounded to {_fmt(c.resolution)}" for label, c in (("A", a), ("B", b))
              if c.resolution > 0]
    row = hidden[0]
    rounding = row.noise_bound - noise.factor * row.noise
    where = "every common step" if len(hidden) == len(rows) else f"{len(hidden)} of {len(rows)} common steps"
    return (f"Cannot decide: {' and '.join(coarse)}, so differences below {_fmt(rounding)} are invisible, while a real "
            f"difference can be as small as {_fmt(noise.factor * row.noise)} ({noise.factor:g}x the {noise.name} "
            f"of {_fmt(row.noise)} at step {row.step}); this holds at {where}.")


def _later_advice(a: LossCurve, b: LossCurve, rows: tuple[StepRow, ...], i: int, noise: NoiseEstimate) -> str:
    """Explain a divergence after step 2: drift, a jump at an epoch boundary, or a jump elsewhere."""
    row, first = rows[i], rows[0].step
    k = row.step
    parts = []
    if first > 1:
        parts.append(f"The logs start at step {first}, so the step-1/step-2 test cannot be made: log the loss of "
                     "every step from step 1 to tell a forward difference from an update difference.")
    if not (np.isfinite(row.a) and np.isfinite(row.b)):
        parts.append(f"The curves part because one loss becomes NaN/inf at step {k}: usual causes are an overflow "
                     "(float16, loss scaling) or log/exp/division of 0 on that side. Dump step "
                     f"{k} on both sides and find the first non-finite tensor:")
        return " ".join(parts)
    over = row.abs_diff / min(row.noise_bound, row.tolerance_bound) if min(row.noise_bound, row.tolerance_bound) > 0 \
        else float("inf")
    if k in a.epoch_starts or k in b.epoch_starts:
        parts.append(f"Step {k} starts a new epoch: compare the data order (shuffling, sampler seed) and per-epoch "
                     "learning-rate schedules.")
    elif over < 10:
        parts.append(f"The difference is just over the bound ({_fmt(row.rel_diff)} relative): rounding differences "
                     f"accumulated over {k - 1} updates can look like this, and the "
                     f"{noise.name} does not model how noise grows through training; measure it with a rerun of "
                     "one side (--repeat-a) or give --noise, and if the curves stay close afterwards, a looser "
                     "bound may be right.")
    else:
        parts.append(f"The difference jumps at step {k} ({_fmt(row.rel_diff)} relative): something changes at "
                     "that step on one side (learning-rate schedule or warmup end, data, loss scaling, a layer "
                     "frozen or unfrozen).")
    last_good = rows[i - 1].step if i else k - 1
    parts.append(f"Save the weights after step {last_good} on both sides and diff them:")
    return " ".join(parts)


def _nan_note(first_nan_a: int | None, first_nan_b: int | None) -> str:
    """Say where each side's loss first becomes NaN/inf, or '' when neither does."""
    notes = [f"{label}'s loss is first NaN/inf at step {step}"
             for label, step in (("A", first_nan_a), ("B", first_nan_b)) if step is not None]
    if notes and (first_nan_a is None or first_nan_b is None):
        notes.append(f"{'B' if first_nan_b is None else 'A'}'s loss stays finite")
    return ", ".join(notes)


def _warnings(a: LossCurve, b: LossCurve, rows: tuple[StepRow, ...], noise: NoiseEstimate) -> list[str]:
    """Different step counts (only common steps are compared), lines too long to read, and logs printed too coarsely
    for the noise bound."""
    warnings = []
    for label, curve in (("A", a), ("B", b)):
        if curve.long_lines:
            warnings.append(f"{label} ({curve.path}): skipped {curve.long_lines} line(s) longer than "
                            f"{MAX_LINE} characters (first: line {curve.first_long_line}); no log line is that long")
    if len(a.steps) != len(rows) or len(b.steps) != len(rows):
        warnings.append(f"A has {len(a.steps)} losses (steps {_span(a.steps)}), B has {len(b.steps)} "
                        f"(steps {_span(b.steps)}): compared only the {len(rows)} common steps")
    finite = [row.noise for row in rows if np.isfinite(row.noise)]
    typical = noise.factor * float(np.median(finite)) if finite else 0.0
    for label, curve in (("A", a), ("B", b)):
        if curve.resolution / 2 > typical:
            warnings.append(f"{label} prints losses rounded to {_fmt(curve.resolution)}: differences below "
                            f"{_fmt(curve.resolution / 2)} cannot be seen (the bounds are widened by that); "
                            "log more digits")
    return warnings


def _curve_dict(curve: LossCurve, first_nan: int | None) -> dict[str, Any]:
    """The source of one side."""
    return {"path": curve.path, "format": curve.format, "pattern": curve.pattern, "losses": len(curve.losses),
            "first_step": curve.steps[0], "last_step": curve.steps[-1], "resolution": curve.resolution,
            "first_nan": first_nan, "long_lines_skipped": curve.long_lines}


def _first_nonfinite(curve: LossCurve) -> int | None:
    """The first global step whose loss is NaN or inf."""
    return next((step for step, loss in zip(curve.steps, curve.losses) if not np.isfinite(loss)), None)


def _span(steps: tuple[int, ...] | np.ndarray) -> str:
    """'1-40' for a list of steps."""
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _fmt(x: float) -> str:
    """A short number for messages."""
    return f"{x:.3g}"
