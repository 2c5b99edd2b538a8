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
        JUMP_FACTOR,
        NOISE_ROUNDINGS,
        REAL_FACTOR,
        Cause,
        Diagnosis,
        LossReport,
        LossWarning,
        NextAction,
        NextCommand,
        NoiseEstimate,
        NoiseSource,
        Side,
        StepRow,
        StepStatus,
        Verdict,
        WarningKind,
        compare_curves,
        compare_losses,
    )
    from aligner.pipelines.losses.parse import LossCurve, read_losses

# public name -> the module holding it (imported on first use)
_LAZY = {**dict.fromkeys(("DEFAULT_ATOL", "DEFAULT_RTOL", "DEFAULT_TOLERANCE", "FLOAT32_EPS", "JUMP_FACTOR",
                          "NOISE_ROUNDINGS", "REAL_FACTOR", "Cause", "Diagnosis", "LossReport", "LossWarning",
                          "NextAction", "NextCommand", "NoiseEstimate", "NoiseSource", "Side", "StepRow", "StepStatus",
                          "Verdict", "WarningKind", "compare_curves", "compare_losses"),
                         "aligner.pipelines.losses.diagnose"),
         **dict.fromkeys(("LossCurve", "read_losses"), "aligner.pipelines.losses.parse")}

__all__ = ["Cause", "DEFAULT_ATOL", "DEFAULT_RTOL", "DEFAULT_TOLERANCE", "Diagnosis", "FLOAT32_EPS",
           "JUMP_FACTOR", "LossCurve", "LossReport", "LossWarning", "NOISE_ROUNDINGS", "NextAction",
           "NextCommand", "NoiseEstimate", "NoiseSource", "REAL_FACTOR", "Side", "StepRow", "StepStatus",
           "Verdict", "WarningKind", "compare_curves", "compare_losses", "read_losses"]


__getattr__ = lazy.attributes(__name__, _LAZY)
