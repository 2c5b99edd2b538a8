"""Multi-rank dumps: which rank this process is, how many ranks there are and how they are grouped, and the gradients
each rank holds after the all-reduce.

The rank layout is read from `torch.distributed` or `mindspore.communication` when the process group is already
initialised (aligner never initialises one). With world size > 1, `aligner.dump(model, "dumps/torch")` writes
`dumps/torch/rank{N}/`, one folder per rank under the one directory every rank is given, and the header names the rank,
the world size and the groups (`groups`: name -> lists of ranks; "world" always, "dp" from a
DistributedDataParallel model's process group, anything else as the user passes it). A single process writes the
directory itself, as before.

Gradients: a parameter hook sees each rank's own gradient as autograd computes it, before DistributedDataParallel
averages it across ranks (measured with DDP on gloo: the hook sees the local gradient, `.grad` after backward the
average). So a multi-rank torch dump also records `.grad` when the dump context exits, as `param_grad` records with io
"reduced": what the optimizer will apply, identical on every data-parallel rank when the all-reduce worked. MindSpore
reduces gradients in user code (`nn.DistributedGradReducer`), which no hook sees: `save_grads` records what it returns.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.dumping.manifest import MANIFEST, Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Session, active
from aligner.dumping.tensors import is_tensor

Groups = dict[str, list[list[int]]]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where this process sits in a multi-process run (all None/empty for a single process)."""

    rank: int | None = None
    world_size: int | None = None
    groups: Groups = dataclasses.field(default_factory=dict)  # name -> groups of ranks, each sorted
    comm: str | None = None  # where the rank came from: "torch.distributed:gloo", "mindspore.communication:mccl"

    @property
    def distributed(self) -> bool:
        """More than one rank: the dump goes to a rank{N}/ folder."""
        return self.world_size is not None and self.world_size > 1

    def header(self) -> dict[str, Any]:
        """The manifest header fields (docs/dump-format.md)."""
        return {"rank": self.rank, "world_size": self.world_size, "groups": self.groups or None, "comm": self.comm}


def rank_folder(rank: int) -> str:
    """The folder name rank `rank` writes: "rank3"."""
    return f"rank{rank}"


def detect(model: Any, framework: str, groups: Mapping[str, Sequence[Any]] | None = None) -> Layout:
    """The layout of the run `model` belongs to: from torch.distributed (a torch model) or mindspore.communication
    (a MindSpore one) when initialised, with the user's `groups` added; a single process otherwise."""
    found = _torch_layout(model) if framework == Framework.PYTORCH else _mindspore_layout()
    if found is None or found.world_size is None or found.world_size <= 1:
        return Layout()
    assert found.rank is not None
    return dataclasses.replace(found, groups=found.groups | _checked_groups(groups or {}, found.rank,
                                                                          found.world_size))


def _torch_layout(model: Any) -> Layout | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    groups: Groups = {"world": [list(range(world))]}
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and model.process_group is not None:
        groups["dp"] = [sorted(dist.get_process_group_ranks(model.process_group))]
    return Layout(rank, world, groups, f"torch.distributed:{dist.get_backend()}")


def _mindspore_layout() -> Layout | None:
    if "mindspore" not in sys.modules:
        return None
    from mindspore.communication import GlobalComm, get_group_size, get_rank

    if not GlobalComm.INITED:  # init() has not run: asking get_rank() would raise, not initialise
        return None
    world = int(get_group_size())
    return Layout(int(get_rank()), world, {"world": [list(range(world))]},
                  f"mindspore.communication:{GlobalComm.BACKEND}")


def _checked_groups(groups: Mapping[str, Sequence[Any]], rank: int, world: int) -> Groups:
    """`groups` as name -> list of sorted rank lists. A value is the partition of the ranks ([[0, 2], [1, 3]]) or the
    group this rank is in ([0, 2]); a rank outside the world, a rank in two groups of one name, or a group list that
    leaves this rank out is one AlignerError line."""
    if not isinstance(groups, Mapping):
        raise AlignerError(f"aligner.dump groups must map names to ranks, e.g. {{'dp': [[0, 2], [1, 3]]}}, got "
                           f"{type(groups).__name__}")
    out: Groups = {}
    for name, value in groups.items():
        where = f"aligner.dump groups[{name!r}]"
        if not isinstance(name, str) or not name:
            raise AlignerError(f"aligner.dump groups names must be non-empty strings, got {name!r}")
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
            raise AlignerError(f"{where} must be a list of ranks or a list of lists of ranks, got {value!r}"[:200])
        nested = all(isinstance(v, Sequence) and not isinstance(v, (str, bytes)) for v in value)
        parts = [list(v) for v in value] if nested else [list(value)]
        seen: set[int] = set()
        for part in parts:
            if not part or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world for r in part):
                raise AlignerError(f"{where}: every group must list ranks 0..{world - 1}, got {part!r}"[:200])
            if seen & set(part) or len(set(part)) != len(part):
                raise AlignerError(f"{where}: rank(s) {sorted(seen & set(part)) or part} appear twice")
            seen |= set(part)
        if rank not in seen:
            raise AlignerError(f"{where} leaves out this process's rank {rank}")
        out[name] = [sorted(p) for p in parts]
    return out


def directory(root: str | os.PathLike, layout: Layout) -> str | os.PathLike:
    """Where this process writes: `root` itself for a single process, else `root`/rank{N}."""
    if not layout.distributed:
        return root
    assert layout.rank is not None
    if (Path(root) / MANIFEST).is_file():
        raise AlignerError(f"dump directory {root} holds a single-process dump; a run of {layout.world_size} ranks "
                           f"writes rank{{N}}/ folders inside the directory it is given: choose a new directory")
    return Path(root) / rank_folder(layout.rank)


class ReducedGrads:
    """Each selected parameter's `.grad` as a dump context opens; at exit, the ones that changed (backward and its
    all-reduce ran inside the context) are recorded as `param_grad` records with io "reduced" (torch)."""

    def __init__(self, model: Any, opts: Options) -> None:
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and opts.selects_name(n)]
        self.before = [_identity(p.grad) for _, p in self.params]

    def emit(self, session: Session) -> None:
        """Record every gradient written since the context opened (in place: its version counter moved)."""
        for (name, param), before in zip(self.params, self.before):
            grad = param.grad
            if grad is not None and _identity(grad) != before:
                session.emit(name, "Parameter", Kind.PARAM_GRAD, Io.REDUCED, 0, grad)


def _identity(grad: Any) -> tuple[int, int] | None:
    return None if grad is None else (id(grad), grad._version)


def save_grads(grads: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
    """Record gradients after their all-reduce (name -> tensor) in the active dump as `param_grad` records with io
    "reduced" (a no-op outside a dump): MindSpore's `DistributedGradReducer` output, which no hook sees, e.g.
    `save_grads(zip((p.name for p in optimizer.parameters), grads))`. torch dumps of more than one rank record `.grad`
    themselves."""
    session = active()
    if session is None or not session.open:
        return
    pairs = grads.items() if isinstance(grads, Mapping) else grads
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and is_tensor(pair[1])):
            raise AlignerError("save_grads needs (parameter name, gradient tensor) pairs or a name -> tensor mapping, "
                               f"got {type(pair).__name__}")
        session.emit(pair[0], "Parameter", Kind.PARAM_GRAD, Io.REDUCED, 0, pair[1])
