"""A saved doctor.json reads back (DoctorResult.from_dict, every stage's outcome with its own result's from_dict):
written again it is the same text, and `align report doctor.json` prints what `align doctor` printed, with its exit
code. Two real runs of the hand-made pairs cover every outcome: the GELU default (a forward blame with its settings,
audit findings, op-level zoom-in, replay and repro) and the halved learning rate (training steps, the update rule and
its optimizer terms)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")

from aligner.pipelines.doctor import Stage, Status
from aligner.pipelines.doctor.result import DoctorResult, StageRun
from aligner.render.doctor import to_json
from aligner.render.jsonout import dumps as dumps_json
from tests.support import doctor_pairs
from tests.support.cli import align_in_process, assert_one_line_error

SHAPE = ",".join(map(str, doctor_pairs.INPUT_SHAPE))


@pytest.mark.parametrize("ms_side, stages", [
    ("ms_gelu_tanh", {"forward": "failed", "repro": "passed", "train": "skipped"}),
    ("ms_half_lr", {"forward": "passed", "train": "failed", "repro": "skipped"}),
])
def test_report_shows_a_saved_doctor_result_as_doctor_did(tmp_path: Path, capsys, ms_side: str,
                                                          stages: dict[str, str]) -> None:
    out = tmp_path / "doc"
    ran = align_in_process(capsys, "doctor", f"{doctor_pairs.__file__}:torch_block",
                           f"{doctor_pairs.__file__}:{ms_side}", "--input-shape", SHAPE, "-o", out)
    assert ran.returncode == 1, ran.stderr
    saved = out / "doctor.json"
    text = saved.read_text(encoding="utf-8")
    data = json.loads(text)
    again = DoctorResult.from_dict(data)
    assert {s.stage.value: s.status.value for s in again.stages if s.stage.value in stages} == stages
    reports = {Stage(s["stage"]): s["reports"] for s in data["stages"]}
    assert dumps_json(to_json(again, reports)) + "\n" == text  # every outcome read back whole
    assert again.blame is not None and (again.blame.settings or again.blame.terms)
    shown = align_in_process(capsys, "report", saved)
    assert (shown.returncode, shown.stdout) == (ran.returncode, ran.stdout)


def test_a_damaged_saved_doctor_result_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "doc"
    ran = align_in_process(capsys, "doctor", f"{doctor_pairs.__file__}:torch_block",
                           f"{doctor_pairs.__file__}:ms_block", "--input-shape", SHAPE, "-o", out, "--only", "audit")
    assert ran.returncode == 0, ran.stderr
    data = json.loads((out / "doctor.json").read_text(encoding="utf-8"))
    assert DoctorResult.from_dict(data).stage("audit").status is Status.PASSED
    data["stages"][0]["stage"] = "nosuch"
    (out / "doctor.json").write_text(json.dumps(data), encoding="utf-8")
    assert_one_line_error(align_in_process(capsys, "report", out / "doctor.json"), "a damaged saved doctor result")


def test_a_stage_time_reads_back_as_it_was_shown() -> None:
    """A stage's time is kept to the millisecond the saved result keeps, so a time on a rounding edge (0.1500004 s:
    0.2 s as measured, 0.1 s once saved as 0.15) reads back equal and `align report` prints what doctor printed."""
    run = StageRun(Stage.BUILD, Status.PASSED, 0.1500004)
    back = StageRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back == run and f"{back.seconds:.1f}" == f"{run.seconds:.1f}"
