"""MindSpore's native dump (the one that runs in GRAPH_MODE and under `@jit`, where hooks cannot) as aligner records,
and the JSON config that turns it on.

What MindSpore 2.10 CPU writes (measured; `MINDSPORE_DUMP_CONFIG` pointing at a config with `e2e_dump_settings`
`{"enable": true, "trans_flag": true}`), under the config's `path`:

    rank_0/.dump_metadata/config.json       {"device_target": "CPU", "ms_version": "2.10.0"}: the version read here
    rank_0/execution_order/ms_execution_order_graph_{G}.csv   the graph's ops in order, full names with scope
    rank_0/graphs/...                        IR of each graph (not read)
    rank_0/{net_name}/{G}/{iteration}/{op_type}.{op_name}.{task}.{stream}.{timestamp}.{input|output}.{slot}.
        {format}.{dtype}.npy                 op_name is the full name with `/` written as `_`

Full names are scope paths: `Default/conv1-Conv2d/Conv2D-op0`, `Default/network-WithLossCell/_backbone-Net/
layer1-SequentialCell/0-Conv2d/Conv2D-op3`; backward ops live under `Gradients/...`. GPU and Ascend can also write
`statistic.csv` in the iteration folder (`saved_data` "statistic"; MindSpore 2.10 refuses it on CPU), read here from
its documented columns.

Mapping (op level, forward only): each cell (not the model itself, whose output aligner's dumps do not record) gets
a forward output record: the first output of the LAST op that ran in its scope, which is what the cell returned when
its last op produced its result (true for layers whose construct ends in an op; not for a cell that returns an
earlier tensor, a tuple, or an input unchanged). A 2-D output of a cell whose input has more dimensions is viewed
back to them (nn.Dense flattens the batch dimensions around its MatMul, and the graph can merge the reshape back
into the next op), and an op the graph runs as a no-op Reshape takes its shape from the graph's IR. The outputs of
ops in a container's or the model's own construct (glue code: reshapes, residual adds) are records of kind op, type
`ops.{op_type}`; a leaf cell's ops are not (its output record stands for them, and op records no module dump has
would outnumber the pairs). Wrappers are peeled off the path: `TrainOneStepCell`'s `network`, `WithLossCell`'s
`_backbone` (ops of the loss and the `optimizer` are left out). Not read: backward ops (in MindSpore 2.10 their
scopes can name the wrong cell: a ReluGrad of relu1 was filed under relu2), ops MindSpore expanded (`Expand/...`, no
cell scope), op inputs and parameters. A `@jit` function that calls a cell (not `ms.jit(cell)`) runs with no cell
scopes (`Default/Conv2D-op0`): such a dump is refused, nothing in it could pair.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import re
from pathlib import Path
from typing import Sequence

import msgspec
import numpy as np

from aligner.core.atomic import atomic_open
from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.core.files import INDEX, TEXT, open_input, open_text, read_text
from aligner.core.nesting import json_loads
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.read.foreign.base import Entry, ForeignDump, npy_layout
from aligner.dumping.read.foreign.layout import (
    EXECUTION_ORDER,
    METADATA,
    NATIVE_RANK,
    inside,
    is_native_rank,
    native_ranks,
)
from aligner.metrics.stats import Stats

STATISTIC_CSV = "statistic.csv"
CONFIG_NAME = "mindspore_dump_config.json"  # what native_dump_config writes into the dump directory
SUPPORTED_VERSIONS = ("2.10",)  # major.minor whose layout was verified on real dumps
_NOT_NETS = {METADATA, EXECUTION_ORDER, "graphs"}
_ORDER_CSV = re.compile(r"ms_execution_order_graph_(\d+)\.csv")
_FILE = re.compile(r"(?P<type>[^.]+)\.(?P<name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
                   r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<format>[^.]+)\.(?P<dtype>[^.]+)\.npy")
_HOST_FORMATS = {"DefaultFormat", "NCHW", "ND", "NCDHW"}  # layouts as the framework sees the tensor (trans_flag)
_WRAPPERS = {"WithLossCell", "WithGradCell", "WithEvalCell", "TrainOneStepCell", "TrainOneStepWithLossScaleCell",
             "ForwardValueAndGrad"}
_BACKBONES = {"_backbone", "network", "_network"}  # the attribute a wrapper keeps the model in
_STAT_COLUMNS = {"Max Value": "max", "Min Value": "min", "Avg Value": "mean", "L2Norm Value": "l2",
                 "NaN Count": "nan"}
_INF_COLUMNS = ("Negative Inf Count", "Positive Inf Count")
_IR_NAME = "# Fullname with scope: ("
_IR_OUTPUT = re.compile(r"-> \(<Tensor\[\w+\], \(([0-9, ]*)\)>\)$")


def _rank_dir(root: Path) -> Path:
    if is_native_rank(root):
        return root
    ranks = native_ranks(root)
    if len(ranks) > 1:
        raise AlignerError(f"{root}: a MindSpore native dump of {len(ranks)} ranks "
                           f"({', '.join(p.name for p in ranks[:4])}); name one rank's folder, e.g. {ranks[0]}")
    return ranks[0]


def _confined(rank: Path, real: Path, path: Path) -> tuple[Path | None, str | None]:
    """`inside` for a file found under the rank folder (`real`: the folder resolved once): (path, None), or (None,
    why) for a link leading out of it."""
    return inside(rank, str(path.relative_to(rank)), real)


def _dump_version(rank: Path, real: Path) -> str | None:
    """The MindSpore version that wrote a rank folder (`.dump_metadata/config.json` "ms_version"), else None."""
    path, why = _confined(rank, real, rank / METADATA / "config.json")
    if path is None:
        raise AlignerError(f"{rank}: {why}")
    try:
        found = json_loads(read_text(path, TEXT)).get("ms_version")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):  # ValueError: not JSON, or nested too deep
        return None
    return found if isinstance(found, str) else None


def _check_version(rank: Path, real: Path) -> None:
    version = _dump_version(rank, real)
    supported = ", ".join(SUPPORTED_VERSIONS)
    if version is None:
        raise AlignerError(f"{rank}: MindSpore native dump of unknown version (no ms_version in {METADATA}/"
                           f"config.json); aligner reads the layout of MindSpore {supported}")
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VERSIONS:
        raise AlignerError(f"{rank}: MindSpore native dump written by MindSpore {version}; aligner reads the layout "
                           f"of MindSpore {supported} only")


def _orders(rank: Path, real: Path, problems: list[str]) -> dict[int, list[str]]:
    """Each graph's op full names in execution order (a file leading out of the rank folder is a problem, skipped)."""
    out: dict[int, list[str]] = {}
    folder = rank / EXECUTION_ORDER
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        found = _ORDER_CSV.fullmatch(path.name)
        if found is None:
            continue
        _, why = _confined(rank, real, path)
        if why:
            problems.append(f"{EXECUTION_ORDER}/{path.name}: {why}")
            continue
        with open_text(path, INDEX, errors="replace") as fh:
            out[int(found[1])] = [line.strip() for line in fh if "/" in line]
    return out


@dataclasses.dataclass
class _Cell:
    """One scope component: attribute name and class (`conv1-Conv2d`)."""

    name: str
    cls: str


def _scope(full: str, train_step: bool) -> list[_Cell] | None:
    """The model's cells an op ran in (peeled of wrappers), None for an op outside the model's forward."""
    parts = full.split("/")
    if len(parts) < 2 or parts[0] != "Default":
        return None
    cells = [_Cell(*p.rsplit("-", 1)) if "-" in p else _Cell(p, "") for p in parts[1:-1]]
    if train_step and cells and cells[0].name == "optimizer":
        return None
    i = 0
    while i < len(cells):
        if cells[i].cls in _WRAPPERS or (i == 0 and train_step and cells[i].name == "network"):
            i += 1
        elif i and cells[i - 1].cls in _WRAPPERS and cells[i].name in _BACKBONES:
            i += 1
            break
        elif i and cells[i - 1].cls in _WRAPPERS:
            return None  # a sibling of the model inside a wrapper: its loss function
        else:
            break
    return cells[i:]


@dataclasses.dataclass
class _Op:
    """One op of one iteration: where it ran, when, and its output tensors by slot."""

    graph: int
    name: str             # underscored, as in file names
    op_type: str
    order: tuple[int, int]  # (timestamp, position in its graph's execution order)
    outputs: dict[int, Entry] = dataclasses.field(default_factory=dict)
    full: str | None = None
    input0: list[int] | None = None  # its first input's shape: a cell's first op reads the cell's input there


def _bounded(text: str, most: int = 300) -> str:
    """`text` kept to `most` characters by cutting its middle: a long path in it must not cut off the reason at its
    end ("... not a regular file (a FIFO)")."""
    return text if len(text) <= most else f"{text[:most // 2 - 2]}...{text[-(most // 2 - 1):]}"


def _tensor_entry(path: Path, rank: Path, real: Path, step: int, found: re.Match[str]) -> Entry:
    record = Record(seq=0, module="", type=f"ops.{found['type']}", kind=Kind.OP, io=Io.OUTPUT,
                    index=int(found["slot"]), dtype="", shape=[], step=step, file=str(path.relative_to(rank)))
    _, why = _confined(rank, real, path)
    if why:
        return Entry(record, error=_bounded(f"{path.name}: {why}"))
    if found["format"] not in _HOST_FORMATS:
        return Entry(record, error=f"{path.name}: device layout {found['format']} (dump with trans_flag true)")
    try:
        record.shape, record.dtype = npy_layout(path)
    except (OSError, ValueError, AlignerError) as exc:
        return Entry(record, error=_bounded(f"{path.name}: not a readable .npy file ({exc})"))
    return Entry(record, path)


def _ir_shapes(rank: Path, real: Path, graph: int, problems: list[str]) -> dict[str, list[int]]:
    """{op full name: output shape} of the graph's single-tensor ops, from its IR (`graphs/ms_output_trace_code_graph_
    G.ir`): the CPU dump writes a Reshape that the graph runs as a no-op with its input's shape, the IR says what it
    outputs. An IR file leading out of the rank folder is a problem, not read."""
    out: dict[str, list[int]] = {}
    path = rank / "graphs" / f"ms_output_trace_code_graph_{graph}.ir"
    if not path.is_file():
        return out
    _, why = _confined(rank, real, path)
    if why:
        problems.append(f"graphs/{path.name}: {why}")
        return out
    abstract: str | None = None
    with open_text(path, INDEX, errors="replace") as fh:
        for line in fh:
            text = line.strip()
            if text.startswith(("%", "Return(")):
                abstract = None
            elif text.startswith(": (") and abstract is None:
                abstract = text
            elif text.startswith(_IR_NAME) and abstract is not None:
                found = _IR_OUTPUT.search(abstract)
                if found:
                    out[text[len(_IR_NAME):-1]] = _shape(found[1])
    return out


def _shape(text: str) -> list[int]:
    return [int(s) for s in text.strip().strip("()").split(",") if s.strip()]


def _statistics(path: Path, rank: Path, graph: int, step: int, ops: dict[tuple[int, str], _Op],
                problems: list[str]) -> None:
    """statistic.csv rows (documented columns: Op Type, Op Name, ..., IO, Slot, Data Size, Data Type, Shape, then the
    chosen statistics) as statistics on the op outputs: attached to a tensor file's record, else a stats-only one."""
    with open_text(path, INDEX, errors="replace", newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), 2):
            try:
                if row.get("IO") != "output":
                    if row.get("IO") == "input" and row.get("Slot") == "0":
                        key = (graph, row["Op Name"])
                        ops.setdefault(key, _Op(graph, key[1], row["Op Type"], (int(row["Timestamp"]), 0)))
                        ops[key].input0 = _shape(row["Shape"])
                    continue
                values: dict[str, float | int] = {key: float(row[column]) for column, key in _STAT_COLUMNS.items()
                                                  if row.get(column)}
                if "nan" in values:
                    values["nan"] = int(values["nan"])
                if all(row.get(c) for c in _INF_COLUMNS):
                    values["inf"] = sum(int(float(row[c])) for c in _INF_COLUMNS)
                stats = msgspec.convert(values, Stats)
                name, slot = row["Op Name"], int(row["Slot"])
                op = ops.setdefault((graph, name), _Op(graph, name, row["Op Type"], (int(row["Timestamp"]), 0)))
                entry = op.outputs.get(slot)
                if entry is None:
                    record = Record(seq=0, module="", type=f"ops.{row['Op Type']}", kind=Kind.OP, io=Io.OUTPUT,
                                    index=slot, dtype=canonical(row["Data Type"]), shape=_shape(row["Shape"]),
                                    step=step)
                    op.outputs[slot] = entry = Entry(record)
                entry.record.stats = stats
            except (KeyError, TypeError, ValueError, OverflowError, AlignerError, csv.Error) as exc:
                problems.append(f"{path.relative_to(rank)} line {lineno}: {exc}"[:300])


def _iterations(rank: Path, real: Path, problems: list[str]) -> dict[int, dict[tuple[int, str], _Op]]:
    """{iteration: {(graph, op name): op}} from every net's graph folders (files leading out of the rank folder: a
    marked row, a problem, or ignored for an op input)."""
    out: dict[int, dict[tuple[int, str], _Op]] = {}
    for net in sorted(p for p in rank.iterdir() if p.is_dir() and p.name not in _NOT_NETS):
        for graph_dir in sorted(p for p in net.iterdir() if p.is_dir() and p.name.isdigit()):
            graph = int(graph_dir.name)
            for folder in sorted(p for p in graph_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                step = int(folder.name)
                ops = out.setdefault(step, {})
                for path in sorted(folder.iterdir()):
                    found = _FILE.fullmatch(path.name)
                    if found is None or found["type"] == "Parameter":
                        continue
                    op = ops.setdefault((graph, found["name"]), _Op(graph, found["name"], found["type"],
                                                                    (int(found["ts"]), 0)))
                    op.order = min(op.order, (int(found["ts"]), 0))
                    if found["io"] == "output":
                        op.outputs[int(found["slot"])] = _tensor_entry(path, rank, real, step, found)
                    elif found["slot"] == "0" and found["format"] in _HOST_FORMATS \
                            and _confined(rank, real, path)[0]:
                        op.input0 = _layout_or_none(path)
                statistic = folder / STATISTIC_CSV
                if statistic.is_file():
                    _, why = _confined(rank, real, statistic)
                    if why:
                        problems.append(f"{statistic.relative_to(rank)}: {why}")
                    else:
                        _statistics(statistic, rank, graph, step, ops, problems)
    return out


def _viewed(path: Path, shape: list[int]) -> np.ndarray:
    """A native dump's .npy file viewed in another shape of the same size (ValueError if it cannot be)."""
    try:
        with open_input(path) as fh:
            return np.load(fh, allow_pickle=False).reshape(shape)
    except OSError as exc:
        raise ValueError(f"{path.name}: cannot read ({exc.strerror or exc})") from None
    except AlignerError as exc:
        raise ValueError(str(exc)) from None


def _layout_or_none(path: Path) -> list[int] | None:
    try:
        return npy_layout(path)[0]
    except (OSError, ValueError, AlignerError):
        return None


def _cell_shape(shape: list[int], first: _Op) -> list[int]:
    """A cell's output shape: a 2-D kernel output [N, C] of a cell whose input is [*B, K] with prod(B) = N is viewed
    [*B, C] (nn.Dense flattens the batch dimensions around its MatMul, and the graph may drop or merge the reshape
    back); any other shape as the file has it."""
    if len(shape) != 2 or first.input0 is None:
        return shape
    batch = first.input0[:-1]
    return [*batch, shape[1]] if len(batch) > 1 and math.prod(batch) == shape[0] else shape


def _module_entries(ops: list[_Op], scopes: list[list[_Cell]]) -> dict[int, list[Entry]]:
    """{op index: forward output entries of the cells whose last op it is, innermost first}."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for i, cells in enumerate(scopes):
        for depth in range(1, len(cells) + 1):
            path = ".".join(c.name for c in cells[:depth])
            first.setdefault(path, i)
            last[path] = i
            kinds[path] = cells[depth - 1].cls
    out: dict[int, list[Entry]] = {}
    for path, i in sorted(last.items(), key=lambda kv: -kv[0].count(".")):
        result = ops[i].outputs.get(0)
        if result is None:
            continue
        rec = result.record
        shape = _cell_shape(rec.shape, ops[first[path]])
        entry = Entry(Record(seq=0, module=path, type=kinds[path], kind=Kind.FORWARD, io=Io.OUTPUT, index=0,
                             dtype=rec.dtype, shape=shape, step=rec.step, stats=rec.stats, file=rec.file),
                      result.path, result.error, result.load)
        if shape != rec.shape and result.path is not None:
            entry.load = functools.partial(_viewed, result.path, shape)
        out.setdefault(i, []).append(entry)
    return out


def read(root: Path) -> ForeignDump:
    """Read a MindSpore native dump (a `rank_N` folder, or the dump path holding one) written by a supported version.

    Raises AlignerError for another version, several ranks (name one), no execution order or a folder that cannot be
    listed; an op whose name the execution order does not hold is a problem (skipped); a bad tensor file marks its
    row.
    """
    try:
        return _read(root)
    except OSError as exc:
        raise AlignerError(f"{root}: cannot read the MindSpore native dump ({exc})") from exc


def _read(root: Path) -> ForeignDump:
    rank = _rank_dir(root)
    real = rank.resolve()  # once for every file of the rank folder
    _check_version(rank, real)
    problems: list[str] = []
    orders = _orders(rank, real, problems)
    if not orders and problems:  # the execution order leads out of the rank folder
        raise AlignerError(f"{rank}: {problems[0]}")
    if not orders:
        raise AlignerError(f"{rank}: no {EXECUTION_ORDER}/ms_execution_order_graph_N.csv (MindSpore writes it with "
                           "every native dump): cannot tell which cell each op ran in")
    position = {(g, full.replace("/", "_")): (i, full) for g, names in orders.items() for i, full in enumerate(names)}
    ir = {g: _ir_shapes(rank, real, g, problems) for g in orders}
    entries: list[Entry] = []
    for _, by_name in sorted(_iterations(rank, real, problems).items()):
        ops = []
        for (graph, name), op in by_name.items():
            placed = position.get((graph, name))
            if placed is None:
                if name.startswith("Default_"):
                    problems.append(f"graph {graph} op {name}: not in its execution order (cell unknown): skipped")
                continue
            op.order, op.full = (op.order[0], placed[0]), placed[1]
            result, shape = op.outputs.get(0), ir[graph].get(op.full)
            if result is not None and shape is not None and shape != result.record.shape \
                    and math.prod(shape) == math.prod(result.record.shape):
                result.record.shape = shape
                if result.path is not None:
                    result.load = functools.partial(_viewed, result.path, shape)
            ops.append(op)
        ops.sort(key=lambda op: (op.order, op.graph))
        train_step = any(op.full and op.full.startswith("Default/optimizer-") for op in ops)
        kept = [(op, cells) for op in ops if (cells := _scope(op.full or "", train_step)) is not None]
        ops = [op for op, _ in kept]
        scopes = [cells for _, cells in kept]
        modules = _module_entries(ops, scopes)
        paths = [".".join(c.name for c in cells) for cells in scopes]
        containers = {".".join(c.name for c in cells[:depth]) for cells in scopes for depth in range(len(cells))}
        for i, op in enumerate(ops):
            path = paths[i]
            entries += modules.get(i, [])  # before the op's own records: after them they would read as a pass-through
            if path and path not in containers:  # an op of a leaf cell: the cell's output record stands for it
                continue
            for _, entry in sorted(op.outputs.items()):
                entry.record.module = entry.record.parent = path
                entries.append(entry)
    if entries and all(e.record.module == "" for e in entries):
        raise AlignerError(f"{rank}: no op of this native dump ran inside a cell's scope (MindSpore records none for "
                           "a @jit function that calls a cell), so no layer can be paired; dump the cell itself: "
                           "GRAPH_MODE, ms.jit(cell) or @ms.jit on its construct")
    for seq, entry in enumerate(entries):
        entry.record.seq = seq
    mode = "full" if any(e.path is not None for e in entries) else "stats"
    return ForeignDump(rank, "mindspore", mode, entries, problems)


def native_dump_config(directory: str | os.PathLike, *, net_name: str = "Net", iteration: str = "all",
                       kernels: Sequence[str] = (), activate: bool = True) -> Path:
    """Write the JSON config that makes MindSpore's own dump save every op's outputs into `directory` (GRAPH_MODE and
    `@jit` runs, where `aligner.dump`'s hooks cannot run), and with `activate` point `MINDSPORE_DUMP_CONFIG` at it.

    Call it before the process runs its first graph (importing mindspore first is fine): MindSpore reads the
    variable when it compiles its first graph, and a config set later dumps nothing. `iteration`: "all" or
    MindSpore's "0|5-8" form; `kernels`: op full names to dump (default every op). Returns the config's path;
    AlignerError if `directory` already holds a native dump (the new one would mix with it).
    """
    root = Path(directory).absolute()
    if root.exists() and not root.is_dir():
        raise AlignerError(f"{root}: not a directory")
    if root.is_dir() and any(NATIVE_RANK.fullmatch(p.name) for p in root.iterdir()):
        raise AlignerError(f"{root}: already holds a MindSpore native dump (rank_N folders); choose an empty "
                           "directory (a new dump would mix with the old one)")
    if not re.fullmatch(r"[A-Za-z0-9_\-/]+", str(root)):
        raise AlignerError(f"{root}: MindSpore's dump path may hold only letters, digits, '_', '-' and '/'")
    if not re.fullmatch(r"[A-Za-z0-9_\-]+", net_name):
        raise AlignerError(f"net_name {net_name!r}: letters, digits, '_' and '-' only (MindSpore's rule)")
    if iteration != "all" and not re.fullmatch(r"\d+(-\d+)?(\|\d+(-\d+)?)*", iteration):
        raise AlignerError(f"iteration {iteration!r}: 'all' or numbers and ranges joined by '|' (e.g. '0|5-8')")
    config = {"common_dump_settings": {"dump_mode": 1 if kernels else 0, "path": str(root), "net_name": net_name,
                                       "iteration": iteration, "saved_data": "tensor", "input_output": 0,
                                       "kernels": list(kernels), "support_device": list(range(8))},
              "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    root.mkdir(parents=True, exist_ok=True)
    path = root / CONFIG_NAME
    with atomic_open(path, "w") as fh:
        fh.write(json.dumps(config, indent=2) + "\n")
    if activate:
        os.environ["MINDSPORE_DUMP_CONFIG"] = str(path)
    return path
