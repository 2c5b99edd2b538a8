"""A dump under torch.inference_mode: its tensors count no in-place changes (reading `_version` raises), so the hooks
raised into the user's forward ("Inference tensors do not track version counter"), and an in-place ReLU's output
must never be linked to the record of the tensor it overwrote."""
from __future__ import annotations

import json
from pathlib import Path

import torch

import aligner


class _InPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.act1 = torch.nn.ReLU(inplace=True)  # overwrites bn1's output: same object, other numbers
        self.fc = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act1(self.bn1(self.conv(x))))


def _records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "manifest.jsonl").read_text().splitlines()]


def test_inference_mode_dump_runs_and_never_links_an_overwritten_tensor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = _InPlace().eval(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        want = model(x.clone())
    with aligner.dump(model, tmp_path / "inference"), torch.inference_mode():
        got = model(x.clone())
    assert torch.equal(got, want)  # the user's forward ran to its end, unchanged
    records = _records(tmp_path / "inference")
    (out,) = [r for r in records if r.get("module") == "act1" and r.get("io") == "output"]
    held = out if out.get("same_as") is None else next(r for r in records if r.get("seq") == out["same_as"])
    assert held["stats"]["min"] >= 0, held  # ReLU's numbers, not bn1's pre-ReLU ones (about half negative)
    with aligner.dump(model, tmp_path / "no_grad"), torch.no_grad():
        model(x.clone())
    result = aligner.compare(tmp_path / "inference", tmp_path / "no_grad")
    assert result.exit_code == 0 and result.compared > 0
