"""What compare's verdict says about where an error starts, as codes: each `Divergence.reason` is `Words(Say.X,
data)`, and aligner/render/words/compare.py holds the sentence of each code. Errors are the rows' error levels."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One kind of reason a record is where the error is introduced, or is not (the data each takes: its template)."""

    UNTWINNED = "untwinned"            # index, module, error, op: (type, source) of the producer or None, producer:
    #                                    its module, where: the other side's computing scope or None
    NO_UPSTREAM = "no_upstream"
    INPUTS_MATCHED = "inputs_matched"  # inputs: how many, e_in, e_out
    AMPLIFIED = "amplified"            # inputs, e_in, e_out
    CARRIED = "carried"                # module, e_in
    BETWEEN = "between"                # before, after (modules), e_in, e_out, parent
    COMPUTED_OP = "computed_op"        # index, type, source, error
    MODEL_INPUT = "model_input"        # index, error
    COMPUTED = "computed"              # index, module, error, scope, note
    NOTE_INSIDE = "note_inside"        # inside: the other side's scope, arrives: this side's
    NOTE_UNCHANGED = "note_unchanged"  # parent
    WIRED = "wired"                    # index, module, error, twin, made, caller
    HANDED = "handed"                  # index, module, error, held: the module whose output it holds or None, where,
    #                                    note, made
    AFTER_FORWARD = "after_forward"    # reason: the backward finding's own
    # why a row holds nothing to compare (evaluate.py: its `skipped`)
    NOT_STORED = "not_stored"          # sides: (side, the dump's reason) of each side that did not store it
    STATS_ONE_SIDE = "stats_one_side"
    # why a reference record has no noise floor (calibrate.py: its `not_calibrated`)
    NO_TWIN = "no_twin"
    NO_TWIN_RECORDS = "no_twin_records"  # kind, step: none of that kind and step in the float64 dump
    TWIN_SHAPE = "twin_shape"          # twin, shape
    TWIN_DTYPE = "twin_dtype"          # dtype: the twin's
    TWIN_UNREADABLE = "twin_unreadable"  # error: the reader's, in one line
    NOTHING_FINITE = "nothing_finite"
    NOISE_NOT_FINITE = "noise_not_finite"
    NOTHING_TO_MEASURE = "nothing_to_measure"
    STATS_LACKING = "stats_lacking"
