"""Draw both loss curves and their absolute/relative difference into an image file."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aligner.core.atomic import atomic_path
from aligner.core.errors import AlignerError
from aligner.pipelines.losses.diagnose import Comparison

SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_suffix(path: Path) -> None:
    """Refuse a file type matplotlib is not asked to write, before any work is done."""
    if path.suffix.lower() not in SUFFIXES:
        raise AlignerError(f"--plot: cannot write {path.suffix or 'a file without suffix'} "
                           f"({path.name}); use {', '.join(SUFFIXES)}")


def plot_comparison(c: Comparison, path: Path) -> None:
    """Top: both curves; bottom: |A-B| and relative difference (log scale) with the tolerance and the parting step."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    marker = "o" if max(len(c.a.steps), len(c.b.steps)) <= 50 else None
    top.plot(c.a.steps, c.a.losses, marker=marker, label=f"A: {Path(c.a.path).name}")
    top.plot(c.b.steps, c.b.losses, marker=marker, linestyle="--", label=f"B: {Path(c.b.path).name}")
    top.set_ylabel("loss")
    with np.errstate(invalid="ignore"):
        positive = lambda x: np.where(x > 0, x, np.nan)  # noqa: E731 - zeros have no place on a log axis
        bottom.semilogy(c.steps, positive(c.abs_diff), marker=marker, label="|A-B|")
        bottom.semilogy(c.steps, positive(c.rel_diff), marker=marker, label="|A-B| / max(|A|,|B|)")
    bottom.axhline(c.rtol, color="grey", linestyle=":", label=f"rtol={c.rtol:g}")
    bottom.set_xlabel("global step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("difference")
    for axis in (top, bottom):
        if c.first_part is not None:
            axis.axvline(c.first_part, color="red", linestyle="--", label=f"curves part (step {c.first_part})")
        for side, step in (("A", c.first_nan_a), ("B", c.first_nan_b)):
            if step is not None:
                axis.axvline(step, color="black", linestyle=":", label=f"{side}: first NaN/inf (step {step})")
        axis.legend(fontsize="small")
    top.set_title("Loss curves" if c.first_part is None else f"Loss curves part at step {c.first_part}")
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lower().lstrip("."))
    except OSError as exc:
        raise AlignerError(f"cannot write {path}: {exc.strerror or exc}") from exc
