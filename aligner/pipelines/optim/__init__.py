"""Optimizer state across frameworks: full training checkpoints (model + optimizer) for resuming at step D."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.mapping.optimizers import OptimizerKind
    from aligner.pipelines.optim.convert import (
        Exactness,
        OptimizerConversion,
        StateDicts,
        TrainingConvertResult,
        convert_state_dicts,
        convert_training_state,
        like_holds_optimizer,
    )
    from aligner.pipelines.optim.kinds import Hyper

# public name -> the module holding it (imported on first use)
_LAZY = {"Exactness": "aligner.pipelines.optim.convert", "OptimizerConversion": "aligner.pipelines.optim.convert",
         "StateDicts": "aligner.pipelines.optim.convert", "TrainingConvertResult": "aligner.pipelines.optim.convert",
         "convert_state_dicts": "aligner.pipelines.optim.convert",
         "convert_training_state": "aligner.pipelines.optim.convert",
         "like_holds_optimizer": "aligner.pipelines.optim.convert", "OptimizerKind": "aligner.mapping.optimizers",
         "Hyper": "aligner.pipelines.optim.kinds"}

__all__ = ["Exactness", "Hyper", "OptimizerConversion", "OptimizerKind", "StateDicts", "TrainingConvertResult",
           "convert_state_dicts", "convert_training_state", "like_holds_optimizer"]


__getattr__ = lazy.attributes(__name__, _LAZY)
