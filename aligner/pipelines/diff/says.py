"""What `align diff --grads` says, as codes: each finding and fix of explain.py is `Words(Say.X, data)`, and
aligner/render/words/diff.py holds the sentence of each code. Sides are named as `who` labels ('A (torch)')."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One kind of sentence of the update-rule comparison (the data each takes: its template)."""

    LOSS_SCALE = "loss_scale"                    # side, other, scale
    CLIP_BEFORE_UNSCALE = "clip_before_unscale"  # side, scale
    CLIP_BEFORE_UNSCALE_FIX = "clip_before_unscale_fix"
    CLIPPED_EVERY = "clipped_every"              # side, norms, unclipped: the other side when it does not clip
    CLIPPED_ASSUMED = "clipped_assumed"          # side, max_norm, other, unclipped
    CLIPPED_BY = "clipped_by"                    # side, max_norm, steps, unclipped
    CLIP_BOTH_FIX = "clip_both_fix"
    NO_RULE_FITS = "no_rule_fits"                # side, name, reason
    NO_RULE_FITS_FIX = "no_rule_fits_fix"
    LOSS_SCALE_NOT_REMOVED = "loss_scale_not_removed"  # side, scale, what
    LOSS_SCALE_NOT_REMOVED_FIX = "loss_scale_not_removed_fix"
    UPDATE_LR = "update_lr"                      # ratio, a, va, b, vb, what
    SAME_LR_FIX = "same_lr_fix"
    WEIGHT_DECAY = "weight_decay"                # what, decays: ((side, value), (side, value))
    WEIGHT_DECAY_FIX = "weight_decay_fix"
    OPTIMIZER = "optimizer"                      # a, fa, b, fb, what, own: the MindSpore family's catalogue words
    OWN_FORMULA = "own_formula"                  # family, why (a catalogue template), ratio, beta1, beta2
    OPTIMIZER_FIX = "optimizer_fix"
    UNEXPLAINED = "unexplained"                  # a, rule, b, what, steps
    UNEXPLAINED_FIX = "unexplained_fix"
    TERM = "term"                                # family (None: the families differ), term, a, va, b, vb, what
    SAME_TERM_FIX = "same_term_fix"              # term
    TOO_FEW_VALUES = "too_few_values"            # values: how many a parameter has (fit.py)
    NO_RULE_REPRODUCES = "no_rule_reproduces"    # closest: (the best rule's description, its misfit) or None
    # align diff's hints on two checkpoints (checkpoints.py)
    BN_MOMENTUM = "bn_momentum"                  # ratio, tensors, assumed: from a fresh layer (no --init), swapped:
    #                                              the side whose momentum is in the other convention, or None
    BN_MOMENTUM_FIX = "bn_momentum_fix"
    LR_RATIO = "lr_ratio"                        # ratio, count
    LR_RATIO_FIX = "lr_ratio_fix"
    UPDATED_ONE_SIDE = "updated_one_side"        # moved, still (the sides), names
    ONE_SIDE_FIX = "one_side_fix"                # still
