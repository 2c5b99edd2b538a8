"""Loss-curve comparison: read training logs, compare them step by step, diagnose where they part.

`compare_losses(run_a, run_b, ...) -> LossReport` is the library form of `align losses`; `compare_curves` does the
same on already-read `LossCurve`s. The agreement rule and its measured margins are in `diagnose`'s docstring.
"""
from aligner.pipelines.losses.diagnose import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    DEFAULT_TOLERANCE,
    FLOAT32_EPS,
    NOISE_ROUNDINGS,
    REAL_FACTOR,
    LossReport,
    NoiseEstimate,
    NoiseSource,
    StepRow,
    StepStatus,
    Verdict,
    compare_curves,
    compare_losses,
)
from aligner.pipelines.losses.parse import LossCurve, read_losses

__all__ = [
    "DEFAULT_ATOL", "DEFAULT_RTOL", "DEFAULT_TOLERANCE", "FLOAT32_EPS", "NOISE_ROUNDINGS", "REAL_FACTOR", "LossCurve",
    "LossReport", "NoiseEstimate", "NoiseSource", "StepRow", "StepStatus", "Verdict", "compare_curves",
    "compare_losses", "read_losses",
]
