"""Every built-in name rule (mappings/torch_mindspore.yaml) checked against the installed torch and MindSpore.

For each layer type the layer is built in both frameworks inside a small parent (attribute `layer`, or a name that
matters for the rules, e.g. `embedding`), every parameter and buffer of the source side gets random values
(BatchNorm variances positive, so a swapped gamma/beta or mean/variance changes the output), the checkpoint goes
through `align convert` (in-process CLI, the library call, or a real `align` subprocess), the result is loaded into
the other framework's model, and both models run on the same float32 input: outputs must agree to 1e-5.

Constructor defaults differ between the frameworks; each case says which ones were aligned so that both layers
compute the same function. Notable ones, for every case:
* MindSpore Conv*/Conv*Transpose: has_bias=False and pad_mode='same' by default -> has_bias=True, pad_mode='pad'
  with torch's explicit padding.
* MindSpore LayerNorm: epsilon 1e-7 by default -> 1e-5 as torch.
* MindSpore BatchNorm: momentum 0.9 means "keep 0.9 of the running value", torch's momentum 0.1 means "take 0.1 of
  the batch value": the same update; eval mode uses the moving statistics in both (use_batch_statistics=None).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import mint
from mindspore import nn as mnn
from torch import nn as tnn

from aligner.cli import main as align_main
from aligner.pipelines.convert.checkpoint import convert

ms.set_context(mode=ms.PYNATIVE_MODE)
ATOL = 1e-5


# ----------------------------------------------------------------------------------------------- the two parents

class TorchParent(tnn.Module):
    """Holds the layer under `name`, so every state_dict key has a prefix."""

    def __init__(self, name: str, layer: tnn.Module) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, layer)

    def forward(self, x):
        return getattr(self, self.name)(x)


class MsParent(mnn.Cell):
    """The MindSpore twin of TorchParent (MindSpore prefixes parameter names with the attribute name)."""

    def __init__(self, name: str, layer: mnn.Cell) -> None:
        super().__init__()
        self.layer_name = name
        setattr(self, name, layer)

    def construct(self, x):
        return getattr(self, self.layer_name)(x)


# ----------------------------------------------------------------------------------------------------- the cases

@dataclasses.dataclass
class Case:
    id: str
    torch_layer: Callable[[], tnn.Module]
    ms_layer: Callable[[], mnn.Cell]
    input_shape: tuple[int, ...]
    name: str = "layer"
    like_to_ms: bool = False       # torch -> MindSpore needs --like ms_init.ckpt
    like_to_torch: bool = False    # MindSpore -> torch needs --like torch_init.pth
    int_input: int = 0             # > 0: integer indices below this (Embedding)
    torch_train: bool = False      # compare with the torch layer in train mode (see InstanceNorm2d)
    via: str = "cli"               # "cli" (aligner.cli.main in-process) or "library" (pipelines.convert.convert)
    scale: float = 1.0             # random parameter values are standard normal times this
    pairs: dict[str, str] | None = None  # torch leaf -> MindSpore leaf, checked by value (no MindSpore CPU kernel)


CASES = [
    # BatchNorm: eps 1e-5 in both; MindSpore momentum=0.9 is torch's momentum=0.1 (unused in eval mode).
    Case("BatchNorm1d", lambda: tnn.BatchNorm1d(4, eps=1e-5, momentum=0.1),
         lambda: mnn.BatchNorm1d(4, eps=1e-5, momentum=0.9), (3, 4, 5)),
    Case("BatchNorm2d", lambda: tnn.BatchNorm2d(4, eps=1e-5, momentum=0.1),
         lambda: mnn.BatchNorm2d(4, eps=1e-5, momentum=0.9), (2, 4, 3, 3), via="library"),
    # MindSpore BatchNorm3d keeps its parameters in a child cell `bn2d`: going to MindSpore only --like can place
    # them; going to torch the rule's mindspore_infix strips `bn2d.` by itself (no --like).
    Case("BatchNorm3d", lambda: tnn.BatchNorm3d(4, eps=1e-5, momentum=0.1),
         lambda: mnn.BatchNorm3d(4, eps=1e-5, momentum=0.9), (2, 4, 2, 3, 3), like_to_ms=True),
    # LayerNorm: MindSpore epsilon defaults to 1e-7, torch eps to 1e-5 -> 1e-5 in both.
    Case("LayerNorm", lambda: tnn.LayerNorm(4, eps=1e-5), lambda: mnn.LayerNorm((4,), epsilon=1e-5), (2, 3, 4),
         via="library"),
    # LayerNorm over the last two axes: MindSpore needs begin_norm_axis=begin_params_axis=1 (on a rank-3 input; it
    # rejects -2) to normalise and scale over (3, 4) as torch's normalized_shape=(3, 4) does; the weights are 2-D.
    Case("LayerNorm-2d-shape", lambda: tnn.LayerNorm((3, 4), eps=1e-5),
         lambda: mnn.LayerNorm((3, 4), begin_norm_axis=1, begin_params_axis=1, epsilon=1e-5), (2, 3, 4)),
    # mint.nn.LayerNorm keeps torch's names (weight/bias): the rules would say gamma/beta, --like makes the target win.
    # Its LayerNormExt kernel does not exist on MindSpore CPU: the values are checked name by name, the forward
    # runs only where the kernel exists.
    Case("mint.LayerNorm", lambda: tnn.LayerNorm(4, eps=1e-5), lambda: mint.nn.LayerNorm(4, eps=1e-5), (2, 3, 4),
         like_to_ms=True, via="library", pairs={"weight": "weight", "bias": "bias"}),
    # GroupNorm: eps 1e-5 and affine in both (defaults agree).
    Case("GroupNorm", lambda: tnn.GroupNorm(2, 4, eps=1e-5), lambda: mnn.GroupNorm(2, 4, eps=1e-5), (2, 4, 3, 3)),
    # InstanceNorm2d: torch with affine=True, track_running_stats=True uses the running statistics in eval mode;
    # MindSpore's InstanceNorm2d always normalises with the per-instance statistics (its construct never looks at
    # `training`; the moving statistics are only updated). The two agree with torch in train mode, so compare there.
    # The parameters map like BatchNorm: construct passes (gamma, beta, moving_mean, moving_variance) to the
    # InstanceNorm primitive. MindSpore has no InstanceNorm kernel on CPU: the values are checked name by name (so a
    # swap cannot pass), the forward runs only where the kernel exists.
    Case("InstanceNorm2d", lambda: tnn.InstanceNorm2d(4, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True),
         lambda: mnn.InstanceNorm2d(4, eps=1e-5, momentum=0.1, affine=True), (2, 4, 3, 3), torch_train=True,
         pairs={"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}),
    # Embedding: the module's name (`embedding`) tells the rules a lone 2-D weight is an embedding table.
    Case("Embedding", lambda: tnn.Embedding(10, 4), lambda: mnn.Embedding(10, 4), (2, 5), name="embedding",
         int_input=10, via="library"),
    # ... and without the name hint, --like decides (structural match weight <-> embedding_table).
    Case("Embedding-no-hint", lambda: tnn.Embedding(10, 4), lambda: mnn.Embedding(10, 4), (2, 5), name="lookup",
         int_input=10, like_to_ms=True),
    # PReLU: one slope per channel in both (torch num_parameters=4, MindSpore channel=4); name `prelu` for the hint.
    Case("PReLU", lambda: tnn.PReLU(4), lambda: mnn.PReLU(channel=4), (2, 4, 5), name="prelu", via="library"),
    # Conv1d: MindSpore weight is (out, in, 1, k); going to torch, --like squeezes the unit axis.
    Case("Conv1d", lambda: tnn.Conv1d(3, 4, 3, stride=1, padding=1),
         lambda: mnn.Conv1d(3, 4, 3, stride=1, pad_mode="pad", padding=1, has_bias=True), (2, 3, 7),
         like_to_torch=True),
    # ConvTranspose1d <-> Conv1dTranspose: weight (in, out, k) vs (in, out, 1, k); stride 2 to exercise the layout.
    Case("ConvTranspose1d", lambda: tnn.ConvTranspose1d(3, 4, 3, stride=2, padding=1),
         lambda: mnn.Conv1dTranspose(3, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True), (2, 3, 5),
         like_to_torch=True, via="library"),
    # Linear <-> Dense: Dense has a bias and no activation by default, as Linear.
    Case("Linear", lambda: tnn.Linear(3, 4), lambda: mnn.Dense(3, 4, has_bias=True), (2, 3)),
    Case("Conv2d", lambda: tnn.Conv2d(3, 4, 3, stride=1, padding=1),
         lambda: mnn.Conv2d(3, 4, 3, stride=1, pad_mode="pad", padding=1, has_bias=True), (2, 3, 5, 5),
         via="library"),
    Case("Conv3d", lambda: tnn.Conv3d(3, 4, 3, stride=1, padding=1),
         lambda: mnn.Conv3d(3, 4, 3, stride=1, pad_mode="pad", padding=1, has_bias=True), (1, 3, 4, 4, 4)),
    Case("ConvTranspose2d", lambda: tnn.ConvTranspose2d(3, 4, 3, stride=2, padding=1),
         lambda: mnn.Conv2dTranspose(3, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True), (2, 3, 4, 4),
         via="library"),
    # LSTM/GRU: 2 layers, bidirectional, batch_first in both (MindSpore's batch_first default is False as torch's);
    # the outputs (sequence, h_n[, c_n]) check the gate order and the bias layout.
    Case("LSTM", lambda: tnn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True),
         lambda: mnn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True), (2, 5, 3)),
    # GRU on MindSpore CPU is composed of ops (same r, z, n gate order and b_hn inside r * (W_hn h + b_hn) as torch),
    # and MindSpore's CPU Tanh is an approximation: abs error up to 1e-4 for 3 < |x| < 6 (and tanh(-5) = -1.0000098),
    # 1e-7 below |x| = 2. Parameters at 0.3 x standard normal keep the new-gate pre-activations where Tanh is exact to
    # float32, so 1e-5 still holds; a gate-order or bias-layout error would change the outputs by ~0.1.
    Case("GRU", lambda: tnn.GRU(3, 4, num_layers=2, batch_first=True, bidirectional=True),
         lambda: mnn.GRU(3, 4, num_layers=2, batch_first=True, bidirectional=True), (2, 5, 3), via="library",
         scale=0.3),
]


# ------------------------------------------------------------------------------------------------------- helpers

def _random_value(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float) -> np.ndarray:
    if name.endswith(("running_var", "moving_variance")):
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def randomize_torch(model: tnn.Module, rng: np.random.Generator, scale: float = 1.0) -> None:
    """Random values in every parameter and buffer (num_batches_tracked too: it must be dropped, not mistaken)."""
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.is_floating_point():
                tensor.copy_(torch.from_numpy(_random_value(name, tuple(tensor.shape), rng, scale)))
            else:
                tensor.fill_(int(rng.integers(1, 1000)))


def randomize_ms(net: mnn.Cell, rng: np.random.Generator, scale: float = 1.0) -> None:
    for param in net.get_parameters():
        param.set_data(ms.Tensor(_random_value(param.name, tuple(param.shape), rng, scale)))


def make_input(case: Case, rng: np.random.Generator) -> np.ndarray:
    if case.int_input:
        return rng.integers(0, case.int_input, case.input_shape).astype(np.int64)
    return rng.standard_normal(case.input_shape).astype(np.float32)


def _flatten(out: Any, to_numpy: Callable[[Any], np.ndarray]) -> list[np.ndarray]:
    if isinstance(out, (tuple, list)):
        return [a for item in out for a in _flatten(item, to_numpy)]
    return [to_numpy(out)]


def torch_outputs(model: tnn.Module, x: np.ndarray, train: bool) -> list[np.ndarray]:
    model.train(train)
    with torch.no_grad():
        return _flatten(model(torch.from_numpy(x)), lambda t: t.detach().numpy())


def ms_outputs(net: mnn.Cell, x: np.ndarray) -> list[np.ndarray]:
    net.set_train(False)
    tensor = ms.Tensor(x.astype(np.int32) if x.dtype == np.int64 else x)
    return _flatten(net(tensor), lambda t: t.asnumpy())


def assert_same_outputs(expected: list[np.ndarray], got: list[np.ndarray]) -> None:
    assert len(expected) == len(got)
    for i, (a, b) in enumerate(zip(expected, got)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        diff = float(np.max(np.abs(a - b)))
        assert diff <= ATOL, f"output {i}: max abs diff {diff:.3g} > {ATOL}"


def run_convert(case: Case, src: str, out: str, like: str | None) -> None:
    """Convert through the in-process CLI or the library call; either way it must succeed completely."""
    if case.via == "cli":
        argv = ["convert", src, "-o", out] + (["--like", like] if like else [])
        with pytest.raises(SystemExit) as exit_info:
            align_main(argv)
        assert exit_info.value.code == 0
    else:
        plan = convert(src, out, like_path=like)
        assert not plan.failures, [e.to_dict() for e in plan.failures]


def load_into_ms(net: mnn.Cell, ckpt: str) -> dict[str, Any]:
    """load_checkpoint + load_param_into_net; every parameter of the net filled, every checkpoint entry used.

    Nothing is legitimately absent on either side for these layers: torch's num_batches_tracked (no MindSpore twin)
    is dropped by the conversion, so it must not reach the checkpoint, and every MindSpore parameter has a torch
    source (moving statistics included)."""
    params = ms.load_checkpoint(ckpt)
    param_not_load, ckpt_not_load = ms.load_param_into_net(net, params)
    assert param_not_load == [], f"MindSpore parameters left at their init: {param_not_load}"
    assert ckpt_not_load == [], f"checkpoint entries MindSpore did not use: {ckpt_not_load}"
    return params


NO_KERNEL = ("Unsupported op [InstanceNorm]", "Create kernelmod for op LayerNormExt failed")


def _ms_forward_or_skip(case: Case, net: mnn.Cell, x: np.ndarray) -> list[np.ndarray]:
    try:
        return ms_outputs(net, x)
    except RuntimeError as exc:  # nn.InstanceNorm2d and mint.nn.LayerNorm have no CPU kernel in MindSpore 2.10
        if case.pairs and any(msg in str(exc) for msg in NO_KERNEL):
            pytest.skip(f"{case.id}: MindSpore has no kernel on this device; parameters checked by value, "
                        "forward not compared")
        raise


def check_pairs(case: Case, tmodel: tnn.Module, net: mnn.Cell) -> None:
    """Each torch tensor is in the MindSpore parameter of the same role (by name, so a swap fails)."""
    tstate = tmodel.state_dict()
    mparams = {p.name: p for p in net.get_parameters()}
    for tleaf, mleaf in (case.pairs or {}).items():
        np.testing.assert_array_equal(mparams[f"{case.name}.{mleaf}"].asnumpy(),
                                      tstate[f"{case.name}.{tleaf}"].numpy(), err_msg=f"{tleaf} -> {mleaf}")


# --------------------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_to_mindspore(case: Case, tmp_path) -> None:
    rng = np.random.default_rng(0)
    tmodel = TorchParent(case.name, case.torch_layer())
    randomize_torch(tmodel, rng, case.scale)
    torch.save(tmodel.state_dict(), tmp_path / "src.pth")
    net = MsParent(case.name, case.ms_layer())
    like = None
    if case.like_to_ms:
        like = str(tmp_path / "ms_init.ckpt")
        ms.save_checkpoint(net, like)

    run_convert(case, str(tmp_path / "src.pth"), str(tmp_path / "out.ckpt"), like)
    params = load_into_ms(net, str(tmp_path / "out.ckpt"))

    # every MindSpore value is one of the torch tensors (nothing left at init, nothing invented)
    torch_values = [v.numpy().ravel() for v in tmodel.state_dict().values() if v.is_floating_point()]
    for name, param in params.items():
        value = param.asnumpy().ravel()
        assert any(v.shape == value.shape and np.array_equal(v, value) for v in torch_values), name
    check_pairs(case, tmodel, net)

    x = make_input(case, rng)
    expected = torch_outputs(tmodel, x, case.torch_train)
    assert_same_outputs(expected, _ms_forward_or_skip(case, net, x))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mindspore_to_torch(case: Case, tmp_path) -> None:
    rng = np.random.default_rng(1)
    net = MsParent(case.name, case.ms_layer())
    randomize_ms(net, rng, case.scale)
    ms.save_checkpoint(net, str(tmp_path / "src.ckpt"))
    tmodel = TorchParent(case.name, case.torch_layer())
    like = None
    if case.like_to_torch:
        like = str(tmp_path / "torch_init.pth")
        torch.save(tmodel.state_dict(), like)

    run_convert(case, str(tmp_path / "src.ckpt"), str(tmp_path / "out.pth"), like)
    state = torch.load(tmp_path / "out.pth", weights_only=True)
    tmodel.load_state_dict(state, strict=True)
    for name, value in state.items():
        if name.endswith("num_batches_tracked"):
            assert value.dtype == torch.int64 and value.shape == () and int(value) == 0
    check_pairs(case, tmodel, net)

    x = make_input(case, rng)
    got = torch_outputs(tmodel, x, case.torch_train)
    assert_same_outputs(_ms_forward_or_skip(case, net, x), got)


def test_real_align_process_round_trip(tmp_path, align) -> None:
    """The installed console path: `align convert` in a subprocess, torch -> MindSpore -> torch, BatchNorm2d + Conv."""
    rng = np.random.default_rng(3)
    tmodel = tnn.Sequential(tnn.Conv2d(3, 4, 3, padding=1), tnn.BatchNorm2d(4))
    randomize_torch(tmodel, rng)
    torch.save(tmodel.state_dict(), tmp_path / "a.pth")
    proc = align("convert", tmp_path / "a.pth", "-o", tmp_path / "b.ckpt")
    assert proc.returncode == 0, proc.stderr
    net = mnn.SequentialCell([mnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True),
                              mnn.BatchNorm2d(4, momentum=0.9)])
    load_into_ms(net, str(tmp_path / "b.ckpt"))
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    assert_same_outputs(torch_outputs(tmodel, x, False), ms_outputs(net, x))

    proc = align("convert", tmp_path / "b.ckpt", "-o", tmp_path / "c.pth")
    assert proc.returncode == 0, proc.stderr
    back = torch.load(tmp_path / "c.pth", weights_only=True)
    original = tmodel.state_dict()
    assert set(back) == set(original)
    for name, value in original.items():
        if name.endswith("num_batches_tracked"):
            assert int(back[name]) == 0     # MindSpore does not keep it: recreated as 0
        else:
            assert torch.equal(back[name], value), name
