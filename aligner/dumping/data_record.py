"""`aligner.record_data`: what an input pipeline feeds the model, sample by sample, for `align data` to compare.

Per batch the work is a few vectorised numpy passes per field (per-channel statistics, pad runs) and one blake2b
digest per sample and field: 10,000 small images cost well under a second beyond the loader's own time
(scripts/bench_data.py). Everything is written into a temp folder beside the target and renamed into place at the
end, so a loader that raises mid-iteration (or a structure that changes between batches) leaves nothing behind.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.atomic import current_umask
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.version import __version__
from aligner.dumping.data_format import (
    ARRAYS,
    FORMAT,
    TENSORS,
    VERSION,
    Encoding,
    FieldKind,
    FieldSpec,
    Layout,
    array_name,
    header_line,
    read_header,
    tensor_name,
)
from aligner.dumping.manifest import MANIFEST
from aligner.dumping.ranks import rank_folder

_CHANNELS = (1, 3, 4)


@dataclasses.dataclass(frozen=True)
class DataRecord:
    """What `record_data` wrote: the folder, how many samples and batches, and the fields as read."""

    directory: str
    samples: int
    batches: int
    fields: tuple[FieldSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "samples": self.samples, "batches": self.batches,
                "fields": [f.to_dict() for f in self.fields]}


def record_data(source: Any, directory: str | os.PathLike, batches: int | None = None,
                fields: Sequence[str] | None = None, tensors: bool = False, *, epochs: int = 1,
                overwrite: bool = False, pad: Mapping[str, int] | None = None, rank: int | None = None,
                world_size: int | None = None) -> DataRecord:
    """Record what `source` yields (a torch DataLoader, a mindspore.dataset Dataset, or any iterable of batches:
    tensors, tuples or dicts of them) into the data dump folder `directory`: per sample a content digest and
    per-field statistics, the sample order, and with tensors=True the batches themselves.

    batches: the first N batches of each epoch (None: all); fields: names for the positions of tuple batches, or the
    keys of dict batches to keep; epochs: passes over the source (2 shows reshuffling and random augmentation);
    pad: the pad token of a sequence field where guessing it from the batches is not enough; rank/world_size: a
    multi-rank run (default: torch.distributed's when initialised), written to `directory/rank{N}/`."""
    _check_args(batches, epochs, fields, pad)
    rank, world_size = _rank(rank, world_size)
    target = Path(directory) / rank_folder(rank) if rank is not None else Path(directory)
    _check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(temp, 0o777 & ~current_umask())  # as a folder made with mkdir would be (mkdtemp makes it 0700)
    try:
        (temp / ARRAYS).mkdir()
        if tensors:
            (temp / TENSORS).mkdir()
        recorder = _Recorder(temp, tensors, fields, dict(pad or {}))
        framework = _iterate(source, recorder, batches, epochs)
        header = {"format": FORMAT, "version": VERSION, "framework": framework.value,
                  "framework_version": _framework_version(framework), "aligner_version": __version__,
                  "epochs": epochs, "batch_sizes": recorder.batch_sizes, "samples": recorder.count,
                  "tensors": tensors, "rank": rank, "world_size": world_size,
                  "fields": [s.to_dict() for s in recorder.specs]}
        recorder.finish()
        with open(temp / MANIFEST, "x", encoding="utf-8") as fh:
            fh.write(header_line(header))
            fh.flush()
            os.fsync(fh.fileno())
        _put_in_place(temp, target, overwrite)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return DataRecord(str(target), recorder.count, sum(len(b) for b in recorder.batch_sizes), tuple(recorder.specs))


def _check_args(batches: int | None, epochs: int, fields: Sequence[str] | None,
                pad: Mapping[str, int] | None) -> None:
    for name, value in (("batches", batches), ("epochs", epochs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise AlignerError(f"aligner.record_data: {name} must be a whole number >= 1, got {value!r}")
    if fields is not None and (isinstance(fields, (str, bytes)) or not all(isinstance(f, str) for f in fields)
                               or len(set(fields)) != len(fields) or not fields):
        raise AlignerError(f"aligner.record_data: fields must be a list of distinct names, got {fields!r}")
    if pad is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in pad.values()):
        raise AlignerError(f"aligner.record_data: pad must map field names to integer pad tokens, got {pad!r}")


def _rank(rank: int | None, world_size: int | None) -> tuple[int | None, int | None]:
    """The rank and world size given, else torch.distributed's when initialised with several ranks."""
    torch = sys.modules.get("torch")
    if rank is None and world_size is None and torch is not None and torch.distributed.is_available() \
            and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    if (rank is None) != (world_size is None):
        raise AlignerError("aligner.record_data: give rank and world_size together")
    if rank is not None and world_size is not None:
        if isinstance(rank, bool) or isinstance(world_size, bool) or not isinstance(rank, int) \
                or not isinstance(world_size, int) or not 0 <= rank < world_size:
            raise AlignerError(f"aligner.record_data: rank must be in 0..world_size-1, got {rank!r} of "
                               f"{world_size!r}")
    return rank, world_size


def _check_target(target: Path, overwrite: bool) -> None:
    """Refuse a target that exists (unless overwrite, and then only an empty folder or a previous data dump)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise AlignerError(f"{target} is {'a link' if target.is_symlink() else 'a file'}; give a folder path")
    if not target.is_dir() or not os.listdir(target):
        return
    if not overwrite:
        raise AlignerError(f"{target} is not empty; choose a new folder or pass overwrite=True")
    read_header(target)  # overwrite replaces a data dump only, never a folder aligner did not write
    extra = sorted(set(os.listdir(target)) - {MANIFEST, ARRAYS, TENSORS})
    if extra:
        raise AlignerError(f"{target} holds {extra[0]}, not a data dump's own file; overwrite=True replaces only "
                           "a previous data dump, so choose another folder")


def _put_in_place(temp: Path, target: Path, overwrite: bool) -> None:
    """Rename the finished temp folder to `target` (the previous data dump moved aside first, then removed)."""
    old = None
    if target.is_dir() and os.listdir(target):
        _check_target(target, overwrite)
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.rename(target, old / "dump")
    elif target.is_dir():
        target.rmdir()
    try:
        os.rename(temp, target)
    except OSError as exc:
        if old is not None:
            os.rename(old / "dump", target)
        raise AlignerError(f"cannot write {target}: {exc.strerror or exc}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _framework_version(framework: Framework) -> str | None:
    module = sys.modules.get({Framework.PYTORCH: "torch", Framework.MINDSPORE: "mindspore"}.get(framework, "numpy"))
    return getattr(module, "__version__", None)


def _iterate(source: Any, recorder: "_Recorder", batches: int | None, epochs: int) -> Framework:
    """Feed every batch of every epoch to `recorder`; the framework the batches came from."""
    ms = sys.modules.get("mindspore")
    if ms is not None and isinstance(source, ms.dataset.Dataset):
        limited = source.take(batches) if batches else source
        try:
            iterator = limited.create_dict_iterator(num_epochs=epochs, output_numpy=True)
        except Exception as exc:
            raise AlignerError(f"the MindSpore dataset cannot be iterated: {type(exc).__name__}: {exc}") from None
        for epoch in range(epochs):
            recorder.epoch(epoch, _guarded(iterator, None, epoch))
        return Framework.MINDSPORE
    for epoch in range(epochs):
        try:
            iterator = iter(source)
        except TypeError:
            raise AlignerError(f"aligner.record_data needs a DataLoader, a mindspore.dataset Dataset or an iterable "
                               f"of batches, got {type(source).__name__}") from None
        if epoch and iterator is source:
            raise AlignerError("aligner.record_data: epochs > 1 needs a source that can be iterated again (a "
                               "DataLoader or a Dataset, not an iterator)")
        recorder.epoch(epoch, _guarded(iterator, batches, epoch))
    return recorder.framework


def _guarded(iterator: Iterator[Any], limit: int | None, epoch: int) -> Iterator[Any]:
    """The batches of one epoch (at most `limit`); an exception the source raises becomes one AlignerError line."""
    count = 0
    while limit is None or count < limit:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except AlignerError:
            raise
        except Exception as exc:
            text = " ".join(str(exc).split())[:200]
            raise AlignerError(f"the data source raised at epoch {epoch} batch {count}: {type(exc).__name__}: "
                               f"{text} (nothing was written)") from None
        yield batch
        count += 1


def _to_numpy(value: Any, where: str) -> tuple[np.ndarray, Framework]:
    """A batch field as a numpy array and the framework it came from; AlignerError for what has no numbers."""
    framework = Framework.NUMPY
    torch = sys.modules.get("torch")
    ms = sys.modules.get("mindspore")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        value, framework = value.numpy(), Framework.PYTORCH
    elif ms is not None and isinstance(value, ms.Tensor):
        value, framework = value.asnumpy(), Framework.MINDSPORE
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise AlignerError(f"{where}: cannot be read as an array ({' '.join(str(exc).split())[:120]})") from None
    if array.dtype.kind not in "biuf":
        raise AlignerError(f"{where}: holds {array.dtype} values ({type(value).__name__}); record_data digests "
                           "numbers only: leave the field out with fields=[...] or turn it into a tensor")
    if array.ndim == 0:
        raise AlignerError(f"{where}: a single value, not a batch (record_data needs batched data)")
    return array, framework


class _Recorder:
    """Turns each batch into per-sample rows; holds them until `finish` writes the arrays."""

    def __init__(self, folder: Path, tensors: bool, names: Sequence[str] | None, pad: dict[str, int]) -> None:
        self.folder, self.tensors, self.names, self.pad = folder, tensors, names, pad
        self.specs: list[FieldSpec] = []
        self.rows: dict[str, list[np.ndarray]] = {}
        self.batch_sizes: list[list[int]] = []
        self.count = 0
        self.framework = Framework.NUMPY
        self._batch_no = 0  # over all epochs (tensor file names)

    def _split(self, batch: Any, where: str) -> dict[str, Any]:
        """name -> value of one batch: a dict's keys, a tuple's positions (named by `fields` when given)."""
        if isinstance(batch, Mapping):
            items = {str(k): v for k, v in batch.items()}
            if self.names is not None:
                missing = [n for n in self.names if n not in items]
                if missing:
                    raise AlignerError(f"{where}: no field {missing[0]!r} (the batch has {', '.join(items)})")
                items = {n: items[n] for n in self.names}
            return items
        values = list(batch) if isinstance(batch, (tuple, list)) else [batch]
        if self.names is not None and len(self.names) != len(values):
            raise AlignerError(f"{where}: {len(values)} values per batch, but fields names {len(self.names)}")
        return dict(zip(self.names or [str(i) for i in range(len(values))], values))

    def epoch(self, epoch: int, batches: Iterable[Any]) -> None:
        """Record one epoch's batches."""
        sizes: list[int] = []
        for b, batch in enumerate(batches):
            where = f"epoch {epoch} batch {b}"
            items = self._split(batch, where)
            arrays = {}
            for name, value in items.items():
                arrays[name], framework = _to_numpy(value, f"{where} field {name!r}")
                if framework != Framework.NUMPY:
                    self.framework = framework
            n = {len(a) for a in arrays.values()}
            if len(n) != 1:
                raise AlignerError(f"{where}: the fields disagree on the batch size ({sorted(n)})")
            if not self.specs:
                self.specs = [_spec(name, a, self.pad.get(name)) for name, a in arrays.items()]
                self.rows = {f"{i}.{w}": [] for i in range(len(self.specs)) for w in _WHAT[self.specs[i].kind]}
                self.rows["samples"] = []
            self._check_structure(arrays, where)
            self._find_pads(arrays)
            size = n.pop()
            self.rows["samples"].append(
                np.stack([np.full(size, epoch), np.full(size, b), np.arange(size)], axis=1).astype(np.int64))
            for i, spec in enumerate(self.specs):
                canon = _canonical(spec, arrays[spec.name])
                for what, values in _summaries(spec, canon).items():
                    self.rows[f"{i}.{what}"].append(values)
                if self.tensors:
                    np.save(self.folder / TENSORS / tensor_name(i, self._batch_no), canon, allow_pickle=False)
            sizes.append(size)
            self.count += size
            self._batch_no += 1
        if not sizes:
            raise AlignerError(f"the data source yielded no batch in epoch {epoch} (an empty loader or dataset)")
        self.batch_sizes.append(sizes)

    def _find_pads(self, arrays: dict[str, np.ndarray]) -> None:
        """A sequence field whose batches so far showed no padding: its pad token from this batch, if it pads."""
        for i, spec in enumerate(self.specs):
            if spec.kind == FieldKind.SEQUENCE and spec.pad is None:
                pad = _pad_value(arrays[spec.name])
                if pad is not None:
                    self.specs[i] = dataclasses.replace(spec, pad=pad)

    def _check_structure(self, arrays: dict[str, np.ndarray], where: str) -> None:
        """Every batch must have the first batch's fields, each with its dtype kind and rank."""
        names = [s.name for s in self.specs]
        if list(arrays) != names:
            raise AlignerError(f"{where}: fields {list(arrays)} differ from the first batch's {names}; a loader must "
                               "yield one structure")
        for spec in self.specs:
            a = arrays[spec.name]
            if a.ndim != len(spec.shape) + 1 or (a.dtype.kind == "f") != (spec.dtype.startswith("float")):
                raise AlignerError(f"{where}: field {spec.name!r} is {a.dtype} {list(a.shape)}, the first batch's "
                                   f"was {spec.dtype} with {len(spec.shape) + 1} dimensions")
            if spec.kind == FieldKind.IMAGE and _canonical_shape(spec, a.shape)[1:] != spec.shape:
                raise AlignerError(f"{where}: image field {spec.name!r} changed shape to {list(a.shape[1:])}")

    def finish(self) -> None:
        """Write the per-sample arrays."""
        for key, parts in self.rows.items():
            name = "samples.npy" if key == "samples" else array_name(int(key.split(".")[0]), key.split(".", 1)[1])
            np.save(self.folder / ARRAYS / name, np.concatenate(parts), allow_pickle=False)


_WHAT = {FieldKind.IMAGE: ("hash", "nonfinite", "stats", "thumb"), FieldKind.TENSOR: ("hash", "nonfinite", "stats"),
         FieldKind.SEQUENCE: ("hash", "nonfinite", "seq", "content"), FieldKind.LABEL: ("hash", "nonfinite", "label")}


def _spec(name: str, a: np.ndarray, pad: int | None) -> FieldSpec:
    """How to read a field, decided on its first batch."""
    dtype = str(a.dtype)
    integer = a.dtype.kind in "biu"
    if a.ndim == 4 and (a.shape[1] in _CHANNELS or a.shape[3] in _CHANNELS):
        layout = Layout.HWC if a.shape[3] in _CHANNELS and a.shape[1] not in _CHANNELS else Layout.CHW
        spec = FieldSpec(name, FieldKind.IMAGE, dtype, (), layout)
        return dataclasses.replace(spec, shape=_canonical_shape(spec, a.shape)[1:])
    if a.ndim == 3 and not integer and min(a.shape[1:]) >= 8:
        return FieldSpec(name, FieldKind.IMAGE, dtype, (1,) + a.shape[1:], Layout.HW)
    if a.ndim == 1 and integer:
        return FieldSpec(name, FieldKind.LABEL, dtype, (), encoding=Encoding.INDEX)
    if a.ndim == 2 and a.shape[1] >= 2 and _one_hot(a):
        return FieldSpec(name, FieldKind.LABEL, dtype, a.shape[1:], encoding=Encoding.ONE_HOT)
    if a.ndim == 2 and integer:
        return FieldSpec(name, FieldKind.SEQUENCE, dtype, a.shape[1:], pad=_pad_value(a) if pad is None else pad)
    return FieldSpec(name, FieldKind.TENSOR, dtype, a.shape[1:])


def _one_hot(a: np.ndarray) -> bool:
    return bool(((a == 0) | (a == 1)).all() and (a.sum(axis=1) == 1).all())


def _runs(a: np.ndarray, value: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many `value`s it starts with, and ends with (a row of only `value` counts on the left)."""
    eq = a == value
    full = eq.all(axis=1)
    left = np.where(full, a.shape[1], np.argmin(eq, axis=1))
    right = np.where(full, 0, np.argmin(eq[:, ::-1], axis=1))
    return left, right


def _pad_value(a: np.ndarray) -> int | None:
    """The pad token of a batch of sequences: of the commonest first and last tokens, the one whose runs at the ends
    are longest beyond their first token (a [CLS] in front of every row is no padding); 0 when it pads at all (an
    attention mask: ones padded with zeros, never zeros padded with ones)."""
    scores = {}
    for column in (a[:, 0], a[:, -1]):
        values, counts = np.unique(column, return_counts=True)
        v = int(values[np.argmax(counts)])
        left, right = _runs(a, v)
        scores[v] = int(np.maximum(left - 1, 0).sum() + np.maximum(right - 1, 0).sum()) + int(
            ((left > 0) & (right > 0)).sum())
    if scores.get(0, 0) > 0:
        return 0
    best = max(scores, key=lambda v: scores[v])
    return best if scores[best] > 0 else None


def _canonical_shape(spec: FieldSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    if spec.layout == Layout.HWC:
        return (shape[0], shape[3], shape[1], shape[2])
    if spec.layout == Layout.HW:
        return (shape[0], 1) + tuple(shape[1:])
    return tuple(shape)


def _canonical(spec: FieldSpec, a: np.ndarray) -> np.ndarray:
    """A batch in the form digests are taken of: images channels-first, integers int64, floats float32."""
    if spec.layout == Layout.HWC:
        a = np.moveaxis(a, 3, 1)
    elif spec.layout == Layout.HW:
        a = a[:, None]
    if a.dtype.kind in "biu":
        return np.ascontiguousarray(a, dtype=np.int64)
    return np.ascontiguousarray(a, dtype=np.float32)


def _digests(a: np.ndarray) -> np.ndarray:
    """A 128-bit digest of each row of `a` (one sample each), as [N, 2] uint64: the row's own bytes where it holds
    16 or fewer (a label: exact, no hashing), else blake2b of them (hashed from one buffer without per-row arrays)."""
    a = np.ascontiguousarray(a)
    n = len(a)
    step = a.nbytes // n if n else 0
    if step <= 16:
        padded = np.zeros((n, 16), dtype=np.uint8)
        padded[:, :step] = a.reshape(n, -1).view(np.uint8)
        return padded.view(np.uint64)
    buf = a.data.cast("B")
    blake = hashlib.blake2b
    out = b"".join([blake(buf[i: i + step], digest_size=16).digest() for i in range(0, n * step, step)])
    return np.frombuffer(out, dtype=np.uint64).reshape(n, 2)


def _content_digests(a: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The digest of each sequence's tokens without its padding (`left` and `right` pad counts per row)."""
    a = np.ascontiguousarray(a)
    n, length = a.shape
    size = a.itemsize
    buf = a.data.cast("B")
    blake = hashlib.blake2b
    out = b"".join([blake(buf[(r * length + lo) * size: ((r + 1) * length - hi) * size], digest_size=16).digest()
                    for r, lo, hi in zip(range(n), left.tolist(), right.tolist())])
    return np.frombuffer(out, dtype=np.uint64).reshape(n, 2)


THUMB = 4  # an image's thumbnail: the means of THUMB x THUMB blocks per channel


def _thumbnail(a: np.ndarray) -> np.ndarray:
    """Per sample and channel the means of a THUMB x THUMB grid of blocks ([N, C, THUMB * THUMB], fewer blocks for a
    smaller image): what a flip or a crop moves while every per-channel statistic stays."""
    n, c, h, w = a.shape
    if h % THUMB == 0 and w % THUMB == 0:  # equal blocks: two sums over reshaped axes (faster than reduceat)
        blocks = a.reshape(n, c, THUMB, h // THUMB, THUMB, w // THUMB).sum(axis=3, dtype=np.float64).sum(axis=4)
        return blocks.reshape(n, c, -1) / (h // THUMB * w // THUMB)
    rows = np.linspace(0, h, min(THUMB, h) + 1).astype(int)
    cols = np.linspace(0, w, min(THUMB, w) + 1).astype(int)
    sums = np.add.reduceat(np.add.reduceat(a, rows[:-1], axis=2, dtype=np.float64), cols[:-1], axis=3)
    return (sums / np.outer(np.diff(rows), np.diff(cols))).reshape(n, c, -1)


def _summaries(spec: FieldSpec, a: np.ndarray) -> dict[str, np.ndarray]:
    """The per-sample arrays of one canonical batch of one field."""
    n = len(a)
    flat = a.reshape(n, -1)
    out = {"hash": _digests(a),
           "nonfinite": (~np.isfinite(flat)).sum(axis=1) if a.dtype.kind == "f" else np.zeros(n, np.int64)}
    if spec.kind in (FieldKind.IMAGE, FieldKind.TENSOR):
        per = a.reshape(n, a.shape[1], -1) if spec.kind == FieldKind.IMAGE else flat[:, None, :]
        if not per.shape[2]:
            out["stats"] = np.zeros(per.shape[:2] + (4,))
        else:
            with np.errstate(invalid="ignore"):  # sums in float64 without a float64 copy of the batch
                mean = per.mean(axis=2, dtype=np.float64)
                std = np.sqrt(np.maximum(np.einsum("ijk,ijk->ij", per, per, dtype=np.float64) / per.shape[2]
                                         - mean ** 2, 0.0))
                out["stats"] = np.stack([mean, std, per.min(axis=2), per.max(axis=2)], axis=2).astype(np.float64)
        if spec.kind == FieldKind.IMAGE:
            out["thumb"] = _thumbnail(a)
    elif spec.kind == FieldKind.SEQUENCE:
        if spec.pad is None:
            left = right = np.zeros(n, np.int64)
        else:
            left, right = _runs(a, spec.pad)
        length = a.shape[1] - left - right
        out["seq"] = np.stack([length, left, right], axis=1).astype(np.int64)
        out["content"] = _content_digests(a, left, right)
    else:
        out["label"] = a.argmax(axis=1) if spec.encoding == Encoding.ONE_HOT else a.reshape(n)
    return out
