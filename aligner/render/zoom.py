"""The next command after a module-level verdict: an op-level dump of the module at fault, on both sides.

What the user is told to paste holds no text from a dump as code: a side's framework appears only as a known
`Framework` name (else "unknown framework"), module paths only as `repr` literals, directories only `shlex.quote`d.
A plain .npy side has no model aligner could dump: its part is a comment saying what to save instead, never code.
"""
from __future__ import annotations

import shlex

from aligner.core.frameworks import Framework
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import Divergence, Phase

_SHORT = {Framework.PYTORCH: "pt", Framework.MINDSPORE: "ms", Framework.NUMPY: "np"}
# a side of plain .npy files: what to do there instead of `aligner.dump(model, ...)`, as comment lines
_NO_MODEL = ("# numpy: plain .npy files, no model to dump. In the code that wrote them, save the tensors computed "
             "inside\n# {where} in execution order as numbered .npy files (0_name.npy, 1_name.npy, ...) in "
             "{directory!r}\n# (or, when a torch or MindSpore model computed them, dump that model with aligner.dump, "
             "ops=True and this scope):")


def _framework(label: str) -> Framework | None:
    """Framework.PYTORCH from a side label such as "dumps_pt/ (pytorch)"; None for a name it does not know."""
    return Framework.parse(label.rpartition(" (")[2].removesuffix(")"))


def side_path(label: str) -> str:
    """The directory of a side label such as "dumps_ms/ (mindspore)", quoted for a shell command."""
    return shlex.quote(label.rpartition(" (")[0] or label)


def zoom_code(result: CompareResult, finding: Divergence) -> str:
    """Code that re-dumps the blamed module with every tensor operation inside it on both sides, then compares."""
    return scoped_zoom(result, *result.zoom_scopes(finding), finding.phase == Phase.BACKWARD)


def scoped_zoom(result: CompareResult, scope_a: str, scope_b: str, backward: bool) -> str:
    """Code for an op-level dump of `scope_a` on side A and `scope_b` on the reference side (for a side of plain .npy
    files, a comment on what to save there), then the compare."""
    run = "    loss = loss_fn(model(batch), target)\n    loss.backward()" if backward else "    model(batch)"
    frameworks = (_framework(result.migrated), _framework(result.reference))
    names = [f"zoom_{_SHORT[fw] if fw is not None else side}/" for fw, side in zip(frameworks, ("a", "ref"))]
    if names[0] == names[1]:  # both sides of one framework
        names = [f"zoom_{_SHORT[fw]}_{side}/" for fw, side in zip(frameworks, ("a", "ref")) if fw is not None]
    blocks = [_NO_MODEL.format(where=repr(scope) if scope else "the model", directory=directory)
              if fw is Framework.NUMPY else
              f"# {fw or 'unknown framework'}, same weights and batch:\n"
              f"with aligner.dump(model, {directory!r}, ops=True, scope={scope!r}):\n{run}"
              for fw, directory, scope in zip(frameworks, names, (scope_a, scope_b))]
    return "\n".join(blocks) + f"\nalign compare {shlex.quote(names[0])} {shlex.quote(names[1])}"


def zoom_hint(result: CompareResult, finding: Divergence) -> str:
    """One sentence: what the zoom-in finds, for the module the finding blames."""
    scope = finding.blame or "the whole model"
    if Framework.NUMPY in (_framework(result.migrated), _framework(result.reference)):
        return (f"Zoom in: record the tensors computed inside {scope} on both sides and compare again (a side of plain "
                f".npy files has no model to dump: save them as numbered .npy files from the code that wrote it); "
                f"the first tensor that diverges is the one to look at.")
    return (f"Zoom in: dump every tensor operation inside the forward of {scope} on both sides and compare again; "
            f"the first op that diverges (with its source line) is the one to fix.")
