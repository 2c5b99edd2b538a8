"""Compare two loss curves step by step and turn where they part into a diagnosis with the next command to run."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aligner.core.errors import EXIT_FOUND, EXIT_OK, AlignerError
from aligner.pipelines.losses import DEFAULT_ATOL, DEFAULT_RTOL
from aligner.pipelines.losses.parse import LossCurve

VERDICTS = ("agree", "forward", "update", "later", "unstable")


@dataclass(frozen=True)
class Comparison:
    """Two curves on their common steps: losses, differences and which steps are within tolerance."""

    a: LossCurve
    b: LossCurve
    rtol: float
    atol: float
    steps: np.ndarray       # common global steps
    loss_a: np.ndarray
    loss_b: np.ndarray
    abs_diff: np.ndarray    # |a - b|
    rel_diff: np.ndarray    # |a - b| / max(|a|, |b|)
    tolerance: np.ndarray   # atol + rtol * max(|a|, |b|) + half the print resolution of each log
    close: np.ndarray       # abs_diff <= tolerance; NaN equals NaN here (NaNs are reported separately)
    first_part: int | None  # first common step that is not close
    first_nan_a: int | None  # first step whose loss is NaN or inf, over the whole curve
    first_nan_b: int | None


@dataclass(frozen=True)
class Diagnosis:
    """What the comparison means, in plain words, and the command to run next."""

    verdict: str            # one of VERDICTS
    summary: str            # one sentence
    advice: str             # why, and what to look at
    next_command: str | None
    warnings: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        """0 when the curves agree, 1 when they part (or a loss is NaN/inf)."""
        return EXIT_OK if self.verdict == "agree" else EXIT_FOUND


def compare_curves(a: LossCurve, b: LossCurve, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> Comparison:
    """Align two curves on the global steps they share and test each step: |a-b| <= atol + rtol*max(|a|,|b|)."""
    steps, ia, ib = np.intersect1d(np.asarray(a.steps), np.asarray(b.steps), assume_unique=True, return_indices=True)
    if steps.size == 0:
        raise AlignerError(f"no common steps: {a.path} has steps {_span(a.steps)}, {b.path} has steps {_span(b.steps)}")
    la, lb = np.asarray(a.losses)[ia], np.asarray(b.losses)[ib]
    scale = np.maximum(np.abs(la), np.abs(lb))
    with np.errstate(invalid="ignore", divide="ignore"):
        abs_diff = np.abs(la - lb)
        rel_diff = abs_diff / np.where(scale > 0, scale, 1.0)  # 0/0 -> 0, anything with NaN -> NaN
        tolerance = atol + rtol * scale + (a.resolution + b.resolution) / 2
        same_nonfinite = ~np.isfinite(la) & ((la == lb) | (np.isnan(la) & np.isnan(lb)))
        close = (abs_diff <= tolerance) | same_nonfinite
    parted = np.flatnonzero(~close)
    return Comparison(
        a=a, b=b, rtol=rtol, atol=atol, steps=steps, loss_a=la, loss_b=lb, abs_diff=abs_diff, rel_diff=rel_diff,
        tolerance=tolerance, close=close, first_part=int(steps[parted[0]]) if parted.size else None,
        first_nan_a=_first_nonfinite(a), first_nan_b=_first_nonfinite(b),
    )


def diagnose(c: Comparison) -> Diagnosis:
    """Apply the migration guide's rule: step 1 differs -> forward; step 2 -> backward/optimizer; later -> where."""
    warnings = _warnings(c)
    nan_note = _nan_note(c)
    k = c.first_part
    if k is None:
        if nan_note:
            step = min(s for s in (c.first_nan_a, c.first_nan_b) if s is not None)
            if c.first_nan_a == c.first_nan_b:
                why = ("Both runs reach NaN/inf at the same step: the migration reproduces an unstable training "
                       "(learning rate, loss scaling, bad data), it does not cause it.")
            else:
                why = (f"Step {step} lies beyond the other log's last step ({int(c.steps[-1])}): log that run "
                       "further to see whether it blows up too.")
            return Diagnosis(
                "unstable", f"The curves agree where both are logged, but {nan_note}.",
                f"{why} To find the first non-finite tensor, dump step {step} on both sides and compare:",
                "align compare dumps_ms/ dumps_pt/", warnings)
        return Diagnosis(
            "agree", f"The curves agree on all {c.steps.size} common steps (max relative difference "
            f"{_fmt(np.nanmax(c.rel_diff))}).", "Forward, backward and optimizer match to the tolerance.", None, warnings)
    first = int(c.steps[0])
    nan_sentence = f" Note: {nan_note}." if nan_note else ""
    if k == 1:
        return Diagnosis(
            "forward", f"Step 1 differs: the forward pass differs.{nan_sentence}",
            "Before the first update both runs hold the same weights, so a different step-1 loss means the forward "
            "computation differs (or the inputs, the initial weights or the loss function). Dump the forward pass "
            "of step 1 on both sides and find the first layer that differs:",
            "align compare dumps_ms/ dumps_pt/", warnings)
    if k == 2 and first == 1:
        return Diagnosis(
            "update", f"Step 1 agrees, step 2 differs: the backward pass or the optimizer update differs.{nan_sentence}",
            "The forward pass matches but the first update does not: compare gradients and the optimizer "
            "(learning rate and its schedule, weight decay, momentum/betas/eps, a parameter missing from the "
            "optimizer or frozen on one side, gradient clipping, loss scaling). Save the weights after step 1 on "
            "both sides and diff them; the parameters that differ point at the cause:",
            "align diff step1_ms.ckpt step1_pt.pth", warnings)
    i = int(np.searchsorted(c.steps, k))
    last_good = int(c.steps[i - 1]) if i else k - 1
    agreed = f"Steps {first}-{last_good} agree" if last_good > first else f"Step {first} agrees"
    if i == 0:
        agreed = f"The first common step ({first}) already differs"
    blows_up = not (np.isfinite(c.loss_a[i]) and np.isfinite(c.loss_b[i]))
    return Diagnosis(
        "later", f"{agreed}; the curves part at step {k}.{nan_sentence}", _later_advice(c, i, last_good),
        "align compare dumps_ms/ dumps_pt/" if blows_up else f"align diff step{last_good}_ms.ckpt step{last_good}_pt.pth",
        warnings)


def _later_advice(c: Comparison, i: int, last_good: int) -> str:
    """Explain a divergence after step 2: drift, a jump at an epoch boundary, or a jump elsewhere."""
    k, first = int(c.steps[i]), int(c.steps[0])
    parts = []
    if first > 1:
        parts.append(f"The logs start at step {first}, so the step-1/step-2 test cannot be made: log the loss of "
                     "every step from step 1 to tell a forward difference from an update difference.")
    over = c.abs_diff[i] / c.tolerance[i]
    if not (np.isfinite(c.loss_a[i]) and np.isfinite(c.loss_b[i])):
        parts.append(f"The curves part because one loss becomes NaN/inf at step {k}: usual causes are an overflow "
                     "(float16, loss scaling) or log/exp/division of 0 on that side. Dump step "
                     f"{k} on both sides and find the first non-finite tensor:")
        return " ".join(parts)
    if k in c.a.epoch_starts or k in c.b.epoch_starts:
        parts.append(f"Step {k} starts a new epoch: compare the data order (shuffling, sampler seed) and per-epoch "
                     "learning-rate schedules.")
    elif over < 10:
        parts.append(f"The difference is just over the tolerance ({_fmt(c.rel_diff[i])} relative): rounding "
                     f"differences accumulated over {k - 1} updates look like this; if the curves stay close "
                     "afterwards, a looser --rtol may be right.")
    else:
        parts.append(f"The difference jumps at step {k} ({_fmt(c.rel_diff[i])} relative): something changes at "
                     "that step on one side (learning-rate schedule or warmup end, data, loss scaling, a layer "
                     "frozen or unfrozen).")
    parts.append(f"Save the weights after step {last_good} on both sides and diff them:")
    return " ".join(parts)


def _nan_note(c: Comparison) -> str:
    """Say where each side's loss first becomes NaN/inf, or '' when neither does."""
    notes = [f"{label}'s loss is first NaN/inf at step {step}"
             for label, step in (("A", c.first_nan_a), ("B", c.first_nan_b)) if step is not None]
    if notes and (c.first_nan_a is None or c.first_nan_b is None):
        notes.append(f"{'B' if c.first_nan_b is None else 'A'}'s loss stays finite")
    return ", ".join(notes)


def _warnings(c: Comparison) -> tuple[str, ...]:
    """Different step counts (only common steps are compared) and logs printed too coarsely for the tolerance."""
    warnings = []
    if len(c.a.steps) != c.steps.size or len(c.b.steps) != c.steps.size:
        warnings.append(f"A has {len(c.a.steps)} losses (steps {_span(c.a.steps)}), B has {len(c.b.steps)} "
                        f"(steps {_span(c.b.steps)}): compared only the {c.steps.size} common steps")
    finite = np.abs(c.loss_a[np.isfinite(c.loss_a)])
    typical = c.atol + c.rtol * (float(np.median(finite)) if finite.size else 0.0)
    for label, curve in (("A", c.a), ("B", c.b)):
        if curve.resolution / 2 > typical:
            warnings.append(f"{label} prints losses rounded to {_fmt(curve.resolution)}: differences below "
                            f"{_fmt(curve.resolution / 2)} cannot be seen (the tolerance is widened by that); "
                            "log more digits")
    return tuple(warnings)


def _first_nonfinite(curve: LossCurve) -> int | None:
    """The first global step whose loss is NaN or inf."""
    return next((step for step, loss in zip(curve.steps, curve.losses) if not np.isfinite(loss)), None)


def _span(steps: tuple[int, ...] | np.ndarray) -> str:
    """'1-40' for a list of steps."""
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _fmt(x: float) -> str:
    """A short number for messages."""
    return f"{x:.3g}"
