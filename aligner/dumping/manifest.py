"""The dump directory format shared by `aligner.dump` (writer) and `align compare` (reader).

A dump directory holds `manifest.jsonl` and `tensors/*.npy`:

* line 1, the header: ``{"format": "aligner-dump", "version": 2, "framework": "pytorch" | "mindspore" | "numpy",
  "framework_version": ..., "aligner_version": ..., "mode": "full" | "stats", "seed": {...} | null,
  "rank": null, "world_size": null, "groups": null, "comm": null}`` (a multi-rank dump, `rank{N}/` folders: this rank,
  the number of ranks, name -> lists of ranks such as ``{"world": [[0, 1]], "dp": [[0, 1]]}``, and where the rank came
  from, ``"torch.distributed:gloo"``; `aligner/dumping/ranks.py`);
* one line per record, in execution order: ``{"seq", "step", "module", "type", "kind", "io", "index", "dtype",
  "shape", "stats", "file"}`` and, from version 2, ``"call", "parent", "same_as", "source"`` and, where they apply,
  ``"arg", "args", "attrs"`` (see `Record`).

Version 1 dumps (no call structure, no op/buffer records) are still read: their new fields are null.

Tensor files are content-addressed (`tensors/<digest>.npy`) so identical tensors are written once; bfloat16 tensors are
stored as their uint16 bit patterns (lossless) and the record's canonical `dtype` says how to view them.
"""
from __future__ import annotations

import enum
import io
import json
import math
import os
import re
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Iterator, cast

import msgspec

from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.core.files import open_input
from aligner.core.nesting import TOO_DEEP, NestingError, json_loads, too_deep
from aligner.core.version import __version__
from aligner.dumping import pending
from aligner.metrics.stats import Stats

MANIFEST = "manifest.jsonl"
TENSOR_DIR = "tensors"
FORMAT = "aligner-dump"
VERSION = 2
READABLE_VERSIONS = (1, 2)
# a multi-rank dump: one folder per rank inside the dump directory (rank0, rank1, ...: aligner.dumping.ranks writes
# them), each a dump directory of its own
RANK_DIR = re.compile(r"rank(\d+)")
# forward/backward: module calls; param_grad: parameter gradients; probe: aligner.save; op: one tensor operation
# called inside a zoomed module (dump(ops=True)); buffer: a normalisation buffer after a training-mode forward;
# call: one module call's signature (no tensor: `args`, and `attrs` on a module's first call of a step), written with
# inputs for replay; param: a parameter's or buffer's value at the start of a step (dump(params=True)).
# block: what a module `leaves_only` keeps no records of (one with children) takes in and hands back, as links or
# statistics only (no file), so a verdict can tell the block's own code from its children's.
class Kind(enum.StrEnum):
    """What a record is (its value is the manifest's `kind` string)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    PARAM_GRAD = "param_grad"
    PROBE = "probe"
    OP = "op"
    BUFFER = "buffer"
    PARAM = "param"
    CALL = "call"
    BLOCK = "block"


class Io(enum.StrEnum):
    """Which tensor of its call a record holds (its value is the manifest's `io` string; a buffer's is its name)."""

    INPUT = "input"
    OUTPUT = "output"
    GRAD_INPUT = "grad_input"    # a backward record: the gradient w.r.t. the module's inputs (flowing out of it)
    GRAD_OUTPUT = "grad_output"  # a backward record: the gradient w.r.t. the module's outputs (flowing into it)
    GRAD = "grad"                # a parameter's gradient
    VALUE = "value"              # a parameter's or buffer's value at the start of a step
    SIGNATURE = "signature"      # a call record
    RUNNING_MEAN = "running_mean"
    RUNNING_VAR = "running_var"
    REDUCED = "reduced"          # a parameter's gradient after the all-reduce (aligner.dumping.ranks)


INPUTS = frozenset({Io.INPUT, Io.GRAD_OUTPUT})  # what flows into a call (forward input, gradient entering backward)
_CALL = Kind.CALL  # bound once for the loop every record goes through (an enum's attribute is a 0.2 us lookup)


class Record(msgspec.Struct, kw_only=True, gc=False):
    """One dumped tensor (not tracked by the cycle collector, gc=False: a record never refers back to what holds it,
    and a million records would otherwise be walked at every full collection).

    kind/io: forward -> io "input"|"output"; backward -> io "grad_input" (gradient w.r.t. the module's inputs, i.e.
    flowing out of it) | "grad_output"; param_grad -> module is the full parameter name, io "grad"; probe (aligner.save)
    -> module is the probe name, io "output"; op -> module is the module whose forward called the op, type the op as
    called ("torch.matmul", "Tensor.__mul__", "ops.BatchMatMul"), io "input"|"output"; buffer -> module is the
    normalisation module, io the buffer in PyTorch's words ("running_mean", "running_var"). `index` is the position
    within the flattened inputs/outputs.

    Version 2 fields (None in version 1 dumps):
    call: the id of the module or op call the record belongs to (a call's inputs and outputs share it);
    parent: the path of the innermost module whose forward was running when the call was made ("" the model itself,
    None called outside the model: the model's own inputs);
    same_as: for an input, the seq of the earlier record holding this very tensor (no file: the input is that
    record's output, unchanged); an input computed by code between module calls is stored with its own file; also
    for an output that is such a tensor (a module handing back its input) and for a gradient that is the very memory
    of the gradient recorded before it (a chain's gradient, unchanged; a pass-through's grad_input);
    source: "file.py:line" of the code that called an op;
    arg: for an input, where the tensor sat in the call: "0" the first positional argument, "mask" a keyword,
    "1/0" the first element of a tuple passed second;
    args: for a call record, the call's arguments as JSON (`aligner.dumping.signature`): tensors as {"tensor": i}
    (i the input index), other values as they were, so a replay can call the module the same way;
    attrs: for a call record, the module's class and scalar attributes (on its first call in a step), so a repro can
    build the layer without the user's code;
    skipped: why the tensor was not stored (``"unsupported dtype complex64"``, an exception its hook met): such a
    record has no file and no statistics, its `dtype` is the tensor's own name even where no reader supports it, and
    compare lists it as not compared with this reason (a dump never aborts the user's forward to store a tensor);
    scope: for an input with data (no recorded call returned it), the module whose code computed it when that is not
    `parent`: the tensor entered `parent`'s call unchanged from there, or a module whose outputs are not recorded
    (`leaves_only`) returned it, so a divergence in it is blamed on the code that computed it, not on the block it
    merely passed through.
    """

    seq: Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # readers keep seqs in int64 arrays
    module: str
    type: str = ""
    kind: Kind
    io: Io = Io.OUTPUT
    index: int = 0
    dtype: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    step: int = 0
    stats: Stats | None = None
    file: str | None = None
    call: int | None = None
    parent: str | None = None
    same_as: int | None = None
    source: str | None = None
    arg: str | None = None
    args: dict[str, Any] | None = None
    attrs: dict[str, Any] | None = None
    skipped: str | None = None
    scope: str | None = None

    def to_json(self) -> str:
        stats = self.stats
        # msgspec (~1 us a line against json's ~8, a call record's ~25) where it writes what json would: it writes a
        # non-finite float as null (json: Infinity, NaN, which the reader takes back) and refuses a lone surrogate
        # (json escapes it)
        if (stats is None or _finite(stats)) and (self.args is None or _all_finite(self.args)) \
                and (self.attrs is None or _all_finite(self.attrs)):  # a call record's values: any float
            try:
                if self.args is None and self.attrs is None and self.skipped is None and self.scope is None:
                    # the struct itself (a plain line in 3.4 us, checks included, where a dict of it took 4.8): the
                    # optional fields come last, so their nulls are the line's tail, cut off (a field added after
                    # them: the dict's line)
                    line = _ENCODER.encode(self)
                    tail = _NULL_TAILS[self.arg is None]
                    if line.endswith(tail):
                        return line[:-len(tail)].decode() + "}"
                return _ENCODER.encode(self._without_nulls()).decode()
            except (UnicodeEncodeError, TypeError, ValueError, OverflowError):  # json's line, or json's error
                pass
        data = self._without_nulls()
        if stats is not None:
            data["stats"] = stats.to_dict()
        return json.dumps(data, separators=(",", ":"))

    def _without_nulls(self) -> dict[str, Any]:
        """The record as a dict, less its optional fields that are None: only call and input records carry these,
        so no null on every other line."""
        data = msgspec.structs.asdict(self)
        for name in _OPTIONAL:
            if data[name] is None:
                del data[name]
        return data


_OPTIONAL = ("arg", "args", "attrs", "skipped", "scope")
# what msgspec writes for the optional fields (the struct's last) when all are None: [arg set, arg None too]
_NULL_TAILS = tuple(b"".join(b',"%s":null' % name.encode() for name in _OPTIONAL[start:]) + b"}" for start in (1, 0))
_ENCODER = msgspec.json.Encoder()


def _all_finite(value: Any) -> bool:
    """Whether no float inside `value` (nested dicts and lists: a call's arguments and settings) is a NaN or an
    infinity. A loop over a stack, plain types first (a recursive walk took 0.15 ms a step for the twin CNN's call
    records, two thirds of their lines' cost)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is dict or isinstance(item, dict):
            stack.extend(item.values())
        elif kind is list or kind is tuple or isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return False
    return True


def _finite(stats: Stats) -> bool:
    """Whether none of `stats`' floats is a NaN or an infinity (min/max/mean/l2 can be; the fractions cannot)."""
    return all(v is None or v is msgspec.UNSET or math.isfinite(v)
               for v in (stats.min, stats.max, stats.mean, stats.l2))


# Manifest lines are decoded and type-checked in one pass by msgspec (100,000 records: ~0.5 s instead of ~7 s for
# json.loads and a field-by-field check): a missing field, a bool where a number belongs or a negative dimension is
# a ValueError naming the field.
_DECODER = msgspec.json.Decoder(Record)


# How deep a manifest line may nest lists and objects (a call's `args`, the header's `groups`: a few levels) is
# aligner.core.nesting's MAX_NESTING: deeper lines are refused (the decoders recurse once per level, and so would
# whatever walked such a value later).
def _record_too_deep(rec: Record) -> bool:
    """Whether a record's free-form fields (`args`, `attrs`: the only ones typed Any) nest too deep."""
    return rec.args is not None and too_deep(rec.args) or rec.attrs is not None and too_deep(rec.attrs)


def _decode(line: bytes) -> Record:
    """One record line; json.dumps writes a non-finite float in `args` (a fill value of -inf) as -Infinity, which
    is not JSON: such a line is parsed by the json module and then checked the same way."""
    try:
        rec = _DECODER.decode(line)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        rec = msgspec.convert(json.loads(line), Record)
    if _record_too_deep(rec):
        raise NestingError(TOO_DEEP)
    if rec.kind == Kind.CALL:
        rec.dtype = ""
    elif rec.skipped is None:  # a skipped record keeps the name of the dtype no reader supports
        rec.dtype = canonical(rec.dtype)  # AlignerError for a dtype no reader supports
    return rec


def create_manifest(path: str | os.PathLike, framework: str, framework_version: str, mode: str,
                    seed: dict[str, Any] | None = None, ranks: dict[str, Any] | None = None) -> int:
    """Create a manifest holding its header line and return its open descriptor (the dump writer appends records
    after it); `ranks`: the rank, world size, groups and comm of a multi-rank run. Created with O_EXCL, so of two
    writers starting on one directory exactly one gets it: FileExistsError when a manifest is there already."""
    header = {"format": FORMAT, "version": VERSION, "framework": framework, "framework_version": framework_version,
              "aligner_version": __version__, "mode": mode, "seed": seed, "rank": None, "world_size": None,
              "groups": None, "comm": None} | (ranks or {})
    fd = os.open(Path(path) / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, (json.dumps(header) + "\n").encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_header(path: str | os.PathLike, framework: str, framework_version: str, mode: str,
                 seed: dict[str, Any] | None = None, ranks: dict[str, Any] | None = None) -> None:
    """`create_manifest`, closed at once (FileExistsError when the directory holds a manifest already)."""
    os.close(create_manifest(path, framework, framework_version, mode, seed, ranks))


def open_manifest(directory: str | os.PathLike, *, settle: bool = True) -> BinaryIO:
    """A dump's manifest opened to read (binary; a FIFO or device refused before it is opened). `settle`: first wait
    for the dumps this process still writes (wait=False, `aligner.dumping.pending`), so it is read complete."""
    if settle:
        pending.settle()
    return open_input(Path(directory) / MANIFEST)


def iter_manifest(directory: str | os.PathLike, *, settle: bool = True
                  ) -> Iterator[tuple[int, Record | dict[str, Any] | ValueError]]:
    """Yield (line number, header dict | Record | ValueError) per line; a bad line yields its error, never raises
    (`settle`: as `open_manifest`)."""
    with open_manifest(directory, settle=settle) as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, decode_line(lineno, line)


def decode_line(lineno: int, line: bytes) -> Record | dict[str, Any] | ValueError:
    """One non-blank line: the header (line 1 only), a Record, or the ValueError that names the line."""
    try:
        if lineno == 1:
            data = json_loads(line)
            if isinstance(data, dict) and data.get("format") == FORMAT:
                return data
        return _decode(line)
    except NestingError as exc:
        return NestingError(f"{MANIFEST} line {lineno}: {exc}")
    except RecursionError:  # msgspec and json raise it, not a DecodeError, for a line nested near Python's limit
        return NestingError(f"{MANIFEST} line {lineno}: {TOO_DEEP}")
    except (ValueError, TypeError, AlignerError) as exc:
        return ValueError(f"{MANIFEST} line {lineno}: {exc}")


BLOCK = 1 << 23  # bytes of record lines decoded in one call (the block's last line is read to its end)


def blocks(fh: BinaryIO, size: int = BLOCK) -> Iterator[tuple[int, int, bytes, int]]:
    """(byte offset, number of its first line, block, its number of lines) for each `size` bytes of whole lines of a
    manifest, from the line after line 1 (where `fh` stands once line 1 is read) to its end."""
    offset, lineno = fh.tell(), 2
    while block := fh.read(size):
        if not block.endswith(b"\n"):
            block += fh.readline()
        lines = block.count(b"\n") + (not block.endswith(b"\n"))
        yield offset, lineno, block, lines
        offset += len(block)
        lineno += lines


def decode_block(block: bytes, lineno: int, canonical_of: dict[str, str], lines: int | None = None
                 ) -> list[Record | str]:
    """Each non-blank line of `block` (whole record lines, the first one numbered `lineno`) as a Record, or the
    problem line naming why it did not parse (as `decode_line` words it); `canonical_of` caches dtype names, `lines`:
    the block's number of lines where the caller counted them (`blocks`).

    Decoded in one msgspec call (decode_lines: 100,000 records in ~0.25 s against ~0.35 s a line at a time); a block
    that does not decode as a whole (a bad line, a blank one, a -Infinity that only the json module reads) is decoded
    again line by line, which names each bad line."""
    count = block.count(b"\n") + (not block.endswith(b"\n")) if lines is None else lines
    try:
        records = _DECODER.decode_lines(block)
    except (msgspec.DecodeError, RecursionError):
        records = []
    if len(records) != count:  # a bad or blank line: one at a time
        return [entry if isinstance(entry, Record) else str(entry)
                for entry in (decode_line(n, line) for n, line in enumerate(io.BytesIO(block), lineno)
                              if line.strip())]
    if _canonical(records, canonical_of):
        return cast(list[Record | str], records)
    problems: dict[int, str] = {}
    for i, rec in enumerate(records):  # what _decode does, inlined (the loop every record goes through)
        if (rec.args is not None or rec.attrs is not None) and _record_too_deep(rec):
            problems[i] = f"{MANIFEST} line {lineno + i}: {TOO_DEEP}"
        elif rec.kind is _CALL:
            rec.dtype = ""
        elif rec.skipped is None:  # a skipped record keeps the name of the dtype no reader supports
            try:
                rec.dtype = canonical_of[rec.dtype]
            except KeyError:
                try:
                    rec.dtype = canonical_of[rec.dtype] = canonical(rec.dtype)
                except AlignerError as exc:
                    problems[i] = f"{MANIFEST} line {lineno + i}: {exc}"
    out: list[Record | str] = list(records)
    for i, problem in problems.items():
        out[i] = problem
    return out


def _canonical(records: list[Record], canonical_of: dict[str, str]) -> bool:
    """Whether `decode_block` has nothing to do record by record: no call, no `args` or `attrs`, and each dtype already
    its canonical name (a skipped record's, which it keeps, too); a set of each field, not a loop (`canonical_of`
    caches dtype names)."""
    if any(map(_ARGS, records)) or any(map(_ATTRS, records)) or _CALL in set(map(_KIND, records)):
        return False
    for dtype in set(map(_DTYPE, records)):
        if dtype not in canonical_of:
            try:
                canonical_of[dtype] = canonical(dtype)
            except AlignerError:
                return False
        if canonical_of[dtype] != dtype:
            return False
    return True


_ARGS, _ATTRS, _KIND, _DTYPE = attrgetter("args"), attrgetter("attrs"), attrgetter("kind"), attrgetter("dtype")


# The most lines `read_manifest` takes from one manifest (records and problem lines), when a dump is read whole: a
# stats-only record costs ~0.9 KB once read, and a whole-list `align compare` (dumps that do not pair in step, --html,
# --all, ...) holds two sides and a row per pair (~3 GiB for 1M records a side), so the default keeps such a comparison
# of two 4M-record dumps near 12 GiB; ALIGNER_MAX_RECORDS raises it. A streamed read (dumping/read/stream.py: `align
# check`, a compare of dumps that pair in step) holds a bounded window and takes any number of lines.
MAX_RECORDS = 4_000_000
MAX_RECORDS_VARIABLE = "ALIGNER_MAX_RECORDS"


def max_records() -> int:
    """The most lines one manifest may hold: `MAX_RECORDS_VARIABLE` when set, else MAX_RECORDS."""
    value = os.environ.get(MAX_RECORDS_VARIABLE, "").strip()
    if not value:
        return MAX_RECORDS
    if not value.isdigit():
        raise AlignerError(f"{MAX_RECORDS_VARIABLE}={value[:40]!r}: expected a whole number of records")
    return int(value)


def _share(rec: Record, strings: dict[str, str], shapes: dict[tuple[int, ...], list[int]]) -> None:
    """Make `rec` hold the one copy of each string and shape equal ones of earlier records hold (the decoder makes a
    new object per field: ~300 of a stats-only record's ~1.3 KB are names, types and shapes other records repeat)."""
    rec.module = strings.setdefault(rec.module, rec.module)
    rec.type = strings.setdefault(rec.type, rec.type)
    rec.dtype = strings.setdefault(rec.dtype, rec.dtype)  # (decode_block leaves a canonical name as decoded)
    if rec.parent is not None:
        rec.parent = strings.setdefault(rec.parent, rec.parent)
    rec.shape = shapes.setdefault(tuple(rec.shape), rec.shape)


def read_manifest(directory: str | os.PathLike) -> tuple[dict[str, Any] | None, list[Record], list[str]]:
    """The manifest gathered: its header (None when line 1 is not one), its records of known kinds in file order, and
    a problem line for each line that did not parse (an unknown kind or io among them) or nests too deep (that line
    left out), as `iter_manifest` words them; AlignerError when line 1 nests too deep (a header no reader can take)
    or the manifest holds more lines than `max_records()` (memory grows with each record kept: refused before it
    runs out).
    Records share equal strings and shapes (`_share`): treat them as read-only.

    Record lines are decoded a block at a time (`decode_block`). OSError when the file cannot be read.
    """
    header: dict[str, Any] | None = None
    records: list[Record] = []
    problems: list[str] = []
    canonical_of: dict[str, str] = {}  # dtype as written -> canonical name
    strings: dict[str, str] = {}
    shapes: dict[tuple[int, ...], list[int]] = {}
    limit = max_records()

    with open_manifest(directory) as fh:
        first = fh.readline()
        entry = decode_line(1, first) if first.strip() else None
        if isinstance(entry, NestingError):
            raise AlignerError(f"{directory}: {entry}; not a manifest aligner wrote")
        if isinstance(entry, ValueError):
            problems.append(str(entry))
        elif isinstance(entry, dict):
            header = entry
        elif isinstance(entry, Record):
            _share(entry, strings, shapes)
            records.append(entry)
        for _, lineno, block, lines in blocks(fh):
            for decoded in decode_block(block, lineno, canonical_of, lines):
                if isinstance(decoded, str):
                    problems.append(decoded)
                else:
                    _share(decoded, strings, shapes)
                    records.append(decoded)
            if len(records) + len(problems) > limit:
                raise AlignerError(f"{directory}: {MANIFEST} holds more than {limit:,} records, the most read at "
                                   f"once (each takes ~1 KB of memory, and compare holds two sides); set "
                                   f"{MAX_RECORDS_VARIABLE} to a larger number to read it")
    return header, records, problems
