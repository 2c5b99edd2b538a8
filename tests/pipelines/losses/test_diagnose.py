"""A saved `align losses --json` report reads back (LossReport.from_dict) and `align report` shows it again as `align
losses` printed it (its table at the default length), on every case of tests/support/losses_cases.py (each verdict,
cause and warning): the same stdout, stderr and exit code, and the JSON written again from the read-back report is the
same text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aligner.pipelines.losses import LossReport, compare_losses
from aligner.render.jsonout import dumps as dumps_json
from aligner.render.losses import report_json
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.losses_cases import LOGS, write_case


@pytest.mark.parametrize("case", sorted(LOGS))
def test_report_shows_a_saved_losses_report_as_losses_did(tmp_path: Path, capsys, case: str) -> None:
    args = write_case(tmp_path, case)
    saved = tmp_path / "losses.json"
    align_in_process(capsys, "losses", *args, "--json", saved)
    shown = align_in_process(capsys, "report", saved)
    at = args.index("--show") if "--show" in args else len(args)  # the table's length is not saved: the default
    ran = align_in_process(capsys, "losses", *args[:at], *args[at + 2:])
    assert (shown.returncode, shown.stdout, shown.stderr) == (ran.returncode, ran.stdout, ran.stderr), case
    text = saved.read_text(encoding="utf-8")
    again = LossReport.from_dict(json.loads(text))
    assert dumps_json(report_json(again)) + "\n" == text, case
    assert again.exit_code == ran.returncode and again.passed is (ran.returncode == 0) and bool(again) is again.passed


def test_the_library_dict_reads_back_too(tmp_path: Path) -> None:
    """to_dict (diagnosis and warnings as data, no words) is read back as --json's file is."""
    args = write_case(tmp_path, "later_epoch_start")
    report = compare_losses(args[0], args[1])
    again = LossReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report and again.a.epoch_starts == frozenset({3})


def test_a_damaged_saved_report_is_one_line(tmp_path: Path, capsys) -> None:
    args = write_case(tmp_path, "forward_differs")
    saved = tmp_path / "losses.json"
    align_in_process(capsys, "losses", *args, "--json", saved)
    data = json.loads(saved.read_text(encoding="utf-8"))
    data["a"]["values"] = data["a"]["values"][:-1]  # a loss missing: the curve no longer fits its steps
    saved.write_text(json.dumps(data), encoding="utf-8")
    proc = align_in_process(capsys, "report", saved)
    assert_one_line_error(proc, "a damaged saved losses result")
