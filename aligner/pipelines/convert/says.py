"""What `align convert` notes, as codes: each note of a conversion (the plan's and the optimizer state's) is
`Words(Say.X, data)`, and aligner/render/words/convert.py holds the sentence of each code."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One kind of note of a checkpoint or training-state conversion (the data each takes: its template)."""

    # the model's plan (checkpoint.py)
    MAP_REVERSED = "map_reversed"            # map, like, source: the three paths
    # the optimizer state read (state.py, training.py)
    GROUPS_DIFFER = "groups_differ"          # key, values: the first groups' values of a hyperparameter
    STEPS_DIFFER = "steps_differ"            # steps: the parameters' step counts
    NO_STATE_YET = "no_state_yet"            # count, names: parameters never updated
    LR_SCHEDULE = "lr_schedule"              # size, step: a per-step learning rate
    SCHEDULER_KEPT_OUT = "scheduler_kept_out"  # key: an LR scheduler's entry in the checkpoint
    STATE_READ_FROM = "state_read_from"      # key: the checkpoint's optimizer entry
    LEGACY = "legacy"                        # why: the catalogue's note of a legacy MindSpore cell
    # the conversion (training.py)
    STATE_DROPPED = "state_dropped"          # count, names: state with no place in the target
    BETAS_READ = "betas_read"                # betas: read back from the beta powers
    STEP_DIFFERS = "step_differs"            # checkpoint, optimizer, used: three step counts
    TORCH_DEFAULTS = "torch_defaults"        # names: hyperparameters written as torch's defaults
    TORCH_ORDER = "torch_order"              # count: parameters the target model must list in order
    CONSTRUCT = "construct"                  # cls, args: the MindSpore cell and its constructor arguments
