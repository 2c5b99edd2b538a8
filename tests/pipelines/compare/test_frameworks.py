"""Real dumps of the twin models from PyTorch and MindSpore (same weights); injected bugs must be localized exactly."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

import aligner  # noqa: E402
from aligner.pipelines.compare.run import compare  # noqa: E402
from aligner.render.compare import to_json  # noqa: E402
from tests.support.twin_models import example_input, make_twins  # noqa: E402


def _dump(tmp: Path, kind: str, tweak_pt: Callable | None = None, tweak_ms: Callable | None = None,
          train: bool = False, warmup: bool = False, stats_only: bool = False) -> tuple[Path, Path]:
    """Dump one forward+backward step of both twins (inputs and all modules recorded), after optional tweaks."""
    tnet, mnet = make_twins(kind, train=train or warmup)
    if tweak_pt:
        tweak_pt(tnet)
    if tweak_ms:
        tweak_ms(mnet)
    x = example_input(kind)
    if warmup:  # one training-mode forward updates BatchNorm running statistics, then dump in eval mode
        tnet(torch.from_numpy(x))
        mnet(ms.Tensor(x))
        tnet.eval()
        mnet.set_train(False)
    pt, msd = tmp / "pt", tmp / "ms"
    with aligner.dump(tnet, pt, inputs=True, leaves_only=False, stats_only=stats_only):
        tnet(torch.from_numpy(x)).square().mean().backward()
    with aligner.dump(mnet, msd, inputs=True, leaves_only=False, stats_only=stats_only):
        ms.value_and_grad(lambda t: mnet(t).square().mean(), None, mnet.trainable_params())(ms.Tensor(x))
    return msd, pt


def _compare(tmp: Path, a: Path, b: Path, *, bisect: bool = False) -> tuple[int, dict[str, Any]]:
    result = compare(str(a), str(b), bisect=bisect)
    return int(result.exit_code), json.loads(json.dumps(to_json(result)))


def _origin(result: dict[str, Any], phase: str = "forward") -> dict[str, Any]:
    found = [f for f in result["findings"] if f["phase"] == phase]
    assert found, f"no {phase} finding: {result['summary']}"
    return found[0]


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_clean_twins_report_no_divergence(tmp_path: Path, kind: str) -> None:
    code, result = _compare(tmp_path, *_dump(tmp_path, kind, train=kind == "cnn"))
    assert code == 0, result["summary"]
    assert result["findings"] == [] and result["nan_origin"] is None
    assert result["counts"]["unmatched_a"] == result["counts"]["unmatched_b"] == 0
    assert result["counts"]["name"] > 40  # forward, backward and parameter gradients (gamma <-> weight) by name
    assert {r["dtype_a"] for r in result["rows"]} == {"float32"}


def test_layernorm_epsilon(tmp_path: Path) -> None:
    code, result = _compare(tmp_path, *_dump(tmp_path, "block", tweak_pt=lambda n: setattr(n.ln2, "eps", 0.1)))
    f = _origin(result)
    assert code == 1
    assert (f["module"], f["origin_module"]) == ("ln2", "ln2")
    assert result["rows"][f["first"]]["io"] == "output" and result["rows"][f["first"]]["label"] == "introduced"
    assert "introduced here: its input matched" in result["summary"]
    assert result["rows"][f["previous"]]["status"] == "ok"


def test_gelu_tanh_vs_erf(tmp_path: Path) -> None:
    code, result = _compare(tmp_path, *_dump(tmp_path, "block",
                                             tweak_pt=lambda n: setattr(n.mlp.act, "approximate", "tanh")))
    f = _origin(result)
    assert code == 1 and f["origin_module"] == "mlp.act" and f["module"] == "mlp.act"
    row = result["rows"][f["first"]]
    # The two GELUs differ by at most 4.7e-4 over the reals (at |x| = 2.7) and by more than 1e-5 for any
    # 0.44 < |x| < 4.5, which layer-normed inputs reach: 20x margins below and above, far from float32 noise.
    assert 1e-5 < row["max_abs_err"] < 1e-2


def test_wrong_padding(tmp_path: Path) -> None:
    code, result = _compare(tmp_path, *_dump(tmp_path, "cnn", train=True,
                                             tweak_pt=lambda n: setattr(n.conv2, "padding_mode", "reflect")))
    f = _origin(result)
    assert code == 1 and f["origin_module"] == "conv2" and f["module"] == "conv2"


def test_swapped_gamma_beta(tmp_path: Path) -> None:
    def swap(net: Any) -> None:
        params = dict(net.parameters_and_names())
        gamma, beta = params["bn1.gamma"], params["bn1.beta"]
        g = gamma.asnumpy().copy()
        gamma.set_data(ms.Tensor(beta.asnumpy().copy()))
        beta.set_data(ms.Tensor(g))

    code, result = _compare(tmp_path, *_dump(tmp_path, "cnn", train=True, tweak_ms=swap))
    assert code == 1 and _origin(result)["origin_module"] == "bn1"


def test_batchnorm_momentum_convention_in_train_mode(tmp_path: Path) -> None:
    # torch momentum 0.9 written for MindSpore's 0.9 (= torch 0.1): running stats differ after a training step
    code, result = _compare(tmp_path, *_dump(tmp_path, "cnn", warmup=True,
                                             tweak_pt=lambda n: setattr(n.bn2, "momentum", 0.9)))
    f = _origin(result)
    assert code == 1 and f["origin_module"] == "bn2" and f["module"] == "bn2"


def test_nan_from_log_of_negative(tmp_path: Path) -> None:
    class LogPt(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.log(x.abs() + 1)

    class LogMs(ms.nn.Cell):
        def construct(self, x: Any) -> Any:
            return ms.ops.log(x + 1)  # the bug: a negative input gives NaN

    code, result = _compare(tmp_path, *_dump(tmp_path, "block", tweak_pt=lambda n: setattr(n.mlp, "act", LogPt()),
                                             tweak_ms=lambda n: setattr(n.mlp, "act", LogMs())))
    assert code == 1 and _origin(result)["origin_module"] == "mlp.act"
    nan = result["nan_origin"]
    assert nan["side"] == "a" and result["rows"][nan["row"]]["module"] == "mlp.act"
    assert result["rows"][nan["row"]]["nan_a"] == nan["count"] > 0


def test_wrong_gradient_only_in_backward(tmp_path: Path) -> None:
    class BadGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.save_for_backward(x)
            return torch.nn.functional.gelu(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (x,) = ctx.saved_tensors
            return grad * torch.sigmoid(1.702 * x)  # an approximate derivative: the forward stays exact

    class Act(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return BadGelu.apply(x)

    code, result = _compare(tmp_path, *_dump(tmp_path, "block", tweak_pt=lambda n: setattr(n.mlp, "act", Act())))
    assert code == 1
    assert not [f for f in result["findings"] if f["phase"] == "forward"]
    f = _origin(result, "backward")
    first = result["rows"][f["first"]]
    assert f["origin_module"] == "mlp.act" and (first["module"], first["io"]) == ("mlp.act", "grad_input")


def test_statistics_only_dumps_localize_too(tmp_path: Path) -> None:
    a, b = _dump(tmp_path, "block", tweak_pt=lambda n: setattr(n.ln2, "eps", 0.1), stats_only=True)
    code, result = _compare(tmp_path, a, b)
    assert code == 1 and _origin(result)["origin_module"] == "ln2"
    assert {r["method"] for r in result["rows"]} == {"stats"}


def test_bisect_agrees_with_full_scan(tmp_path: Path) -> None:
    a, b = _dump(tmp_path, "block", tweak_pt=lambda n: setattr(n.ln2, "eps", 0.1))
    code, result = _compare(tmp_path, a, b, bisect=True)
    f = _origin(result)
    assert code == 1 and result["rows"][f["first"]]["module"] == "ln2"
    pairs = sum(1 for r in result["rows"] if r["status"] != "unmatched")
    assert result["bisect_reads"] < pairs // 2
    assert result["bisect_confirmed"] is (result["bisect_unread"] == 0)  # proven first only when all before was read


def test_bisect_is_not_fooled_by_a_loss_probe(tmp_path: Path) -> None:
    """A tanh-GELU in one block leaves the scalar loss within tolerance; bisect must still name the activation, as the
    full comparison does, in both argument orders (a probe proves nothing about the layers before it)."""
    tnet, mnet = make_twins("block")
    tnet.mlp.act.approximate = "tanh"
    x = example_input("block")
    pt, msd = tmp_path / "pt", tmp_path / "ms"
    with aligner.dump(tnet, pt):
        loss = tnet(torch.from_numpy(x)).square().mean()
        aligner.save("loss", loss)
    with aligner.dump(mnet, msd):
        aligner.save("loss", mnet(ms.Tensor(x)).square().mean())
    for a, b in ((msd, pt), (pt, msd)):
        full, fast = compare(str(a), str(b)), compare(str(a), str(b), bisect=True)
        origins = [[r.module(f.origin) for f in r.verdict.findings] for r in (full, fast)]
        assert origins[0] == origins[1] == ["mlp.act"], origins
        assert fast.exit_code == full.exit_code == 1
