"""The model audit as a pipeline and a command: either argument order, the reference side, size-dependent padding
with and without example inputs, layer pairing, initialisation laws, the baseline, the report's JSON round trip, and
every bad input (one line, exit 2). Real torch and MindSpore layers throughout."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.core.findings import Finding, Severity
from aligner.pipelines.audit import AuditReport, audit, initlaw
from aligner.render.jsonout import dumps
from aligner.render.words import say
from tests.support.cli import align_in_process

FACTORIES = '''
import numpy as np


def _torch():
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(3, 2, padding=1)).eval()


def make_torch():
    return _torch()


def make_torch_pair():
    import torch
    model = _torch()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def make_ms(pad_mode="same"):
    from mindspore import nn
    kw = {"pad_mode": "pad", "padding": 1} if pad_mode == "pad" else {"pad_mode": "same"}
    net = nn.SequentialCell([nn.Conv2d(3, 4, 3, pad_mode="same"), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.MaxPool2d(3, 2, **kw)])
    net.set_train(False)
    return net


def make_ms_fixed():
    return make_ms("pad")


def not_a_model():
    return 42
'''


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    path = tmp_path / "nets.py"
    path.write_text(textwrap.dedent(FACTORIES))
    return path


def _load(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("nets_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rules(report: AuditReport) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def test_stem_pool_padding_by_input_size(factories: Path) -> None:
    nets = _load(factories)
    even = np.zeros((1, 3, 8, 8), np.float32)
    odd = np.zeros((1, 3, 9, 9), np.float32)
    (found,) = _rules(audit(nets.make_torch(), nets.make_ms(), even))["padding"]
    assert found.severity == Severity.ERROR and found.values == (((1, 1), (1, 1)), ((0, 1), (0, 1)))
    assert say(found.fix) == "nn.MaxPool2d(3, 2, pad_mode='pad', padding=1)"
    assert (found.torch_path, found.ms_path, found.attribute) == ("3", "3", "padding")
    assert "padding" not in _rules(audit(nets.make_torch(), nets.make_ms(), odd))
    (guess,) = _rules(audit(nets.make_torch(), nets.make_ms()))["padding"]
    assert guess.severity == Severity.WARNING and "even input sizes" in say(guess.message)
    assert "padding" not in _rules(audit(nets.make_torch(), nets.make_ms_fixed()))


def test_either_order_and_reference(factories: Path) -> None:
    nets = _load(factories)
    x = np.zeros((1, 3, 8, 8), np.float32)
    a = audit(nets.make_torch(), nets.make_ms(), x)
    b = audit(nets.make_ms(), nets.make_torch(), x)
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    (reverse,) = _rules(audit(nets.make_torch(), nets.make_ms(), x, ref="mindspore"))["padding"]
    assert say(reverse.fix).startswith("F.pad(x, (0, 1, 0, 1), value=float('-inf')) before nn.MaxPool2d")
    assert audit(nets.make_ms(), nets.make_torch(), x, ref="first").reference.value == "mindspore"


def test_pairing_uses_names_structure_and_order() -> None:
    import torch.nn as tnn
    from mindspore import nn

    pt = tnn.Sequential(tnn.Conv2d(3, 4, 3, padding=1), tnn.GELU(), tnn.Dropout(0.1), tnn.Flatten(),
                        tnn.Linear(4 * 16, 5))
    ms = nn.SequentialCell([nn.Conv2d(3, 4, 3, has_bias=True), nn.GELU(approximate=False), nn.Flatten(),
                            nn.Dense(4 * 16, 5)])
    report = audit(pt, ms, np.zeros((1, 3, 4, 4), np.float32))
    pairs = {(p.torch_path, p.ms_path): p.how for p in report.pairs}
    assert pairs[("0", "0")] == "names" and pairs[("1", "1")] == "order" and pairs[("4", "3")] == "structure"
    assert [(u.framework.value, u.path, u.kind) for u in report.unpaired] == [("pytorch", "2", "Dropout")]
    assert not report.findings, [say(f.message) for f in report.findings]
    # the unpaired Dropout(0.1) trains differently and nothing audited it: no pass (a Dropout(0.0) would be none)
    assert [(n.torch_path, n.ms_path, n.kind) for n in report.not_audited] == [("2", None, "Dropout")]
    assert report.exit_code == 1


def test_init_laws_named_and_compared() -> None:
    import torch
    from mindspore import nn
    from mindspore.common.initializer import Normal

    torch.manual_seed(0)
    pt = torch.nn.Linear(256, 128)
    report = audit(pt, nn.Dense(256, 128, weight_init=Normal(0.01)))
    (found,) = [f for f in report.findings if f.rule == "init-law" and f.attribute == "init:weight"]
    assert found.severity == Severity.WARNING
    assert found.values == ("kaiming_uniform(a=sqrt(5))", "normal(0, 0.01)"), found.values
    assert "HeUniform(negative_slope=math.sqrt(5))" in say(found.fix)
    assert not [f for f in audit(pt, nn.Dense(256, 128)).findings if f.attribute == "init:weight"]


@pytest.mark.parametrize("law, draw", [
    ("kaiming_normal(a=0)", lambda rng, shape: rng.normal(0, math.sqrt(2 / shape[1]), shape)),
    ("xavier_uniform", lambda rng, shape: rng.uniform(-1, 1, shape) * math.sqrt(6 / (shape[0] + shape[1]))),
    ("normal(0, 0.02)", lambda rng, shape: rng.normal(0, 0.02, shape)),
])
def test_fit_names_the_law_and_same_law_draws_agree(law: str, draw: Any) -> None:
    """Each law is named on 20 independent draws, and no two draws of one law are flagged (5-sigma tolerance); a 20%
    larger std is flagged every time."""
    rng = np.random.default_rng(0)
    shape = (64, 128)
    fits = [initlaw.fit(draw(rng, shape)) for _ in range(20)]
    assert all(f.name == law for f in fits), {f.name for f in fits}
    assert not any(initlaw.differ(a, b) for a, b in zip(fits, fits[1:]))
    wider = [initlaw.fit(draw(rng, shape) * 1.2) for _ in range(20)]
    assert all(initlaw.differ(a, b) for a, b in zip(fits, wider))


def test_mixed_precision_amp_o2() -> None:
    import torch
    from mindspore import amp, nn

    pt = torch.nn.Sequential(torch.nn.Linear(8, 4))
    ms = amp.auto_mixed_precision(nn.SequentialCell([nn.Dense(8, 4)]), "O2")
    found = _rules(audit(pt, ms))["compute-dtype"]
    assert found[0].values == ("float32", "float16") and found[0].severity == Severity.ERROR
    assert not _rules(audit(pt.half(), ms)).get("compute-dtype")


def test_trace_leaves_running_statistics_alone() -> None:
    import torch
    from mindspore import nn

    pt = torch.nn.BatchNorm2d(3).train()
    cell = nn.BatchNorm2d(3)
    cell.set_train(True)
    audit(pt, cell, np.ones((2, 3, 4, 4), np.float32) * 5)
    assert pt.running_mean is not None
    assert float(pt.running_mean.abs().max()) == 0.0 and float(np.abs(cell.moving_mean.asnumpy()).max()) == 0.0


def test_report_round_trip_and_baseline(factories: Path, tmp_path: Path) -> None:
    nets = _load(factories)
    x = np.zeros((1, 3, 8, 8), np.float32)
    report = audit(nets.make_torch(), nets.make_ms(), x)
    assert report.exit_code == 1 and not report
    saved = dumps(report.to_dict())   # render/ writes each finding's words as its sentence; read back, the same text
    assert dumps(AuditReport.from_dict(json.loads(saved)).to_dict()) == saved
    base = tmp_path / "accepted.json"
    base.write_text(saved)
    again = audit(nets.make_torch(), nets.make_ms(), x, baseline=base)
    assert again.exit_code == 0 and not again.findings and len(again.accepted) == len(report.findings)
    only_pool = tmp_path / "pool.yaml"
    only_pool.write_text("- {rule: padding, where: ['3', '3'], attribute: padding}\n")
    partial = audit(nets.make_torch(), nets.make_ms(), x, baseline=only_pool)
    assert [f.rule for f in partial.accepted] == ["padding"] and "padding" not in _rules(partial)


def test_finding_stays_backward_compatible() -> None:
    f = Finding("bn-momentum", Severity.WARNING, "m", ("fc.bias",), fix="x")
    assert f.torch_path == "fc.bias" and f.ms_path is None and f.attribute is None and f.values == ()
    assert {"rule", "severity", "message", "where", "step", "fix"} <= set(f.to_dict())
    assert Finding.from_dict(f.to_dict()) == f


def test_bad_inputs_are_one_line_errors(factories: Path) -> None:
    import torch

    nets = _load(factories)
    with pytest.raises(AlignerError, match="both models are pytorch"):
        audit(nets.make_torch(), torch.nn.Linear(2, 2))
    with pytest.raises(AlignerError, match="not a torch.nn.Module"):
        audit(nets.make_torch(), 42)
    with pytest.raises(AlignerError, match="rejects the example input") as info:
        audit(nets.make_torch(), nets.make_ms(), np.zeros((1, 5, 8, 8), np.float32))
    assert "\n" not in str(info.value)


def test_cli(capsys: pytest.CaptureFixture[str], factories: Path, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def align(*args: object) -> Any:
        return align_in_process(capsys, *args)

    t, m, fixed = f"{factories}:make_torch", f"{factories}:make_ms", f"{factories}:make_ms_fixed"
    proc = align("audit", t, m, "--input-shape", "1,3,8,8")
    assert proc.returncode == 1, proc.stderr
    assert "ERROR (1)" in proc.stdout and "fix: nn.MaxPool2d(3, 2, pad_mode='pad', padding=1)" in proc.stdout
    proc = align("audit", "nets:make_torch_pair", fixed, "--input-shape", "1,3,8,8", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 0
    np.savez(tmp_path / "x.npz", np.zeros((1, 3, 8, 8), np.float32))    # unnamed (arr_0): positional
    assert align("audit", t, m, "--input", tmp_path / "x.npz").returncode == 1
    align("audit", t, m, "--input-shape", "1,3,8,8", "--json", tmp_path / "r.json")
    assert align("audit", t, m, "--input-shape", "1,3,8,8", "--baseline", tmp_path / "r.json").returncode == 0
    for args, words in [(("nope.module:f", m), "cannot import nope.module"),
                        ((f"{factories}:not_a_model", m), "returned int"),
                        ((t, f"{factories}:make_torch"), "both models are pytorch"),
                        ((t, m, "--input-shape", "1,5,8,8"), "rejects the example input"),
                        ((t, m, "--input-shape", "1,x"), "comma-separated")]:
        proc = align("audit", *args)
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            proc.stderr


def test_small_tensors_of_one_law_are_not_flagged() -> None:
    """A 32-value bias drawn twice from torch's default uniform(+-1/sqrt(fan_in)): 200 pairs, none flagged (the
    family is not compared below 256 values, the moments at 5 standard errors)."""
    rng = np.random.default_rng(0)
    bound = 1 / math.sqrt(288)
    draws = [initlaw.fit(rng.uniform(-bound, bound, 32), (32, 32, 3, 3)) for _ in range(201)]
    assert not any(initlaw.differ(a, b) for a, b in zip(draws, draws[1:]))
    assert all(initlaw.differ(a, initlaw.fit(np.zeros(32))) for a in draws)


@pytest.mark.parametrize("seed", range(12))
def test_a_free_law_is_named_by_its_parameter_not_its_sampling_error(seed: int) -> None:
    """Normal(0.01) drawn 32768 times has a sample std within 0.4% (one standard error) of 0.01: a draw of 0.0099
    (2.5 standard errors, about 1 run in 80) was named 'normal(0, 0.0099)' and failed the audit test above; one
    significant digit is used whenever it lies within sampling error (Z standard errors)."""
    x = np.random.default_rng(seed).normal(0, 0.01, (128, 256))
    x *= 0.01 * (1 - 2.5 / math.sqrt(2 * x.size)) / x.std()  # the unlucky draw: 2.5 standard errors low
    assert initlaw.fit(x).name == "normal(0, 0.01)"
    assert initlaw.fit(x * 1.25).name == "normal(0, 0.012)"  # 25% away from one digit: two digits
