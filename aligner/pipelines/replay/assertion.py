"""`aligner.assert_close(model_a, model_b, inputs)`: a replay for a user's own test suite, silent when the models
agree, else an AssertionError in torch.testing's words (what differs, by how much, against what was allowed)."""
from __future__ import annotations

from typing import Any

from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.core.words import Words, words
from aligner.pipelines.replay.result import ReplayResult, ReplayRow, ReplayVerdict
from aligner.pipelines.replay.run import replay
from aligner.pipelines.replay.says import Say


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


def _where(row: ReplayRow) -> dict[str, Any]:
    """The words' data naming a row: its module and type on each side, its step and phase."""
    return {"module": row.module, "module_b": row.module_b, "type": row.type, "type_b": row.type_b, "step": row.step,
            "phase": row.phase}


def failure_message(result: ReplayResult) -> Words:
    """The AssertionError text, as Words: torch.testing's lines for the module to blame, then its inherited error."""
    if result.verdict is ReplayVerdict.PARENT_CODE and result.parent_code is not None:
        row = result.rows[result.parent_code]
        assert row.inherited is not None
        return words(Say.NOT_CLOSE_PARENT_CODE, **_where(row), parent=row.parent, metrics=row.inherited)
    if result.culprit is not None:
        row = result.rows[result.culprit]
        assert row.local is not None
        inherited = row.inherited.max_abs_err if row.inherited is not None else None
        return words(Say.NOT_CLOSE_LOCAL, **_where(row), reference=result.reference, metrics=row.local,
                     inherited=inherited)
    first = result.first_total
    assert first is not None
    row = result.rows[first]
    assert row.total is not None
    worst = result.largest_local
    local = result.rows[worst].local if worst is not None else None
    largest = (local.max_abs_err, result.rows[worst].module) if local is not None and worst is not None else None
    return words(Say.NOT_CLOSE_GROWING, **_where(row), metrics=row.total, largest=largest)
