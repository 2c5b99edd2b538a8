"""The next command after a module-level verdict: an op-level dump of the module at fault, on both sides."""
from __future__ import annotations

from aligner.core.frameworks import Framework
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import Culprit, Divergence, Phase


def _framework(label: str) -> str:
    """"pytorch" from a side label such as "dumps_pt/ (pytorch)"."""
    return label.rpartition("(")[2].rstrip(")") or "side"


def scopes(result: CompareResult, finding: Divergence) -> tuple[str, str]:
    """(scope on side A, scope on the reference side) of the module whose code the finding blames."""
    row = result.rows[finding.origin]
    a = row.pair.a.record if row.pair.a is not None else None
    if a is None:
        return finding.blame, finding.blame
    if finding.culprit in (Culprit.PARENT_CODE, Culprit.OP):
        return a.parent or "", finding.blame
    if a.kind == "param_grad":
        return a.module.rpartition(".")[0], finding.blame
    return a.module, finding.blame


def zoom_code(result: CompareResult, finding: Divergence) -> str:
    """Code that re-dumps the blamed module with every tensor operation inside it on both sides, then compares."""
    return scoped_zoom(result, *scopes(result, finding), finding.phase == Phase.BACKWARD)


def scoped_zoom(result: CompareResult, scope_a: str, scope_b: str, backward: bool) -> str:
    """Code for an op-level dump of `scope_a` on side A and `scope_b` on the reference side, then the compare."""
    run = "    loss = loss_fn(model(batch), target)\n    loss.backward()" if backward else "    model(batch)"
    names = []
    blocks = []
    for label, scope in ((result.side_a, scope_a), (result.side_b, scope_b)):
        fw = _framework(label)
        directory = f"zoom_{'pt' if fw == Framework.PYTORCH else 'ms' if fw == Framework.MINDSPORE else fw}/"
        names.append(directory)
        blocks.append(f"# {fw}, same weights and batch:\n"
                      f"with aligner.dump(model, {directory!r}, ops=True, scope={scope!r}):\n{run}")
    return "\n".join(blocks) + f"\nalign compare {names[0]} {names[1]}"


def zoom_hint(result: CompareResult, finding: Divergence) -> str:
    """One sentence: what the zoom-in finds, for the module the finding blames."""
    scope = finding.blame or "the whole model"
    return (f"Zoom in: dump every tensor operation inside the forward of {scope} on both sides and compare again; "
            f"the first op that diverges (with its source line) is the one to fix.")
