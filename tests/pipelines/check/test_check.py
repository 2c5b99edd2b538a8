"""`align check`: tiny MLPs trained for real in PyTorch and MindSpore (aligner.dump with params=True over a few steps)
show each symptom, the right rule finds it, and the same model fixed gives no error-severity finding.

Margins (measured in both frameworks, which agree to 3 digits, against each threshold): vanishing: input/output
gradient ratio 2e-6 vs 1e-3 (500x), fixed (ReLU + He) ~0.3; exploding: the global gradient norm reaches 9e16 then Inf
at step 2; update-ratio: lr 10x gives 0.20-0.37 vs 0.1 (2x), fixed 0.02-0.037 (2.7x below); dead-relu: 100% zeros vs
90%; fp16-overflow: |v| 5.7e5 vs 32752 (17x); fp16-underflow: 100% tiny vs 50%, fixed (loss scale 1024) 0%;
clip-before-unscale: grad_norm equals the scaled norm to 1e-7 (rtol 0.1), fixed is 1/1024 of it; grads-not-unscaled:
1024x vs 2x; loss-scale-overflow: NaN/Inf gradients at all 3 steps, fixed none; SGD at lr 1.0 (fixed: 0.01), 5 steps:
loss-trend 13.6x its lowest so far at step 1 vs 3x (4.5x), gradient-trend 15.2x in one step vs 10x (1.5x; 0.013x at
step 4 too); zero-initialised weights: every Linear's output all zeros.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from msgspec import UNSET

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.dumping.read.source import read_source
from aligner.pipelines.check import RuleConfig, check, evaluate
from tests.support.cli import align_in_process, assert_one_line_error

BATCH = 16


@dataclasses.dataclass(frozen=True)
class Case:
    """A tiny MLP (Linear, activation, ..., Linear) and how it is trained: MSE loss against fixed random targets."""

    widths: tuple[int, ...] = (8, 32, 32, 4)
    act: str = "ReLU"                 # ReLU | Sigmoid | Tanh
    gain: float = 2 ** 0.5            # weights ~ N(0, gain^2 / fan_in): sqrt(2) is He init
    bias: float = 0.0
    x_scale: float = 1.0
    lr: float = 0.01
    adam: bool = False
    frozen: tuple[int, ...] = ()      # Linear layers (0, 1, ...) left out of the optimizer
    loss_mult: float = 1.0            # multiplies the loss (how large the gradients are)
    scale: float = 1.0                # a static loss scale
    unscale: bool = True              # divide the gradients by the scale before the update
    clip: float | None = None         # clip_grad_norm_ / clip_by_global_norm max norm
    clip_scaled: bool = False         # clip before unscaling (checklist mp.03)
    steps: int = 3
    half: bool = False                # torch only: a float16 model
    stats_only: bool = False

    def weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng(0)
        return [((rng.standard_normal((o, i)) * self.gain / np.sqrt(i)).astype(np.float32),
                 np.full(o, self.bias, np.float32)) for i, o in zip(self.widths, self.widths[1:])]

    def data(self) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng(1)
        return [((rng.standard_normal((BATCH, self.widths[0])) * self.x_scale).astype(np.float32),
                 rng.standard_normal((BATCH, self.widths[-1])).astype(np.float32)) for _ in range(self.steps)]


def _linear_names(case: Case) -> list[str]:
    return [str(2 * k) for k in range(len(case.widths) - 1)]


def train_torch(case: Case, root: Path) -> Path:
    """Train `case` in PyTorch, dumping every step with its probes; returns the dump directory."""
    import torch

    import aligner

    layers: list[Any] = []
    for k, (w, b) in enumerate(case.weights()):
        if k:
            layers.append(getattr(torch.nn, case.act)())
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
    net = torch.nn.Sequential(*layers)
    dtype = torch.float16 if case.half else torch.float32
    net.to(dtype)
    skip = {f"{_linear_names(case)[k]}.{p}" for k in case.frozen for p in ("weight", "bias")}
    trained = [p for n, p in net.named_parameters() if n not in skip]
    params = list(net.parameters())
    opt = (torch.optim.Adam if case.adam else torch.optim.SGD)(trained, lr=case.lr)
    out = root / "pt"

    def norm() -> Any:
        return torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params))

    for s, (x, y) in enumerate(case.data()):
        with aligner.dump(net, out, step=s, params=True, stats_only=case.stats_only):
            opt.zero_grad()
            pred = net(torch.from_numpy(x).to(dtype)).float()
            loss = ((pred - torch.from_numpy(y)) ** 2).mean() * case.loss_mult
            (loss * case.scale).backward()
            aligner.save("loss", loss.detach())
            aligner.save("loss_scale", torch.tensor(case.scale))
            if case.clip is not None and case.clip_scaled:
                aligner.save("grad_norm", torch.nn.utils.clip_grad_norm_(params, case.clip))
            if case.unscale:
                for p in params:
                    p.grad.div_(case.scale)
            if case.clip is not None and not case.clip_scaled:
                aligner.save("grad_norm", torch.nn.utils.clip_grad_norm_(params, case.clip))
            if case.clip is None:
                aligner.save("grad_norm", norm())
            else:
                aligner.save("grad_norm_clipped", norm())
            opt.step()
    return out


def train_ms(case: Case, root: Path) -> Path:
    """Train `case` in MindSpore (PYNATIVE, value_and_grad inside aligner.dump) like `train_torch`."""
    import mindspore as ms
    from mindspore import nn, ops

    import aligner

    assert not case.half
    ms.set_context(mode=ms.PYNATIVE_MODE)
    layers: list[Any] = []
    for k, (w, b) in enumerate(case.weights()):
        if k:
            layers.append(getattr(nn, case.act)())
        dense = nn.Dense(w.shape[1], w.shape[0])
        dense.weight.set_data(ms.Tensor(w))
        dense.bias.set_data(ms.Tensor(b))
        layers.append(dense)
    net = nn.SequentialCell(layers)
    params = net.trainable_params()
    skip = {f"{_linear_names(case)[k]}.{p}" for k in case.frozen for p in ("weight", "bias")}
    keep = [i for i, p in enumerate(params) if p.name not in skip]
    opt = (nn.Adam if case.adam else nn.SGD)([params[i] for i in keep], learning_rate=case.lr)

    def forward(x: Any, y: Any) -> Any:
        loss = ((net(x) - y) ** 2).mean() * case.loss_mult
        return loss * case.scale, loss

    grad_fn = ms.value_and_grad(forward, None, params, has_aux=True)

    def norm(grads: Any) -> Any:
        return ops.sqrt(sum((g ** 2).sum() for g in grads))

    out = root / "ms"
    for s, (x, y) in enumerate(case.data()):
        with aligner.dump(net, out, step=s, params=True, stats_only=case.stats_only):
            (_, loss), grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
            aligner.save("loss", loss)
            aligner.save("loss_scale", ms.Tensor(np.float32(case.scale)))
            if case.clip is not None and case.clip_scaled:
                aligner.save("grad_norm", norm(grads))
                grads = ops.clip_by_global_norm(grads, case.clip)
            if case.unscale:
                grads = tuple(g / case.scale for g in grads)
            if case.clip is not None and not case.clip_scaled:
                aligner.save("grad_norm", norm(grads))
                grads = ops.clip_by_global_norm(grads, case.clip)
            aligner.save("grad_norm" if case.clip is None else "grad_norm_clipped", norm(grads))
            opt(tuple(grads[i] for i in keep))
    return out


TRAIN = {"pt": train_torch, "ms": train_ms}


def run_check(framework: str, case: Case, tmp: Path, **rules: Any) -> Any:
    return check(TRAIN[framework](case, tmp), rules or None)


DEEP = (8,) + (32,) * 8 + (4,)
# symptom -> (the model showing it, the same model fixed, the rule that must find it); margins: module docstring
SYMPTOMS: dict[str, tuple[Case, Case, str]] = {
    "vanishing": (Case(widths=DEEP, act="Sigmoid", gain=1.0), Case(widths=DEEP), "vanishing-gradients"),
    "exploding": (Case(widths=(8, 32, 32, 32, 32, 4), gain=4.0), Case(widths=(8, 32, 32, 32, 32, 4)),
                  "exploding-gradients"),
    "frozen": (Case(frozen=(1,)), Case(), "frozen-weights"),
    "lr-10x": (Case(adam=True, lr=0.1), Case(adam=True, lr=0.01), "update-ratio"),
    "dead-relu": (Case(x_scale=0.1, bias=-0.5), Case(bias=-0.5), "dead-relu"),
    # lr 1e-13 keeps the 1e5-scaled run from exploding (its gradients are ~1e10); the fixed run normalises its input
    # and trains at the usual lr (at 1e-13 its weights would not move in float32: frozen-weights)
    "fp16-overflow": (Case(x_scale=1e5, lr=1e-13), Case(), "fp16-overflow"),
    "fp16-underflow": (Case(loss_mult=1e-5), Case(loss_mult=1e-5, scale=1024.0), "fp16-underflow"),
    "clip-scaled": (Case(scale=1024.0, clip=1.0, clip_scaled=True), Case(scale=1024.0, clip=1.0),
                    "clip-before-unscale"),
    "not-unscaled": (Case(scale=1024.0, unscale=False, adam=True), Case(scale=1024.0, adam=True),
                     "grads-not-unscaled"),
    "scale-overflow": (Case(scale=2.0 ** 127, loss_mult=10.0), Case(scale=1024.0), "loss-scale-overflow"),
    "loss-spike": (Case(lr=1.0, steps=5), Case(steps=5), "loss-trend"),
    "gradient-jump": (Case(lr=1.0, steps=5), Case(steps=5), "gradient-trend"),
    "zero-init": (Case(gain=0.0), Case(), "constant-activations"),
}


@pytest.mark.parametrize("framework", ["pt", "ms"])
@pytest.mark.parametrize("symptom", list(SYMPTOMS))
def test_symptom_found_and_fixed(symptom: str, framework: str, tmp_path: Path) -> None:
    bad, fixed, rule = SYMPTOMS[symptom]
    report = run_check(framework, bad, tmp_path / "bad")
    assert rule in {f.rule for f in report.findings}, [f.message for f in report.findings]
    assert rule in report.evaluation.checked
    healthy = run_check(framework, fixed, tmp_path / "fixed")
    assert not healthy.errors, [f.message for f in healthy.errors]
    assert rule not in {f.rule for f in healthy.findings}, [f.message for f in healthy.findings]
    assert rule in healthy.evaluation.checked


def test_finding_details(tmp_path: Path) -> None:
    """Where, step and values of the findings: the input-side layer vanishes, the frozen layer is named, the
    gradient first overflows at step 2, the update ratio of lr 10x is above 0.1 (margin: ~0.37 at worst layer)."""
    vanish = run_check("pt", SYMPTOMS["vanishing"][0], tmp_path / "v")
    f = next(f for f in vanish.findings if f.rule == "vanishing-gradients")
    assert f.where == ("0.weight",) and f.step == 0 and f.values[0] < 1e-3 * 1e-2 and f.severity == Severity.ERROR
    frozen = run_check("pt", SYMPTOMS["frozen"][0], tmp_path / "f")
    assert {f.where[0] for f in frozen.findings if f.rule == "frozen-weights"} == {"2.weight", "2.bias"}
    explode = run_check("pt", SYMPTOMS["exploding"][0], tmp_path / "e")
    origin = next(f for f in explode.findings if f.rule == "nonfinite")
    assert origin.step == 2 and origin.severity == Severity.ERROR
    lr = run_check("pt", SYMPTOMS["lr-10x"][0], tmp_path / "lr")
    ratio = next(f for f in lr.findings if f.rule == "update-ratio")
    assert ratio.values[0] > 0.3 and ratio.severity == Severity.WARNING
    assert max(lr.evaluation.update_ratios["2.weight"].values()) > 0.2


def test_float16_run_with_and_without_loss_scaling(tmp_path: Path) -> None:
    """A real float16 torch run: small gradients are subnormal without loss scaling; a scale of 1024 lifts them."""
    bad = run_check("pt", Case(half=True, loss_mult=1e-3), tmp_path / "bad")
    found = next(f for f in bad.findings if f.rule == "fp16-underflow")
    assert "float16 run" in found.message
    good = run_check("pt", Case(half=True, loss_mult=1e-3, scale=1024.0), tmp_path / "good")
    assert "fp16-underflow" not in {f.rule for f in good.findings}


def test_saturated_tanh(tmp_path: Path) -> None:
    """A large init drives tanh to +-1 (|v| >= 0.99 for most outputs); He-scaled tanh does not."""
    bad = run_check("pt", Case(act="Tanh", gain=20.0, lr=1e-4), tmp_path / "bad")
    assert "saturated-activations" in {f.rule for f in bad.findings}
    good = run_check("pt", Case(act="Tanh", gain=1.0), tmp_path / "good")
    assert "saturated-activations" not in {f.rule for f in good.findings}


def test_one_step_dump_skips_trends_and_updates(tmp_path: Path) -> None:
    report = run_check("pt", Case(steps=1), tmp_path)
    for rule in ("frozen-weights", "update-ratio", "loss-trend", "gradient-trend"):
        assert rule in report.skipped and report.skipped[rule], rule
    assert "consecutive steps" in report.skipped["update-ratio"]
    assert "nonfinite" in report.evaluation.checked


def test_stats_only_dump(tmp_path: Path) -> None:
    """Without tensor files, a frozen weight is still found (identical statistics) and the update ratio is a stated
    lower bound."""
    report = run_check("pt", Case(frozen=(1,), stats_only=True), tmp_path)
    assert report.mode == "stats"
    assert "2.weight" in {f.where[0] for f in report.findings if f.rule == "frozen-weights"}
    assert not report.evaluation.exact_updates and any("bounded below" in n for n in report.evaluation.notes)


def test_older_stats_are_skipped_with_reason(tmp_path: Path) -> None:
    """Records without the newer statistics (zeros, near_one, tiny): the rules needing them are skipped, not passed."""
    source = read_source(train_torch(Case(), tmp_path))
    records = [item.record for item in source.items] + [item.record for item in source.params.values()]
    for rec in records:
        if rec.stats:
            rec.stats = msgspec.structs.replace(rec.stats, zeros=UNSET, near_zero=UNSET, near_one=UNSET, tiny=UNSET,
                                                numel=UNSET)
    ev = evaluate(records, RuleConfig.load(), framework="pytorch")
    assert "lack 'zeros'" in ev.skipped["dead-relu"]
    assert "lack 'tiny'" in ev.skipped["fp16-underflow"]
    assert "constant-activations" in ev.checked


def test_rule_config_overrides() -> None:
    config = RuleConfig.load({"update-ratio.high": "0.05", "dead-relu": {"zeros": 0.5, "enabled": "false"}})
    assert config("update-ratio", "high") == 0.05 and config("dead-relu", "zeros") == 0.5
    assert not config.enabled("dead-relu")
    for bad in ({"nosuch.key": 1}, {"update-ratio.nosuch": 1}, {"update-ratio.high": "abc"},
                {"update-ratio.severity": "fatal"}, {"update-ratio": 3}):
        with pytest.raises(AlignerError):
            RuleConfig.load(bad)


def test_cli_exit_codes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = train_torch(SYMPTOMS["frozen"][0], tmp_path)
    proc = align_in_process(capsys, "check", dump, "--json", tmp_path / "r.json", "--html", tmp_path / "r.html")
    assert proc.returncode == 1, proc.stderr
    assert "frozen-weights" in proc.stdout and "FAILED" in proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["exit_code"] == 1 and any(f["rule"] == "frozen-weights" for f in data["findings"])
    assert "saturated-activations" in data["skipped"]
    page = (tmp_path / "r.html").read_text()
    assert page.count("Plotly.newPlot") >= 2 and 'id="update-ratios"' in page and 'id="grad-norms"' in page
    # relaxing the rule's severity: no error left, exit 0
    proc = align_in_process(capsys, "check", dump, "--rule", "frozen-weights.severity=warning")
    assert proc.returncode == 0, proc.stdout


def test_cli_bad_rule_and_all_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = train_torch(Case(steps=1), tmp_path)
    for text in ("update-ratio.high=abc", "nosuch.key=1", "update-ratio", "update-ratio.high="):
        assert_one_line_error(align_in_process(capsys, "check", dump, "--rule", text), "--rule" if "=" not in text
                              or text.endswith("=") else "rule")
    off = [f"--rule={name}.enabled=false" for name in RuleConfig.load().names if name != "loss-trend"]
    proc = align_in_process(capsys, "check", dump, *off)
    assert_one_line_error(proc, "every rule was skipped", "loss-trend")
    shutil.rmtree(dump)


def test_a_gradient_that_is_rounding_noise_is_not_a_frozen_weight(tmp_path):
    """An attention key bias gets exactly 0 gradient in theory (softmax ignores a constant per query): in float32 its
    gradient is noise ~1e-8 of the others and its update is below rounding, so the weight 'does not change'. That is
    not a parameter missing from the optimizer (the demo model showed it), and its noise is not float16 underflow."""
    import torch

    import aligner
    from aligner.pipelines.check import check

    torch.manual_seed(0)
    q, k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    model = torch.nn.ModuleDict({"q": q, "k": k})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 5, 8)
    for step in range(2):
        with aligner.dump(model, tmp_path / "d", step=step, params=True, backward=True):
            att = torch.softmax(q(x) @ k(x).transpose(1, 2), dim=-1)
            loss = (att @ x).square().mean()
            opt.zero_grad()
            loss.backward()
        opt.step()
    report = check(tmp_path / "d")
    assert not [f for f in report.findings if f.rule in ("frozen-weights", "fp16-underflow")], report.findings
    # with the noise threshold off, the same run is (wrongly) flagged: the test can fail
    strict = check(tmp_path / "d", rules={"frozen-weights.negligible": 0.0, "fp16-underflow.negligible": 0.0})
    assert any(f.rule == "frozen-weights" and "k.bias" in f.where for f in strict.findings), strict.findings
