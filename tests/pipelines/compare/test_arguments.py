"""A call's inputs pair by the argument they were passed as (issue 27, item 5): two ports that pass the same keyword
arguments in different orders (transformers and mindone decoder layers) flatten them into different input positions;
pairing by position reported a false divergence ("forward input #1: shape [2, 1, 16, 16] vs [1, 16, 32]")."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import nn

import aligner
from tests.support.cli import align_in_process

ms.set_context(mode=ms.PYNATIVE_MODE)

B, S, D = 2, 4, 8
RNG = np.random.default_rng(0)
X = RNG.standard_normal((B, S, D)).astype(np.float32)
MASK = RNG.standard_normal((B, 1, S, S)).astype(np.float32)
SCALE = RNG.standard_normal((1, S, D)).astype(np.float32)
W = RNG.standard_normal((D, D)).astype(np.float32)


class TorchBlock(torch.nn.Module):
    """forward(x, mask, scale): the three tensors have different shapes, so pairing them by position fails."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(D, D, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.from_numpy(W))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.proj(x) * scale
        return torch.softmax(h @ h.transpose(-1, -2) + mask[:, 0], -1) @ h


class MsBlock(nn.Cell):
    """construct(scale, mask, x): the same arguments, declared in another order."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Dense(D, D, has_bias=False)
        self.proj.weight.set_data(ms.Tensor(W))

    def construct(self, scale: ms.Tensor | None = None, mask: ms.Tensor | None = None,
                  x: ms.Tensor | None = None) -> ms.Tensor:
        h = self.proj(x) * scale
        return ms.ops.softmax(h @ h.swapaxes(-1, -2) + mask[:, 0], -1) @ h


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = TorchBlock()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.block(x=x, mask=mask, scale=scale)


class MsNet(nn.Cell):
    def __init__(self, bug: bool = False) -> None:
        super().__init__()
        self.block = MsBlock()
        self.bug = bug

    def construct(self, x: ms.Tensor, mask: ms.Tensor, scale: ms.Tensor) -> ms.Tensor:
        return self.block(scale=scale, mask=mask * 2 if self.bug else mask, x=x)


def dump_pair(tmp_path: Path, bug: bool = False) -> tuple[Path, Path]:
    """Both nets dumped with leaves_only=False (the block's own inputs recorded, in each side's keyword order)."""
    pt_dir, ms_dir = tmp_path / "pt", tmp_path / "ms"
    net = TorchNet()
    with aligner.dump(net, pt_dir, leaves_only=False, backward=False), torch.no_grad():
        want = net(torch.from_numpy(X), torch.from_numpy(MASK), torch.from_numpy(SCALE)).numpy()
    cell = MsNet(bug)
    with aligner.dump(cell, ms_dir, leaves_only=False, backward=False):
        got = cell(ms.Tensor(X), ms.Tensor(MASK), ms.Tensor(SCALE)).asnumpy()
    if not bug:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return pt_dir, ms_dir


def compare(capsys: pytest.CaptureFixture[str], tmp_path: Path, first: Path, second: Path) -> tuple[int, dict]:
    out = tmp_path / f"{first.name}_{second.name}.json"
    proc = align_in_process(capsys, "compare", first, second, "--json", out)
    return proc.returncode, json.loads(out.read_text())


@pytest.mark.parametrize("order", ["ms_pt", "pt_ms"])
def test_keyword_arguments_in_another_order_pair_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         order: str) -> None:
    """The block's three inputs pair with the inputs of the same name, whatever their positions: exit 0."""
    pt_dir, ms_dir = dump_pair(tmp_path)
    first, second = (ms_dir, pt_dir) if order == "ms_pt" else (pt_dir, ms_dir)
    code, report = compare(capsys, tmp_path, first, second)
    assert code == 0, [r for r in report["rows"] if r["status"] != "ok"]
    inputs = [r for r in report["rows"] if r["module"] == "block" and r["io"] == "input"]
    assert sorted((r["arg_a"], r["arg_b"]) for r in inputs) == [("mask", "mask"), ("scale", "scale"), ("x", "x")]
    assert {r["matched_by"] for r in inputs} == {"name"} and {r["status"] for r in inputs} == {"ok"}


def test_a_wrong_keyword_argument_is_still_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pairing by name keeps real findings: the MindSpore parent doubles `mask`, and the diverged input row is the
    block's `mask` (the other two inputs match)."""
    pt_dir, ms_dir = dump_pair(tmp_path, bug=True)
    code, report = compare(capsys, tmp_path, ms_dir, pt_dir)
    assert code == 1
    inputs = {r["arg_b"]: r["status"] for r in report["rows"] if r["module"] == "block" and r["io"] == "input"}
    assert inputs == {"x": "ok", "mask": "diverged", "scale": "ok"}


def _llama_layers() -> tuple[Any, Any, Any]:
    """A transformers and a mindone LlamaDecoderLayer of tests/zoo/decoder_lm.py's config with the same weights, and
    transformers' rotary table."""
    from tests.zoo import ms_compat, torch_compat  # noqa: F401  (torchvision op schemas before transformers)

    ms_compat.install()
    import transformers
    from mindone.transformers.models.llama import modeling_llama as mindone_llama
    from transformers.models.llama import modeling_llama as torch_llama

    from tests.zoo.decoder_lm import CFG

    cfg = transformers.LlamaConfig(**CFG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    pt = torch_llama.LlamaDecoderLayer(cfg, 0).eval()
    cell = mindone_llama.LlamaDecoderLayer(cfg, 0)
    cell.set_train(False)
    weights = {k: v.detach().numpy() for k, v in pt.state_dict().items()}
    for p in cell.get_parameters():
        p.set_data(ms.Tensor(weights[p.name]))
    return pt, cell, torch_llama.LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("ms_order", [(2, 1, 0), (2, 0, 1)], ids=["reversed", "rotated"])
def test_transformers_and_mindone_decoder_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 ms_order: tuple[int, ...]) -> None:
    """A decoder layer called with keywords (hidden_states, attention_mask, position_embeddings) on the PyTorch side
    and in another order on the MindSpore side, dumped with leaves_only=False: a clean port, exit 0
    in both argument orders of compare."""
    from tests.zoo import ms_compat

    pt, cell, rotary = _llama_layers()
    try:
        gen = torch.Generator().manual_seed(1)
        hidden = torch.randn(2, 6, 32, generator=gen)
        cos, sin = rotary(hidden, torch.arange(6)[None])
        mask = torch.triu(torch.full((6, 6), -1e9), 1)[None, None].expand(2, 1, 6, 6).contiguous()
        kwargs = {"hidden_states": hidden, "attention_mask": mask, "position_embeddings": (cos, sin)}
        with aligner.dump(pt, tmp_path / "pt", leaves_only=False, backward=False), torch.no_grad():
            pt(**kwargs)
        names = [list(kwargs)[i] for i in ms_order]
        as_ms = {"hidden_states": ms.Tensor(hidden.numpy()), "attention_mask": ms.Tensor(mask.numpy()),
                 "position_embeddings": (ms.Tensor(cos.numpy()), ms.Tensor(sin.numpy()))}
        with aligner.dump(cell, tmp_path / "ms", leaves_only=False, backward=False):
            cell(**{k: as_ms[k] for k in names})
    finally:
        ms_compat.uninstall()
    for first, second in ((tmp_path / "ms", tmp_path / "pt"), (tmp_path / "pt", tmp_path / "ms")):
        code, report = compare(capsys, tmp_path, first, second)
        assert code == 0, [(r["module"], r["io"], r["index"], r["status"]) for r in report["rows"]
                           if r["status"] not in ("ok", "folded")]
        layer = [r for r in report["rows"] if r["module"] == "" and r["io"] == "input"]
        assert {(r["arg_a"], r["status"]) for r in layer} == {
            ("hidden_states", "ok"), ("attention_mask", "ok"), ("position_embeddings/0", "ok"),
            ("position_embeddings/1", "ok")}
