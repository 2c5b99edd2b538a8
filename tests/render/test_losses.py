"""The losses pipeline returns evidence, render/losses.py writes every sentence (issue 29 item 6).

tests/support/losses_cases.py builds one pair of logs per branch of the diagnosis and per warning;
tests/data/losses/render_golden.json holds what `align losses` printed for each (terminal and `--json -`), written by
the code before the sentences moved out of the pipeline (aligner at 33d0fb1): the words stay byte for byte the same.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from aligner.core.tolerance import Tolerance
from aligner.pipelines.losses import (
    Cause,
    Diagnosis,
    LossReport,
    LossWarning,
    NextAction,
    NextCommand,
    NoiseEstimate,
    Side,
    Verdict,
    WarningKind,
    compare_losses,
)
from aligner.pipelines.losses.parse import FORMATS
from aligner.render.jsonout import dumps as dumps_json
from aligner.render.losses import report_json, report_text
from tests.support.cli import align_in_process
from tests.support.losses_cases import LOGS, write_case
from tests.support.paths import DATA

GOLDEN = DATA / "losses" / "render_golden.json"
# the only text a report holds is what was read from the user's files and options: paths, formats, patterns
INPUT_TEXT = {"a.path", "a.format", "a.pattern", "a.pattern_name", "b.path", "b.format", "b.pattern",
              "b.pattern_name", "noise.repeats[]", "warnings[].repeat"}


def _report(folder: Path, case: str) -> LossReport:
    """The library's report for a case, with the options its command line gives."""
    args = write_case(folder, case)
    options = dict(zip(args[2::2], args[3::2]))
    tolerance = Tolerance(float(options["--rtol"]), float(options["--atol"]), True) if "--rtol" in options else None
    noise = float(options["--noise"]) if "--noise" in options else None
    return compare_losses(args[0], args[1], tolerance=tolerance, noise=noise, repeat_a=options.get("--repeat-a"),
                          repeat_b=options.get("--repeat-b"))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LossReport]:
    root = tmp_path_factory.mktemp("losses")
    return {case: _report(root / case, case) for case in LOGS}


@pytest.mark.parametrize("case", sorted(LOGS))
def test_align_losses_prints_the_words_it_printed_before(capsys, tmp_path, case):
    """Terminal (stdout, stderr) and `--json -`, byte for byte, the logs' folder written {logs}."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[case]
    args = write_case(tmp_path, case)
    for mode, extra in (("text", ()), ("json", ("--json", "-"))):
        proc = align_in_process(capsys, "losses", *args, *extra)
        stdout = proc.stdout if mode == "text" else _as_before(proc.stdout)
        got = {"code": proc.returncode, "stdout": stdout.replace(str(tmp_path), "{logs}"),
               "stderr": proc.stderr.replace(str(tmp_path), "{logs}")}
        assert got == golden[mode], (case, mode)


# what --json gained after the golden file was written, so that `align report` reads a saved report back: each
# curve's points and sources, and the diagnosis and warnings as data (`evidence`, last); the rest is as it was
SINCE = ("pattern_name", "first_long_line", "epoch_starts", "steps", "values")


def _as_before(text: str) -> str:
    """`--json -`'s text without what it gained since the golden file (every key it had, in its place)."""
    data = json.loads(text)
    assert list(data)[-1] == "evidence" and list(data["a"])[-len(SINCE):] == list(SINCE)
    del data["evidence"]
    for side in ("a", "b"):
        for key in SINCE:
            del data[side][key]
    return dumps_json(data) + "\n"


def test_the_cases_reach_every_verdict_cause_and_warning(reports):
    """The golden cases cover the whole vocabulary, so no sentence can change unseen."""
    assert {r.verdict for r in reports.values()} == set(Verdict)
    assert {r.diagnosis.cause for r in reports.values()} == set(Cause)
    assert {w.kind for r in reports.values() for w in r.warnings} == set(WarningKind)
    assert set(json.loads(GOLDEN.read_text(encoding="utf-8"))) == set(LOGS)


def _strings(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(field path, text) of every str in a result or its dict that is not an enum member."""
    if isinstance(value, enum.Enum):
        return []
    if isinstance(value, str):
        return [(where, value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _strings(item, f"{where}.{key}".lstrip("."))]
    if isinstance(value, (tuple, list, frozenset)):
        return [found for item in value for found in _strings(item, f"{where}[]")]
    return []


def _members(hint: Any) -> set[Any]:
    """The types a hint admits (str | None -> {str, NoneType}; tuple[str, ...] -> {str, Ellipsis})."""
    args = typing.get_args(hint)
    return {hint} if not args else {member for arg in args for member in _members(arg)}


def test_the_report_holds_evidence_not_sentences(reports):
    """No text of the pipeline's making in a LossReport or its dict; the next command is an argv of single words."""
    for case, report in reports.items():
        for where, text in _strings(report):
            assert where in INPUT_TEXT, (case, where, text)
        assert report.a.format in FORMATS and report.b.format in FORMATS
        data = report.to_dict()
        for where, text in _strings(data):
            words = where == "diagnosis.next_command.argv[]" and " " not in text
            assert where in INPUT_TEXT | {"a.pattern_name", "b.pattern_name"} or words or text.isidentifier(), \
                (case, where, text)
        assert not {"summary", "advice", "next_command"} & set(data), case
    for cls in (LossReport, Diagnosis, NextCommand, LossWarning, NoiseEstimate):  # the types say so too
        text_fields = {name for name, hint in typing.get_type_hints(cls).items() if str in _members(hint)}
        assert text_fields <= {"repeat", "repeats"}, (cls.__name__, text_fields)


def test_render_words_a_fixed_report(reports):
    """The render layer on one report: its evidence, then the sentences and the command line joined from the argv."""
    report = reports["later_logs_start_late"]
    assert (report.verdict, report.diagnosis) == \
        (Verdict.LATER, Diagnosis(Cause.DRIFT, 20, 10, NextCommand(NextAction.DIFF_WEIGHTS, 10)))
    assert report.diagnosis.next_command.argv == ("align", "diff", "step10_ms.ckpt", "step10_pt.pth")
    assert [(w.kind, w.side) for w in report.warnings] == [(WarningKind.LENGTHS_DIFFER, None),
                                                           (WarningKind.COARSE_PRINT, Side.B)]
    text = report_text(report)
    assert text.summary == ("Step 10 agrees; the curves part at step 20. The difference at step 20 is 0.1 (0.0909 "
                            "relative, 1.91e+05x the estimated float32 noise of 5.25e-07), beyond the tolerance, "
                            "rtol=0.0001, atol=1e-06 (symmetric).")
    assert text.advice == ("The logs start at step 10, so the step-1/step-2 test cannot be made: log the loss of "
                           "every step from step 1 to tell a forward difference from an update difference. The "
                           "difference is just over the bound (0.0909 relative): rounding differences accumulated "
                           "over 19 updates can look like this, and the estimated float32 noise does not model how "
                           "noise grows through training; measure it with a rerun of one side (--repeat-a) or give "
                           "--noise, and if the curves stay close afterwards, a looser bound may be right. Save the "
                           "weights after step 10 on both sides and diff them:")
    assert text.next_command == "align diff step10_ms.ckpt step10_pt.pth"
    assert text.warnings == ("A has 3 losses (steps 10-30), B has 2 (steps 10-20): compared only the 2 common steps",
                             "B prints losses rounded to 0.1: differences below 0.05 cannot be seen (the bounds are "
                             "widened by that); log more digits")
    data = report_json(report)
    assert list(data)[6:11] == ["verdict", "summary", "advice", "next_command", "warnings"]
    assert (data["summary"], data["noise"]["rule"]) == (text.summary, "4 * eps32 * max(|A|,|B|)")
