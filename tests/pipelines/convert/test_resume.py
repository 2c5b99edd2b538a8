"""Resume at step D across frameworks: train a torch MLP D-1 steps, convert {"model", "optimizer", "step"} to a
MindSpore checkpoint with `convert_training_state`, load it into a MindSpore twin and its optimizer, take step D, and
match torch's step D. mint.optim.Adam/AdamW do not update parameters on the mindspore 2.10 CPU build (measured):
there their update is run in numpy, transcribed from their source, on the state loaded into them. A resume
with the weights alone (a fresh optimizer) visibly does not match: the state matters.

How the MindSpore side loads it (the recipe docs/convert.md gives):
    params = ms.load_checkpoint(path)
    ms.load_param_into_net(net, params)   # weights and BatchNorm statistics
    ms.load_param_into_net(opt, params)   # moments / exp_avg / exp_avg_sq, global_step / state_step / step_t
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from aligner.pipelines.convert import convert_training_state

D = 4                 # the step that is compared; D - 1 steps are trained before the checkpoint
# Weights after step D, |ms - torch|: float32 forward/backward of an 8x6 -> 16 -> 3 MLP differ by ~1e-7 between the
# frameworks (measured max 6e-8 with state); 1e-5 leaves a 100x margin, and the resume without state is >1e-3 off.
ATOL = 1e-5
MIN_STATELESS_ERROR = 1e-3

PAIRS = [  # torch optimizer factory, MindSpore target, MindSpore optimizer factory
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "ms:Momentum",
     lambda ms, p: ms.nn.Momentum(p, 0.1, 0.9)),
    pytest.param("sgd-nesterov", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "ms:Momentum",
                 lambda ms, p: ms.nn.Momentum(p, 0.1, 0.9, use_nesterov=True), marks=pytest.mark.xfail(
                     strict=True, reason="measured: mindspore 2.10's CPU kernel of nn.Momentum(use_nesterov=True) "
                                         "takes the plain momentum step")),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.01), "mint:Adam", lambda ms, p: ms.mint.optim.Adam(p, lr=0.01)),
    ("adamw", lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), "mint:AdamW",
     lambda ms, p: ms.mint.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
]


class TorchMLP(torch.nn.Module):
    """Linear (no bias: a bias before BatchNorm gets a gradient of rounding noise only, which Adam's m/sqrt(v)
    blows up to lr-sized steps that differ between any two implementations) -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn = torch.nn.Linear(6, 16, bias=False), torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _ms_mlp(ms):
    class MsMLP(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = ms.nn.Dense(6, 16, has_bias=False), ms.nn.Dense(16, 3)
            self.bn = ms.nn.BatchNorm1d(16, momentum=0.9)   # torch's momentum 0.1 in MindSpore's convention

        def construct(self, x):
            return self.fc2(ms.ops.relu(self.bn(self.fc1(x))))
    return MsMLP()


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32))
            for _ in range(D)]


def _torch_run(make_opt, tmp_path):
    """Train D-1 steps, save the checkpoint, take step D: (checkpoint path, loss at D, weights after D)."""
    torch.manual_seed(0)
    model = TorchMLP()
    opt = make_opt(model.parameters())
    batches = _batches()

    def step(x: np.ndarray, y: np.ndarray) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return float(loss)

    for x, y in batches[:D - 1]:
        step(x, y)
    path = tmp_path / "step.pth"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": D - 1}, path)
    loss = step(*batches[D - 1])
    return path, loss, {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


def _updates(ms, opt) -> bool:
    """Whether this optimizer class changes a parameter when called (mindspore 2.10 CPU, PyNative: the
    mint.optim classes leave the parameters unchanged, measured)."""
    param = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="probe")
    probe = type(opt)([param], lr=0.1)
    try:
        probe((ms.Tensor(np.ones(2, np.float32)),))
        return not np.array_equal(param.asnumpy(), np.ones(2, np.float32))
    except RuntimeError:  # mint.optim.AdamW: "The kernel AdamW unregistered" on CPU
        return False


def _mint_adam_step(ms, opt, grads, decoupled: bool, lr: float, wd: float, betas=(0.9, 0.999), eps=1e-8) -> None:
    """mint.optim.Adam/AdamW's update transcribed from their source (mindspore/mint/optim/adam.py, adamw.py), run in
    numpy on the optimizer's own loaded state: Adam counts state_step from 0, AdamW from -1 (its kernel adds 1)."""
    t = float(opt.state_step.asnumpy()[0]) + (2 if decoupled else 1)
    b1, b2 = betas
    for p, g, m, v in zip(opt.parameters, grads, opt.exp_avg, opt.exp_avg_sq):
        w, g, m_, v_ = p.asnumpy(), g.asnumpy(), m.asnumpy(), v.asnumpy()
        if decoupled:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        m_ = b1 * m_ + (1 - b1) * g
        v_ = b2 * v_ + (1 - b2) * g * g
        w = w - lr / (1 - b1 ** t) * m_ / (np.sqrt(v_) / np.sqrt(1 - b2 ** t) + eps)
        p.set_data(ms.Tensor(w.astype(np.float32)))


def _ms_step(ckpt: str, make_opt, with_state: bool):
    """Load the converted checkpoint into the twin (and its optimizer), take step D: (loss, weights by torch name)."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = _ms_mlp(ms)
    opt = make_opt(ms, net.trainable_params())
    params = ms.load_checkpoint(ckpt)
    not_loaded, _ = ms.load_param_into_net(net, params)
    assert not not_loaded, not_loaded
    if with_state:
        not_loaded, _ = ms.load_param_into_net(opt, params)
        assert not not_loaded, not_loaded
    net.set_train(True)
    x, y = _batches()[D - 1]

    def forward(a, b):
        return ms.ops.mse_loss(net(a), b)

    loss, grads = ms.value_and_grad(forward, None, opt.parameters)(ms.Tensor(x), ms.Tensor(y))
    if hasattr(opt, "exp_avg") and not _updates(ms, opt):
        decoupled = type(opt).__name__ == "AdamW"
        _mint_adam_step(ms, opt, grads, decoupled, 0.01, 0.1 if decoupled else 0.0)
    else:
        opt(grads)
    names = {"bn.gamma": "bn.weight", "bn.beta": "bn.bias"}
    return float(loss), {names.get(p.name, p.name): p.asnumpy() for p in net.trainable_params()}


@pytest.mark.parametrize("label,torch_opt,target,ms_opt", PAIRS, ids=["sgd", "sgd-nesterov", "adam", "adamw"])
def test_resume_at_step_d_matches_torch(tmp_path, label, torch_opt, target, ms_opt):
    path, loss, weights = _torch_run(torch_opt, tmp_path)
    out = tmp_path / "step.ckpt"
    result = convert_training_state(str(path), str(out), optimizer=target)
    assert result.written and result.optimizer.exactness == "exact" and result.optimizer.step == D - 1
    ms_loss, ms_weights = _ms_step(str(out), ms_opt, with_state=True)
    _, stateless = _ms_step(str(out), ms_opt, with_state=False)
    err = max(float(np.abs(ms_weights[k] - weights[k]).max()) for k in weights)
    err_stateless = max(float(np.abs(stateless[k] - weights[k]).max()) for k in weights)
    print(f"{label} -> {target}: step-{D} weights max |ms - torch| with state {err:.2e}, without {err_stateless:.2e}; "
          f"loss {ms_loss:.7f} vs {loss:.7f}")
    assert abs(ms_loss - loss) <= 1e-5 * max(1.0, abs(loss))
    assert err <= ATOL, err
    assert err_stateless >= MIN_STATELESS_ERROR, err_stateless
