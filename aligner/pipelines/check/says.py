"""What `align check` says, as codes: each finding's message and fix, each note, and the `aligner.watch` log line are
`Words(Say.X, data)`, and aligner/render/words/check.py holds the sentence of each code. A record is named by its
`kind`, `io` and `module` (render words it: "the output of fc1")."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One kind of sentence of the health rules, the cross-rank rules and the watch (the data each takes)."""

    # nonfinite: step, kind, io, module, type, nan, inf, numel (the first record holding NaN/Inf)
    NONFINITE_INPUT = "nonfinite_input"        # the model's input holds them
    NONFINITE_BETWEEN = "nonfinite_between"    # code between module calls computed it
    NONFINITE_OP = "nonfinite_op"              # the module's own computation
    NONFINITE_LATER = "nonfinite_later"        # later: (step, module) of the next steps' first, more: past 8 steps
    FIX_NONFINITE_DATA = "fix_nonfinite_data"
    FIX_NONFINITE_BETWEEN = "fix_nonfinite_between"  # module
    FIX_NONFINITE_OP = "fix_nonfinite_op"      # scope: the module to zoom into
    # float16 range
    FP16_OVERFLOW = "fp16_overflow"            # kind, io, module, value, times (value / 65504), limit, more
    FIX_FP16_OVERFLOW = "fix_fp16_overflow"
    FP16_UNDERFLOW = "fp16_underflow"          # hits, total, step, percent, module, tiny, subnormal (a float16 run)
    FIX_FP16_UNDERFLOW = "fix_fp16_underflow"
    # gradients by depth and over steps
    VANISHING = "vanishing"                    # first, norm, ratio, last, limit
    FIX_VANISHING = "fix_vanishing"
    DEPTH_GROWTH = "depth_growth"              # first, norm, ratio, last, limit
    NORM_NONFINITE = "norm_nonfinite"          # norm, step, then: the step it turned NaN/Inf
    NORM_GROWTH = "norm_growth"                # growth, start, start_step, norm, step
    FIX_EXPLODING = "fix_exploding"
    # updates
    FROZEN = "frozen"                          # name, step, exact
    FIX_FROZEN = "fix_frozen"
    UPDATE_LARGE = "update_large"              # step, name, ratio, limit, bound (a lower bound), count, weights
    UPDATE_SMALL = "update_small"              # step, name, ratio, limit, count, weights
    FIX_UPDATE_LARGE = "fix_update_large"
    FIX_UPDATE_SMALL = "fix_update_small"
    UPDATE_BOUND_NOTE = "update_bound_note"
    # activations
    DEAD_RELU = "dead_relu"                    # zeros, module, type
    FIX_DEAD_RELU = "fix_dead_relu"
    SATURATED = "saturated"                    # share, module, type, sigmoid
    FIX_SATURATED = "fix_saturated"
    CONSTANT = "constant"                      # module, type, value, numel
    FIX_CONSTANT = "fix_constant"
    # loss scaling
    LOSS_SCALE_OVERFLOW = "loss_scale_overflow"  # steps, first, first_step, last, last_step (scales)
    FIX_LOSS_SCALE_OVERFLOW = "fix_loss_scale_overflow"
    CLIP_BEFORE_UNSCALE = "clip_before_unscale"  # scale, step, norm, unscaled
    FIX_CLIP_BEFORE_UNSCALE = "fix_clip_before_unscale"
    GRADS_NOT_UNSCALED = "grads_not_unscaled"  # norm, step, probe, unscaled, scale
    FIX_GRADS_NOT_UNSCALED = "fix_grads_not_unscaled"
    # trends
    LOSS_NONFINITE = "loss_nonfinite"          # value, step
    FIX_LOSS_NONFINITE = "fix_loss_nonfinite"
    LOSS_SPIKE = "loss_spike"                  # step, value, best
    FIX_LOSS_SPIKE = "fix_loss_spike"
    GRADIENT_JUMP = "gradient_jump"            # name, others, step, before, after
    FIX_GRADIENT_JUMP = "fix_gradient_jump"
    # across ranks (ranks.py): who: ((rank, reference rank), ...), name, diff (inf: not comparable), names: how many
    RANK_WEIGHTS_START = "rank_weights_start"  # step, who, name, diff, names
    FIX_RANK_WEIGHTS_START = "fix_rank_weights_start"
    RANK_WEIGHTS_DRIFT = "rank_weights_drift"  # step, who, name, diff, names
    FIX_RANK_WEIGHTS_DRIFT = "fix_rank_weights_drift"
    RANK_GRADS = "rank_grads"                  # step, who, name, diff, names
    FIX_RANK_GRADS = "fix_rank_grads"
    RANK_GRADS_NOTE = "rank_grads_note"
    RANK_NONFINITE = "rank_nonfinite"          # ranks, rank, step, kind, io, module, type, nan, inf, later: ((rank,
    #                                            step, kind, io, module), ...)
    FIX_RANK_NONFINITE = "fix_rank_nonfinite"  # rank, directory
    RANKS_AS_ONE = "ranks_as_one"              # world
    # the watch's log line (watch.py)
    WATCH = "watch"                            # rule, severity, step, where, message, fix
