"""Why `align replay` did not replay a call, as codes: a row's `reason` is `Words(Say.X, data)` (or the text of the
dump's own error), and `assert_close`'s AssertionError text; aligner/render/words/replay.py holds the sentence of each
code."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One reason a call was not replayed, or not compared (the data each takes: its template)."""

    UNPAIRED_INPUTS = "unpaired_inputs"      # reference, other: how many tensors each side's call takes
    INPUT_UNREADABLE = "input_unreadable"    # index: the reference's input (a damaged dump)
    FORWARD_RAISED = "forward_raised"        # error: the exception, in one line
    OUTPUT_UNREADABLE = "output_unreadable"  # (a damaged dump)
    NO_OUTPUT_PAIRS = "no_output_pairs"
    CALLED_TWICE = "called_twice"
    BACKWARD_RAISED = "backward_raised"      # error
    NO_GRADIENT_PAIRS = "no_gradient_pairs"
    # assert_close's AssertionError (assertion.py); each: module, module_b, type, type_b, step, phase (the row
    # blamed) and metrics (its Metrics: mismatched, greatest differences against what was allowed)
    NOT_CLOSE_PARENT_CODE = "not_close_parent_code"  # parent: whose code ran between calls (None: the caller)
    NOT_CLOSE_LOCAL = "not_close_local"      # reference: the side replayed on; inherited: error carried in, or None
    NOT_CLOSE_GROWING = "not_close_growing"  # largest: (error, module) of the largest own error, or None
