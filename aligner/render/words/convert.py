"""The notes of `align convert` and `align convert --optimizer` (codes: pipelines/convert/says.py)."""
from __future__ import annotations

from aligner.pipelines.convert.says import Say
from aligner.render.words import Template

TEMPLATES: dict[Say, Template] = {
    Say.MAP_REVERSED: "{map} names {like}'s tensors as its sources and {source}'s as its targets (a --save-map of "
                      "the other direction): applied in reverse",
    Say.GROUPS_DIFFER: "param groups differ in {key} ({values!j}): the first group's is recorded; set the others when "
                       "constructing the target optimizer",
    Say.STEPS_DIFFER: "parameters have different step counts ({steps!j}): the largest is used",
    Say.NO_STATE_YET: "{count} parameter(s) have no optimizer state yet (never updated), written as zeros: {names!j}",
    Say.LR_SCHEDULE: "learning_rate is a schedule of {size} values: recorded the one of step {step}",
    Say.SCHEDULER_KEPT_OUT: "{key!r} (LR scheduler state) not converted: recreate the schedule in the target and set "
                            "its step",
    Say.STATE_READ_FROM: "optimizer state read from {key!r}; its positions named by the model's parameters in "
                         "state_dict order minus buffers (named_parameters() order)",
    Say.LEGACY: "legacy optimizer: {why}",
    Say.STATE_DROPPED: "optimizer state of {count} parameter(s) with no place in the target dropped: {names!j}",
    Say.BETAS_READ: "betas {betas} read back from beta1_power/beta2_power and global_step (--betas to set)",
    Say.STEP_DIFFERS: "the checkpoint's step {checkpoint} differs from the optimizer's {optimizer}: used {used}",
    Say.TORCH_DEFAULTS: "not recorded in the source, written as torch's defaults: {names!j} (torch's load_state_dict "
                        "replaces the optimizer's own values with these: pass the options to set them)",
    Say.TORCH_ORDER: "torch numbers the state by position: the target model's named_parameters() must list {count} "
                     "parameters in this file's model order",
    Say.CONSTRUCT: "construct {cls} with {args} (hyperparameters are constructor arguments in MindSpore, not "
                   "checkpoint entries)",
}
