"""The sentences of compare: its verdict on where an error starts, why a row holds nothing to compare, why a record
has no noise floor (aligner/pipelines/compare/says.py names each code)."""
from __future__ import annotations

from aligner.core.words import Words
from aligner.pipelines.compare.says import Say
from aligner.render.words import Template, fill, say

ROOT = "(root)"   # the model itself, where a record names no module


def _here(w: Words) -> str:
    """'input 0 of blocks.1 (error 3.2e-02)'."""
    return f"input {w['index']} of {w['module'] or ROOT} (error {w['error']:.1e})"


def _untwinned(w: Words) -> str:
    op = w["op"]
    name = (f"the op {op[0]}" + (f" at {op[1]}" if op[1] else "")) if op is not None else (w["producer"] or ROOT)
    there = "" if w["where"] is None else f" (there, code in the forward of {w['where'] or 'the model'} computed it)"
    return f"{_here(w)} is what {name} returned, and {name} has no twin on the other side{there}"


def _inputs(w: Words) -> str:
    return "input" if w["inputs"] == 1 else "inputs"


def _amplified(w: Words) -> str:
    ratio = "inf" if w["e_in"] == 0 else f"{w['e_out'] / w['e_in']:.0f}"
    return f"its error {w['e_out']:.1e} is {ratio}x its {_inputs(w)}' {w['e_in']:.1e}"


def _between(w: Words) -> str:
    x, y, parent = w["before"] or ROOT, w["after"] or ROOT, w["parent"]
    where = f"inside the forward of {parent}" if parent else "in the model's own forward"
    return (f"the numbers part between {x} (last matching record, error {w['e_in']:.1e}) and {y} "
            f"(error {w['e_out']:.1e}), {where}: {y} itself or the code of {parent or 'the top-level forward'} that "
            "runs between the two calls (its input was not recorded; dump with inputs=True to tell them apart)")


def _computed_op(w: Words) -> str:
    at = f" at {w['source']}" if w["source"] else ""
    return (f"input {w['index']} of the op {w['type']}{at} (error {w['error']:.1e}) was returned by no recorded op: a "
            "parameter, buffer or constant it reads, or code between the ops; every record before it matched")


def _note(w: Words) -> str:
    return "" if w["note"] is None else say(w["note"])


def _computed(w: Words) -> str:
    where = f"the forward of {w['scope']}" if w["scope"] else "the model's top-level forward"
    return (f"{_here(w)} was computed by code in {where} (no recorded call returned that tensor{_note(w)}), and "
            "every record before it matched")


def _handed(w: Words) -> str:
    where = w["where"] or "the model"
    what = f"holds the numbers of {w['held']}'s output" if w["held"] else \
        f"is no recorded call's output (computed in the forward of {where}{_note(w)})"
    return (f"{_here(w)} {what} on the other side, and the output of {w['made']} here, which matched: the forward of "
            f"{where} hands the call another tensor")


TEMPLATES: dict[Say, Template] = {
    Say.UNTWINNED: _untwinned,
    Say.NO_UPSTREAM: "no upstream record: its inputs were not dumped or it is a model input",
    Say.INPUTS_MATCHED: lambda w: f"its {_inputs(w)} " + fill("matched (input error {e_in:.1e}, output error "
                                                              "{e_out:.1e})", **w.fields),
    Say.AMPLIFIED: _amplified,
    Say.CARRIED: lambda w: f"carried from {w['module'] or ROOT} (input error {w['e_in']:.1e})",
    Say.BETWEEN: _between,
    Say.COMPUTED_OP: _computed_op,
    Say.MODEL_INPUT: "the model's own input {index} differs (error {error:.1e}): the two sides were given different "
                     "data",
    Say.COMPUTED: _computed,
    Say.NOTE_INSIDE: lambda w: (f"; on the other side it is computed inside the forward of {w['inside'] or 'the model'}"
                                f", where here it arrives from {w['arrives'] or 'the model'}"),
    Say.NOTE_UNCHANGED: lambda w: f"; it entered the forward of {w['parent'] or 'the model'} from there unchanged",
    Say.WIRED: lambda w: (f"{_here(w)} is the output of {w['twin'] or ROOT} on the other side and of {w['made']} here, "
                          f"which matched: the forward of {w['caller'] or 'the model'} wires them differently"),
    Say.HANDED: _handed,
    Say.AFTER_FORWARD: lambda w: say(w["reason"]) + "; the forward pass had already diverged, so the backward one "
                                                    "follows from it",
    Say.NOT_STORED: lambda w: "; ".join(f"the {side} dump did not store it ({why})" for side, why in w["sides"]),
    Say.STATS_ONE_SIDE: "one side has only statistics and the other none to compare them with",
    Say.NO_TWIN: "no float64 twin",
    Say.NO_TWIN_RECORDS: "the float64 dump has no {kind} records of step {step}",
    Say.TWIN_SHAPE: "its float64 twin has shape {twin}, not {shape}",
    Say.TWIN_DTYPE: "its twin is {dtype}, not float64",
    Say.TWIN_UNREADABLE: "unreadable ({error})",
    Say.NOTHING_FINITE: "nothing finite to measure",
    Say.NOISE_NOT_FINITE: "its error against float64 is not finite",
    Say.NOTHING_TO_MEASURE: "no tensor and no statistics to measure",
    Say.STATS_LACKING: "its statistics lack min/max/mean/l2",
}
