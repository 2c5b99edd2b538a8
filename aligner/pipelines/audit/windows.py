"""Sliding-window geometry of convolutions and pools, read from either framework's layer and evaluated for an input
size: the padding actually applied before and after each spatial axis, and the output size.

MindSpore's pad_mode='same' pads like TensorFlow: total = max((ceil(n/s) - 1) * s + d * (k - 1) + 1 - n, 0), the
smaller half before. With stride > 1 that depends on n (for k=3, s=2: (0, 1) on even sizes, (1, 1) on odd ones),
which is why the audit computes it per input size.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from aligner.core.frameworks import Framework

SAME_TF = "same"        # MindSpore pad_mode='same'
SAME_TORCH = "same_t"   # torch padding='same': total d*(k-1), the smaller half before
EXPLICIT = "explicit"


@dataclasses.dataclass(frozen=True)
class Axis:
    kernel: int
    stride: int
    dilation: int
    mode: str
    before: int = 0
    after: int = 0

    def pads(self, n: int) -> tuple[int, int]:
        if self.mode == EXPLICIT:
            return self.before, self.after
        if self.mode == SAME_TORCH:
            total = self.dilation * (self.kernel - 1)
        else:
            total = max((math.ceil(n / self.stride) - 1) * self.stride + self.dilation * (self.kernel - 1) + 1 - n, 0)
        return total // 2, total - total // 2

    def out(self, n: int, ceil_mode: bool) -> int:
        before, after = self.pads(n)
        span = n + before + after - self.dilation * (self.kernel - 1) - 1
        if not ceil_mode:
            return span // self.stride + 1
        out = -(-span // self.stride) + 1
        return out - 1 if (out - 1) * self.stride >= n + before else out


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One layer's windows, one Axis per spatial dimension (the last ones of the input)."""

    axes: tuple[Axis, ...]
    ceil_mode: bool = False

    def trailing(self, rank: int) -> "Geometry":
        return dataclasses.replace(self, axes=self.axes[-rank:]) if rank < len(self.axes) else self

    def pads(self, sizes: Sequence[int]) -> tuple[tuple[int, int], ...]:
        return tuple(a.pads(n) for a, n in zip(self.axes, sizes[-len(self.axes):]))

    def out(self, sizes: Sequence[int]) -> tuple[int, ...]:
        return tuple(a.out(n, self.ceil_mode) for a, n in zip(self.axes, sizes[-len(self.axes):]))

    @property
    def input_dependent(self) -> bool:
        return any(a.mode == SAME_TF and a.stride > 1 for a in self.axes)


def _tuple(value: Any, rank: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        values = tuple(int(v) for v in value)
        return values[-rank:] if len(values) > rank else values * (rank // len(values))
    return (int(value),) * rank


def _explicit(kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
              pairs: Sequence[tuple[int, int]], ceil_mode: bool) -> Geometry:
    return Geometry(tuple(Axis(k, s, d, EXPLICIT, b, a) for k, s, d, (b, a) in zip(kernel, stride, dilation, pairs)),
                    ceil_mode)


def _torch_like(layer: Any, rank: int) -> Geometry:
    """PyTorch layers and mindspore.mint's (torch's attribute names and meaning)."""
    kernel = _tuple(layer.kernel_size, rank)
    stride = _tuple(getattr(layer, "stride", None) or kernel, rank)
    dilation = _tuple(getattr(layer, "dilation", 1), rank)
    padding = getattr(layer, "padding", 0)
    ceil_mode = bool(getattr(layer, "ceil_mode", False))
    if isinstance(padding, str):
        mode = SAME_TORCH if padding == "same" else EXPLICIT
        return Geometry(tuple(Axis(k, s, d, mode) for k, s, d in zip(kernel, stride, dilation)), ceil_mode)
    pads = _tuple(padding, rank)
    return _explicit(kernel, stride, dilation, [(p, p) for p in pads], ceil_mode)


def _mindspore(layer: Any, rank: int) -> Geometry:
    """mindspore.nn layers: pad_mode 'same' / 'valid' / 'pad' and their own padding layouts."""
    pad_mode = str(layer.pad_mode).lower()
    prim = getattr(layer, "max_pool", None) or getattr(layer, "avg_pool", None)
    attrs = getattr(prim, "attrs", {}) or {}
    kernel = _tuple(layer.kernel_size, rank)
    stride = _tuple(layer.stride, rank)
    dilation = _tuple(getattr(layer, "dilation", attrs.get("dilation", 1)), rank)
    ceil_mode = bool(attrs.get("ceil_mode", False))
    if pad_mode in ("same", "valid"):
        mode = SAME_TF if pad_mode == "same" else EXPLICIT
        return Geometry(tuple(Axis(k, s, d, mode) for k, s, d in zip(kernel, stride, dilation)), ceil_mode)
    if "pad" in attrs:                       # AvgPool3D primitive: (front, back, top, bottom, left, right)
        flat = tuple(int(p) for p in attrs["pad"])
        pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][-rank:]
    elif hasattr(layer, "has_bias"):         # Conv: int, or (top, bottom, left, right[, ...]) per axis in pairs
        padding = layer.padding
        if isinstance(padding, (list, tuple)):
            flat = tuple(int(p) for p in padding)
            pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][-rank:]
        else:
            pairs = [(int(padding), int(padding))] * rank
    else:                                    # MaxPool: int or one symmetric padding per axis
        pairs = [(p, p) for p in _tuple(layer.padding, rank)]
    return _explicit(kernel, stride, dilation, pairs, ceil_mode)


def geometry(layer: Any, framework: Framework, rank: int) -> Geometry:
    """The windows of a conv or pool layer of `framework` with `rank` spatial axes."""
    if framework == Framework.MINDSPORE and hasattr(layer, "pad_mode"):
        kernel = layer.kernel_size
        full = len(kernel) if isinstance(kernel, (list, tuple)) else rank
        return _mindspore(layer, max(full, rank)).trailing(rank)
    return _torch_like(layer, rank)


def spatial_rank(class_name: str) -> int:
    """1, 2 or 3 from a class name such as Conv2d or MaxPool1d (2 when it says nothing)."""
    for rank in (1, 2, 3):
        if f"{rank}d" in class_name.lower():
            return rank
    return 2
