"""Read one side of a comparison: an aligner dump directory (manifest + .npy) or a plain directory of .npy files.

Readers know nothing of comparison: they list records in execution order and open tensors as chunk streams. A bad
file or manifest line becomes an `Item.error` (that row is marked, the comparison goes on); only a directory that
cannot be compared at all raises `AlignerError`.
"""
from __future__ import annotations

import dataclasses
import io
import math
import operator
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable, Iterator

import numpy as np
from msgspec import UNSET

from aligner.core.dtypes import canonical, to_numpy, to_storable
from aligner.core.errors import AlignerError
from aligner.core.files import open_fd
from aligner.core.frameworks import Framework
from aligner.dumping import manifest
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.read import foreign
from aligner.dumping.read.foreign.layout import inside
from aligner.io.npy_header import NpyHeader, NpyHeaderError, read_header
from aligner.metrics.kernel import KERNEL_DTYPES
from aligner.metrics.measure import FileRegion, MemoryStream, flat_chunks
from aligner.metrics.stats import Stats

if TYPE_CHECKING:  # what foreign.read_foreign returns (its module is loaded only for a foreign dump)
    from aligner.dumping.read.foreign.base import ForeignDump

_GRAD_TOKENS = {"backward", "grad", "grads", "gradient"}
_EXECUTION_ORDER = operator.attrgetter("record.step", "record.seq")  # an item's (step, seq)
_READ_BLOCK = 1 << 20  # bytes: files up to this size are read in one call, larger ones a block at a time


class TensorError(ValueError):
    """A tensor file that cannot be read (missing, truncated, pickled, not .npy, or not what the manifest says)."""


@dataclasses.dataclass(slots=True)
class Item:
    """One record of one side, with where its tensor lives and anything wrong with it (slots: one per record)."""

    record: manifest.Record
    path: Path | None = None
    error: str | None = None
    header: NpyHeader | None = None  # already parsed (plain .npy directories read it to learn shape and dtype)
    load: Callable[[], np.ndarray] | None = None  # a foreign tensor not stored as .npy (msprobe .pt, trust_pickle)

    @property
    def link(self) -> Hashable | None:
        """Identity of the tensor's content (its digest file name, else its shape and statistics) to follow data
        flow."""
        if self.record.file:
            return self.record.file
        if self.record.stats:
            return tuple(self.record.shape), stats_identity(self.record.stats)
        return None


def stats_identity(stats: Stats) -> tuple:
    """What tells two stats-only records of one dump apart: equal L2 norm, mean, extrema and NaN/Inf counts (exact
    floats; one not recorded counts as None) is the same tensor for data-flow purposes (a far cheaper key than every
    statistic)."""
    return tuple(None if v is UNSET else v for v in (stats.l2, stats.mean, stats.max, stats.min, stats.nan, stats.inf))


@dataclasses.dataclass
class Source:
    """One side: its records in execution order and what the manifest header says."""

    root: Path
    framework: str           # a Framework value ("pytorch", "mindspore", "numpy"), or what the manifest says
    mode: str                # "full" | "stats" | "npy" (plain directory of .npy files)
    items: list[Item]
    problems: list[str]      # manifest lines that did not parse
    # what compare does not pair but replay and repro read: call signatures by (step, call id), and parameter values
    # recorded as each step started (dump(params=True)), by (step, name)
    calls: dict[tuple[int, int], manifest.Record] = dataclasses.field(default_factory=dict)
    params: dict[tuple[int, str], Item] = dataclasses.field(default_factory=dict)


def _open_tensor_file(path: Path) -> io.FileIO:
    """A tensor file opened unbuffered through aligner.core.files (a regular file, checked again once open: one
    swapped for a FIFO since it was listed never blocks); TensorError naming the file when it is missing, not a
    regular file or unreadable."""
    try:
        return io.FileIO(open_fd(path), "rb")
    except FileNotFoundError:
        raise TensorError(f"{path.name}: file missing") from None
    except AlignerError as exc:  # a FIFO, device, socket or directory
        raise TensorError(str(exc)) from None
    except OSError as exc:
        raise TensorError(f"{path.name}: cannot read ({exc.strerror or exc})") from None


def read_npy_header(path: Path) -> NpyHeader:
    """Parse a .npy header without loading data (aligner.io.npy_header: object arrays and structured dtypes
    refused); TensorError naming the file for those, a bad header, or a file shorter than its header declares."""
    with _open_tensor_file(path) as fh:
        try:
            header = read_header(fh)
        except OSError as exc:
            raise TensorError(f"{path.name}: cannot read ({exc.strerror or exc})") from exc
        except NpyHeaderError as exc:
            raise TensorError(f"{path.name}: {exc}") from None
        size = os.fstat(fh.fileno()).st_size
    if size < header.data_offset + header.nbytes:
        raise TensorError(f"{path.name}: truncated ({size} of {header.data_offset + header.nbytes} bytes)")
    return header


@dataclasses.dataclass
class NpyStream:
    """A .npy file read in flat C-order chunks (an `ArrayStream`): small files in one read, large ones a block at a
    time into one reused buffer."""

    path: Path
    header: NpyHeader
    dtype: str  # canonical; bfloat16 files store uint16 bit patterns

    @property
    def shape(self) -> tuple[int, ...]:
        return self.header.shape

    def _view(self, raw: np.ndarray) -> np.ndarray:
        return raw.view(to_numpy("bfloat16")) if self.dtype == "bfloat16" else raw

    def region(self) -> FileRegion | None:
        """Where the elements lie in the file, for the kernel to fold them from its mapped pages: None unless they are
        stored in C order as one of the kernel's dtypes (native byte order), aligned to their size."""
        stored, header = self.header.dtype, self.header
        if (header.fortran_order and len(header.shape) > 1) or stored not in KERNEL_DTYPES \
                or header.data_offset % stored.itemsize:
            return None
        return FileRegion(lambda: _open_tensor_file(self.path), header.data_offset, math.prod(header.shape), stored,
                          lambda: TensorError(f"{self.path.name}: truncated while being compared"))

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        stored = self.header.dtype
        total = math.prod(self.header.shape)
        if self.header.fortran_order and len(self.header.shape) > 1:  # rare (not np.save's default): read whole
            try:
                with _open_tensor_file(self.path) as fh:
                    array = np.load(fh, allow_pickle=False)
            except TensorError:
                raise
            except ValueError as exc:  # cut short since its header was read
                raise TensorError(f"{self.path.name}: truncated while being compared") from exc
            yield from flat_chunks(self._view(array), size)
            return
        if total == 0:
            return
        if total * stored.itemsize <= _READ_BLOCK:  # small: one read()
            data = np.empty(total, stored)
            with _open_tensor_file(self.path) as fh:
                fh.seek(self.header.data_offset)
                if fh.readinto(data.data) != data.nbytes:
                    raise TensorError(f"{self.path.name}: truncated while being compared")
            yield from (self._view(data[start:start + size]) for start in range(0, total, size))
            return
        # large: read a block at a time into one buffer with readinto, so memory stays at one block (never a numpy
        # memory map: a file truncated while it is read would raise SIGBUS inside a numpy copy, which Python cannot
        # catch; only the kernel reads mapped pages, see `region`)
        block = max(size, _READ_BLOCK // stored.itemsize // size * size)
        buffer = np.empty(min(block, total), stored)
        with _open_tensor_file(self.path) as fh:
            fh.seek(self.header.data_offset)
            for begin in range(0, total, block):
                part = buffer[:min(block, total - begin)]
                if fh.readinto(part.data) != part.nbytes:
                    raise TensorError(f"{self.path.name}: truncated while being compared")
                for start in range(0, len(part), size):
                    yield self._view(part[start:start + size])


def open_tensor(item: Item) -> NpyStream | MemoryStream:
    """The item's tensor as a stream, checked against its record (shape, dtype); a header read at listing is reused."""
    if item.error:
        raise TensorError(item.error)
    if item.load is not None:  # its loader checks shape and dtype
        try:
            return MemoryStream(item.load())
        except ValueError as exc:
            raise TensorError(str(exc)) from exc
    if item.path is None:
        raise TensorError(f"record {item.record.module!r} has no tensor file (statistics-only dump)")
    if item.header is not None:
        return NpyStream(item.path, item.header, item.record.dtype)
    header = read_npy_header(item.path)  # TensorError for a missing file or one that is not a regular file
    rec = item.record
    if list(header.shape) != list(rec.shape):
        raise TensorError(f"{item.path.name}: shape {list(header.shape)} but manifest says {rec.shape}")
    stored = to_storable(np.empty(0, to_numpy(rec.dtype))).dtype
    if header.dtype.newbyteorder("=") != stored:
        raise TensorError(f"{item.path.name}: dtype {header.dtype} but manifest says {rec.dtype}")
    return NpyStream(item.path, header, rec.dtype)


def load_tensor(item: Item) -> np.ndarray:
    """The item's whole tensor (checked as open_tensor checks it), in its canonical dtype (bfloat16 viewed back)."""
    stream = open_tensor(item)
    chunks = list(stream.chunks(1 << 20))
    flat = np.concatenate(chunks) if chunks else np.empty(0, to_numpy(stream.dtype))
    return flat.reshape(stream.shape)


def _number_key(name: str) -> tuple[tuple[int, ...], str]:
    """Order plain .npy files by the numbers in their names, then by name ("2_x" before "10_x")."""
    return tuple(int(n) for n in re.findall(r"\d+", name)), name


def _plain_item(path: Path, seq: int) -> Item:
    """A record for a hand-written .npy: module = file stem without a leading order number."""
    stem = path.name[:-4]
    name = re.sub(r"^\d+[_\-.]", "", stem) or stem
    kind = Kind.BACKWARD if _GRAD_TOKENS & set(re.split(r"[._\-]", stem.lower())) else Kind.FORWARD
    rec = manifest.Record(seq=seq, module=name, type="", kind=kind, io=Io.OUTPUT, index=0, dtype="", shape=[])
    item = Item(rec, path)
    try:
        item.header = read_npy_header(path)
        rec.shape = list(item.header.shape)
        rec.dtype = canonical(item.header.dtype)
    except (TensorError, AlignerError) as exc:
        item.error = str(exc)
    return item


def _read_plain(root: Path) -> Source:
    files = sorted((p for p in root.iterdir() if p.suffix == ".npy" and p.is_file()), key=lambda p: _number_key(p.name))
    items, real = [], root.resolve()  # a directory just listed: resolved once for all its files
    for i, p in enumerate(files):
        confined, why = inside(root, p.name, real)
        if confined is None:
            items.append(Item(manifest.Record(seq=i, module=p.name[:-4], type="", kind=Kind.FORWARD, io=Io.OUTPUT,
                                              index=0, dtype="", shape=[]), error=why))
        else:
            items.append(_plain_item(p, i))
    return Source(root, Framework.NUMPY, "npy", items, [])


def link(item: Item, producer: Item | None) -> None:
    """Give a record that is a link (`same_as`: an input, an output handed back, a gradient passed on) the tensor
    file and statistics of the record holding its data, `producer`: the latest record read before it with that seq
    (None: none was; a record of another step is refused too)."""
    rec = item.record
    if producer is None or producer.record.step != rec.step:
        item.error = f"{rec.io} links to record {rec.same_as!r}, which {manifest.MANIFEST} does not hold before it"
        return
    rec.file, rec.stats = producer.record.file, producer.record.stats
    rec.skipped = rec.skipped or producer.record.skipped
    item.path, item.error, item.header = producer.path, producer.error, producer.header


def _read_dump(root: Path) -> Source:
    framework, mode = "unknown", "full"
    real = root.resolve()  # once for the manifest and all the tensor files it names
    _, why = inside(root, manifest.MANIFEST, real)
    if why is not None:
        raise AlignerError(f"{root}: {why}")
    try:
        header, records, problems = manifest.read_manifest(root)
    except (OSError, UnicodeDecodeError) as exc:
        raise AlignerError(f"{root}: cannot read {manifest.MANIFEST}: {exc}") from exc
    if header is not None:
        version = header.get("version")
        if version not in manifest.READABLE_VERSIONS:
            raise AlignerError(f"{root}: dump format version {version!r}; this aligner reads versions "
                               f"{', '.join(map(str, manifest.READABLE_VERSIONS))} (a newer aligner wrote it?)")
        framework, mode = str(header.get("framework", "unknown")), str(header.get("mode", "full"))
    items: list[Item] = []
    by_seq: dict[int, Item] = {}
    calls: dict[tuple[int, int], manifest.Record] = {}
    params: dict[tuple[int, str], Item] = {}
    for entry in records:
        if entry.kind == Kind.CALL:
            if entry.call is not None:
                calls[(entry.step, entry.call)] = entry
            continue
        item = Item(entry)
        if entry.file:
            item.path, item.error = inside(root, entry.file, real)
        if entry.same_as is not None:
            link(item, by_seq.get(entry.same_as))
        by_seq[entry.seq] = item
        if entry.kind == Kind.PARAM:
            params[(entry.step, entry.module)] = item
        else:
            items.append(item)
    items.sort(key=_EXECUTION_ORDER)
    return Source(root, framework, mode, items, problems, calls, params)


def _foreign(dump: ForeignDump) -> Source:
    """Another tool's dump (msprobe, MindSpore's native dump) as a Source."""
    items = [Item(e.record, e.path, e.error, load=e.load) for e in dump.entries]
    return Source(dump.root, dump.framework, dump.mode, items, dump.problems)


def read_source(path: str | Path, *, trust_pickle: bool = False) -> Source:
    """Read a dump directory (if it has a manifest), another tool's dump (msprobe, MindSpore's native dump; its
    PyTorch `.pt` tensors only with `trust_pickle`) or a plain directory of .npy files; refuse one with no records."""
    root = Path(path)
    if not root.exists():
        raise AlignerError(f"{root}: no such directory")
    if not root.is_dir():
        raise AlignerError(f"{root}: not a directory (expected a dump directory or a directory of .npy files)")
    if os.path.lexists(root / manifest.MANIFEST):  # a manifest that is no regular file is refused by its reader
        source = _read_dump(root)
    else:
        tool = foreign.detect(root)
        source = _read_plain(root) if tool is None else \
            _foreign(foreign.read_foreign(root, tool, trust_pickle=trust_pickle))
    if not source.items:
        why = f" ({len(source.problems)} unparsable manifest line(s): {source.problems[0]})" if source.problems else ""
        raise AlignerError(f"{root}: no records to compare{why}")
    return source
