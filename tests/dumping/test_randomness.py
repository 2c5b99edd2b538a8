"""fix_random, disable_dropout and check_determinism on real torch and MindSpore runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(autouse=True)
def restore_global_switches():
    """fix_random flips torch's process-wide switch: put it back so other tests in this worker are unaffected
    (MindSpore's deterministic mode can be set only once per process, and is harmless to leave on)."""
    yield
    torch.use_deterministic_algorithms(False)


def torch_block_step(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One forward/backward of the transformer block; returns output and gradients."""
    out = model(torch.from_numpy(example_input("block")))
    out.square().sum().backward()
    return {"out": out.detach(), **{n: p.grad for n, p in model.named_parameters()}}


def ms_block_step(model: ms.nn.Cell) -> tuple:
    """One forward/backward of the MindSpore block through value_and_grad."""
    fn = ms.value_and_grad(lambda x: model(x).square().sum(), None, model.trainable_params())
    return fn(ms.Tensor(example_input("block")))


def test_fix_random_pins_every_framework_and_says_what_it_did():
    record = aligner.fix_random(123)
    assert record["seed"] == record["python_random"] == record["numpy"] == 123
    assert "child processes only" in record["PYTHONHASHSEED"] and os.environ["PYTHONHASHSEED"] == "123"
    assert record["pytorch"]["deterministic_algorithms"] is True and torch.are_deterministic_algorithms_enabled()
    assert record["pytorch"]["cudnn_benchmark"] is False and torch.backends.cudnn.deterministic
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == record["pytorch"]["CUBLAS_WORKSPACE_CONFIG"]
    assert record["mindspore"] == {"version": ms.__version__, "set_seed": 123, "deterministic": True,
                                   "dataset_seed": 123}
    a = (np.random.rand(), torch.rand(1).item(), ms.ops.uniform((1,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()[0])
    aligner.fix_random(123)
    b = (np.random.rand(), torch.rand(1).item(), ms.ops.uniform((1,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()[0])
    assert a == b
    json.dumps(record)  # goes into dump headers


def test_fix_random_is_recorded_in_dump_headers(tmp_path):
    record = aligner.fix_random(7, frameworks=["torch"])  # the module's name is accepted for "pytorch"
    assert record["mindspore"] == "not requested" and record["pytorch"]["manual_seed"] == 7
    net = torch.nn.Linear(2, 2)
    with aligner.dump(net, tmp_path / "d", backward=False):
        net(torch.ones(1, 2))
    header = json.loads((tmp_path / "d" / "manifest.jsonl").read_text().splitlines()[0])
    assert header["seed"] == record


@pytest.mark.parametrize("module, missing, present", [("mindspore", "mindspore", "pytorch"),
                                                     ("torch", "pytorch", "mindspore")])
def test_fix_random_works_with_one_framework_installed(module, missing, present):
    code = (f"import sys; sys.modules[{module!r}] = None\n"  # makes `import {module}` fail, as if not installed
            "import json, aligner; print(json.dumps(aligner.fix_random(5)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record[missing] == "not installed" and isinstance(record[present], dict)


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "0", True])
def test_fix_random_rejects_bad_seeds(bad):
    with pytest.raises(AlignerError, match="integer seed"):
        aligner.fix_random(bad)


def test_fix_random_rejects_unknown_frameworks():
    with pytest.raises(AlignerError, match="unknown framework.*jax"):
        aligner.fix_random(0, frameworks=["jax"])


def test_seeded_torch_runs_are_bitwise_identical_and_unseeded_dropout_is_caught():
    tnet, _ = make_twins("block", dropout=0.5)
    seeded = aligner.check_determinism(lambda: torch_block_step(tnet), model=tnet, seed=0)
    assert seeded.deterministic, str(seeded)
    assert seeded.compared > 40  # outputs, every module's forward/backward record, parameter gradients
    assert str(seeded) == f"deterministic: 2 runs, {seeded.compared} tensors bitwise identical"
    unseeded = aligner.check_determinism(lambda: torch_block_step(tnet), runs=3, model=tnet)
    assert not unseeded.deterministic
    first = unseeded.differences[0]
    assert first.run == 1 and first.name.startswith("output['out']")
    assert any("forward attn.drop output[0]" in d.name for d in unseeded.differences)
    assert {d.run for d in unseeded.differences} == {1, 2}
    first_line = str(unseeded).splitlines()[0]
    assert first_line == unseeded.summary
    assert first_line.startswith(f"NOT deterministic: {len(unseeded.differing)} of {unseeded.compared} tensors differ "
                                 f"between 3 runs; first: output['out']")
    assert unseeded.to_dict()["summary"] == first_line


def test_seeded_mindspore_runs_are_bitwise_identical_and_unseeded_dropout_is_caught():
    def fresh_run() -> tuple:
        aligner.fix_random(0)  # MindSpore random ops take their generator state when built: seed, then build
        return ms_block_step(make_twins("block", dropout=0.5)[1])

    seeded = aligner.check_determinism(fresh_run)
    assert seeded.deterministic, str(seeded)
    assert seeded.compared == 1 + 16  # the loss and the 16 parameter gradients
    _, mnet = make_twins("block", dropout=0.5)
    unseeded = aligner.check_determinism(lambda: ms_block_step(mnet), model=mnet, seed=0)
    assert unseeded.compared > 40
    assert any("forward attn.drop output[0]" in d.name for d in unseeded.differences)
    assert not any("forward attn.v output[0]" in d.name for d in unseeded.differences)  # before the dropout


def test_check_determinism_restores_the_model_between_training_steps():
    tnet, _ = make_twins("cnn")

    def train_step() -> torch.Tensor:
        opt = torch.optim.SGD(tnet.parameters(), lr=0.1)
        loss = tnet(torch.from_numpy(example_input("cnn"))).square().mean()
        loss.backward()
        opt.step()
        return tnet.fc.weight.detach().clone()  # changes every step unless the model is restored

    assert aligner.check_determinism(train_step, model=tnet).deterministic
    assert not aligner.check_determinism(train_step).deterministic  # without model=, state leaks between runs


def test_check_determinism_compares_probes_and_rejects_one_run():
    calls = iter(range(10))

    def fn() -> None:
        aligner.save("counter", np.array([next(calls)]))

    report = aligner.check_determinism(fn)
    assert [d.name for d in report.differences] == ["probe counter output[0] #0"]
    with pytest.raises(AlignerError, match="runs >= 2"):
        aligner.check_determinism(fn, runs=1)


def test_disable_dropout_makes_training_mode_deterministic_in_both_frameworks():
    tnet, mnet = make_twins("block", dropout=0.5)
    t_off, m_off = aligner.disable_dropout(tnet), aligner.disable_dropout(mnet)
    assert t_off == ["attn.drop"] == m_off  # the paths switched off
    assert t_off.attributes == {"attn.drop.p": 0.5} == m_off.attributes  # and what each held before
    assert type(tnet.attn.drop).__name__ == type(mnet.attn.drop).__name__ == "Dropout"  # kept, probability zeroed
    assert tnet.attn.drop.p == mnet.attn.drop.p == 0.0
    assert tnet.training and mnet.training
    assert aligner.check_determinism(lambda: torch_block_step(tnet), model=tnet).deterministic
    assert aligner.check_determinism(lambda: ms_block_step(mnet), model=mnet).deterministic
    reference, _ = make_twins("block", dropout=0.0)  # same weights: dropout removed == dropout never there
    assert torch.equal(torch_block_step(tnet)["out"], torch_block_step(reference)["out"])


def test_disable_dropout_handles_sequential_containers_and_bad_input():
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.3), torch.nn.ReLU())
    cell = ms.nn.SequentialCell([ms.nn.Dense(2, 2), ms.nn.Dropout(p=0.3), ms.nn.ReLU()])
    assert aligner.disable_dropout(seq) == ["1"] == aligner.disable_dropout(cell)
    assert seq[1].p == cell.cell_list[1].p == 0.0
    cell.set_train(True)
    x = ms.Tensor(np.ones((4, 2), np.float32))
    assert np.array_equal(cell(x).asnumpy(), cell(x).asnumpy())
    with pytest.raises(AlignerError, match="disable_dropout needs"):
        aligner.disable_dropout([seq])


def test_check_determinism_lives_below_randomness():
    """One-way imports: determinism uses randomness.fix_random; randomness knows nothing of determinism."""
    import inspect

    from aligner.dumping import determinism, randomness

    assert aligner.check_determinism is determinism.check_determinism
    assert not hasattr(randomness, "check_determinism")
    imports = [line for line in inspect.getsource(randomness).splitlines() if "import " in line]
    assert not any("determinism" in line for line in imports), imports
