"""`align inspect` and `aligner.inspect_model`: parameter/buffer counts, trainable/frozen only where really known."""
from __future__ import annotations

import json

import numpy as np
import pytest

import aligner
from aligner.core.errors import AlignerError
from aligner.pipelines.inspect import InspectResult, TensorKind, inspect_checkpoint
from tests.support.cli import assert_one_line_error


def _torch_net():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4, 2))
    for p in net[0].parameters():  # freeze the first layer
        p.requires_grad_(False)
    return net


def _ms_net():
    from mindspore import nn

    net = nn.SequentialCell([nn.Conv2d(3, 4, 3, has_bias=True), nn.BatchNorm2d(4), nn.Flatten(), nn.Dense(4, 2)])
    for p in net.cell_list[0].get_parameters():
        p.requires_grad = False
    return net


def test_torch_model_counts_trainable_and_frozen():
    result = aligner.inspect_model(_torch_net())
    assert isinstance(result, InspectResult) and result.framework == "pytorch"
    c = result.counts
    # conv 4x3x3x3 + 4 (frozen), BN weight/bias 4 + 4, linear 2x4 + 2; buffers: BN mean/var/num_batches_tracked
    assert (c.parameters, c.buffers, c.trainable, c.frozen) == (6, 3, 4, 2)
    assert (c.trainable_elements, c.frozen_elements, c.buffer_elements) == (18, 112, 9)
    kinds = {r.name: r.kind for r in result.rows}
    assert kinds["1.running_mean"] is TensorKind.BUFFER and kinds["0.weight"] is TensorKind.PARAMETER
    assert not next(r for r in result.rows if r.name == "0.weight").trainable


def test_mindspore_model_counts_trainable_and_frozen():
    result = aligner.inspect_model(_ms_net())
    c = result.counts
    assert result.framework == "mindspore"
    # MindSpore has no num_batches_tracked; moving_mean/moving_variance are Parameters that are buffers by name
    assert (c.parameters, c.buffers, c.trainable, c.frozen) == (6, 2, 4, 2)
    assert (c.trainable_elements, c.frozen_elements, c.buffer_elements) == (18, 112, 8)


def test_model_filter_stats_and_bad_input():
    result = aligner.inspect_model(_torch_net(), pattern=r"^1\.", stats=True)
    assert [r.name for r in result.rows] == ["1.weight", "1.bias", "1.running_mean", "1.running_var",
                                             "1.num_batches_tracked"]
    assert result.rows[0].stats.min == 1.0 and result.to_dict()["tensors"][0]["max"] == 1.0
    with pytest.raises(AlignerError, match="inspect_model needs"):
        aligner.inspect_model({"w": np.zeros(2)})
    with pytest.raises(AlignerError, match="bad --filter"):
        aligner.inspect_model(_torch_net(), pattern="(")


def test_file_says_trainable_unknown_not_a_wrong_number(tmp_path, align):
    import torch

    torch.save(_torch_net().state_dict(), tmp_path / "m.pth")
    result = inspect_checkpoint(str(tmp_path / "m.pth"))
    assert (result.counts.parameters, result.counts.buffers) == (6, 3)
    assert result.counts.trainable is None and result.counts.frozen is None  # requires_grad is not in the file
    proc = align("inspect", tmp_path / "m.pth")
    assert proc.returncode == 0, proc.stderr
    assert "6 parameters (130 elements), 3 buffers" in proc.stdout
    assert "trainable/frozen: unknown" in proc.stdout
    out = json.loads(align("inspect", tmp_path / "m.pth", "--json", "-").stdout)
    assert out["summary"]["parameters"] == 6 and out["summary"]["trainable"] is None
    assert {t["name"]: t["kind"] for t in out["tensors"]}["1.num_batches_tracked"] == "buffer"


def test_mindspore_ckpt_counts_buffers_by_name(tmp_path, align):
    import mindspore as ms

    ms.save_checkpoint(_ms_net(), str(tmp_path / "m.ckpt"))
    out = json.loads(align("inspect", tmp_path / "m.ckpt", "--json", "-").stdout)
    assert (out["summary"]["parameters"], out["summary"]["buffers"]) == (6, 2)
    assert out["summary"]["trainable"] is None


def test_json_to_file_and_flag_is_now_a_path(tmp_path, align):
    np.save(tmp_path / "x.npy", np.array([1.0, np.inf], np.float32))
    proc = align("inspect", tmp_path / "x.npy", "--stats", "--json", tmp_path / "r.json")
    assert proc.returncode == 0 and "1 tensors" in proc.stdout  # the table still printed
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["tensors"][0]["inf"] == 1
    assert_one_line_error(align("inspect", tmp_path / "x.npy", "--json", tmp_path / "r.json"), "already exists")
    assert_one_line_error(align("inspect", tmp_path / "x.npy", "--json"), "requires an argument")
