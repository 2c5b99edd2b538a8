"""Run a step function several times from the same state and list every tensor that is not bitwise identical."""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from aligner.dumping import MemoryCapture
from aligner.dumping.tensors import is_tensor, to_host
from aligner.core.errors import AlignerError


@dataclasses.dataclass
class Difference:
    """One tensor whose value in run `run` is not bitwise identical to run 0."""

    name: str
    run: int
    detail: str


@dataclasses.dataclass
class DeterminismReport:
    """What `check_determinism` compared and what differed (empty `differences`: bitwise deterministic)."""

    runs: int
    compared: int
    differences: list[Difference]

    @property
    def deterministic(self) -> bool:
        return not self.differences

    def __str__(self) -> str:
        if self.deterministic:
            return f"deterministic: {self.compared} tensors bitwise identical over {self.runs} runs"
        lines = [f"NOT deterministic: {len(self.differences)} of {self.compared} tensors differ over {self.runs} runs"]
        lines += [f"  run {d.run}: {d.name}: {d.detail}" for d in self.differences]
        return "\n".join(lines)


def _leaves(obj: Any, name: str) -> list[tuple[str, np.ndarray]]:
    """(name, host array) for every tensor, array or number in a nested return value."""
    if is_tensor(obj) or isinstance(obj, np.ndarray):
        return [(name, to_host(obj))]
    if isinstance(obj, (bool, int, float, np.generic)):
        return [(name, np.asarray(obj))]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{name}[{k!r}]")]
    if isinstance(obj, (tuple, list)):
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, f"{name}[{i}]")]
    return []


def _diff(a: np.ndarray, b: np.ndarray) -> str | None:
    """None when bitwise identical, else what differs."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.tobytes() == b.tobytes():
        return None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    unequal = ~((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))
    return f"{int(unequal.sum())} of {a.size} elements differ, max |diff| {float(np.nanmax(np.abs(a64 - b64))):.3g}"


class _State:
    """A snapshot of a model's parameters and buffers, restored before every run after the first."""

    def __init__(self, model: Any) -> None:
        self.model = model
        torch = sys.modules.get("torch")
        self.is_torch = torch is not None and isinstance(model, torch.nn.Module)
        if self.is_torch:
            self.saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.saved = {name: p.asnumpy().copy() for name, p in model.parameters_and_names()}

    def restore(self) -> None:
        if self.is_torch:
            self.model.load_state_dict(self.saved)
            for p in self.model.parameters():
                p.grad = None
        else:
            import mindspore as ms

            for name, p in self.model.parameters_and_names():
                p.set_data(ms.Tensor(self.saved[name].copy()))


def run_and_compare(fn: Callable[[], Any], runs: int, model: Any | None, seed: int | None) -> DeterminismReport:
    """Call `fn` `runs` times (restoring `model` and reseeding between runs) and compare outputs and captures."""
    from aligner.dumping.randomness import fix_random

    if not isinstance(runs, int) or runs < 2:
        raise AlignerError(f"check_determinism needs runs >= 2, got {runs!r}")
    state = _State(model) if model is not None else None
    results: list[list[tuple[str, np.ndarray]]] = []
    for run in range(runs):
        if state is not None and run:
            state.restore()
        if seed is not None:
            fix_random(seed)
        with MemoryCapture(model) as capture:
            output = fn()
        captured = [(f"{r.kind} {r.module or '<model>'} {r.io}[{r.index}] #{r.seq}", a) for r, a in capture.items]
        results.append(_leaves(output, "output") + captured)
    differences = []
    for run, result in enumerate(results[1:], 1):
        if [n for n, _ in result] != [n for n, _ in results[0]]:
            differences.append(Difference("record sequence", run, f"{len(result)} tensors vs {len(results[0])} "
                                          "in run 0, or in another order"))
            continue
        differences += [Difference(name, run, d) for (name, a), (_, b) in zip(results[0], result)
                        if (d := _diff(a, b)) is not None]
    return DeterminismReport(runs, len(results[0]), differences)
