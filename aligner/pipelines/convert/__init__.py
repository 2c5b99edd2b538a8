"""`align convert`: a checkpoint's weights into the other framework's names and layout (`checkpoint.py`: the plan,
then the tensors streamed into the output), and with --optimizer the full training state (`training.py`: the
optimizer's state renamed parameter by parameter with the same plan, its step and bias-correction state filled, for
resuming at step D; `kinds.py` and `state.py` read and write each optimizer's state)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.mapping.optimizers import OptimizerKind
    from aligner.pipelines.convert.checkpoint import ConvertResult, convert, plan_conversion, state_dict_to
    from aligner.pipelines.convert.kinds import Hyper
    from aligner.pipelines.convert.training import (
        Exactness,
        OptimizerConversion,
        StateDicts,
        TrainingConvertResult,
        convert_state_dicts,
        convert_training_state,
        like_holds_optimizer,
    )

# public name -> the module holding it (imported on first use)
_CHECKPOINT, _TRAINING = "aligner.pipelines.convert.checkpoint", "aligner.pipelines.convert.training"
_LAZY = {"convert": _CHECKPOINT, "ConvertResult": _CHECKPOINT, "plan_conversion": _CHECKPOINT,
         "state_dict_to": _CHECKPOINT, "Exactness": _TRAINING, "OptimizerConversion": _TRAINING,
         "StateDicts": _TRAINING, "TrainingConvertResult": _TRAINING, "convert_state_dicts": _TRAINING,
         "convert_training_state": _TRAINING, "like_holds_optimizer": _TRAINING,
         "OptimizerKind": "aligner.mapping.optimizers", "Hyper": "aligner.pipelines.convert.kinds"}

__all__ = ["ConvertResult", "Exactness", "Hyper", "OptimizerConversion", "OptimizerKind", "StateDicts",
           "TrainingConvertResult", "convert", "convert_state_dicts", "convert_training_state", "like_holds_optimizer",
           "plan_conversion", "state_dict_to"]


__getattr__ = lazy.attributes(__name__, _LAZY)
