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
