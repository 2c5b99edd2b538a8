"""The data entering the model, compared first: `aligner.save("batch", x)` before the forward on both sides makes a
difference in the data pipeline the answer, before any module (the migration guide's first suspect for step 1)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import torch

import aligner
from aligner.core.progress import SILENT
from aligner.pipelines.compare.verdict import Culprit
from aligner.render.compare import summary
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


def _dumps(tmp_path, ms_batch: np.ndarray, loss_scale: float = 1.0):
    tnet, mnet = make_twins("cnn", train=False)
    x = example_input("cnn")
    with aligner.dump(tnet, tmp_path / "pt", backward=False), torch.no_grad():
        xt = torch.from_numpy(x)
        aligner.save("batch", xt)
        aligner.save("loss", tnet(xt).square().mean())
    with aligner.dump(mnet, tmp_path / "ms", backward=False):
        xm = ms.Tensor(ms_batch)
        aligner.save("batch", xm)
        aligner.save("loss", mnet(xm).square().mean() * loss_scale)
    return aligner.compare(tmp_path / "ms", tmp_path / "pt", progress=SILENT)


def test_a_batch_that_differs_is_blamed_on_the_data_pipeline(tmp_path):
    x = example_input("cnn")
    result = _dumps(tmp_path, (x - 0.5) / 0.5)  # another normalisation on the MindSpore side
    finding = result.verdict.findings[0]
    assert (finding.culprit, finding.blame) == (Culprit.MODEL_INPUT, "batch")
    assert "the data, before the model ran" in summary(result) and "data pipelines" in summary(result)


def test_a_loss_probe_after_the_model_is_not_the_data(tmp_path):
    result = _dumps(tmp_path, example_input("cnn"), loss_scale=1.01)  # the loss code differs, not the data
    finding = result.verdict.findings[0]
    assert finding.blame == "loss" and finding.culprit is Culprit.MODULE
    assert "data pipelines" not in summary(result)
