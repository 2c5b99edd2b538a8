"""`align check`'s findings, fixes and notes are Words (pipelines/check/says.py) worded by render/words/check.py, and
so is the `aligner.watch` log line (watch.describe): the evidence stays readable, and the JSON report and the log line
hold the sentence. Real runs: tests/pipelines/check/test_check.py's tiny MLPs."""
from __future__ import annotations

import io
import json
from pathlib import Path

from aligner.core.words import Words
from aligner.pipelines.check.says import Say
from aligner.pipelines.check.watch import describe
from aligner.render.check import write_check_json
from tests.pipelines.check.test_check import SYMPTOMS, run_check


def test_nonfinite_finding_is_its_evidence_worded(tmp_path: Path) -> None:
    report = run_check("pt", SYMPTOMS["exploding"][0], tmp_path)  # the global norm reaches Inf at step 2
    finding = next(f for f in report.findings if f.rule == "nonfinite")
    message, fix = finding.message, finding.fix
    assert isinstance(message, Words) and isinstance(fix, Words)
    assert message.code in (Say.NONFINITE_INPUT, Say.NONFINITE_BETWEEN, Say.NONFINITE_OP)
    assert message["step"] == finding.step == 2 and message["nan"] + message["inf"] > 0
    assert message.startswith("first NaN/Inf at step 2: ")
    assert f"holds {message['nan']} NaN and {message['inf']} Inf of {message['numel']} elements; " in message
    out = io.StringIO()
    write_check_json(report, out)
    saved = next(f for f in json.loads(out.getvalue())["findings"] if f["rule"] == "nonfinite")
    assert saved["message"] == str(message) and saved["fix"] == str(fix)
    line = describe(finding)
    assert line.code is Say.WATCH and line["message"] is message
    assert line == (f"aligner.watch: nonfinite (error) at step 2 in {', '.join(finding.where)}: {message}; "
                    f"fix: {fix}")


def test_update_ratio_words_name_the_bound_and_the_count(tmp_path: Path) -> None:
    report = run_check("pt", SYMPTOMS["lr-10x"][0], tmp_path)  # Adam at lr 0.1: ratios 0.20-0.37 vs 0.1
    finding = next(f for f in report.findings if f.rule == "update-ratio")
    said = finding.message
    assert said.code is Say.UPDATE_LARGE and not said["bound"] and said["ratio"] == finding.values[0] > 0.1
    more = f" ({said['count']} of {said['weights']} weights)" if said["count"] > 1 else ""
    assert said == (f"step {said['step']} changed {said['name']} by {said['ratio']:.3g} of its norm (above 0.1; "
                    f"about 1e-3 is typical){more}")
    assert finding.fix.code is Say.FIX_UPDATE_LARGE
