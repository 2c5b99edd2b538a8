"""The data dump format shared by `aligner.record_data` (writer) and `align data` (reader).

A data dump folder holds `manifest.jsonl` (one header line: ``{"format": "aligner-data", "version": 1, "framework",
"framework_version", "aligner_version", "epochs", "batch_sizes": [[per batch] per epoch], "samples", "tensors",
"rank", "world_size", "fields": [FieldSpec, ...]}``) and per-sample arrays in `arrays/`, named by the field's
position (never by its name, which is the user's data): `samples.npy` (epoch, batch, row) per sample, and per field
`f{i}.hash.npy` (a 128-bit content digest per sample, as two uint64), `f{i}.nonfinite.npy` (NaN/Inf count), and by
kind `f{i}.stats.npy` (image: per channel mean, std, min, max; tensor: the same over the whole sample),
`f{i}.thumb.npy` (image: per channel the means of a 4 x 4 grid of blocks, which a flip or crop moves),
`f{i}.seq.npy` (sequence: length without padding, pad tokens on the left, on the right), `f{i}.content.npy` (the
digest of the tokens without padding), `f{i}.label.npy` (label: the class index). With tensors=True, `tensors/`
holds each batch of each field as recorded (images channels-first): `f{i}.b{j}.npy`, j counting over all epochs.

Digests are taken of a canonical form (images channels-first, integers as int64, floats as float32), so a layout or
an integer width that differs between the frameworks alone does not make two samples different.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.files import INDEX, open_input, read_bytes
from aligner.core.nesting import NestingError, json_loads
from aligner.dumping.manifest import FORMAT as MODEL_FORMAT
from aligner.dumping.manifest import MANIFEST, RANK_DIR

FORMAT = "aligner-data"
VERSION = 1
ARRAYS = "arrays"
TENSORS = "tensors"
STATS = ("mean", "std", "min", "max")  # the last axis of a stats array


class FieldKind(str, enum.Enum):
    """How a field is summarised per sample."""

    IMAGE = "image"        # [batch, C, H, W] or [batch, H, W, C] (or [batch, H, W]): per-channel statistics
    SEQUENCE = "sequence"  # integer [batch, length]: lengths and padding
    LABEL = "label"        # integer [batch] or one-hot [batch, classes]: the class index
    TENSOR = "tensor"      # anything else: statistics over the whole sample


class Layout(str, enum.Enum):
    """Where an image field keeps its channels."""

    CHW = "CHW"
    HWC = "HWC"
    HW = "HW"  # no channel axis (one channel)
    NONE = ""  # not an image


class Encoding(str, enum.Enum):
    """How a label field gives the class."""

    INDEX = "index"
    ONE_HOT = "one-hot"
    NONE = ""


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One field as recorded: its name, kind, dtype, per-sample shape (canonical: images channels-first) and how it
    was read (layout, pad value, label encoding)."""

    name: str
    kind: FieldKind
    dtype: str
    shape: tuple[int, ...]
    layout: Layout = Layout.NONE
    pad: int | None = None
    encoding: Encoding = Encoding.NONE

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "dtype": self.dtype, "shape": list(self.shape),
                "layout": self.layout.value, "pad": self.pad, "encoding": self.encoding.value}

    @classmethod
    def from_dict(cls, data: Any) -> "FieldSpec":
        """A spec from a header entry; ValueError when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("a field entry is not an object")
        try:
            pad = data.get("pad")
            shape = data["shape"]
            if not isinstance(data["name"], str) or not isinstance(shape, list) or \
                    not all(isinstance(n, int) and n >= 0 for n in shape) or \
                    not (pad is None or isinstance(pad, int) and not isinstance(pad, bool)):
                raise ValueError
            return cls(data["name"], FieldKind(data["kind"]), str(data["dtype"]), tuple(shape),
                       Layout(data.get("layout", "")), pad, Encoding(data.get("encoding", "")))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"field entry {str(data)[:60]!r} is not a field description") from None


def array_name(index: int, what: str) -> str:
    """The file (inside arrays/) of one per-sample array of field `index`."""
    return f"f{index}.{what}.npy"


def tensor_name(index: int, batch: int) -> str:
    """The file (inside tensors/) of one recorded batch of field `index`."""
    return f"f{index}.b{batch}.npy"


@dataclasses.dataclass
class FieldData:
    """One field's per-sample arrays, as read back."""

    spec: FieldSpec
    index: int
    digest: np.ndarray                 # [N, 2] uint64
    nonfinite: np.ndarray              # [N] int64
    stats: np.ndarray | None = None    # [N, C, 4] float64 (image: per channel; tensor: C = 1)
    seq: np.ndarray | None = None      # [N, 3] int64: length, pad left, pad right
    content: np.ndarray | None = None  # [N, 2] uint64: digest without padding
    label: np.ndarray | None = None    # [N] int64
    thumb: np.ndarray | None = None    # [N, C, 16] float64: image block means (4 x 4 grid)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> FieldKind:
        return self.spec.kind


@dataclasses.dataclass
class DataDump:
    """One data dump folder, read: the header, per-sample positions and every field's arrays."""

    path: str
    header: dict[str, Any]
    samples: np.ndarray                # [N, 3] int64: epoch, batch, row
    fields: list[FieldData]
    _cache: dict[tuple[int, int], np.ndarray] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def framework(self) -> str:
        return str(self.header.get("framework", ""))

    @property
    def epochs(self) -> int:
        return int(self.samples[:, 0].max()) + 1 if len(self.samples) else 0

    @property
    def has_tensors(self) -> bool:
        return bool(self.header.get("tensors"))

    @property
    def batch_sizes(self) -> list[list[int]]:
        return [list(sizes) for sizes in self.header.get("batch_sizes", [])]

    def field(self, name: str) -> FieldData:
        return next(f for f in self.fields if f.name == name)

    def epoch(self, epoch: int) -> np.ndarray:
        """The sample positions of one epoch."""
        return np.flatnonzero(self.samples[:, 0] == epoch)

    def tensor(self, field: FieldData, sample: int) -> np.ndarray | None:
        """The recorded values of one sample of one field (None without tensors=True)."""
        if not self.has_tensors:
            return None
        _, batch, row = (int(v) for v in self.samples[sample])
        batch += sum(len(s) for s in self.batch_sizes[: int(self.samples[sample, 0])])
        key = (field.index, batch)
        if key not in self._cache:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = _load(Path(self.path) / TENSORS / tensor_name(field.index, batch), self.path)
        values = self._cache[key]
        if row >= len(values) or values.shape[1:] != field.spec.shape and field.kind == FieldKind.IMAGE:
            raise AlignerError(f"{self.path}: {TENSORS}/{tensor_name(field.index, batch)} does not hold the "
                               "samples the manifest describes")
        return values[row]


def rank_folders(path: str | os.PathLike) -> dict[int, Path]:
    """rank -> folder of a multi-rank data dump (DIR/rank{N}/ with a manifest each); empty for a single folder."""
    root = Path(path)
    if not root.is_dir() or (root / MANIFEST).exists():
        return {}
    found = {}
    for name in os.listdir(root):
        match = RANK_DIR.fullmatch(name)
        if match and (root / name).is_dir() and not (root / name).is_symlink():
            found[int(match.group(1))] = root / name
    return dict(sorted(found.items()))


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of the data dump at `path`; one AlignerError line when it is not one (missing, a model dump, ...)."""
    root = Path(path)
    if not root.exists():
        raise AlignerError(f"{path}: no such directory")
    if not root.is_dir():
        raise AlignerError(f"{path}: not a directory; give the folder aligner.record_data wrote")
    manifest = root / MANIFEST
    if not os.path.lexists(manifest):
        raise AlignerError(f"{path} is not a data dump (no {MANIFEST}); record one with aligner.record_data(loader, "
                           f"{str(path)!r})")
    first = read_bytes(manifest, INDEX).split(b"\n", 1)[0]  # a FIFO or device is refused, never opened
    try:
        header = json_loads(first)
    except (ValueError, NestingError):
        header = None
    if isinstance(header, dict) and header.get("format") == MODEL_FORMAT:
        raise AlignerError(f"{path} is a model dump (aligner.dump), not a data dump; record the data loader with "
                           "aligner.record_data and compare those folders")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise AlignerError(f"{path} is not a data dump ({MANIFEST} has no aligner-data header)")
    if header.get("version") != VERSION:
        raise AlignerError(f"{path}: data dump version {header.get('version')!r} is not readable by this aligner "
                           f"(reads version {VERSION})")
    return header


def _load(path: Path, shown: str) -> np.ndarray:
    """One .npy file of a data dump, refused unless it is a regular file inside the dump; no pickles."""
    if path.is_symlink():
        raise AlignerError(f"{shown}: {path.name} is a link; a data dump holds its own files")
    if not os.path.lexists(path):
        raise AlignerError(f"{shown}: {path.parent.name}/{path.name} is missing (the data dump is incomplete)")
    try:
        with open_input(path) as fh:
            return np.load(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise AlignerError(f"{shown}: {path.parent.name}/{path.name} is not a readable array: "
                           f"{' '.join(str(exc).split())}") from None


def read_data_dump(path: str | os.PathLike) -> DataDump:
    """The data dump folder `path` (one rank), its arrays checked against the header."""
    shown = str(path)
    header = read_header(path)
    try:
        specs = [FieldSpec.from_dict(f) for f in header.get("fields") or []]
    except ValueError as exc:
        raise AlignerError(f"{shown}: {MANIFEST}: {exc}") from None
    if not specs:
        raise AlignerError(f"{shown}: the data dump records no field")
    arrays = Path(path) / ARRAYS
    if not arrays.is_dir() or stat.S_ISLNK(os.lstat(arrays).st_mode):
        raise AlignerError(f"{shown}: {ARRAYS}/ is missing (the data dump is incomplete)")
    samples = _load(arrays / "samples.npy", shown)
    n = len(samples)
    if samples.ndim != 2 or samples.shape[1] != 3 or not np.issubdtype(samples.dtype, np.integer) or n == 0:
        raise AlignerError(f"{shown}: {ARRAYS}/samples.npy is not a list of sample positions")
    _check_positions(samples, header.get("batch_sizes"), shown)
    fields = []
    for i, spec in enumerate(specs):
        channels = spec.shape[0] if spec.kind == FieldKind.IMAGE and spec.shape else 1

        def get(what: str, tail: tuple[int | None, ...], index: int = i) -> np.ndarray:
            """One per-sample array: N rows of shape `tail` (None: any length), numbers only."""
            values = _load(arrays / array_name(index, what), shown)
            if values.ndim != len(tail) + 1 or len(values) != n or values.dtype.kind not in "iuf" or any(
                    want is not None and got != want for got, want in zip(values.shape[1:], tail)):
                raise AlignerError(f"{shown}: {ARRAYS}/{array_name(index, what)} does not hold {n} samples of its "
                                   "field")
            return values
        data = FieldData(spec, i, get("hash", (2,)), get("nonfinite", ()))
        if spec.kind in (FieldKind.IMAGE, FieldKind.TENSOR):
            data.stats = get("stats", (channels, len(STATS))).astype(np.float64, copy=False)
            if spec.kind == FieldKind.IMAGE:
                data.thumb = get("thumb", (channels, None)).astype(np.float64, copy=False)
        elif spec.kind == FieldKind.SEQUENCE:
            data.seq, data.content = get("seq", (3,)), get("content", (2,))
        else:
            data.label = get("label", ()).astype(np.int64, copy=False)
        fields.append(data)
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise AlignerError(f"{shown}: the data dump names a field twice")
    return DataDump(shown, header, samples.astype(np.int64, copy=False), fields)


def _check_positions(samples: np.ndarray, sizes: Any, shown: str) -> None:
    """The header's batch sizes (a list per epoch) must account for every sample position, each within them."""
    if not isinstance(sizes, list) or not sizes or not all(
            isinstance(epoch, list) and epoch and all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                                                      for b in epoch) for epoch in sizes):
        raise AlignerError(f"{shown}: {MANIFEST}: batch_sizes is not a list of batch sizes per epoch")
    if sum(map(sum, sizes)) != len(samples):
        raise AlignerError(f"{shown}: {MANIFEST} counts {sum(map(sum, sizes))} samples, {ARRAYS}/samples.npy holds "
                           f"{len(samples)}")
    epoch, batch, row = samples[:, 0], samples[:, 1], samples[:, 2]
    if epoch.min() < 0 or epoch.max() >= len(sizes) or batch.min() < 0 or row.min() < 0:
        raise AlignerError(f"{shown}: {ARRAYS}/samples.npy names positions outside the recorded batches")
    for e, epoch_sizes in enumerate(sizes):
        mine = epoch == e
        if batch[mine].max(initial=0) >= len(epoch_sizes) or \
                np.any(row[mine] >= np.asarray(epoch_sizes)[batch[mine]]):
            raise AlignerError(f"{shown}: {ARRAYS}/samples.npy names positions outside the recorded batches")


def header_line(header: dict[str, Any]) -> str:
    """The manifest's one line."""
    return json.dumps(header) + "\n"
