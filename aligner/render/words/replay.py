"""Why `align replay` did not replay a call, and `assert_close`'s AssertionError in torch.testing's words (what
differs, by how much, against what was allowed; aligner/pipelines/replay/says.py names each code)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core.words import Words
from aligner.pipelines.replay.says import Say
from aligner.render.words import Template

if TYPE_CHECKING:
    from aligner.metrics.measure import Metrics


def _where(w: Words) -> str:
    types = w["type"] if w["type"] == w["type_b"] else f"{w['type']} / {w['type_b']}"
    path = repr(w["module"]) if w["module"] == w["module_b"] else f"{w['module']!r} ({w['module_b']!r})"
    return f"{path} ({types}), step {w['step']}, {w['phase']}"


def _owner(parent: str | None) -> str:
    """The module whose forward code ran between calls ("" the model itself, None the caller: model inputs)."""
    if parent is None:
        return "the caller (the model's own inputs differ)"
    return "the model's own forward" if parent == "" else repr(parent)


def _lines(m: Metrics) -> list[str]:
    index = f" at index {m.max_abs_index}" if m.max_abs_index is not None else ""
    return [f"Mismatched elements: {m.mismatched} / {m.numel} ({(m.mismatch_fraction or 0.0):.1%})",
            f"Greatest absolute difference: {m.max_abs_err:.3g}{index} (up to {m.atol:g} allowed)",
            f"Greatest relative difference: {(m.max_rel_err or 0.0):.3g} (up to {m.rtol:g} allowed)"]


def _not_close(w: Words) -> str:
    if w.code is Say.NOT_CLOSE_PARENT_CODE:
        head = [f"The input of {_where(w)} differs though no earlier module's output does: it was computed by the "
                f"code of {_owner(w['parent'])} between module calls:"]
        tail = []
    elif w.code is Say.NOT_CLOSE_LOCAL:
        head = [f"First module with its own error: {_where(w)}, replayed on the reference's inputs ({w['reference']}):"]
        tail = [] if w["inherited"] is None else \
            [f"Error carried in at its inputs: {w['inherited']:.3g} (greatest absolute difference)"]
    else:
        largest = "" if w["largest"] is None else "; the largest is {:.3g} in {!r}".format(*w["largest"])
        head = ["No module exceeds its tolerance on the reference's inputs: the error grows a little at every "
                f"layer{largest}. It first exceeds the tolerance at {_where(w)}:"]
        tail = []
    return "\n".join(["Models are not close!", "", *head, *_lines(w["metrics"]), *tail])


TEMPLATES: dict[Say, Template] = {
    Say.UNPAIRED_INPUTS: "the calls take different tensors (reference {reference}, replayed side {other}) that their "
                         "shapes do not pair",
    Say.INPUT_UNREADABLE: "the reference's input {index} could not be read",
    Say.FORWARD_RAISED: "calling it on the reference's inputs raised {error}",
    Say.OUTPUT_UNREADABLE: "the reference's recorded output could not be read",
    Say.NO_OUTPUT_PAIRS: "no output pairs with a recorded reference output",
    Say.CALLED_TWICE: "called more than once in the step: its gradients cannot be told apart by call",
    Say.BACKWARD_RAISED: "pulling gradients back through it raised {error}",
    Say.NO_GRADIENT_PAIRS: "no input gradient pairs with a recorded reference gradient",
    Say.NOT_CLOSE_PARENT_CODE: _not_close,
    Say.NOT_CLOSE_LOCAL: _not_close,
    Say.NOT_CLOSE_GROWING: _not_close,
}
