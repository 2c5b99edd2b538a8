"""The demo's model in PyTorch and MindSpore: conv + BatchNorm stem, a pre-norm attention block with LayerNorm, an MLP.

Both have the same module paths. `MsDemoNet(ln_epsilon=...)` lets the demo inject the classic migration bug: MindSpore's
`nn.LayerNorm` defaults to epsilon 1e-7 where torch's `nn.LayerNorm` uses 1e-5. The token embedding is initialised
with std 0.02 (GPT style), so the LayerNorm inputs have a small variance and the epsilon matters.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

INPUT = (4, 3, 8, 8)       # batch, channels, height, width
CLASSES, CHANNELS, D_MODEL, HEADS, D_FF = 10, 8, 16, 2, 32
TORCH_LN_EPS = 1e-5


def torch_model(seed: int = 0) -> Any:
    """The PyTorch model with weights drawn from `seed`."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        """Self-attention with explicit q/k/v/out projections."""

        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.out = (nn.Linear(D_MODEL, D_MODEL) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            split = (b, s, HEADS, D_MODEL // HEADS)
            q, k, v = (f(x).reshape(split).transpose(1, 2) for f in (self.q, self.k, self.v))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D_MODEL // HEADS), dim=-1)
            return self.out((att @ v).transpose(1, 2).reshape(b, s, D_MODEL))

    class DemoNet(nn.Module):
        """conv -> bn -> relu -> tokens -> embed -> x + attn(ln1(x)) -> x + mlp(ln2(x)) -> mean -> head."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, CHANNELS, 3, padding=1)
            self.bn = nn.BatchNorm2d(CHANNELS)
            self.relu = nn.ReLU()
            self.embed = nn.Linear(CHANNELS, D_MODEL)
            self.ln1 = nn.LayerNorm(D_MODEL, eps=TORCH_LN_EPS)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(D_MODEL, eps=TORCH_LN_EPS)
            self.fc1 = nn.Linear(D_MODEL, D_FF)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(D_FF, D_MODEL)
            self.head = nn.Linear(D_MODEL, CLASSES)
            nn.init.normal_(self.embed.weight, std=0.02)
            nn.init.zeros_(self.embed.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.relu(self.bn(self.conv(x)))
            x = self.embed(x.flatten(2).transpose(1, 2))
            x = x + self.attn(self.ln1(x))
            x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
            return self.head(x.mean(dim=1))

    torch.manual_seed(seed)
    return DemoNet()


def mindspore_model(ln_epsilon: float = TORCH_LN_EPS) -> Any:
    """The MindSpore twin (weights to be loaded); `ln_epsilon=None` keeps MindSpore's LayerNorm default (the bug)."""
    import mindspore as ms
    from mindspore import nn, ops

    ln_kwargs = {} if ln_epsilon is None else {"epsilon": ln_epsilon}

    class Attention(nn.Cell):
        """MindSpore twin of the torch Attention."""

        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.out = (nn.Dense(D_MODEL, D_MODEL) for _ in range(4))

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            b, s, _ = x.shape
            split = (b, s, HEADS, D_MODEL // HEADS)
            q, k, v = (f(x).reshape(split).swapaxes(1, 2) for f in (self.q, self.k, self.v))
            att = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(D_MODEL // HEADS), axis=-1)
            return self.out(ops.matmul(att, v).swapaxes(1, 2).reshape(b, s, D_MODEL))

    class DemoNet(nn.Cell):
        """MindSpore twin of the torch DemoNet (BatchNorm momentum 0.9 = torch's 0.1)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, CHANNELS, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn = nn.BatchNorm2d(CHANNELS, momentum=0.9)
            self.relu = nn.ReLU()
            self.embed = nn.Dense(CHANNELS, D_MODEL)
            self.ln1 = nn.LayerNorm((D_MODEL,), **ln_kwargs)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm((D_MODEL,), **ln_kwargs)
            self.fc1 = nn.Dense(D_MODEL, D_FF)
            self.act = nn.GELU(approximate=False)
            self.fc2 = nn.Dense(D_FF, D_MODEL)
            self.head = nn.Dense(D_MODEL, CLASSES)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            x = self.relu(self.bn(self.conv(x)))
            x = self.embed(x.flatten(start_dim=2).swapaxes(1, 2))
            x = x + self.attn(self.ln1(x))
            x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
            return self.head(x.mean(axis=1))

    return DemoNet()


def batches(steps: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed (inputs, int32 labels) for each training step."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(INPUT).astype(np.float32), rng.integers(0, CLASSES, INPUT[0]).astype(np.int32))
            for _ in range(steps)]


def mindspore_model_default_eps() -> Any:
    """The buggy MindSpore twin (LayerNorm epsilon left at MindSpore's default): the factory `align replay` and
    `align repro` rebuild it from."""
    return mindspore_model(None)
