"""`align convert --optimizer`: full training checkpoints (model + optimizer) both ways, bit-exact where values are
copied, --like naming every key, and every bad input as one line with exit 2 (nothing written, old output kept)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from aligner.io import open_checkpoint
from aligner.pipelines.convert import Hyper, convert_state_dicts
from tests.support.cli import align_in_process, assert_one_line_error

TORCH = {"torch:SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
         "torch:Adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01),
         "torch:AdamW": lambda p: torch.optim.AdamW(p, lr=0.01)}
TARGETS = {"torch:SGD": ["ms:Momentum", "mint:SGD"], "torch:Adam": ["mint:Adam", "ms:Adam"],
           "torch:AdamW": ["mint:AdamW", "ms:AdamWeightDecay"]}
LEGACY = {"ms:Adam", "ms:AdamWeightDecay"}
SLOT_PREFIX = {"ms:Momentum": ["moments"], "mint:SGD": ["momentum_buf"], "mint:Adam": ["exp_avg", "exp_avg_sq"],
               "mint:AdamW": ["exp_avg", "exp_avg_sq"], "ms:Adam": ["moment1", "moment2"],
               "ms:AdamWeightDecay": ["adam_m", "adam_v"]}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _train(kind: str, path, steps: int = 3, **extra) -> dict:
    model = _model()
    opt = TORCH[kind](model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": steps, **extra}
    torch.save(ckpt, path)
    return ckpt


@pytest.mark.parametrize("kind,target", [(k, t) for k, ts in TARGETS.items() for t in ts])
def test_torch_to_mindspore_and_back_is_bit_exact(tmp_path, capsys, kind, target):
    ckpt = _train(kind, tmp_path / "a.pth")
    proc = align_in_process(capsys, "convert", tmp_path / "a.pth", "-o", tmp_path / "a.ckpt", "--optimizer", target)
    assert proc.returncode == 0, proc.stderr
    assert ("legacy optimizer" in proc.stdout) == (target in LEGACY), proc.stdout   # the update differs: said so
    with open_checkpoint(str(tmp_path / "a.ckpt")) as src:
        names = set(src.infos)
        state = ckpt["optimizer"]["state"]
        for prefix, slot in zip(SLOT_PREFIX[target], ["momentum_buffer"] if kind == "torch:SGD"
                                else ["exp_avg", "exp_avg_sq"]):
            np.testing.assert_array_equal(src.get(f"{prefix}.1.gamma"), state[2][slot].numpy())   # bn.weight: pos 2
        if target == "ms:Adam":   # bias-correction state filled from the step count
            assert float(src.get("beta1_power")) == np.float32(0.9 ** 3)
            assert float(src.get("beta2_power")) == np.float32(0.999 ** 3)
        step_key = {"mint:AdamW": ("state_step", 2), "mint:Adam": ("state_step", 3), "mint:SGD": ("step_t", 3)}
        key, want = step_key.get(target, ("global_step", 3))
        assert int(src.get(key).reshape(-1)[0]) == want
    assert all(n in names for n in ("0.weight", "1.gamma", "1.moving_mean"))
    back = align_in_process(capsys, "convert", tmp_path / "a.ckpt", "-o", tmp_path / "b.pth", "--optimizer", kind,
                            "--from-optimizer", target, "--betas", "0.9,0.999", "--lr", "0.01")
    assert back.returncode == 0, back.stderr
    got = torch.load(tmp_path / "b.pth", weights_only=True)
    assert got["step"] == 3
    for name, tensor in ckpt["model"].items():
        if not name.endswith("num_batches_tracked"):   # recreated as 0 (MindSpore has no such counter)
            assert torch.equal(got["model"][name], tensor), name
    for index, record in ckpt["optimizer"]["state"].items():
        for slot, value in record.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], value), (index, slot)
    # torch loads it into a fresh optimizer of the model
    model = _model()
    model.load_state_dict(got["model"])
    TORCH[kind](model.parameters()).load_state_dict(got["optimizer"])


def _ms_net():
    import mindspore as ms

    class Net(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.bn, self.fc2 = ms.nn.Dense(3, 4), ms.nn.BatchNorm1d(4), ms.nn.Dense(4, 2)

        def construct(self, x):
            return self.fc2(ms.ops.relu(self.bn(self.fc1(x))))
    return ms, Net()


@pytest.mark.parametrize("cell,target", [("Momentum", "torch:SGD"), ("Adam", "torch:Adam"),
                                         ("AdamWeightDecay", "torch:AdamW")])
def test_mindspore_cells_to_torch(tmp_path, capsys, cell, target):
    ms, net = _ms_net()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    args = (0.1, 0.9) if cell == "Momentum" else (0.1,)
    opt = getattr(ms.nn, cell)(net.trainable_params(), *args)
    net.set_train(True)
    grad = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)
    for _ in range(2):
        opt(grad(ms.Tensor(np.ones((5, 3), np.float32)))[1])
    model_names = {p.name for p in net.get_parameters()}   # the network (with its BatchNorm statistics), then the
    ms.save_checkpoint([{"name": p.name, "data": p} for p in net.get_parameters()]   # optimizer's own state
                       + [{"name": p.name, "data": p} for p in opt.get_parameters() if p.name not in model_names],
                       str(tmp_path / "m.ckpt"))
    proc = align_in_process(capsys, "convert", tmp_path / "m.ckpt", "-o", tmp_path / "m.pth", "--optimizer", target)
    assert proc.returncode == 0, proc.stderr
    got = torch.load(tmp_path / "m.pth", weights_only=True)
    slots = {"Momentum": [("moments", "momentum_buffer")], "Adam": [("moment1", "exp_avg"), ("moment2", "exp_avg_sq")],
             "AdamWeightDecay": [("adam_m", "exp_avg"), ("adam_v", "exp_avg_sq")]}[cell]
    for prefix, slot in slots:   # positions follow the model's order: fc1.weight, fc1.bias, bn.weight, ...
        np.testing.assert_array_equal(got["optimizer"]["state"][2][slot].numpy(),
                                      getattr(opt, {"moments": "moments", "moment1": "moment1", "moment2": "moment2",
                                                    "adam_m": "moments1", "adam_v": "moments2"}[prefix])[2].asnumpy())
    group = got["optimizer"]["param_groups"][0]
    assert group["lr"] == pytest.approx(0.1) and got["step"] == 2
    if cell == "Adam":   # betas read back from beta1_power/beta2_power and global_step
        assert tuple(group["betas"]) == (0.9, 0.999)
    if cell != "Momentum":
        assert "legacy optimizer" in proc.stdout


def test_like_names_every_key_and_missing_ones_write_nothing(tmp_path, capsys):
    ms, net = _ms_net()
    opt = ms.nn.Momentum(net.trainable_params(), 0.1, 0.9)
    ms.save_checkpoint(opt, str(tmp_path / "like.ckpt"))   # the optimizer's parameters: model weights + its state
    like_names = list(ms.load_checkpoint(str(tmp_path / "like.ckpt")))
    _train_named(tmp_path / "a.pth")
    proc = align_in_process(capsys, "convert", tmp_path / "a.pth", "-o", tmp_path / "a.ckpt", "--like",
                            tmp_path / "like.ckpt")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    with open_checkpoint(str(tmp_path / "a.ckpt")) as src:
        assert set(src.infos) == set(like_names), set(src.infos) ^ set(like_names)
    # a --like key nothing fills: exit 1, nothing written
    ms.save_checkpoint([{"name": n, "data": v} for n, v in ms.load_checkpoint(str(tmp_path / "like.ckpt")).items()]
                       + [{"name": "moments.extra.weight", "data": ms.Tensor(np.zeros(3, np.float32))}],
                       str(tmp_path / "like2.ckpt"))
    proc = align_in_process(capsys, "convert", tmp_path / "a.pth", "-o", tmp_path / "b.ckpt", "--like",
                            tmp_path / "like2.ckpt")
    assert proc.returncode == 1 and "moments.extra.weight" in proc.stdout and not (tmp_path / "b.ckpt").exists()


def _train_named(path) -> None:
    """The MindSpore twin's layout in torch (fc1, bn, fc2), one SGD step, saved as a training checkpoint."""
    model = torch.nn.Module()
    model.fc1, model.bn, model.fc2 = torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.fc2(torch.relu(model.bn(model.fc1(torch.randn(5, 3))))).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, path)


def test_in_memory_api():
    ckpt = _train_memory()
    out = convert_state_dicts({k: v.numpy() for k, v in ckpt["model"].items()}, ckpt["optimizer"], src="pytorch",
                              target="mint:Adam")
    assert out.conversion.exactness == "exact" and out.conversion.step == 2
    np.testing.assert_array_equal(out.optimizer["exp_avg.1.gamma"], ckpt["optimizer"]["state"][2]["exp_avg"])
    back = convert_state_dicts(out.model, out.optimizer, src="mindspore", target="torch:Adam",
                               from_optimizer="mint:Adam", hyper=Hyper(lr=0.01))
    np.testing.assert_array_equal(back.optimizer["state"][2]["exp_avg_sq"], ckpt["optimizer"]["state"][2]["exp_avg_sq"])


def _train_memory() -> dict:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    state = opt.state_dict()
    state["state"] = {i: {k: v.numpy() for k, v in r.items()} for i, r in state["state"].items()}
    return {"model": model.state_dict(), "optimizer": state}


def test_bad_inputs_are_one_line_and_leave_outputs_alone(tmp_path, capsys):
    _train("torch:AdamW", tmp_path / "w.pth")
    (tmp_path / "old.ckpt").write_bytes(b"old")
    cases = [
        (["--optimizer", "ms:Adam"], ["weight_decay=0.01", "decoupled"]),       # no exact equivalent, named
        (["--optimizer", "ms:Momentum"], ["no equivalent state", "exp_avg_sq"]),
        (["--optimizer", "ms:Bogus"], ["ms:Bogus", "mint:AdamW"]),                # unknown class: the supported list
        (["--optimizer", "torch:SGD"], ["not a mindspore optimizer"]),
    ]
    for args, needles in cases:
        proc = align_in_process(capsys, "convert", tmp_path / "w.pth", "-o", tmp_path / "old.ckpt", "--force", *args)
        assert_one_line_error(proc, *needles)
        assert (tmp_path / "old.ckpt").read_bytes() == b"old"
    # a model but no optimizer
    torch.save({"model": _model().state_dict()}, tmp_path / "m.pth")
    assert_one_line_error(align_in_process(capsys, "convert", tmp_path / "m.pth", "-o", tmp_path / "m.ckpt",
                                           "--optimizer", "ms:Momentum"), "no optimizer state")
    # optimizer state for another model: both counts
    other = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9).state_dict()
    torch.save({"model": _model().state_dict(), "optimizer": other, "step": 1}, tmp_path / "c.pth")
    assert_one_line_error(align_in_process(capsys, "convert", tmp_path / "c.pth", "-o", tmp_path / "c.ckpt",
                                           "--optimizer", "ms:Momentum"), "covers 1 parameters", "has 6")
    # torch SGD with dampening into nn.Momentum; amsgrad into anything
    model = _model()
    damp = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1).state_dict()
    torch.save({"model": model.state_dict(), "optimizer": damp, "step": 1}, tmp_path / "d.pth")
    assert_one_line_error(align_in_process(capsys, "convert", tmp_path / "d.pth", "-o", tmp_path / "d.ckpt",
                                           "--optimizer", "ms:Momentum"), "dampening=0.1")
    ams = torch.optim.Adam(model.parameters(), amsgrad=True).state_dict()
    torch.save({"model": model.state_dict(), "optimizer": ams, "step": 1}, tmp_path / "e.pth")
    assert_one_line_error(align_in_process(capsys, "convert", tmp_path / "e.pth", "-o", tmp_path / "e.ckpt",
                                           "--optimizer", "mint:Adam"), "amsgrad")
    assert_one_line_error(align_in_process(capsys, "convert", tmp_path / "e.pth", "-o", tmp_path / "e.ckpt",
                                           "--optimizer", "mint:Adam", "--betas", "2,3"), "--betas")
    assert not any((tmp_path / n).exists() for n in ("m.ckpt", "c.ckpt", "d.ckpt", "e.ckpt"))
