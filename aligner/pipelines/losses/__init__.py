"""Loss-curve comparison: read training logs, compare them step by step, diagnose where they part.

`compare_losses(run_a, run_b, ...) -> LossReport` is the library form of `align losses`; `compare_curves` does the
same on already-read `LossCurve`s. The agreement rule and its measured margins are in `diagnose`'s docstring.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
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

# public name -> the module holding it (imported on first use)
_LAZY = {"DEFAULT_ATOL": "aligner.pipelines.losses.diagnose", "DEFAULT_RTOL": "aligner.pipelines.losses.diagnose",
         "DEFAULT_TOLERANCE": "aligner.pipelines.losses.diagnose", "FLOAT32_EPS": "aligner.pipelines.losses.diagnose",
         "NOISE_ROUNDINGS": "aligner.pipelines.losses.diagnose", "REAL_FACTOR": "aligner.pipelines.losses.diagnose",
         "LossReport": "aligner.pipelines.losses.diagnose", "NoiseEstimate": "aligner.pipelines.losses.diagnose",
         "NoiseSource": "aligner.pipelines.losses.diagnose", "StepRow": "aligner.pipelines.losses.diagnose",
         "StepStatus": "aligner.pipelines.losses.diagnose", "Verdict": "aligner.pipelines.losses.diagnose",
         "compare_curves": "aligner.pipelines.losses.diagnose", "compare_losses": "aligner.pipelines.losses.diagnose",
         "LossCurve": "aligner.pipelines.losses.parse", "read_losses": "aligner.pipelines.losses.parse"}

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "DEFAULT_TOLERANCE", "FLOAT32_EPS", "LossCurve", "LossReport",
           "NOISE_ROUNDINGS", "NoiseEstimate", "NoiseSource", "REAL_FACTOR", "StepRow", "StepStatus", "Verdict",
           "compare_curves", "compare_losses", "read_losses"]


__getattr__ = lazy.attributes(__name__, _LAZY)
