"""The update step explained: real 3-step trainings of a tiny Linear+BatchNorm+Linear MLP in PyTorch and MindSpore,
gradients dumped with aligner.dump, each side's optimizer rule fitted and the difference between two sides named.

Tolerance margins: a correct rule reproduces the weights to ~1e-5 of the distance travelled (float32 arithmetic),
the fit accepts up to FIT_RTOL = 1e-3, and every wrong rule exercised here is off by more than 1e-2. Fitted numbers
are asserted within 2% of the value set (fits resolve them to ~1e-4; rounding to 3 significant digits is exact for
the values used), except what 3 steps cannot resolve (eps far below the gradients), which is asserted as a bound.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.pipelines.diff import (
    MIN_STEPS,
    ClipKind,
    Family,
    UpdateReport,
    explain_updates,
    fit_side,
)
from aligner.render.words import say
from tests.support.cli import align_in_process, assert_one_line_error

STEPS = 3
_RNG = np.random.default_rng(7)
W1 = (_RNG.standard_normal((8, 4)) * 0.5).astype(np.float32)
W2 = (_RNG.standard_normal((3, 8)) * 0.5).astype(np.float32)
B2 = (_RNG.standard_normal(3) * 0.1).astype(np.float32)
GAMMA = (1 + _RNG.standard_normal(8) * 0.1).astype(np.float32)
BETA = (_RNG.standard_normal(8) * 0.1).astype(np.float32)
X = [_RNG.standard_normal((6, 4)).astype(np.float32) for _ in range(5)]
Y = [_RNG.standard_normal((6, 3)).astype(np.float32) for _ in range(5)]
DECAYED_PT = ("fc1.weight", "fc2.weight")   # the conv/linear weights: the usual "no decay on biases and norms" group


@dataclasses.dataclass
class Run:
    """One training run's files: weights before step 1, after the last step, and the gradient dump."""

    init: Path
    final: Path
    grads: Path


def _torch_net() -> Any:
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.bn = torch.nn.Linear(4, 8, bias=False), torch.nn.BatchNorm1d(8)
            self.fc2 = torch.nn.Linear(8, 3)

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.relu(self.bn(self.fc1(x))))

    net = MLP()
    with torch.no_grad():
        for p, v in zip((net.fc1.weight, net.bn.weight, net.bn.bias, net.fc2.weight, net.fc2.bias),
                        (W1, GAMMA, BETA, W2, B2)):
            p.copy_(torch.from_numpy(v))
    return net


def _ms_net() -> Any:
    import mindspore as ms
    from mindspore import nn, ops

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.bn = nn.Dense(4, 8, has_bias=False), nn.BatchNorm1d(8, momentum=0.9)
            self.fc2 = nn.Dense(8, 3)

        def construct(self, x: Any) -> Any:
            return self.fc2(ops.relu(self.bn(self.fc1(x))))

    net = MLP()
    for p, v in zip((net.fc1.weight, net.bn.gamma, net.bn.beta, net.fc2.weight, net.fc2.bias),
                    (W1, GAMMA, BETA, W2, B2)):
        p.set_data(ms.Tensor(v))
    net.set_train(True)
    return net


def train_torch(root: Path, make_opt: Callable[[Any], Any], *, steps: int = STEPS, clip: float | None = None,
                scale: float = 1.0, unscale: bool = True, clip_scaled: bool = False, grad_scale: float = 1.0,
                dumped: range | None = None, params: bool = False) -> Run:
    """Train the torch MLP `steps` steps, dumping parameter gradients; `scale` multiplies the loss (a loss scale),
    removed before the update when `unscale`; `clip` is clip_grad_norm_'s max_norm, applied to the still-scaled
    gradients with `clip_scaled` (mp.03); `grad_scale` multiplies the loss like a different loss reduction."""
    import torch

    import aligner

    root.mkdir(parents=True)
    net = _torch_net()
    opt = make_opt(net)
    run = Run(root / "init.pth", root / "final.pth", root / "grads")
    torch.save(net.state_dict(), run.init)
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        with aligner.dump(net, run.grads, step=s + 1, steps=dumped, params=params):
            loss = ((net(torch.from_numpy(X[s])) - torch.from_numpy(Y[s])) ** 2).mean() * scale * grad_scale
            loss.backward()
        if clip is not None and clip_scaled:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        if unscale and scale != 1.0:
            for p in net.parameters():
                p.grad.div_(scale)
        if clip is not None and not clip_scaled:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
    torch.save(net.state_dict(), run.final)
    return run


def train_ms(root: Path, make_opt: Callable[[Any], Any], *, steps: int = STEPS, clip: float | None = None,
             scale: float = 1.0, unscale: bool = True, grad_scale: float = 1.0, params: bool = False) -> Run:
    """Train the MindSpore MLP (PYNATIVE, value_and_grad inside aligner.dump) like `train_torch`."""
    import mindspore as ms
    from mindspore import ops

    import aligner

    ms.set_context(mode=ms.PYNATIVE_MODE)
    root.mkdir(parents=True)
    net = _ms_net()
    opt = make_opt(net)
    run = Run(root / "init.ckpt", root / "final.ckpt", root / "grads")
    ms.save_checkpoint(net, str(run.init))
    params = net.trainable_params()

    def loss_fn(x: Any, y: Any) -> Any:
        return ((net(x) - y) ** 2).mean() * scale * grad_scale

    grad_fn = ms.value_and_grad(loss_fn, None, params)
    for s in range(steps):
        with aligner.dump(net, run.grads, step=s + 1, params=params):
            _, grads = grad_fn(ms.Tensor(X[s]), ms.Tensor(Y[s]))
        if unscale and scale != 1.0:
            grads = tuple(g / scale for g in grads)
        if clip is not None:
            grads = ops.clip_by_global_norm(grads, clip)
        opt(grads)
    ms.save_checkpoint(net, str(run.final))
    return run


def _pt_groups(net: Any, wd: float, decayed: tuple[str, ...] = DECAYED_PT, **kw: Any) -> list[dict]:
    """torch parameter groups: weight decay `wd` on the `decayed` parameters (the linear weights) only."""
    decay = [p for n, p in net.named_parameters() if n in decayed]
    rest = [p for n, p in net.named_parameters() if n not in decayed]
    return [{"params": decay, "weight_decay": wd, **kw}, {"params": rest, "weight_decay": 0.0, **kw}]


def _ms_groups(net: Any, wd: float) -> list[dict]:
    decay = [p for p in net.trainable_params() if p.name in DECAYED_PT]
    rest = [p for p in net.trainable_params() if p.name not in DECAYED_PT]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def _torch_opt(kind: str, **kw: Any) -> Callable[[Any], Any]:
    def make(net: Any) -> Any:
        import torch

        return getattr(torch.optim, kind)(net.parameters(), **kw)
    return make


# name -> (framework, optimizer factory, expected family, expected settings, training options)
SETTINGS: dict[str, tuple[str, Callable[[Any], Any], Family, dict, dict]] = {
    "pt_sgd": ("pt", _torch_opt("SGD", lr=0.1), Family.SGD, {"lr": 0.1, "momentum": 0.0}, {}),
    "pt_momentum_wd": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9, weight_decay=0.01), Family.SGD,
                       {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": False}, {}),
    "pt_nesterov": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.8, nesterov=True), Family.SGD,
                    {"lr": 0.05, "momentum": 0.8, "nesterov": True}, {}),
    "pt_dampening": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9, dampening=0.5), Family.SGD,
                     {"lr": 0.05, "momentum": 0.9, "dampening": 0.5}, {"steps": 4}),
    "pt_adam": ("pt", _torch_opt("Adam", lr=0.01), Family.ADAM, {"lr": 0.01, "beta1": 0.9, "beta2": 0.999}, {}),
    "pt_adamw": ("pt", _torch_opt("AdamW", lr=0.01, weight_decay=0.5), Family.ADAMW,
                 {"lr": 0.01, "weight_decay": 0.5, "beta1": 0.9, "beta2": 0.999}, {}),
    "pt_adam_betas": ("pt", _torch_opt("Adam", lr=0.01, betas=(0.8, 0.99)), Family.ADAM,
                      {"lr": 0.01, "beta1": 0.8, "beta2": 0.99}, {}),
}


def _ms_opt(kind: str, **kw: Any) -> Callable[[Any], Any]:
    def make(net: Any) -> Any:
        from mindspore import nn

        return getattr(nn, kind)(net.trainable_params(), **kw)
    return make


SETTINGS.update({
    "ms_momentum": ("ms", _ms_opt("Momentum", learning_rate=0.05, momentum=0.9), Family.SGD,
                    {"lr": 0.05, "momentum": 0.9}, {}),
    # MindSpore's default weight-decay filter skips names with 'gamma'/'beta' (BatchNorm) but decays biases
    "ms_momentum_wd": ("ms", _ms_opt("Momentum", learning_rate=0.05, momentum=0.8, weight_decay=0.01), Family.SGD,
                       {"lr": 0.05, "momentum": 0.8}, {}),
    "ms_adam": ("ms", _ms_opt("Adam", learning_rate=0.01), Family.ADAM, {"lr": 0.01, "beta1": 0.9}, {}),
    "ms_adam_weight_decay": ("ms", _ms_opt("AdamWeightDecay", learning_rate=0.01, weight_decay=0.5),
                             Family.MS_ADAM_WEIGHT_DECAY, {"lr": 0.01, "beta1": 0.9, "beta2": 0.999}, {}),
})


def train(root: Path, name: str, **options: Any) -> Run:
    framework, make_opt, _, _, defaults = SETTINGS[name]
    return (train_torch if framework == "pt" else train_ms)(root / name, make_opt, **{**defaults, **options})


def _ms_all_decayed(wd: float, kind: str = "Momentum", **kw: Any) -> Callable[[Any], Any]:
    """A MindSpore optimizer whose one parameter group decays every parameter (BatchNorm gamma/beta included)."""
    def make(net: Any) -> Any:
        from mindspore import nn

        return getattr(nn, kind)([{"params": net.trainable_params(), "weight_decay": wd}], **kw)
    return make


def _pt_linear_decayed(kind: str, wd: float, decayed: tuple[str, ...] = DECAYED_PT, **kw: Any
                       ) -> Callable[[Any], Any]:
    """A torch optimizer decaying only the `decayed` parameters (the others in a wd=0 group)."""
    def make(net: Any) -> Any:
        import torch

        return getattr(torch.optim, kind)(_pt_groups(net, wd, decayed), **kw)
    return make


# name -> (framework, optimizer, training options): the runs the pair tests compare
PAIR_RUNS: dict[str, tuple[str, Callable[[Any], Any], dict]] = {
    "pt_momentum": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9), {}),
    "ms_momentum": ("ms", _ms_opt("Momentum", learning_rate=0.05, momentum=0.9), {}),
    "ms_momentum_lr": ("ms", _ms_opt("Momentum", learning_rate=0.005, momentum=0.9), {}),
    "pt_momentum_wd_linear": ("pt", _pt_linear_decayed("SGD", 0.05, lr=0.05, momentum=0.9), {}),
    "ms_momentum_wd_all": ("ms", _ms_all_decayed(0.05, learning_rate=0.05, momentum=0.9), {}),
    "ms_momentum_clip": ("ms", _ms_opt("Momentum", learning_rate=0.05, momentum=0.9), {"clip": 0.05}),
    "pt_adam_eps6": ("pt", _torch_opt("Adam", lr=0.01, eps=1e-6), {"grad_scale": 1e-6}),
    "ms_adam_eps8": ("ms", _ms_opt("Adam", learning_rate=0.01, eps=1e-8), {"grad_scale": 1e-6}),
    # MindSpore's default filter: weight decay on everything but gamma/beta; torch grouped the same way
    "pt_adamw_no_bn": ("pt", _pt_linear_decayed("AdamW", 0.5, ("fc1.weight", "fc2.weight", "fc2.bias"), lr=0.01),
                       {}),
    "pt_sgd_small": ("pt", _torch_opt("SGD", lr=1e-4), {}),
    "ms_sgd_scaled": ("ms", _ms_opt("Momentum", learning_rate=1e-4, momentum=0.0), {"scale": 1024.0,
                                                                                    "unscale": False}),
    "ms_sgd_unscaled": ("ms", _ms_opt("Momentum", learning_rate=1e-4, momentum=0.0), {"scale": 1024.0}),
    # mp.03 pair: updates 1/1024 of the other side's must stay far above float32 rounding, hence lr 1 and clip 0.5
    # (global gradient norms are 1.2-3.5: every step clipped on both sides)
    "pt_sgd_clip_scaled": ("pt", _torch_opt("SGD", lr=1.0), {"clip": 0.5, "scale": 1024.0, "clip_scaled": True}),
    "ms_sgd_clip": ("ms", _ms_opt("Momentum", learning_rate=1.0, momentum=0.0), {"clip": 0.5}),
    "pt_momentum_params": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9), {"params": True}),
    "ms_momentum_params": ("ms", _ms_opt("Momentum", learning_rate=0.05, momentum=0.9), {"params": True}),
    "pt_two_steps": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9), {"steps": 2}),
    "pt_other_steps": ("pt", _torch_opt("SGD", lr=0.05, momentum=0.9), {"steps": 4, "dumped": range(1, 4)}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """Train a named run on first use (settings in SETTINGS or PAIR_RUNS), then hand back its files."""
    root = tmp_path_factory.mktemp("update_rule")
    done: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            if name in SETTINGS:
                done[name] = train(root, name)
            else:
                framework, make_opt, options = PAIR_RUNS[name]
                done[name] = (train_torch if framework == "pt" else train_ms)(root / name, make_opt, **options)
        return done[name]
    return get


def explain(runs: Callable[[str], Run], a: str, b: str) -> UpdateReport:
    """A vs the reference B, each side from its own init."""
    ra, rb = runs(a), runs(b)
    return explain_updates(str(ra.final), str(rb.final), str(ra.grads), str(rb.grads), init_a=str(ra.init),
                           init_b=str(rb.init))


def _side_fit(run: Run) -> Any:
    """Fit one run alone (the array-level API under the reader)."""
    from aligner.io import open_checkpoint
    from aligner.pipelines.diff import read_dump

    dump = read_dump(str(run.grads))
    with open_checkpoint(str(run.init)) as init, open_checkpoint(str(run.final)) as final:
        weights = {n: [init.get(n), final.get(n)] for n in dump.grads}
    return fit_side(weights, dump.grads)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_fit_identifies_setting(runs, name):
    """Every parameter of a run follows one fitted rule of the right family with the numbers that were set."""
    _, _, family, expected, _ = SETTINGS[name]
    side = _side_fit(runs(name))
    assert not side.unfitted, [say(p.reason) for p in side.unfitted]
    assert side.clipping.kind is ClipKind.NONE
    fitted = [p for p in side.params if p.rule is not None]
    assert len(fitted) == 5    # fc1.weight, bn weight/bias, fc2 weight/bias (fc1 has no bias: BatchNorm follows)
    for p in fitted:
        assert p.rule.family is family, (p.name, p.rule.describe())
        for key, value in expected.items():
            got = getattr(p.rule, key)
            assert got == value if isinstance(value, bool) else abs(got - value) <= 0.02 * abs(value) + 1e-9, \
                (p.name, key, got, value)
        if family.adaptive:
            assert p.rule.eps_max is not None  # gradients ~1e-2 are far above eps: eps is a bound, not a value


def test_groups_by_weight_decay(runs):
    """torch groups with weight decay on the linear weights only, and MindSpore's default filter (gamma/beta
    skipped, biases decayed), both come back as two groups described by what the parameters are."""
    pt = _side_fit(runs("pt_momentum_wd_linear"))
    groups = {tuple(sorted(g.names)): g for g in pt.groups}
    assert set(groups) == {("fc1.weight", "fc2.weight"), ("bn.bias", "bn.weight", "fc2.bias")}
    assert abs(groups[("fc1.weight", "fc2.weight")].rule.weight_decay - 0.05) < 1e-3
    assert groups[("bn.bias", "bn.weight", "fc2.bias")].rule.weight_decay == 0
    assert "conv/linear weights" in groups[("fc1.weight", "fc2.weight")].description
    ms = _side_fit(runs("ms_momentum_wd"))
    assert {tuple(sorted(g.names)) for g in ms.groups} == {("fc1.weight", "fc2.bias", "fc2.weight"),
                                                          ("bn.beta", "bn.gamma")}


def test_same_rule_no_difference(runs):
    report = explain(runs, "ms_momentum", "pt_momentum")
    assert report.differences == [] and report.loss_scale == 1.0
    assert len(report.pairs) == 5
    assert ("bn.gamma", "bn.weight") in report.pairs   # names paired through the conversion rules


def _rules(report: UpdateReport) -> dict[str, Any]:
    return {f.rule: f for f in report.findings}


def test_weight_decay_on_norm_and_bias_one_side(runs):
    report = explain(runs, "ms_momentum_wd_all", "pt_momentum_wd_linear")
    found = _rules(report)
    assert set(found) == {"update-weight-decay"}, [say(f.message) for f in report.findings]
    f = found["update-weight-decay"]
    assert set(f.where) == {"bn.weight", "bn.bias", "fc2.bias"}
    assert abs(f.values[0] - 0.05) < 1e-3 and f.values[1] == 0
    assert "norm weights/biases" in say(f.message) and "biases" in say(f.message)


def test_learning_rate_ratio(runs):
    report = explain(runs, "ms_momentum_lr", "pt_momentum")
    found = _rules(report)
    assert set(found) == {"update-lr"}, [say(f.message) for f in report.findings]
    assert "learning rate 0.1x" in say(found["update-lr"].message)
    assert len(found["update-lr"].where) == 5


def test_eps(runs):
    """Gradients ~1e-7 (loss x 1e-6): eps is visible. MindSpore nn.Adam eps 1e-8 (added to the uncorrected sqrt(v))
    vs torch Adam eps 1e-6: both the eps and nn.Adam's eps placement are named."""
    report = explain(runs, "ms_adam_eps8", "pt_adam_eps6")
    found = _rules(report)
    assert "update-eps" in found, [say(f.message) for f in report.findings]
    a_eps, b_eps = (float(v) for v in found["update-eps"].values)
    assert abs(a_eps / 1e-8 - 1) < 0.05 and abs(b_eps / 1e-6 - 1) < 0.05
    assert report.a.groups[0].rule.family is Family.MS_ADAM and report.b.groups[0].rule.family is Family.ADAM


def test_clipping_one_side(runs):
    report = explain(runs, "ms_momentum_clip", "pt_momentum")
    assert report.a.clipping.kind is ClipKind.EVERY and report.b.clipping.kind is ClipKind.NONE
    found = _rules(report)
    assert set(found) == {"grad-clipping"}, [say(f.message) for f in report.findings]
    assert found["grad-clipping"].where == ("A",)
    # every step was clipped: max_norm is inferred assuming B's learning rate (the two are confounded)
    assert abs(report.a.clipping.max_norm - 0.05) < 0.001 and report.a.clipping.assumed


def test_loss_scale_not_removed(runs):
    report = explain(runs, "ms_sgd_scaled", "pt_sgd_small")
    assert report.loss_scale == 1024.0
    found = _rules(report)
    assert "loss-scale-not-removed" in found and "update-lr" not in found, [say(f.message) for f in report.findings]
    assert "1024x" in say(found["loss-scale-not-removed"].message)


def test_loss_scale_removed(runs):
    report = explain(runs, "ms_sgd_unscaled", "pt_sgd_small")
    assert report.loss_scale == 1024.0
    assert report.differences == [], [say(f.message) for f in report.findings]
    assert "loss-scale" in _rules(report)


def test_legacy_adam_weight_decay_vs_adamw(runs):
    report = explain(runs, "ms_adam_weight_decay", "pt_adamw_no_bn")
    found = _rules(report)
    assert set(found) == {"update-optimizer"}, [say(f.message) for f in report.findings]
    message = say(found["update-optimizer"].message)
    assert "no bias correction" in message and "~3.2x" in message


def test_clip_before_unscale(runs):
    """mp.03: torch clips the gradients while they still carry the loss scale 1024; MindSpore clips unscaled ones."""
    report = explain(runs, "pt_sgd_clip_scaled", "ms_sgd_clip")
    found = _rules(report)
    assert "clip-before-unscale" in found, [say(f.message) for f in report.findings]
    assert found["clip-before-unscale"].where == ("A",)
    assert set(found) == {"loss-scale", "clip-before-unscale", "grad-clipping"}, \
        [say(f.message) for f in report.findings]


def test_per_step_values(runs):
    """Dumps with params=True give the whole trajectory; the fit uses it (and needs no --init)."""
    ra, rb = runs("ms_momentum_params"), runs("pt_momentum_params")
    report = explain_updates(str(ra.final), str(rb.final), str(ra.grads), str(rb.grads))
    assert report.a.trajectory and report.b.trajectory
    assert report.differences == []
    assert abs(report.a.groups[0].rule.momentum - 0.9) < 0.01


def test_fewer_steps_refused(runs):
    run = runs("pt_two_steps")
    with pytest.raises(AlignerError, match=f"at least {MIN_STEPS}"):
        explain_updates(str(run.final), str(run.final), str(run.grads), str(run.grads), init_a=str(run.init))


def test_gradients_of_other_steps_fit_nothing(runs):
    """Weights after 4 steps, gradients of the first 3: no rule fits, and none is guessed."""
    report = explain(runs, "pt_other_steps", "pt_momentum")
    assert report.a.groups == [] and len(report.a.unfitted) == 5
    assert {f.rule for f in report.differences} == {"no-rule-fits"}
    assert "other steps" in say(report.differences[0].message)


# ---- through the CLI


def test_cli_explains_and_fails(align, runs):
    ra, rb = runs("ms_momentum_lr"), runs("pt_momentum")
    proc = align("diff", ra.final, rb.final, "--init", ra.init, "--init-b", rb.init, "--grads", ra.grads, rb.grads)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "learning rate 0.1x" in proc.stdout and "Update rules fitted over 3 steps" in proc.stdout


def test_cli_json(capsys, runs):
    ra, rb = runs("ms_momentum"), runs("pt_momentum")
    proc = align_in_process(capsys, "diff", ra.final, rb.final, "--init", ra.init, "--init-b", rb.init,
                            "--grads", ra.grads, rb.grads, "--json", "-")
    data = json.loads(proc.stdout)
    assert data["update_rule"]["agree"] and data["update_rule"]["findings"] == []
    assert data["update_rule"]["a"]["groups"][0]["rule"]["family"] == "SGD"


def test_cli_one_init_for_both(capsys, runs):
    """One init (A's, converted onto B's names) serves both sides when they started from the same weights."""
    ra, rb = runs("ms_momentum"), runs("pt_momentum")
    proc = align_in_process(capsys, "diff", ra.final, rb.final, "--init", ra.init, "--grads", ra.grads,
                            rb.grads)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_bad_input(capsys, runs, tmp_path):
    def align(*args: object) -> Any:
        return align_in_process(capsys, *args)

    ra, rb = runs("ms_momentum"), runs("pt_momentum")
    two = runs("pt_two_steps")
    assert_one_line_error(align("diff", two.final, rb.final, "--init", two.init, "--init-b", rb.init,
                                "--grads", two.grads, rb.grads), "at least 3")
    # a dump missing one parameter's gradients while the checkpoint shows it moved
    cut = tmp_path / "cut"
    shutil.copytree(ra.grads, cut)
    lines = (Path(ra.grads) / "manifest.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"module":"fc2.bias"' not in line.replace(" ", "")]
    assert len(kept) < len(lines)
    (cut / "manifest.jsonl").write_text("\n".join(kept) + "\n")
    assert_one_line_error(align("diff", ra.final, rb.final, "--init", ra.init, "--init-b", rb.init,
                                "--grads", cut, rb.grads), "fc2.bias", "gradients are missing")
    assert_one_line_error(align("diff", ra.final, rb.final, "--init-b", rb.init), "--init-b needs --grads")
