"""`aligner.assert_close`'s AssertionError is Words (pipelines/replay/says.py): its text is torch.testing's lines
(render/words/replay.py), and its evidence is the row blamed and its Metrics, what was measured against what was
allowed. Real frameworks: the cnn twins with one weight 1% off."""
from __future__ import annotations

import pytest

import aligner
from aligner.core.words import Words
from aligner.pipelines.replay.says import Say
from tests.pipelines.replay.test_replay import scale_weight  # (PYNATIVE mode set there)
from tests.support.twin_models import example_input, make_twins


def test_assertion_error_text_is_its_evidence_worded() -> None:
    tnet, mnet = make_twins("cnn", train=False)
    x = example_input("cnn")
    scale_weight(dict(mnet.parameters_and_names())["conv1.weight"], 1.01)
    with pytest.raises(AssertionError) as info:
        aligner.assert_close(tnet, mnet, x)
    said = info.value.args[0]
    assert isinstance(said, Words) and said.code is Say.NOT_CLOSE_LOCAL and said["module"] == "conv1"
    m = said["metrics"]
    assert m.atol == 1e-05 and m.max_abs_err > m.atol and 0 < m.mismatched <= m.numel  # actual above allowed
    lines = str(info.value).splitlines()
    assert lines[:2] == ["Models are not close!", ""]
    assert lines[2].startswith("First module with its own error: 'conv1' (Conv2d") and lines[2].endswith(":")
    assert f"Mismatched elements: {m.mismatched} / {m.numel} ({m.mismatch_fraction:.1%})" in lines
    assert f"Greatest absolute difference: {m.max_abs_err:.3g} at index {m.max_abs_index} (up to 1e-05 allowed)" \
        in lines
    assert lines[-1] == f"Error carried in at its inputs: {said['inherited']:.3g} (greatest absolute difference)"

