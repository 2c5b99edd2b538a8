"""Real checkpoint files holding random values, for the mapping and convert tests: written by the frameworks' own
savers (torch.save, mindspore.save_checkpoint) and read back by their own loaders."""
from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import torch


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """A float32 array of `shape` drawn from `rng`."""
    return rng.standard_normal(shape).astype(np.float32)


def save_pth(path: str | Path, state: dict[str, np.ndarray]) -> str:
    """`state` saved by torch.save as a dict of tensors; the path as a string."""
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, path)
    return str(path)


def save_ckpt(path: str | Path, state: dict[str, np.ndarray]) -> str:
    """`state` saved by mindspore.save_checkpoint; the path as a string."""
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in state.items()], str(path))
    return str(path)


def read(path: str | Path) -> dict[str, np.ndarray]:
    """A checkpoint as its framework itself loads it (.ckpt: MindSpore; anything else: torch, weights only)."""
    path = str(path)
    if path.endswith(".ckpt"):
        return {k: p.asnumpy() for k, p in ms.load_checkpoint(path).items()}
    return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}
