"""What a checkpoint (or a live model) holds: every tensor's name, shape, dtype, whether it is a parameter or a buffer,
and the totals, with trainable/frozen counts only where they are really known.

A file alone does not say which parameters were trainable (a torch state_dict and a MindSpore checkpoint do not keep
`requires_grad` reliably), so `inspect_checkpoint` reports those counts as unknown (None) rather than a wrong number;
`inspect_model` reads them from the model itself. Nothing here prints.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import sys
from typing import Any, Iterable, Mapping

import msgspec
import numpy as np

from aligner.core.buffers import is_buffer
from aligner.core.dtypes import FLOATING, canonical, to_numpy
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Framework
from aligner.core.result import PassedByExitCode, check_schema, typed
from aligner.dumping.tensors import to_host
from aligner.io import TensorSource, open_checkpoint
from aligner.metrics.stats import Stats, tensor_stats


class TensorKind(str, enum.Enum):
    """A trained parameter or a buffer (running statistics, counters: never updated by an optimizer)."""

    PARAMETER = "parameter"
    BUFFER = "buffer"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class TensorRow:
    """One tensor. `trainable` is None when unknown (always, for a file); `stats` only when asked for."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    bytes: int
    kind: TensorKind
    trainable: bool | None = None
    stats: Stats | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "numel": self.numel,
               "bytes": self.bytes, "kind": self.kind.value, "trainable": self.trainable}
        if self.stats is not None:
            out.update(self.stats.to_dict())
        return out


@dataclasses.dataclass(frozen=True)
class Counts:
    """Totals of a set of tensors: all, parameters, buffers; trainable/frozen parameters None when unknown."""

    tensors: int
    elements: int
    bytes: int
    parameters: int
    parameter_elements: int
    buffers: int
    buffer_elements: int
    trainable: int | None = None
    trainable_elements: int | None = None
    frozen: int | None = None
    frozen_elements: int | None = None

    @property
    def trainable_known(self) -> bool:
        return self.trainable is not None

    @classmethod
    def of(cls, rows: Iterable[TensorRow]) -> "Counts":
        """Counts of `rows`; trainable/frozen only when every parameter row knows its flag."""
        rows = list(rows)
        params = [r for r in rows if r.kind is TensorKind.PARAMETER]
        known = all(r.trainable is not None for r in params)
        trainable = [r for r in params if r.trainable] if known else None
        frozen = [r for r in params if r.trainable is False] if known else None
        return cls(len(rows), sum(r.numel for r in rows), sum(r.bytes for r in rows),
                   len(params), sum(r.numel for r in params),
                   len(rows) - len(params), sum(r.numel for r in rows if r.kind is TensorKind.BUFFER),
                   None if trainable is None else len(trainable),
                   None if trainable is None else sum(r.numel for r in trainable),
                   None if frozen is None else len(frozen),
                   None if frozen is None else sum(r.numel for r in frozen))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class InspectResult(PassedByExitCode):
    """Everything `align inspect` / `aligner.inspect_model` reports: the rows (after --filter) and their totals."""

    path: str                      # the file, or the model's class name
    format: str                    # "pytorch", "mindspore", "safetensors", "npy", or "model"
    framework: Framework | None    # naming convention (None: either)
    rows: list[TensorRow]
    counts: Counts
    notes: list[str] = dataclasses.field(default_factory=list)
    with_stats: bool = False

    @property
    def exit_code(self) -> ExitCode:
        """0: the file (or model) was read; a file that cannot be is an AlignerError instead."""
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        summary = {"path": self.path, "format": self.format,
                   "framework": self.framework.value if self.framework else None, **self.counts.to_dict(),
                   "notes": list(self.notes)}
        return {"summary": summary, "tensors": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InspectResult:
        """A saved `align inspect --json` read back; with statistics when any row holds them. NotAResultError,
        ValueError, KeyError or TypeError when `data` is not one."""
        data = check_schema(data, "inspect", ("summary", "tensors"))
        summary = typed(data["summary"], dict, "summary")
        rows = [_row_from(typed(r, dict, "tensor")) for r in typed(data["tensors"], list, "tensors")]
        framework = summary["framework"]
        counts = Counts(**{f.name: summary[f.name] for f in dataclasses.fields(Counts)})
        return cls(typed(summary["path"], str, "path"), typed(summary["format"], str, "format"),
                   None if framework is None else Framework(framework), rows, counts,
                   [typed(n, str, "note") for n in summary["notes"]], any(r.stats for r in rows))


_ROW_KEYS = ("name", "shape", "dtype", "numel", "bytes", "kind", "trainable")


def _row_from(d: Mapping[str, Any]) -> TensorRow:
    """A TensorRow from its dict: the keys beyond the row's own are its statistics ("nan"/"inf" strings back to
    floats, counts kept as they are)."""
    stats = {k: float(v) if isinstance(v, str) else v for k, v in d.items() if k not in _ROW_KEYS}
    recorded = msgspec.convert(stats, Stats) if stats else None  # ValueError for a bad one; unknown keys ignored
    return TensorRow(typed(d["name"], str, "name"), tuple(typed(n, int, "dimension") for n in d["shape"]),
                     typed(d["dtype"], str, "dtype"), typed(d["numel"], int, "numel"), typed(d["bytes"], int, "bytes"),
                     TensorKind(d["kind"]), d["trainable"] if d["trainable"] is None else typed(d["trainable"], bool,
                                                                                                "trainable"),
                     recorded)


def _kind(name: str) -> TensorKind:
    return TensorKind.BUFFER if is_buffer(name) else TensorKind.PARAMETER


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern) if pattern else None
    except re.error as exc:
        raise AlignerError(f"bad --filter regex {pattern!r}: {exc}") from None


STATS_CHUNK = 1 << 20  # elements per piece when statistics stream a stored tensor


def streamed_stats(chunks: Iterable[np.ndarray], dtype: str) -> Stats:
    """`tensor_stats` over a tensor given as flat pieces, one piece in memory at a time: min/max/mean/L2 norm over
    the finite elements (None if there are none) and NaN/Inf counts (the fractions not computed: unset); the mean is
    summed in float64 piece by piece."""
    floating = dtype in FLOATING
    low, high, total, squares, count, nan, inf = np.inf, -np.inf, 0.0, 0.0, 0, 0, 0
    for piece in chunks:
        if floating:
            values = piece.astype(np.float32) if piece.dtype.itemsize < 4 else piece
            finite = np.isfinite(values)
            bad = values.size - int(np.count_nonzero(finite))
            if bad:
                piece_nan = int(np.count_nonzero(np.isnan(values)))
                nan, inf = nan + piece_nan, inf + bad - piece_nan
                values = values[finite]
        else:
            values = piece
        if values.size == 0:
            continue
        wide = values.astype(np.float64)
        low, high = min(low, float(values.min())), max(high, float(values.max()))
        total += float(wide.sum())
        squares += float(np.einsum("i,i->", wide, wide))
        count += values.size
    if not count:
        return Stats(min=None, max=None, mean=None, l2=None if floating else 0.0, nan=nan, inf=inf)
    return Stats(min=low, max=high, mean=total / count, l2=float(np.sqrt(squares)), nan=nan, inf=inf)


def source_rows(source: TensorSource, pattern: re.Pattern[str] | None = None,
                stats: bool = False) -> list[TensorRow]:
    """The rows of an open checkpoint (names matching `pattern`); `stats` streams every tensor once, a piece at a
    time, so memory stays at a few pieces whatever the tensor's size."""
    rows = []
    for name, info in source.infos.items():
        if pattern and not pattern.search(name):
            continue
        values = streamed_stats(source.chunks(name, STATS_CHUNK), info.dtype) if stats else None
        rows.append(TensorRow(name, tuple(info.shape), info.dtype, info.numel, info.nbytes, _kind(name), None,
                              values))
    return rows


def inspect_checkpoint(path: str, *, pattern: str | None = None, stats: bool = False,
                       trust_pickle: bool = False) -> InspectResult:
    """List a checkpoint's tensors (names matching `pattern`), with statistics when `stats` (reads every tensor)."""
    regex = _compile(pattern)
    with open_checkpoint(path, allow_pickle=trust_pickle) as source:
        rows = source_rows(source, regex, stats)
        return InspectResult(path, source.format, Framework.parse(source.framework), rows, Counts.of(rows),
                             list(source.notes), stats)


def _model_tensors(model: Any) -> tuple[Framework, list[tuple[str, Any, TensorKind, bool]]]:
    """(framework, [(name, tensor, kind, trainable)]) of a torch Module or MindSpore Cell, in state-dict order."""
    torch = sys.modules.get("torch")
    ms = sys.modules.get("mindspore")
    if torch is not None and isinstance(model, torch.nn.Module):
        out = []
        for name, value in model.state_dict(keep_vars=True).items():
            is_param = isinstance(value, torch.nn.Parameter)
            out.append((name, value, TensorKind.PARAMETER if is_param else TensorKind.BUFFER,
                        bool(is_param and value.requires_grad)))
        return Framework.PYTORCH, out
    if ms is not None and isinstance(model, ms.nn.Cell):
        # every MindSpore tensor is a Parameter; BatchNorm statistics are told apart by name (moving_mean, ...)
        return Framework.MINDSPORE, [(name, p, _kind(name), bool(p.requires_grad))
                                     for name, p in model.parameters_and_names()]
    raise AlignerError(f"inspect_model needs a torch.nn.Module or a mindspore.nn.Cell, got {type(model).__name__}")


def inspect_model(model: Any, *, pattern: str | None = None, stats: bool = False) -> InspectResult:
    """The `align inspect` result for a live torch nn.Module or MindSpore Cell, with real trainable/frozen counts
    (torch: `requires_grad`; MindSpore: `Parameter.requires_grad`; buffers are never trainable)."""
    regex = _compile(pattern)
    framework, tensors = _model_tensors(model)
    rows = []
    for name, tensor, kind, trainable in tensors:
        if regex and not regex.search(name):
            continue
        dtype = canonical(tensor.dtype)
        shape = tuple(int(d) for d in tensor.shape)
        numel = int(np.prod(shape, dtype=np.int64))
        rows.append(TensorRow(name, shape, dtype, numel, numel * to_numpy(dtype).itemsize, kind,
                              trainable if kind is TensorKind.PARAMETER else False,
                              tensor_stats(to_host(tensor)) if stats else None))
    return InspectResult(type(model).__name__, "model", framework, rows, Counts.of(rows), [], stats)
