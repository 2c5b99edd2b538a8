"""`check_determinism`: run a step function several times from the same state and list every tensor that is not
bitwise identical ("does this framework even agree with itself?", asked before two frameworks are compared).

Imports point one way: this module uses `randomness.fix_random`; `randomness` only pins seeds and knows nothing of it.
The report is data with a `__str__` whose first line is the verdict; printing it is the caller's business.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.dumping.context import MemoryCapture
from aligner.dumping.randomness import fix_random
from aligner.dumping.tensors import is_tensor, model_framework, to_host


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

    @property
    def differing(self) -> list[str]:
        """Names of the tensors that differ in at least one run, in first-seen order."""
        return list(dict.fromkeys(d.name for d in self.differences))

    @property
    def summary(self) -> str:
        """The one-line verdict (the first line of `str(report)`)."""
        if self.deterministic:
            return f"deterministic: {self.runs} runs, {self.compared} tensors bitwise identical"
        first = self.differences[0]
        return (f"NOT deterministic: {len(self.differing)} of {self.compared} tensors differ between {self.runs} "
                f"runs; first: {first.name} (run {first.run}: {first.detail})")

    def __str__(self) -> str:
        return "\n".join([self.summary] + [f"  run {d.run}: {d.name}: {d.detail}" for d in self.differences])

    def to_dict(self) -> dict[str, Any]:
        return {"deterministic": self.deterministic, "runs": self.runs, "compared": self.compared,
                "summary": self.summary, "differences": [dataclasses.asdict(d) for d in self.differences]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeterminismReport:
        """The report `to_dict` gave (`deterministic` and `summary` are derived); KeyError or TypeError else."""
        return cls(int(data["runs"]), int(data["compared"]),
                   [Difference(str(d["name"]), int(d["run"]), str(d["detail"])) for d in data["differences"]])


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
        self.is_torch = model_framework(model) == Framework.PYTORCH
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


def check_determinism(fn: Callable[[], Any], runs: int = 2, *, model: Any = None,
                      seed: int | None = None) -> DeterminismReport:
    """Run the step function `fn` `runs` times and report every output, and with `model` every module output,
    gradient and `aligner.save` probe, that is not bitwise identical to the first run.

    With `model`, its parameters and buffers are restored (and torch `.grad` cleared) before each later run; with
    `seed`, `fix_random(seed)` runs before each run. Build any optimizer inside `fn`: its state is not restored.
    """
    if not isinstance(runs, int) or runs < 2:
        raise AlignerError(f"check_determinism needs runs >= 2, got {runs!r}")
    state = _State(model) if model is not None else None
    results: list[list[tuple[str, np.ndarray]]] = []
    for run in range(runs):
        if state is not None and run:
            state.restore()
        if seed is not None:
            fix_random(seed)
        capture = MemoryCapture(model)
        with capture:
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
