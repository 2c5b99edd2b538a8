"""`align doctor`: the whole migration check in one command -- audit, weights, determinism, forward (dump, compare,
zoom-in, replay), training steps (losses, gradients, update rule) and a repro of the culprit -- as one chain of
evidence (DoctorResult)."""
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

__all__ = ["Blame", "CulpritKind", "DoctorResult", "InputSpec", "SkipReason", "Stage", "StageRun", "Status", "STAGES",
           "doctor", "parse_stages"]
