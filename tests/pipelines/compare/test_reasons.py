"""Why a record kept the default tolerance under --calibrate (pipelines/compare/says.py, worded by
render/words/compare.py) reaches the rows as the sentence's text: a row is a flat record that msgspec encodes, for
the JSON report and `to_dict` alike. Real frameworks: test_calibrate.py's 24-layer pair and its float64 run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aligner.core.words import words
from aligner.pipelines.compare.run import compare
from aligner.pipelines.compare.says import Say
from aligner.render.jsonout import dumps
from tests.pipelines.compare.test_calibrate import deep  # noqa: F401  (the module-scoped fixture)
from tests.support.cli import align_in_process


def test_records_without_a_twin_say_why_in_every_report(deep: Path, tmp_path: Path,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    partial = tmp_path / "f64"
    shutil.copytree(deep / "f64", partial)
    manifest = partial / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(line for line in lines if '"module":"layers.23.' not in line.replace(" ", ""))
                        + "\n")
    result = compare(str(deep / "ms"), str(deep / "pt"), calibrate=str(partial))
    cal = result.calibration
    assert cal is not None and cal.missing
    why = str(words(Say.NO_TWIN))   # the step and kind are in the float64 dump: only these records lack a twin
    assert why == "no float64 twin" and set(cal.missing.values()) == {why}
    assert all(type(text) is str for text in cal.missing.values())
    rows = json.loads(dumps(result.to_dict()))["rows"]
    assert {i for i, row in enumerate(rows) if row.get("not_calibrated")} == set(cal.missing)
    proc = align_in_process(capsys, "compare", deep / "ms", deep / "pt", "--calibrate", partial, "--json",
                            tmp_path / "r.json")
    assert proc.returncode in (0, 1), proc.stderr
    saved = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {row["not_calibrated"] for row in saved if row.get("not_calibrated")} == {why}
