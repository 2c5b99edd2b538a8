"""Backward capture on shapes the zoo models have: an in-place activation right after a pass-through module (timm's
Bottleneck: `drop_block` Identity, then `act2 = ReLU(inplace=True)`), whose input is then a view (the alias the
Identity returned), and an in-place module applied to a slice."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import aligner  # noqa: E402


class _Block(torch.nn.Module):
    def __init__(self, sliced: bool) -> None:
        super().__init__()
        self.sliced = sliced
        self.lin, self.drop_block = torch.nn.Linear(4, 6), torch.nn.Identity()
        self.act, self.out = torch.nn.ReLU(inplace=True), torch.nn.Linear(6, 2)

    def forward(self, x):
        h = self.drop_block(self.lin(x))
        if self.sliced:
            self.act(h[:, 1:4])
            return self.out(h)
        return self.out(self.act(h))


def _backward_records(root) -> dict:
    """(module, io) -> gradient of every backward record; a link (`same_as`: the very tensor an earlier record
    holds) read through to that record's file, as docs/dump-format.md tells readers to."""
    recs = [json.loads(line) for line in open(root / "manifest.jsonl", encoding="utf-8")][1:]
    files = {r["seq"]: r["file"] for r in recs}
    return {(r["module"], r["io"]): np.load(root / (r["file"] or files[r["same_as"]]))
            for r in recs if r["kind"] == "backward"}


@pytest.mark.parametrize("sliced", [False, True])
def test_in_place_module_after_an_identity_records_its_grad_input(tmp_path, sliced) -> None:
    torch.manual_seed(0)
    model, x = _Block(sliced), torch.randn(3, 4)
    with aligner.dump(model, tmp_path / "pt"):
        model(x).pow(2).mean().backward()
    got = _backward_records(tmp_path / "pt")
    # the truth without hooks: d loss / d (act's input)
    h = model.lin(x).detach()
    part = (h[:, 1:4] if sliced else h).clone().requires_grad_()
    full = h.clone()
    if sliced:
        full[:, 1:4] = torch.relu(part)
    else:
        full = torch.relu(part)
    model.out(full).pow(2).mean().backward()
    assert ("act", "grad_input") in got, sorted(got)
    np.testing.assert_allclose(got[("act", "grad_input")], part.grad.numpy(), rtol=1e-6, atol=1e-7)
