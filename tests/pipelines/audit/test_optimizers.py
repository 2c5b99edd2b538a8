"""The optimizer and schedule audit on real torch and MindSpore optimizers over the twin CNN (BatchNorm, conv biases,
a Linear/Dense head): clean pairs give no finding, each planted difference (weight decay on norm weights and biases on
one side only, eps, dampening, a schedule shifted by one step, the legacy nn.AdamWeightDecay) is found with its fix,
and the same through `align audit` with factories returning (model, optimizer[, scheduler]); bad input is one line."""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

from aligner.core.errors import AlignerError
from aligner.core.findings import Finding, Severity
from aligner.pipelines.audit import audit
from aligner.pipelines.audit.optimizers import OptimizerAudit, audit_optimizers
from aligner.render.words import say
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.paths import ROOT
from tests.support.twin_models import make_twins


@pytest.fixture(scope="module")
def twins() -> tuple[Any, Any]:
    return make_twins("cnn")


def _by_rule(report: OptimizerAudit) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def _torch_lrs(optimizer: Any, scheduler: Any, steps: int, ahead: int = 0) -> list[float]:
    """torch's applied rate per step (read before each scheduler step), `ahead` steps early; the caller's objects are
    stepped, so pass throwaway ones."""
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(ahead):
            scheduler.step()
        for _ in range(steps):
            rates.append(optimizer.param_groups[0]["lr"])
            scheduler.step()
    return rates


def test_clean_pairs_have_no_finding(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import mint, nn

    tn, mn = twins
    sgd = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9),
                           nn.Momentum(mn.trainable_params(), 0.1, 0.9), tn, mn)
    assert sgd.paired == 10 and not sgd.findings, [say(f.message) for f in sgd.findings]
    adamw = audit_optimizers(mint.optim.AdamW(mn.trainable_params(), lr=1e-3, weight_decay=0.05),   # either order
                             torch.optim.AdamW(tn.parameters(), lr=1e-3, weight_decay=0.05), mn, tn)
    assert adamw.paired == 10 and not adamw.findings, [say(f.message) for f in adamw.findings]
    assert (adamw.torch_optimizer, adamw.ms_optimizer) == ("torch.optim.AdamW", "mint.optim.AdamW")


def test_weight_decay_on_norm_and_bias_one_side_only(twins: tuple[Any, Any]) -> None:
    """torch decays only conv/linear weights (param groups); mint AdamW decays everything; and the classic: torch SGD
    decays every parameter while nn.Momentum with one weight_decay skips gamma/beta."""
    import torch
    from mindspore import mint, nn

    tn, mn = twins
    decay = [p for n, p in tn.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in tn.named_parameters() if p.ndim <= 1]
    torch_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3)
    report = audit_optimizers(torch_opt, mint.optim.AdamW(mn.trainable_params(), lr=1e-3, weight_decay=0.01), tn, mn)
    (found,) = report.findings
    assert found.rule == "optimizer-weight-decay" and found.severity == Severity.ERROR
    assert found.values == (0.0, 0.01)
    message = say(found.message)
    assert "biases" in message and "bn1.weight/bn1.gamma" in message and "conv1.weight" not in message
    assert "a parameter group for [conv1.bias" in say(found.fix) and "weight_decay=0" in say(found.fix)

    legacy = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4),
                              nn.Momentum(mn.trainable_params(), 0.1, 0.9, weight_decay=1e-4), tn, mn)
    (found,) = legacy.findings
    assert found.rule == "optimizer-weight-decay" and found.values == (1e-4, 0.0)
    assert "norm weights/biases" in say(found.message) and "conv1.bias" not in say(found.message)
    assert "skip parameters named gamma/beta" in say(found.message)
    assert say(found.fix).startswith("group the parameters: nn.Momentum([{'params': [bn1.gamma, bn1.beta")
    grouped = [p for p in mn.trainable_params() if "gamma" in p.name or "beta" in p.name]
    rest = [p for p in mn.trainable_params() if "gamma" not in p.name and "beta" not in p.name]
    fixed = nn.Momentum([{"params": rest}, {"params": grouped, "weight_decay": 1e-4}], 0.1, 0.9, weight_decay=1e-4)
    assert not audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4), fixed,
                                tn, mn).findings


def test_eps(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import mint

    tn, mn = twins
    report = audit_optimizers(torch.optim.Adam(tn.parameters(), lr=1e-3, eps=1e-8),
                              mint.optim.Adam(mn.trainable_params(), lr=1e-3, eps=1e-6), tn, mn)
    (found,) = report.findings
    assert found.rule == "optimizer-eps" and found.values == (1e-8, 1e-6) and "all 10 parameters" in say(found.message)
    assert say(found.fix) == "mint.optim.Adam(..., eps=1e-08)"


def test_momentum_vs_sgd_with_dampening(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import nn

    tn, mn = twins
    report = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9),
                              nn.SGD(mn.trainable_params(), 0.1, momentum=0.9, dampening=0.1), tn, mn)
    (found,) = report.findings
    assert found.rule == "optimizer-dampening" and found.values == (0.0, 0.1)
    assert say(found.fix) == "nn.SGD(..., dampening=0)"
    momentum = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9, dampening=0.5),
                                nn.Momentum(mn.trainable_params(), 0.1, 0.9), tn, mn, ref="mindspore")
    (found,) = momentum.findings
    assert found.rule == "optimizer-dampening" and say(found.fix) == "torch.optim.SGD(..., dampening=0)"
    # torch the reference: nn.Momentum takes no dampening argument (the catalogue's args), so the fix names the class
    # of torch's formula that does, not nn.Momentum(..., dampening=0.5) (a TypeError)
    momentum = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9, dampening=0.5),
                                nn.Momentum(mn.trainable_params(), 0.1, 0.9), tn, mn)
    (found,) = momentum.findings
    assert found.rule == "optimizer-dampening"
    assert say(found.fix) == "nn.Momentum has no dampening argument: mindspore.mint.optim.SGD(..., dampening=0.5)"


def test_schedule_shifted_by_one_step(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import nn

    tn, mn = twins

    def torch_side() -> tuple[Any, Any]:
        opt = torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)

    opt, sched = torch_side()
    shifted = _torch_lrs(*torch_side(), steps=30, ahead=1)
    report = audit_optimizers(opt, nn.Momentum(mn.trainable_params(), shifted, 0.9), tn, mn, steps=30,
                              schedulers=[sched])
    assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == 0.1     # the user's scheduler was not stepped
    (found,) = report.findings
    assert found.rule == "optimizer-lr-schedule" and found.step == 0 and found.severity == Severity.ERROR
    assert "the MindSpore schedule is the torch schedule shifted by one step" in say(found.message)
    assert "step 0 uses the base lr, 0.1" in say(found.message)
    same = _torch_lrs(*torch_side(), steps=30)
    assert not audit_optimizers(opt, nn.Momentum(mn.trainable_params(), same, 0.9), tn, mn, steps=30,
                                schedulers=[sched]).findings
    short = audit_optimizers(opt, nn.Momentum(mn.trainable_params(), same[:10], 0.9), tn, mn, steps=30,
                             schedulers=[sched])
    assert [f.rule for f in short.findings] == ["optimizer-lr-list-short"] and short.findings[0].step == 10
    cell = nn.CosineDecayLR(0.0, 0.1, 20)        # a LearningRateSchedule cell: evaluated at global_step 0..N-1
    report = audit_optimizers(opt, nn.Momentum(mn.trainable_params(), cell, 0.9), tn, mn, steps=30,
                              schedulers=[sched])
    (found,) = report.findings
    # equal through the decay (float32 within 1e-6 of the peak); then torch's cosine rises again after T_max while
    # CosineDecayLR holds its minimum
    assert found.rule == "optimizer-lr-schedule" and found.step == 21, say(found.message)
    assert found.values[1] == 0.0 and "torch's rates from step 21: 0.000615583, 0.00244717" in say(found.message)


def test_mindspore_scheduler_and_mint_sgd(twins: tuple[Any, Any]) -> None:
    """A mindspore.experimental LRScheduler is stepped on a copy; mint.optim.SGD applies its constructor lr."""
    import torch
    from mindspore import mint
    from mindspore.experimental.optim import lr_scheduler

    tn, mn = twins
    opt = torch.optim.Adam(tn.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    mopt = mint.optim.Adam(mn.trainable_params(), lr=0.1)
    msched = lr_scheduler.StepLR(mopt, 5, 0.5)
    assert not audit_optimizers(opt, mopt, tn, mn, steps=20, schedulers=[msched, sched]).findings
    assert float(msched.last_epoch.asnumpy()) == 0.0
    off = lr_scheduler.StepLR(mint.optim.Adam(mn.trainable_params(), lr=0.1), 4, 0.5)
    (found,) = audit_optimizers(opt, off.optimizer, tn, mn, steps=20, schedulers=[off, sched]).findings
    assert found.step == 4 and found.values == pytest.approx((0.1, 0.05))
    sgd = mint.optim.SGD(mn.trainable_params(), lr=0.1, momentum=0.9)
    report = audit_optimizers(torch.optim.SGD(tn.parameters(), lr=0.1, momentum=0.9), sgd, tn, mn, steps=5,
                              schedulers=[lr_scheduler.StepLR(sgd, 2, 0.5)])
    assert "optimizer-scheduler-ignored" in _by_rule(report)


def test_legacy_adam_weight_decay_and_adam_are_flagged(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import nn

    tn, mn = twins
    report = audit_optimizers(torch.optim.AdamW(tn.parameters(), lr=1e-3, weight_decay=0.01),
                              nn.AdamWeightDecay(mn.trainable_params(), 1e-3, eps=1e-8, weight_decay=0.01), tn, mn)
    rules = _by_rule(report)
    (formula,) = rules["optimizer-formula"]
    assert formula.severity == Severity.ERROR and "no bias correction" in say(formula.message)
    assert "3.16x" in say(formula.message)
    assert say(formula.fix).startswith("mindspore.mint.optim.AdamW(params, lr=0.001")
    assert set(rules) == {"optimizer-formula", "optimizer-weight-decay"}     # gamma/beta skipped by decay_flags
    adam = audit_optimizers(torch.optim.Adam(tn.parameters(), lr=1e-3),
                            nn.Adam(mn.trainable_params(), 1e-3, loss_scale=8.0), tn, mn)
    rules = _by_rule(adam)
    assert rules["optimizer-formula"][0].severity == Severity.WARNING
    assert "uncorrected sqrt(v)" in say(rules["optimizer-formula"][0].message)
    assert say(rules["optimizer-formula"][0].fix).startswith("mindspore.mint.optim.Adam(")
    assert rules["optimizer-loss-scale"][0].values == (1.0, 8.0)


def test_experimental_adam_runs_nn_adams_formula(twins: tuple[Any, Any]) -> None:
    """mindspore.experimental.optim.Adam runs MindSpore's Adam kernel (eps on the uncorrected sqrt(v)), measured in
    tests/mapping/test_optimizers.py: against torch Adam it is the nn.Adam formula warning, with the mint fix."""
    import torch
    from mindspore.experimental import optim

    tn, mn = twins
    report = audit_optimizers(torch.optim.Adam(tn.parameters(), lr=1e-3),
                              optim.Adam(mn.trainable_params(), lr=1e-3), tn, mn)
    (found,) = report.findings
    assert found.rule == "optimizer-formula" and found.severity == Severity.WARNING
    assert found.values == ("Adam", "MindSpore nn.Adam") and "uncorrected sqrt(v)" in say(found.message)
    assert say(found.fix).startswith("mindspore.mint.optim.Adam(params, lr=0.001")


def test_unsupported_and_bad_input(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import nn

    tn, mn = twins
    report = audit_optimizers(torch.optim.RMSprop(tn.parameters()), nn.Momentum(mn.trainable_params(), 0.1, 0.9),
                              tn, mn)
    (found,) = report.findings
    assert found.rule == "optimizer-unsupported" and "torch.optim.rmsprop.RMSprop" in say(found.message)
    assert "supported: torch.optim.SGD" in say(found.message) and "mint.optim.AdamW" in say(found.message)
    other = torch.nn.Linear(3, 2)
    with pytest.raises(AlignerError, match="holds 2 parameter\\(s\\) that are not the torch model's") as info:
        audit_optimizers(torch.optim.SGD(other.parameters(), lr=0.1), nn.Momentum(mn.trainable_params(), 0.1, 0.9),
                         tn, mn)
    assert "\n" not in str(info.value)
    with pytest.raises(AlignerError, match="not a torch or MindSpore optimizer"):
        audit_optimizers(42, nn.Momentum(mn.trainable_params(), 0.1, 0.9), tn, mn)
    partial = [p for p in tn.parameters()][:-2]          # the fc layer left out on the torch side
    (found,) = audit_optimizers(torch.optim.SGD(partial, lr=0.1, momentum=0.9),
                                nn.Momentum(mn.trainable_params(), 0.1, 0.9), tn, mn).findings
    assert found.rule == "optimizer-not-optimized" and "fc.weight" in say(found.message)
    assert "MindSpore optimizer only" in say(found.message)


FACTORIES = '''
import sys
sys.path.insert(0, {root!r})
from tests.support.twin_models import make_twins

_T, _M = make_twins("cnn")


def _lrs(ahead):
    import warnings
    import torch
    opt = torch.optim.SGD(_T.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(ahead):
            sched.step()
        for _ in range(40):
            out.append(opt.param_groups[0]["lr"])
            sched.step()
    return out


def torch_training():
    import torch
    opt = torch.optim.SGD(_T.parameters(), lr=0.1, momentum=0.9)
    return _T, opt, torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)


def ms_training(ahead=0):
    from mindspore import nn
    return _M, nn.Momentum(_M.trainable_params(), _lrs(ahead), 0.9)


def ms_shifted():
    return ms_training(1)


def torch_rmsprop():
    import torch
    return _T, torch.optim.RMSprop(_T.parameters())


def torch_foreign():
    import torch
    return _T, torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1)


def torch_not_optimizer():
    return _T, 42
'''


def test_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    nets = tmp_path / "training.py"
    nets.write_text(textwrap.dedent(FACTORIES.format(root=str(ROOT))))
    t, m = f"{nets}:torch_training", f"{nets}:ms_training"
    proc = align_in_process(capsys, "audit", t, m, "--input-shape", "2,3,16,16", "--steps", "40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "optimizers: torch.optim.SGD vs nn.Momentum; 10 parameter pairs; learning rates over 40 steps (torch " \
           "StepLR, MindSpore dynamic lr)" in proc.stdout
    proc = align_in_process(capsys, "audit", t, f"{nets}:ms_shifted", "--steps", "40")
    assert proc.returncode == 1 and "shifted by one step" in proc.stdout, proc.stdout
    assert "fix: evaluate the MindSpore schedule one step later" in proc.stdout
    proc = align_in_process(capsys, "audit", f"{nets}:ms_shifted", t, "--steps", "40", "--json", "-")
    import json

    data = json.loads(proc.stdout)
    assert data["optimizer"]["steps"] == 40 and [f["step"] for f in data["findings"]
                                                 if f["rule"] == "optimizer-lr-schedule"] == [2]
    proc = align_in_process(capsys, "audit", f"{nets}:torch_rmsprop", m)
    assert proc.returncode == 0 and "RMSprop is not one the audit reads (supported:" in proc.stdout, proc.stdout
    assert_one_line_error(align_in_process(capsys, "audit", f"{nets}:torch_foreign", m),
                          "holds 2 parameter(s) that are not the torch model's")
    assert_one_line_error(align_in_process(capsys, "audit", f"{nets}:torch_not_optimizer", m),
                          "returned a int as the optimizer")
    assert_one_line_error(align_in_process(capsys, "audit", t, m, "--steps", "0"), "--steps")


def test_model_audit_carries_optimizer_findings(twins: tuple[Any, Any]) -> None:
    import torch
    from mindspore import mint

    tn, mn = twins
    report = audit(tn, mn, optimizers=(torch.optim.Adam(tn.parameters(), lr=1e-3),
                                       mint.optim.Adam(mn.trainable_params(), lr=1e-3, eps=1e-6)))
    assert report.optimizer is not None and report.optimizer.paired == 10
    assert [f.rule for f in report.findings if f.rule.startswith("optimizer")] == ["optimizer-eps"]
    assert report.exit_code == 1
    from aligner.pipelines.audit import AuditReport

    assert AuditReport.from_dict(report.to_dict()) == report
