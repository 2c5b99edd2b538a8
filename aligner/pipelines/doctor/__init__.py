"""`align doctor`: the whole migration check in one command -- audit, weights, determinism, forward (dump, compare,
zoom-in, replay), training steps (losses, gradients, update rule) and a repro of the culprit -- as one chain of
evidence (DoctorResult)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.doctor.result import (
        Blame,
        CulpritKind,
        DoctorResult,
        InputSpec,
        SkipReason,
        Stage,
        StageRun,
        Status,
    )
    from aligner.pipelines.doctor.run import STAGES, doctor, parse_stages

# public name -> the module holding it (imported on first use)
_RESULT = "aligner.pipelines.doctor.result"
_RUN = "aligner.pipelines.doctor.run"
_LAZY = {"Blame": _RESULT, "CulpritKind": _RESULT, "DoctorResult": _RESULT, "InputSpec": _RESULT,
         "SkipReason": _RESULT, "Stage": _RESULT, "StageRun": _RESULT, "Status": _RESULT,
         "STAGES": _RUN, "doctor": _RUN, "parse_stages": _RUN}

__all__ = ["Blame", "CulpritKind", "DoctorResult", "InputSpec", "SkipReason", "Stage", "StageRun", "Status", "STAGES",
           "doctor", "parse_stages"]


__getattr__ = lazy.attributes(__name__, _LAZY)
