"""Draw both loss curves and their absolute/relative difference into an image file."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aligner.core.atomic import atomic_path
from aligner.core.errors import AlignerError
from aligner.core.text import printable
from aligner.pipelines.losses import LossReport

SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_suffix(path: Path) -> None:
    """Refuse a file type matplotlib is not asked to write, before any work is done."""
    if path.suffix.lower() not in SUFFIXES:
        raise AlignerError(f"--plot: cannot write {path.suffix or 'a file without suffix'} "
                           f"({path.name}); use {', '.join(SUFFIXES)}")


def plot_report(report: LossReport, path: Path) -> None:
    """Top: both curves; bottom: |A-B|, the noise bound and the relative difference (log scale), the parting step.
    The legend names the loss files as plain text (no mathtext, no TeX, control characters escaped)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.ticker import MaxNLocator

    a, b, part = report.a, report.b, report.first_part
    steps = np.array([row.step for row in report.steps])
    abs_diff = np.array([row.abs_diff for row in report.steps])
    rel_diff = np.array([row.rel_diff for row in report.steps])
    noise_bound = np.array([row.noise_bound for row in report.steps])
    fig = Figure(figsize=(8, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    marker = "o" if max(len(a.steps), len(b.steps)) <= 50 else None
    top.plot(a.steps, a.losses, marker=marker, label=f"A: {printable(Path(a.path).name)}")
    top.plot(b.steps, b.losses, marker=marker, linestyle="--", label=f"B: {printable(Path(b.path).name)}")
    top.set_ylabel("loss")
    with np.errstate(invalid="ignore"):
        positive = lambda x: np.where(x > 0, x, np.nan)  # noqa: E731 - zeros have no place on a log axis
        bottom.semilogy(steps, positive(abs_diff), marker=marker, label="|A-B|")
        bottom.semilogy(steps, positive(noise_bound), color="grey", linestyle="-.",
                        label=f"noise bound ({report.noise.factor:g} sigma + rounding)")
        bottom.semilogy(steps, positive(rel_diff), marker=marker, label="|A-B| / max(|A|,|B|)")
    bottom.axhline(report.tolerance.rtol, color="grey", linestyle=":", label=f"rtol={report.tolerance.rtol:g}")
    bottom.set_xlabel("global step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("difference")
    for axis in (top, bottom):
        if part is not None:
            axis.axvline(part, color="red", linestyle="--", label=f"curves part (step {part})")
        for side, step in (("A", report.first_nan_a), ("B", report.first_nan_b)):
            if step is not None:
                axis.axvline(step, color="black", linestyle=":", label=f"{side}: first NaN/inf (step {step})")
        for text in axis.legend(fontsize="small").get_texts():  # file names are data: `$...$` is no mathtext
            text.set_parse_math(False)
            text.set_usetex(False)
    top.set_title("Loss curves" if part is None else f"Loss curves part at step {part}")
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lower().lstrip("."))
    except OSError as exc:
        raise AlignerError(f"cannot write {path}: {exc.strerror or exc}") from exc
