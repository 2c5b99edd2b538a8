"""Streamed `align compare` (aligner/pipelines/compare/stream.py) on real zoo pairs: for a bug of the localization
catalogue in the MindSpore twin of a timm and a transformers-style pair, the reports (JSON, CSV, table, summary) of
the streamed comparison equal the whole-list ones, in both argument orders and with --bisect: against the clean
MindSpore dump (same framework, paired in step) and against the torch reference (Identity calls folded on one side,
inputs in another order: paired a window at a time, aligner/dumping/pair/window.py), both streamed, also with
16-record windows (so that the windows cut inside the model); --bisect reads whole, the reason kept.

Skipped when the zoo is not installed (scripts/install_zoo.sh); about 40 s on the shared 2-core machine.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from aligner.pipelines.compare import stream  # noqa: E402
from aligner.pipelines.compare.run import compare  # noqa: E402
from aligner.pipelines.compare.stream import compare_streamed  # noqa: E402
from aligner.render.compare import ReportSpool  # noqa: E402
from tests.pipelines.compare.test_stream import _reports  # noqa: E402
from tests.zoo import localization as loc  # noqa: E402

BUGS = {"vit": "vit-attn-scale", "moe_lm": "moe-missing-residual"}


@pytest.mark.parametrize("family", BUGS)
def test_streamed_equals_whole_on_zoo_pairs(pair_runs, family: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run = pair_runs(family)
    bug = next(b for b in loc.CATALOGUE if b.id == BUGS[family])
    reference = run.reference("base")
    clean = run.dump_ms(run.fresh("ms_clean"))
    restore = bug.inject(run.pair)
    try:
        buggy = run.dump_ms(run.fresh(f"ms_{bug.id}"))
    finally:
        restore()
    streamed_count = 0
    for a, b in ((buggy, clean), (clean, buggy), (buggy, reference), (reference, buggy)):
        for bisect in (False, True):
            whole = compare(str(a), str(b), bisect=bisect)
            for block in (stream.BLOCK, 16):
                monkeypatch.setattr(stream, "BLOCK", block)
                spool = ReportSpool(json_rows=True, csv_rows=True)
                streamed = compare_streamed(str(a), str(b), bisect=bisect, sink=spool)
                assert _reports(streamed, tmp_path / "s", spool) == _reports(whole, tmp_path / "w"), (a, b, bisect)
                assert streamed.verdict.findings and streamed.verdict == whole.verdict
                streamed_count += streamed.streamed.fallback is None
                monkeypatch.undo()
    assert streamed_count == 8  # both pairs in both orders at both window sizes streamed; --bisect: read whole
