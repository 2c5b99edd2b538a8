"""aligner.watch on real tiny training loops in PyTorch and MindSpore: a deep sigmoid MLP's vanishing gradients are
caught at the first step with the layer named, on_finding="raise" raises, a healthy MLP trains 5 steps without an
error finding, unwatched steps run without hooks, and a bad rules dict is one line."""
from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
import pytest
import torch

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.pipelines.check.watch import WatchError, watch

ms.set_context(mode=ms.PYNATIVE_MODE)
WIDTH, DEPTH, BATCH = 16, 8, 32


def weights(depth: int, gain: float) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [((rng.standard_normal((WIDTH, WIDTH)) * gain / np.sqrt(WIDTH)).astype(np.float32),
             np.zeros(WIDTH, np.float32)) for _ in range(depth)]


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((BATCH, WIDTH)).astype(np.float32), rng.standard_normal((BATCH, WIDTH)).astype(
        np.float32)


def torch_loop(act: str, depth: int, gain: float, lr: float = 0.01):
    """A Sequential of Linear + activation layers and a step function (forward, backward, SGD)."""
    layers: list[torch.nn.Module] = []
    for w, b in weights(depth, gain):
        lin = torch.nn.Linear(WIDTH, WIDTH)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, getattr(torch.nn, act)()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = (torch.from_numpy(a) for a in data())

    def step() -> None:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return model, step


def ms_loop(act: str, depth: int, gain: float, lr: float = 0.01):
    """The same model as a MindSpore SequentialCell, stepped by value_and_grad + optimizer(grads)."""
    cells: list[ms.nn.Cell] = []
    for w, b in weights(depth, gain):
        cells += [ms.nn.Dense(WIDTH, WIDTH, weight_init=ms.Tensor(w), bias_init=ms.Tensor(b)),
                  getattr(ms.nn, act)()]
    model = ms.nn.SequentialCell(cells[:-1])
    opt = ms.nn.SGD(model.trainable_params(), learning_rate=lr)
    x, y = (ms.Tensor(a) for a in data())
    grad_fn = ms.value_and_grad(lambda a, b: ((model(a) - b) ** 2).mean(), None, opt.parameters)

    def step() -> None:
        _, grads = grad_fn(x, y)
        opt(grads)
    return model, step


LOOPS = {"pytorch": torch_loop, "mindspore": ms_loop}


@pytest.mark.parametrize("framework", sorted(LOOPS))
def test_vanishing_gradients_caught_at_the_first_step_with_the_layer(framework, caplog):
    model, step = LOOPS[framework]("Sigmoid", DEPTH, 1.0)
    with caplog.at_level(logging.WARNING, logger="aligner"), watch(model) as w:
        step()
        new = w.step()
    vanishing = [f for f in new if f.rule == "vanishing-gradients"]
    assert vanishing and vanishing[0].step == 0 and vanishing[0].where == ("0.weight",)
    assert vanishing[0].severity == Severity.ERROR and vanishing[0].fix
    logged = [r.getMessage() for r in caplog.records if "vanishing-gradients" in r.getMessage()]
    assert len(logged) == 1 and "0.weight" in logged[0] and "fix:" in logged[0]
    assert w.step_number == 1


@pytest.mark.parametrize("framework", sorted(LOOPS))
def test_raise_stops_at_the_first_step(framework):
    model, step = LOOPS[framework]("Sigmoid", DEPTH, 1.0)
    with pytest.raises(WatchError) as info, watch(model, on_finding="raise") as w:
        for _ in range(3):
            step()
            w.step()
    assert info.value.finding.rule == "vanishing-gradients" and info.value.finding.step == 0
    assert "\n" not in str(info.value) and "0.weight" in str(info.value)


@pytest.mark.parametrize("framework", sorted(LOOPS))
def test_healthy_model_trains_five_steps_without_error(framework):
    model, step = LOOPS[framework]("ReLU", 3, 2 ** 0.5)
    with watch(model, on_finding="raise") as w:
        for _ in range(5):
            step()
            w.step()
    assert not [f for f in w.findings if f.severity == Severity.ERROR], w.findings
    assert w.evaluation is not None and "dead-relu" in w.evaluation.checked
    assert "nonfinite" in w.evaluation.checked and "update-ratio" in w.evaluation.checked


def test_every_and_weight_gradient_rules_only():
    model, step = torch_loop("ReLU", 3, 2 ** 0.5)
    grad_rules = {"vanishing-gradients", "exploding-gradients", "fp16-underflow", "gradient-trend"}
    from aligner.pipelines.check import RuleConfig
    rules = {f"{n}.enabled": n in grad_rules for n in RuleConfig.load().names}
    with watch(model, rules=rules, every=2) as w:
        assert w._handles and all(not m._forward_hooks for m in model.modules())  # parameter hooks only
        for i in range(4):
            step()
            w.step()
            assert bool(w._handles) == (i % 2 == 1)  # hooks only on the watched steps (0, 2, ...)
    kinds = {(r.step, r.kind) for r in w._sink.records}
    assert kinds == {(0, "param_grad"), (2, "param_grad")}
    assert all(not m._forward_hooks for m in model.modules()) and not w._handles


@pytest.mark.parametrize("rules, every, on_finding", [
    ({"no-such-rule.enabled": False}, 1, "log"), ({"dead-relu.zeros": "lots"}, 1, "log"), ("dead-relu", 1, "log"),
    (None, 0, "log"), (None, 1, "print")])
def test_bad_arguments_are_one_line(rules, every, on_finding):
    model, _ = torch_loop("ReLU", 2, 1.0)
    with pytest.raises(AlignerError) as info:
        watch(model, rules=rules, every=every, on_finding=on_finding)
    assert "\n" not in str(info.value)


def test_step_outside_the_context_is_one_line():
    model, _ = torch_loop("ReLU", 2, 1.0)
    with pytest.raises(AlignerError) as info:
        watch(model).step()
    assert "\n" not in str(info.value)


def faulty_net(frozen: bool):
    """A torch MLP with a saturated sigmoid, a dead ReLU and (`frozen`) a layer left out of the optimizer, and its step
    function (forward, the loss saved as a probe, backward, SGD) over four fixed batches."""
    import aligner

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.Sigmoid(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    with torch.no_grad():
        model[2].weight.mul_(500.0)      # saturated sigmoid
        model[4].bias.fill_(-5.0)        # dead ReLU
    params = [p for n, p in model.named_parameters() if not (frozen and n.startswith("6."))]
    opt = torch.optim.SGD(params, lr=0.5)   # 6.* left out of the optimizer: frozen weights
    rng = np.random.default_rng(3)
    batches = [(torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32)),
                torch.from_numpy(rng.standard_normal((16, 4)).astype(np.float32))) for _ in range(4)]

    def step(i: int) -> None:
        opt.zero_grad()
        loss = ((model(batches[i][0]) - batches[i][1]) ** 2).mean()
        aligner.save("loss", loss.detach())
        loss.backward()
        opt.step()
    return model, step



def test_watch_finds_what_align_check_finds_in_a_dump_of_the_same_steps(tmp_path):
    """The same training run watched and dumped (stats only, parameter values): the same findings, rule, layer and
    step (the watch's batched statistics and `align check`'s per-record ones feed the same rules)."""
    import aligner
    from aligner.pipelines.check import check

    watched, step_w = faulty_net(True)
    dumped, step_d = faulty_net(True)
    with watch(watched) as w:
        for i in range(4):
            step_w(i)
            w.step()
    for i in range(4):
        with aligner.dump(dumped, tmp_path / "d", step=i, params=True, stats_only=True):
            step_d(i)
    report = check(tmp_path / "d")
    seen = {(f.rule, f.where, f.step) for f in w.findings if f.severity != Severity.INFO}
    found = {(f.rule, f.where, f.step) for f in report.evaluation.findings if f.severity != Severity.INFO}
    assert {"frozen-weights", "dead-relu", "saturated-activations"} <= {rule for rule, _, _ in seen}, seen
    assert seen == found


@pytest.mark.parametrize("table_bytes", [1 << 28, 200], ids=["read-at-step", "read-every-2-records"])
def test_statistics_queued_by_the_gpu_kernel_are_those_computed_on_the_host(monkeypatch, table_bytes):
    """On a GPU the watch queues each tensor's statistics by the Triton kernel (fstats.StatsStage.reduce) and reads
    them in `step()`, or earlier once its table rows reach DEFER_BYTES. Forced here onto CPU tensors (Triton's
    interpreter, tests/metrics/test_triton_stats.py): the same records and findings as the host's batches."""
    from aligner.dumping import session
    from aligner.metrics import triton_stats

    def run(kernel: bool) -> tuple[list, list]:
        model, step = faulty_net(True)  # findings to agree on
        with monkeypatch.context() as m:
            m.setattr(triton_stats, "DEVICES", frozenset({"cpu"} if kernel else ()))
            m.setattr(triton_stats, "_failed", [])
            m.setattr(session, "DEFER_BYTES", table_bytes)
            launches = []
            m.setattr(triton_stats, "launch", lambda *a, f=triton_stats.launch: launches.append(1) or f(*a))
            with watch(model) as w:
                for i in range(4):
                    step(i)
                    w.step()
            assert triton_stats.why_not() is None and bool(launches) == kernel
        records = [(r.step, r.module, r.kind, r.io, r.index, r.stats and r.stats.to_dict()) for r in w._sink.records]
        return records, sorted((f.rule, f.where, f.step) for f in w.findings)

    (host, found_host), (queued, found_queued) = run(False), run(True)
    assert found_queued == found_host and any(rule == "saturated-activations" for rule, _, _ in found_host)
    assert len(queued) == len(host) > 20
    for a, b in zip(queued, host):
        assert a[:5] == b[:5]
        sa, sb = a[5], b[5]
        for key in set(sa or {}) | set(sb or {}):  # the kernel's records carry every statistic; extrema agree
            va, vb = (sa or {}).get(key), (sb or {}).get(key)
            if vb is not None and key in ("min", "max", "nan", "inf"):
                assert va == vb, (a[:5], key)
            elif vb is not None and key in ("mean", "l2"):
                assert va == pytest.approx(vb, rel=1e-9), (a[:5], key)


MINDSPORE_ONLY = """
import sys
import numpy as np
import mindspore as ms
import aligner
ms.set_context(mode=ms.PYNATIVE_MODE)
net = ms.nn.SequentialCell([ms.nn.Dense(4, 8), ms.nn.ReLU(), ms.nn.Dense(8, 2)])
opt = ms.nn.SGD(net.trainable_params(), learning_rate=0.1)
x = ms.Tensor(np.ones((3, 4), np.float32))
grad_fn = ms.value_and_grad(lambda a: net(a).sum(), None, opt.parameters)
with aligner.watch(net) as w:
    for _ in range(2):
        _, grads = grad_fn(x)
        opt(grads)
        w.step()
with aligner.dump(net, sys.argv[1], stats_only=True, params=True):
    grad_fn(x)
records = w._sink.records
print(len(records), sum(r.stats is None or r.skipped is not None for r in records), "torch" in sys.modules)
"""


def test_a_mindspore_only_process_never_needs_torch(tmp_path):
    """A MindSpore user who never imports torch: the watch and a dump run (the GPU kernel's checks once read
    sys.modules["torch"] and broke the watch's first step), every record has its statistics, and aligner imported no
    torch of its own."""
    import subprocess
    import sys

    from aligner.dumping.manifest import read_manifest

    done = subprocess.run([sys.executable, "-c", MINDSPORE_ONLY, str(tmp_path / "d")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    count, missing, torch_loaded = done.stdout.split()[-3:]
    assert int(count) > 10 and missing == "0" and torch_loaded == "False"
    _, dumped, problems = read_manifest(tmp_path / "d")
    assert not problems and all(r.skipped is None for r in dumped)
    assert sum(r.stats is not None for r in dumped) > 10


def _sqrt_loop(framework: str):
    """fc -> sqrt(v - v.detach()) -> fc, stepped forward and backward WITHOUT an update (the weights stay finite, so
    every step repeats): the forward is finite (all zeros), but d sqrt(u)/du at u = 0 is infinite, so the backward
    turns non-finite inside module "1", which has no parameter."""
    x = data()[0]
    if framework == "pytorch":
        class Root(torch.nn.Module):
            def forward(self, v: torch.Tensor) -> torch.Tensor:
                return torch.sqrt(v - v.detach())  # 0 forward; d sqrt(u)/du at u = 0 is infinite

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), Root(), torch.nn.Linear(WIDTH, WIDTH))
        tx = torch.from_numpy(x)

        def step() -> None:
            model.zero_grad()
            model(tx).sum().backward()
        return model, step

    class MsRoot(ms.nn.Cell):
        def construct(self, v: ms.Tensor) -> ms.Tensor:
            return ms.ops.sqrt(v - ms.ops.stop_gradient(v))

    model = ms.nn.SequentialCell([ms.nn.Dense(WIDTH, WIDTH), MsRoot(), ms.nn.Dense(WIDTH, WIDTH)])
    grad_fn = ms.value_and_grad(lambda a: model(a).sum(), None, model.trainable_params())
    mx = ms.Tensor(x)

    def step() -> None:
        grad_fn(mx)
    return model, step


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_module_gradients_recorded_from_the_step_after_a_non_finite_value(framework):
    """Module gradients cost a hook per module (MindSpore: a cell backward hook each) and only locate a backward
    non-finite producer: the watch records them once a non-finite value has been seen. Step 0 flags the first
    non-finite parameter gradient; step 1 (escalated) names the parameter-less module whose backward produced it."""
    model, step = _sqrt_loop(framework)
    with watch(model, rules={"fp16-overflow.enabled": False, "frozen-weights.enabled": False,
                             "constant-activations.enabled": False}) as w:
        assert not w.options.module_backward  # no module gradient hooks to start with
        step()
        first = [f for f in w.step() if f.rule == "nonfinite"]
        assert first, w.findings
        assert w.options.module_backward  # escalated
        step()
        w.step()
    named = [f for f in w.findings if f.rule == "nonfinite"]
    assert any("1" in [p for p in f.where if p] and f.step == 1 for f in named), named


@pytest.mark.parametrize("framework", sorted(LOOPS))
def test_gradients_handed_to_step_replace_the_parameter_hooks(framework):
    # grads="step": no hook on any parameter; the gradients the loop already has (torch: .grad, MindSpore: what
    # value_and_grad returned) are passed to w.step and give the same finding, on the same layer, as the hooks do
    model, step = LOOPS[framework]("Sigmoid", DEPTH, 1.0)
    params = list(model.parameters()) if framework == "pytorch" else model.trainable_params()
    with watch(model) as hooked:
        with_hooks = len(hooked._handles)
    with watch(model, grads="step") as w:
        assert with_hooks - len(w._handles) == len(params)  # one hook per parameter fewer, the module hooks kept
        step()
        if framework == "pytorch":
            grads = [p.grad for p in params]
        else:
            loss = ms.value_and_grad(lambda a, b: ((model(a) - b) ** 2).mean(), None, params)
            grads = loss(*(ms.Tensor(v) for v in data()))[1]
        new = w.step(grads)
    vanishing = [f for f in new if f.rule == "vanishing-gradients"]
    assert vanishing and vanishing[0].where == ("0.weight",) and vanishing[0].severity == Severity.ERROR
    assert sum(r.kind == "param_grad" for r in w._sink.records) == len(params)


def test_gradients_for_step_are_checked():
    model, step = torch_loop("ReLU", 2, 1.0)
    with watch(model, grads="step") as w:
        step()
        with pytest.raises(AlignerError, match="pass the step's gradients"):
            w.step()
    with watch(model) as w, pytest.raises(AlignerError, match="grads='step'"):
        w.step([p.grad for p in model.parameters()])
    with watch(model, grads="step") as w, pytest.raises(AlignerError, match="1 gradients for 4"):
        w.step([torch.zeros(1)])
    with pytest.raises(AlignerError, match="'hooks'"):
        watch(model, grads="tape")
