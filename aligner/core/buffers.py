"""Which state-dict leaves are buffers (running statistics, counters) rather than parameters, in either framework.

Shared by `align inspect` (parameter/buffer counts) and `align diff` (buffers are never trained by an optimizer).
"""
from __future__ import annotations

# Leaves that are buffers, never trained by an optimizer: torch BatchNorm/InstanceNorm and MindSpore BatchNorm.
BUFFER_LEAVES = frozenset({"running_mean", "running_var", "num_batches_tracked", "moving_mean", "moving_variance"})
# Running-statistic leaves -> the value they start from in a freshly built layer (both frameworks).
RUNNING_STAT_INIT = {"running_mean": 0.0, "moving_mean": 0.0, "running_var": 1.0, "moving_variance": 1.0}


def leaf(name: str) -> str:
    """The last dotted component: 'bn1.running_mean' -> 'running_mean'."""
    return name.rpartition(".")[2]


def is_buffer(name: str) -> bool:
    """True when the tensor `name` is a known buffer leaf (by name: a file does not say)."""
    return leaf(name) in BUFFER_LEAVES
