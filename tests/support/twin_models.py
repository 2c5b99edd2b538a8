"""The same two small models in PyTorch and MindSpore, with identical module paths, and a weight copier.

Other tests import these to get a torch model and its MindSpore twin that compute the same function:

* `TorchCNN` / `MsCNN`: Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d -> Conv2d -> BatchNorm2d -> ReLU -> AvgPool2d ->
  Flatten -> Linear(128, 10), on a `CNN_INPUT` = (2, 3, 16, 16) input.
* `TorchBlock` / `MsBlock`: a pre-norm transformer block (LayerNorm, hand-written 2-head self-attention with a
  Softmax module, Dropout (p=0 unless asked), GELU MLP) with d_model 16 on a `BLOCK_INPUT` = (2, 4, 16) input.

Attention is written out by hand (not `nn.MultiheadAttention`) so both frameworks call the same submodules in the same
order. `make_twins(kind, seed)` builds both, seeds the torch weights and copies them into the MindSpore twin through an
explicit torch -> MindSpore parameter-name table (`NAME_MAPS`).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

CNN_INPUT = (2, 3, 16, 16)
BLOCK_INPUT = (2, 4, 16)
D_MODEL, HEADS, D_FF = 16, 2, 32


@functools.cache
def _torch_classes() -> tuple[type, type]:
    import torch
    from torch import nn

    class TorchCNN(nn.Module):
        """Small CNN: two conv/BN/ReLU/pool stages and a Linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(4)
            self.relu1 = nn.ReLU()
            self.pool1 = nn.MaxPool2d(2, 2)
            self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
            self.bn2 = nn.BatchNorm2d(8)
            self.relu2 = nn.ReLU()
            self.pool2 = nn.AvgPool2d(2, 2)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(8 * 4 * 4, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
            x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
            return self.fc(self.flatten(x))

    class Attention(nn.Module):
        """Multi-head self-attention with explicit q/k/v/out projections and a Softmax module."""

        def __init__(self, dropout: float) -> None:
            super().__init__()
            self.q = nn.Linear(D_MODEL, D_MODEL)
            self.k = nn.Linear(D_MODEL, D_MODEL)
            self.v = nn.Linear(D_MODEL, D_MODEL)
            self.softmax = nn.Softmax(dim=-1)
            self.drop = nn.Dropout(dropout)
            self.out = nn.Linear(D_MODEL, D_MODEL)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            split = (b, s, HEADS, D_MODEL // HEADS)
            q = self.q(x).reshape(split).transpose(1, 2)
            k = self.k(x).reshape(split).transpose(1, 2)
            v = self.v(x).reshape(split).transpose(1, 2)
            scores = torch.matmul(q, k.transpose(-1, -2)) / float(np.sqrt(D_MODEL // HEADS))
            ctx = torch.matmul(self.drop(self.softmax(scores)), v)
            return self.out(ctx.transpose(1, 2).reshape(b, s, D_MODEL))

    class Mlp(nn.Module):
        """Linear -> GELU (exact) -> Linear."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(D_MODEL, D_FF)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(D_FF, D_MODEL)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    class TorchBlock(nn.Module):
        """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.))."""

        def __init__(self, dropout: float = 0.0) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(D_MODEL)
            self.attn = Attention(dropout)
            self.ln2 = nn.LayerNorm(D_MODEL)
            self.mlp = Mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    return TorchCNN, TorchBlock


@functools.cache
def _mindspore_classes() -> tuple[type, type]:
    import mindspore as ms
    from mindspore import nn, ops

    class MsCNN(nn.Cell):
        """MindSpore twin of TorchCNN (same attribute names, torch defaults for padding and BN momentum)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn1 = nn.BatchNorm2d(4, momentum=0.9)
            self.relu1 = nn.ReLU()
            self.pool1 = nn.MaxPool2d(2, 2)
            self.conv2 = nn.Conv2d(4, 8, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn2 = nn.BatchNorm2d(8, momentum=0.9)
            self.relu2 = nn.ReLU()
            self.pool2 = nn.AvgPool2d(2, 2)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(8 * 4 * 4, 10)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
            x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
            return self.fc(self.flatten(x))

    class Attention(nn.Cell):
        """MindSpore twin of the torch Attention."""

        def __init__(self, dropout: float) -> None:
            super().__init__()
            self.q = nn.Dense(D_MODEL, D_MODEL)
            self.k = nn.Dense(D_MODEL, D_MODEL)
            self.v = nn.Dense(D_MODEL, D_MODEL)
            self.softmax = nn.Softmax(axis=-1)
            self.drop = nn.Dropout(p=dropout)
            self.out = nn.Dense(D_MODEL, D_MODEL)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            b, s, _ = x.shape
            split = (b, s, HEADS, D_MODEL // HEADS)
            q = self.q(x).reshape(split).swapaxes(1, 2)
            k = self.k(x).reshape(split).swapaxes(1, 2)
            v = self.v(x).reshape(split).swapaxes(1, 2)
            scores = ops.matmul(q, k.swapaxes(-1, -2)) / float(np.sqrt(D_MODEL // HEADS))
            ctx = ops.matmul(self.drop(self.softmax(scores)), v)
            return self.out(ctx.swapaxes(1, 2).reshape(b, s, D_MODEL))

    class Mlp(nn.Cell):
        """Dense -> GELU (exact, like torch's default) -> Dense."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Dense(D_MODEL, D_FF)
            self.act = nn.GELU(approximate=False)
            self.fc2 = nn.Dense(D_FF, D_MODEL)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    class MsBlock(nn.Cell):
        """MindSpore twin of TorchBlock (LayerNorm epsilon 1e-5 like torch)."""

        def __init__(self, dropout: float = 0.0) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm((D_MODEL,), epsilon=1e-5)
            self.attn = Attention(dropout)
            self.ln2 = nn.LayerNorm((D_MODEL,), epsilon=1e-5)
            self.mlp = Mlp()

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    return MsCNN, MsBlock


def _linear(prefix: str) -> dict[str, str]:
    return {f"{prefix}.weight": f"{prefix}.weight", f"{prefix}.bias": f"{prefix}.bias"}


def _batchnorm(prefix: str) -> dict[str, str]:
    return {f"{prefix}.weight": f"{prefix}.gamma", f"{prefix}.bias": f"{prefix}.beta",
            f"{prefix}.running_mean": f"{prefix}.moving_mean", f"{prefix}.running_var": f"{prefix}.moving_variance"}


def _layernorm(prefix: str) -> dict[str, str]:
    return {f"{prefix}.weight": f"{prefix}.gamma", f"{prefix}.bias": f"{prefix}.beta"}


# torch state_dict name -> MindSpore parameter name (BatchNorm's num_batches_tracked has no MindSpore counterpart)
NAME_MAPS: dict[str, dict[str, str]] = {
    "cnn": {**_linear("conv1"), **_batchnorm("bn1"), **_linear("conv2"), **_batchnorm("bn2"), **_linear("fc")},
    "block": {**_layernorm("ln1"), **_linear("attn.q"), **_linear("attn.k"), **_linear("attn.v"),
              **_linear("attn.out"), **_layernorm("ln2"), **_linear("mlp.fc1"), **_linear("mlp.fc2")},
}


def torch_model(kind: str, seed: int = 0, dropout: float = 0.0) -> Any:
    """A freshly initialised torch twin ("cnn" or "block") with weights drawn from `seed`."""
    import torch

    cnn, block = _torch_classes()
    torch.manual_seed(seed)
    return cnn() if kind == "cnn" else block(dropout)


def mindspore_model(kind: str, dropout: float = 0.0) -> Any:
    """An uninitialised-weights MindSpore twin ("cnn" or "block"); fill it with `copy_weights`."""
    cnn, block = _mindspore_classes()
    return cnn() if kind == "cnn" else block(dropout)


def copy_weights(torch_net: Any, ms_net: Any, kind: str) -> None:
    """Copy every torch parameter and buffer into the MindSpore twin through `NAME_MAPS[kind]`."""
    import mindspore as ms

    name_map = NAME_MAPS[kind]
    ms_params = dict(ms_net.parameters_and_names())
    state = {k: v for k, v in torch_net.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert set(state) == set(name_map), f"torch names {sorted(set(state) ^ set(name_map))} not in NAME_MAPS"
    assert set(ms_params) == set(name_map.values()), "MindSpore parameter names differ from NAME_MAPS"
    for torch_name, value in state.items():
        ms_params[name_map[torch_name]].set_data(ms.Tensor(value.detach().numpy().copy()))


def make_twins(kind: str, seed: int = 0, dropout: float = 0.0, train: bool = True) -> tuple[Any, Any]:
    """(torch model, MindSpore model) of `kind` with identical weights, both in training (or eval) mode.

    The mode is set on both because a MindSpore Cell starts in eval mode while a torch Module starts in training mode.
    """
    tnet = torch_model(kind, seed, dropout)
    mnet = mindspore_model(kind, dropout)
    copy_weights(tnet, mnet, kind)
    tnet.train(train)
    mnet.set_train(train)
    return tnet, mnet


def example_input(kind: str, seed: int = 0) -> np.ndarray:
    """A float32 input for `kind` drawn from a fixed numpy generator."""
    shape = CNN_INPUT if kind == "cnn" else BLOCK_INPUT
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
