"""Optimizer state across frameworks: full training checkpoints (model + optimizer) for resuming at step D."""
from __future__ import annotations

from aligner.pipelines.optim.convert import (
                                             Exactness,
                                             OptimizerConversion,
                                             StateDicts,
                                             TrainingConvertResult,
                                             convert_state_dicts,
                                             convert_training_state,
                                             like_holds_optimizer,
)
from aligner.pipelines.optim.kinds import Hyper, OptimizerKind

__all__ = ["Exactness", "Hyper", "OptimizerConversion", "OptimizerKind", "StateDicts", "TrainingConvertResult",
           "convert_state_dicts", "convert_training_state", "like_holds_optimizer"]
