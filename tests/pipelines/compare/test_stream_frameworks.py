"""Streamed `align compare` on real PyTorch and MindSpore dumps of one training step (tests/support/twin_models):
forward, backward and parameter gradients (MindSpore's `gamma` against PyTorch's `weight`, planned as `namers` plans
them), BatchNorm in training mode (buffer records: the tolerance floor), paired a window at a time: the reports equal
the whole-list ones at the default block and at 8-record windows, in both orders."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")

from aligner.pipelines.compare import stream
from tests.pipelines.compare.test_frameworks import _dump
from tests.pipelines.compare.test_stream import _both


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_training_steps_stream_with_the_whole_list_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           kind: str) -> None:
    ms, pt = _dump(tmp_path, kind, train=kind == "cnn")
    for block in (stream.BLOCK, 8):
        monkeypatch.setattr(stream, "BLOCK", block)
        for a, b in ((ms, pt), (pt, ms)):
            whole, whole_text, streamed, streamed_text = _both(a, b, tmp_path)
            assert streamed.streamed.fallback is None, (block, a.name)
            assert streamed_text == whole_text, (block, a.name)
            grads = [r for r in whole.rows if r.pair.b is not None and r.pair.b.record.kind == "param_grad"]
            assert grads and all(r.pair.matched_by == "name" for r in grads)  # (gamma <-> weight: planned names)
            assert any(r.pair.a.record.module != r.pair.b.record.module for r in grads)
