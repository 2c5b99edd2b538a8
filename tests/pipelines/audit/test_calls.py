"""The model audit pairs layers by calls, not by objects: a stateless layer one side calls several times (mindcv's one
`relu` after every conv) pairs with one layer of the other side per call; a call nothing on the other side matches is
not audited; a layer with parameters called twice where the other side has two layers is weight sharing; a layer
whose traced inputs differ only in the first axis (tokens an MoE router sent) is still probed. Also the other pairings
the clean zoo pairs needed: mint.nn.Embedding, a module one side only reads (paired by path), a fused qkv split into
q, k and v. Real torch and MindSpore layers throughout."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aligner.core.findings import Severity
from aligner.pipelines.audit import audit
from aligner.render.audit import audit_lines
from aligner.render.words import say

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")
ms_nn = ms.nn

X = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)


class MsOneReLU(ms_nn.Cell):
    """Dense, relu, Dense, and the same relu again when `twice` (mindcv's ResNet blocks reuse one ReLU cell)."""

    def __init__(self, twice: bool = True) -> None:
        super().__init__()
        self.fc1, self.fc2, self.relu, self.twice = ms_nn.Dense(8, 16), ms_nn.Dense(16, 4), ms_nn.ReLU(), twice

    def construct(self, x: Any) -> Any:
        x = self.fc2(self.relu(self.fc1(x)))
        return self.relu(x) if self.twice else x


def _torch_relus(count: int) -> torch.nn.Module:
    """Linear, ReLU, Linear, and a second ReLU object when `count` is 2."""
    tail = [torch.nn.ReLU()] if count == 2 else []
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), *tail).eval()


def _ms(twice: bool = True) -> MsOneReLU:
    net = MsOneReLU(twice)
    net.set_train(False)
    return net


@pytest.mark.parametrize("torch_first", [True, False])
def test_reused_relu_pairs_once_per_call_in_either_order(torch_first: bool) -> None:
    """Two torch ReLUs, one MindSpore relu called twice: each torch ReLU pairs with one call, and the clean pair
    passes (exit 0). Before: the second torch ReLU stayed unpaired, 'not audited', INCOMPLETE, exit 1."""
    pt, msm = _torch_relus(2), _ms()
    report = audit(*((pt, msm) if torch_first else (msm, pt)), X)
    assert [(p.torch_path, p.ms_path) for p in report.pairs if p.kind == "ReLU"] == [("1", "relu"), ("3", "relu")]
    assert report.exit_code == 0 and not report.unpaired, [say(n.why) for n in report.not_audited]
    assert audit_lines(report)[-1][0].startswith("PASSED")


def test_a_call_the_other_side_lacks_is_not_audited() -> None:
    """One torch ReLU, a MindSpore relu called twice (an extra activation after the last Dense): the second call is
    not audited, named by its call number. Before: the relu object was paired once, the extra call unseen, PASSED."""
    report = audit(_torch_relus(1), _ms(twice=True), X)
    assert [(n.torch_path, n.ms_path, n.kind) for n in report.not_audited] == [(None, "relu", "ReLU")]
    assert "(call 2 of 2)" in say(report.not_audited[0].why)
    assert report.exit_code == 1 and audit_lines(report)[-1][0].startswith("INCOMPLETE")


class MsOneDense(ms_nn.Cell):
    """One Dense called twice: its weight is shared by both calls."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = ms_nn.Dense(8, 8)

    def construct(self, x: Any) -> Any:
        return self.fc(self.fc(x))


def test_layer_with_parameters_called_twice_is_weight_sharing() -> None:
    """Two torch Linears, one MindSpore Dense called twice: the calls pair with the two Linears, and the sharing audit
    says MindSpore shares one parameter where torch has two (they train apart). Before: the second Linear unpaired
    ('not audited') and nothing said about the sharing."""
    pt = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).eval()
    msm = MsOneDense()
    msm.set_train(False)
    report = audit(pt, msm, X)
    assert [(p.torch_path, p.ms_path) for p in report.pairs] == [("0", "fc"), ("1", "fc")]
    assert not report.not_audited
    shared = [f for f in report.findings if f.rule == "weight-sharing"]
    assert {f.values for f in shared} == {
        (("0.weight", "1.weight"), ("fc.weight (call 1 of 2)", "fc.weight (call 2 of 2)")),
        (("0.bias", "1.bias"), ("fc.bias (call 1 of 2)", "fc.bias (call 2 of 2)"))}
    assert all(f.severity == Severity.WARNING and say(f.fix).startswith("untie them") for f in shared)


class SiLUActivation(torch.nn.Module):
    """transformers' SiLUActivation-style class: a plain nn.Module (taken by its name, so only a probe checks it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x)


class MsSiLUActivation(ms_nn.Cell):
    """mindone's twin: a plain Cell of the same class name."""

    def construct(self, x: Any) -> Any:
        return ms.ops.silu(x)


MsSiLUActivation.__name__ = "SiLUActivation"


class TorchExpert(torch.nn.Module):
    """An expert that gets the first `tokens` rows, as a router with its own (unconverted) weights would pick them."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.fc, self.act, self.tokens = torch.nn.Linear(8, 8), SiLUActivation(), tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x[:self.tokens]))


class MsExpert(ms_nn.Cell):
    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.fc, self.act, self.tokens = ms_nn.Dense(8, 8), MsSiLUActivation(), tokens

    def construct(self, x: Any) -> Any:
        return self.act(self.fc(x[:self.tokens]))


def test_probe_runs_when_the_traced_inputs_differ_in_the_first_axis_only() -> None:
    """An expert's activation traced at 3 tokens in torch and 2 in MindSpore (routers with different random weights
    pick different tokens): probed on one side's shape, equal, a pass. Before: 'not probed: the traced input shapes
    differ', not audited, exit 1 (the clean Mixtral zoo pair had 7 such activations)."""
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    msm = MsExpert(2)
    msm.set_train(False)
    report = audit(TorchExpert(3).eval(), msm, x)
    (act,) = [p for p in report.pairs if p.kind == "SiLU"]
    assert say(act.probe).startswith("outputs equal"), say(act.probe)
    assert report.exit_code == 0, [say(n.why) for n in report.not_audited]


def test_mint_embedding_is_an_embedding() -> None:
    """mindone builds `mint.nn.Embedding` (class EmbeddingExt): paired with torch's Embedding and its settings read.
    Before: not a known kind, so every torch Embedding of the mindone zoo pairs was unpaired ('not audited')."""
    from mindspore import mint

    report = audit(torch.nn.Embedding(10, 4, padding_idx=0), mint.nn.Embedding(10, 4))
    assert [p.kind for p in report.pairs] == ["Embedding"] and not report.not_audited
    assert [(f.rule, f.values) for f in report.findings if f.rule == "embedding-padding-idx"] == [
        ("embedding-padding-idx", (0, None))]


class TorchAttention(torch.nn.Module):
    """transformers' style: the dropout module's p is passed to a function; the module itself is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.dropout, self.out = torch.nn.Linear(8, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.dropout(self.proj(x), p=self.dropout.p, training=self.training))


class MsAttention(ms_nn.Cell):
    """mindone's style: the same dropout cell, called."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.proj, self.dropout, self.out = ms_nn.Dense(8, 8), ms_nn.Dropout(p=p), ms_nn.Dense(8, 4)

    def construct(self, x: Any) -> Any:
        return self.out(self.dropout(self.proj(x)))


def test_module_one_side_only_reads_pairs_by_its_path() -> None:
    """A dropout torch never calls (its p goes to F.dropout) and MindSpore calls: paired by their common path, so
    its p is compared (a p that differs is found). Before: the called MindSpore dropout unpaired, 'not audited'."""
    for p, found in ((0.1, []), (0.2, [(0.1, 0.2)])):
        msm = MsAttention(p)
        msm.set_train(False)
        report = audit(TorchAttention().eval(), msm, X)
        assert [(x.torch_path, x.ms_path, x.how) for x in report.pairs if x.kind == "Dropout"] == [
            ("dropout", "dropout", "path")]
        assert not report.not_audited
        assert [f.values for f in report.findings if f.rule == "dropout-p"] == [pytest.approx(v) for v in found]


class MsSplitQKV(ms_nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = ms_nn.Dense(8, 8), ms_nn.Dense(8, 8), ms_nn.Dense(8, 8)

    def construct(self, x: Any) -> Any:
        return self.q(x) + self.k(x) + self.v(x)


class TorchFusedQKV(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x).reshape(2, 3, 8).sum(1)


def test_fused_layer_split_by_the_plan_pairs_with_each_part() -> None:
    """timm's fused qkv, mindcv's q, k and v (the conversion plan splits the one weight): each part pairs with qkv,
    and no weight sharing is claimed for it. Before: q paired, k and v 'not audited' (the Swin zoo pair's 8)."""
    msm = MsSplitQKV()
    msm.set_train(False)
    report = audit(TorchFusedQKV().eval(), msm, X)
    assert [(p.torch_path, p.ms_path) for p in report.pairs] == [("qkv", "q"), ("qkv", "k"), ("qkv", "v")]
    assert not report.not_audited and not [f for f in report.findings if f.rule == "weight-sharing"]
