"""`aligner.assert_close(model_a, model_b, inputs)`: a replay for a user's own test suite, silent when the models
agree, else an AssertionError in torch.testing's words (what differs, by how much, against what was allowed)."""
from __future__ import annotations

from typing import Any

from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.metrics.measure import Metrics
from aligner.pipelines.replay.result import ReplayResult, ReplayRow, ReplayVerdict
from aligner.pipelines.replay.run import replay


def assert_close(model_a: Any, model_b: Any, inputs: Any, *, rtol: float | None = None, atol: float | None = None,
                 backward: bool = False, ref: str | None = None, modules: str | None = None) -> ReplayResult:
    """Raise AssertionError naming the first module with its own error (replayed on the reference's inputs) or, when
    every module agrees on its own but the runs do not, where the accumulated error first exceeds the tolerance.

    rtol/atol: both or neither, as torch.testing (default: per dtype). Returns the replay when all match."""
    tolerance = ToleranceSpec(Tolerance.of(rtol, atol))
    result = replay(model_a, model_b, inputs, backward=backward, ref=ref, modules=modules, tolerance=tolerance)
    if result.verdict is ReplayVerdict.MATCH:
        return result
    raise AssertionError(failure_message(result))


def _where(row: ReplayRow) -> str:
    types = row.type if row.type == row.type_b else f"{row.type} / {row.type_b}"
    path = repr(row.module) if row.module == row.module_b else f"{row.module!r} ({row.module_b!r})"
    return f"{path} ({types}), step {row.step}, {row.phase}"


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


def failure_message(result: ReplayResult) -> str:
    """The AssertionError text: torch.testing's lines for the module to blame, then its inherited error."""
    if result.verdict is ReplayVerdict.PARENT_CODE and result.parent_code is not None:
        row = result.rows[result.parent_code]
        assert row.inherited is not None
        return "\n".join(["Models are not close!", "", f"The input of {_where(row)} differs though no earlier module's "
                          f"output does: it was computed by the code of {_owner(row.parent)} between module calls:",
                          *_lines(row.inherited)])
    if result.culprit is not None:
        row = result.rows[result.culprit]
        assert row.local is not None
        lines = ["Models are not close!", "",
                 f"First module with its own error: {_where(row)}, replayed on the reference's inputs "
                 f"({result.reference}):", *_lines(row.local)]
        inherited = row.inherited.max_abs_err if row.inherited is not None else None
        if inherited is not None:
            lines.append(f"Error carried in at its inputs: {inherited:.3g} (greatest absolute difference)")
        return "\n".join(lines)
    first = result.first_total
    assert first is not None
    row = result.rows[first]
    assert row.total is not None
    worst = result.largest_local
    local = result.rows[worst].local if worst is not None else None
    largest = f"; the largest is {local.max_abs_err:.3g} in {result.rows[worst].module!r}" \
        if local is not None and worst is not None else ""
    return "\n".join(["Models are not close!", "",
                      "No module exceeds its tolerance on the reference's inputs: the error grows a little at every "
                      f"layer{largest}. It first exceeds the tolerance at {_where(row)}:", *_lines(row.total)])
