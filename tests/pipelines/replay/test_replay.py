"""Replay (`aligner.replay`, `aligner.assert_close`, `align replay`): each module re-run on the reference's recorded
inputs, so its own error stands apart from the error it inherited. Real frameworks, hand-made twins with one bug at a
time; the zoo pairs are in tests/zoo/test_replay_zoo.py."""
from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
import torch

import aligner
from aligner.pipelines.replay.result import ReplayStatus, ReplayVerdict
from aligner.pipelines.replay.run import replay_dumps
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.paths import ROOT
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


def scale_weight(param: ms.Parameter, factor: float) -> None:
    param.set_data(ms.Tensor(param.asnumpy() * np.float32(factor)))


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_clean_twins_match_forward_and_backward(kind):
    tnet, mnet = make_twins(kind, train=False)
    result = aligner.replay(tnet, mnet, example_input(kind), backward=True)
    assert result.verdict is ReplayVerdict.MATCH and result.passed
    assert all(p.grad is None for p in tnet.parameters())  # the user's model is left as found
    assert {r.phase for r in result.rows} == {"forward", "backward"}
    assert not result.skipped, [(r.module, r.reason) for r in result.rows if r.reason]
    # every leaf call of the twin is replayed (cnn: 10 leaves; block: 11)
    assert len([r for r in result.rows if r.phase == "forward"]) == {"cnn": 10, "block": 11}[kind]


@pytest.mark.parametrize("kind,module", [("cnn", "conv2"), ("block", "mlp.fc1"), ("block", "attn.q")])
def test_a_wrong_weight_is_the_module_own_error_and_downstream_only_inherits(kind, module):
    tnet, mnet = make_twins(kind, train=False)
    params = dict(mnet.parameters_and_names())
    scale_weight(params[f"{module}.weight"], 1.001)  # 1e-3 relative: ~100x the float32 default tolerance
    result = aligner.replay(tnet, mnet, example_input(kind), backward=True)
    assert result.verdict is ReplayVerdict.LAYER and result.blame == module
    culprit = result.rows[result.culprit]
    assert culprit.phase == "forward" and culprit.status is ReplayStatus.LOCAL
    assert culprit.inherited is not None and not culprit.inherited.diverged  # nothing carried in
    after = [r for r in result.rows[result.culprit + 1:] if r.phase == "forward"]
    assert after and all(r.status is ReplayStatus.INHERITED for r in after if r.total and r.total.diverged)
    assert all(r.status is not ReplayStatus.LOCAL for r in after)  # downstream layers are right on good inputs
    # backward: the same module is the first whose own gradient differs (its weight enters its grad_input)
    backward = [r for r in result.rows if r.phase == "backward" and r.status is ReplayStatus.LOCAL]
    if kind == "cnn" or module != "attn.q":  # attn.q's grad_input is the block input: a sum with k and v paths
        assert backward and backward[0].module == module


def _chain(n: int, drift: float) -> tuple[torch.nn.Module, ms.nn.Cell]:
    """n identity Linear/Dense layers; the MindSpore weights scaled by 1 + drift (a per-layer error under the
    float32 tolerance that adds up)."""
    tnet = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(n)]).eval()
    mnet = ms.nn.SequentialCell([ms.nn.Dense(8, 8) for _ in range(n)])
    mnet.set_train(False)
    with torch.no_grad():
        for layer in tnet:
            layer.weight.copy_(torch.eye(8))
            layer.bias.zero_()
    for cell in mnet:
        cell.weight.set_data(ms.Tensor(np.eye(8, dtype=np.float32) * np.float32(1 + drift)))
        cell.bias.set_data(ms.Tensor(np.zeros(8, np.float32)))
    return tnet, mnet


def test_error_that_grows_a_little_at_every_layer_is_accumulation_not_a_layer():
    # values ~100: one layer's drift 3e-7 * 100 = 3e-5 is under atol + rtol * 100 = 1.4e-4 (4.7x margin); 30 layers
    # add up to ~9e-4, 6x over it at the output
    tnet, mnet = _chain(30, 3e-7)
    x = np.full((2, 8), 100.0, np.float32)
    result = aligner.replay(tnet, mnet, x)
    assert result.verdict is ReplayVerdict.ACCUMULATED and result.culprit is None
    assert all(r.status in (ReplayStatus.OK, ReplayStatus.INHERITED) for r in result.rows)
    last = result.rows[-1]
    assert last.total is not None and last.total.diverged
    with pytest.raises(AssertionError, match="grows a little at every layer"):
        aligner.assert_close(tnet, mnet, x)


def test_glue_code_between_calls_blames_the_parent():
    class TorchGlue(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.fc1(x) * 2.0)

    class MsGlue(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = ms.nn.Dense(6, 6), ms.nn.Dense(6, 3)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            return self.fc2(self.fc1(x) * 2.02)  # the glue differs by 1%

    tnet, mnet = TorchGlue().eval(), MsGlue()
    for name in ("fc1", "fc2"):
        getattr(mnet, name).weight.set_data(ms.Tensor(getattr(tnet, name).weight.detach().numpy()))
        getattr(mnet, name).bias.set_data(ms.Tensor(getattr(tnet, name).bias.detach().numpy()))
    result = aligner.replay(tnet, mnet, np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))
    assert result.verdict is ReplayVerdict.PARENT_CODE and result.blame == ""  # the model's own forward
    assert result.rows[result.parent_code].module == "fc2"
    with pytest.raises(AssertionError, match="computed by the code of the model's own forward"):
        aligner.assert_close(tnet, mnet, np.ones((4, 6), np.float32))


def test_assert_close_is_quiet_on_twins_and_says_what_torch_testing_says_on_a_bug():
    tnet, mnet = make_twins("cnn", train=False)
    x = example_input("cnn")
    aligner.assert_close(tnet, mnet, x)
    scale_weight(dict(mnet.parameters_and_names())["conv1.weight"], 1.01)
    with pytest.raises(AssertionError) as info:
        aligner.assert_close(tnet, mnet, x)
    text = str(info.value)
    for needle in ("'conv1'", "Mismatched elements:", "Greatest absolute difference:", "at index (",
                   "(up to 1e-05 allowed)", "Error carried in at its inputs: 0"):
        assert needle in text, text
    # a tolerance wide enough for the 1% weight error passes; rtol/atol come together, as in torch.testing
    aligner.assert_close(tnet, mnet, x, rtol=0.05, atol=0.05)
    with pytest.raises(aligner.core.errors.AlignerError, match="without"):
        aligner.assert_close(tnet, mnet, x, rtol=0.05)


def test_ms_reference_replays_torch_modules():
    tnet, mnet = make_twins("block", train=False)
    with torch.no_grad():
        tnet.ln2.weight.mul_(1.001)
    result = aligner.replay(tnet, mnet, example_input("block"), ref="mindspore")
    assert result.verdict is ReplayVerdict.LAYER and result.blame == "ln2"
    assert "re-run live" in result.replayed and "pytorch" in result.replayed


# -- align replay ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_case(tmp_path_factory):
    """Dumps of the cnn twins with conv2 wrong on the MindSpore side, its weights, and a factory building it."""
    root = tmp_path_factory.mktemp("replay_cli")
    tnet, mnet = make_twins("cnn", train=False)
    scale_weight(dict(mnet.parameters_and_names())["conv2.weight"], 1.001)
    x = example_input("cnn")
    with aligner.dump(tnet, root / "pt", backward=False), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, root / "ms", backward=False):
        mnet(ms.Tensor(x))
    for step in (0, 1):  # two steps, same weights (eval mode, no update)
        with aligner.dump(tnet, root / "pt2", step=step, backward=False), torch.no_grad():
            tnet(torch.from_numpy(x))
        with aligner.dump(mnet, root / "ms2", step=step, backward=False):
            mnet(ms.Tensor(x))
    with aligner.dump(tnet, root / "pt_noinputs", inputs=False, backward=False), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(tnet, root / "pt_stats", stats_only=True, backward=False), torch.no_grad():
        tnet(torch.from_numpy(x))
    ms.save_checkpoint(mnet, str(root / "ms.ckpt"))
    (root / "factory.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.support.twin_models import mindspore_model\n\n"
        "def make():\n    m = mindspore_model('cnn')\n    m.set_train(False)\n    return m\n\n"
        "def make_block():\n    return mindspore_model('block')\n\n"
        "def make_train():\n    m = mindspore_model('cnn')\n    m.set_train(True)\n    return m\n\n"
        "def make_torch():\n    from tests.support.twin_models import torch_model\n    return torch_model('cnn')\n")
    return root


def test_cli_names_the_module_and_writes_json(cli_case, capsys):
    root = cli_case
    out = root / "replay.json"
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", f"{root / 'factory.py'}:make",
                            "--weights", root / "ms.ckpt", "--json", out)
    assert proc.returncode == 1, proc.stderr
    assert "FOUND: conv2 (Conv2d, forward) makes its own error" in proc.stdout
    data = json.loads(out.read_text())
    assert data["verdict"] == "layer" and data["blame"] == "conv2"
    statuses = {r["module"]: r["status"] for r in data["rows"]}
    assert statuses["conv1"] == "ok" and statuses["conv2"] == "local" and statuses["bn2"] == "inherited"
    # --modules narrows the replay; the argument order does not matter (torch is the reference)
    proc = align_in_process(capsys, "replay", root / "ms", root / "pt", "--factory", f"{root / 'factory.py'}:make",
                            "--weights", root / "ms.ckpt", "--modules", "^(conv1|bn1)$")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 calls replayed: 2 agree" in proc.stdout


@pytest.mark.parametrize("case,needles", [
    (("pt_noinputs", "make", True), ("holds no module inputs", "inputs=True")),
    (("pt_stats", "make", True), ("statistics-only",)),
    (("pt", "make_block", False), ("has no module", "build the model that was dumped")),
    (("pt", "make_torch", False), ("pytorch model", "side to re-run")),
])
def test_cli_bad_inputs_are_one_line_errors(cli_case, capsys, case, needles):
    root = cli_case
    ref, factory, weights = case
    args = ["replay", root / ref, root / "ms", "--factory", f"{root / 'factory.py'}:{factory}"]
    proc = align_in_process(capsys, *args, *(["--weights", root / "ms.ckpt"] if weights else []))
    assert_one_line_error(proc, *needles)


def test_cli_weights_and_options_errors(cli_case, capsys, tmp_path):
    root = cli_case
    factory = f"{root / 'factory.py'}:make"
    torch.save({"conv1.weight": torch.zeros(4, 3, 3, 3)}, tmp_path / "partial.pth")
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", factory,
                            "--weights", tmp_path / "partial.pth")
    assert_one_line_error(proc, "has no", "align convert")
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", factory, "--modules", "(")
    assert_one_line_error(proc, "not a valid regular expression")
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", factory, "--ref", "left")
    assert_one_line_error(proc, "--ref")
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", "nowhere.py:make")
    assert_one_line_error(proc, "no such file")


def test_replay_dumps_library_form_refuses_same_directory(cli_case):
    root = cli_case
    tnet, _ = make_twins("cnn", train=False)
    with pytest.raises(aligner.core.errors.AlignerError, match="same directory"):
        replay_dumps(root / "pt", root / "pt", tnet)


def test_cli_modules_matching_nothing_names_the_nearest(cli_case, capsys):
    root = cli_case
    proc = align_in_process(capsys, "replay", root / "pt", root / "ms", "--factory", f"{root / 'factory.py'}:make",
                            "--weights", root / "ms.ckpt", "--modules", "^conv3$")
    assert_one_line_error(proc, "no recorded module call matches", "nearest")


def test_cli_replays_one_step_in_the_recorded_mode(cli_case, capsys):
    root = cli_case
    # the factory returns a training-mode model; the dump ran in eval mode: each module is replayed as recorded
    # (BatchNorm on batch statistics would differ by O(1) from the recorded running-statistics output)
    args = ["replay", root / "pt2", root / "ms2", "--factory", f"{root / 'factory.py'}:make_train",
            "--weights", root / "ms.ckpt", "--modules", "^(conv1|bn1|relu1)$"]
    proc = align_in_process(capsys, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 calls replayed: 3 agree" in proc.stdout and "step 0 of the dumped steps 0, 1" in proc.stdout
    proc = align_in_process(capsys, *args, "--step", "1", "--json", "-")
    assert proc.returncode == 0 and json.loads(proc.stdout)["step"] == 1
    assert_one_line_error(align_in_process(capsys, *args, "--step", "5"), "step 5 is not in", "0, 1")
    assert_one_line_error(align_in_process(capsys, *args, "--step", "-1"), "--step must be a whole number")
