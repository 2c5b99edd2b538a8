"""A dump's records as a stream, so `align check` and `align compare` read a manifest of any length in bounded memory.

    with open_stream(path) as stream:     # header read and checked as read_source checks it (same one-line errors)
        for item in stream:               # Items in execution order, `same_as` links resolved as read_source does
            ...
        stream.problems                   # the manifest lines that did not parse, met so far
    # or: for batch in stream.batches(): ... (the same items, a manifest block's in one list)

The items are those `read_source` gives for the same directory, in the same order: its `items` (sorted by (step,
seq)) with the parameter values (kind "param", its `params`) in their place among them. Call records (kind "call")
are not items: those carrying a module's attributes are kept in `Stream.calls` (compare's settings read them);
replay and repro read every call with `read_source`, which stays the reader for random access. A directory
without a manifest (a plain folder of .npy files, another tool's dump) is read whole by `read_source` and streamed
from memory.

Order. aligner.dump writes records in execution order ((step, seq) never decreasing). A manifest out of that order
(edited by hand, concatenated) raises `UnorderedError` before the first record out of place is yielded: the caller reads
it with `read_source` instead (its sort gives the order). Once iteration ends without records, the error is
read_source's ("no records to compare").

Memory, the bound: the records of the block of lines being decoded and of the block before it (`BLOCK` bytes
each, 8 MiB: ~20,000 stats-only records), a link table of 16 bytes per record of the current step (seq -> where its
line is), up to `CACHED_BLOCKS` blocks decoded again to resolve a link to a record older than the previous block,
and the first `MAX_PROBLEMS` problem lines. Nothing else grows with the number of records.

Speed: a block of records with no call, link (`same_as`) or problem line among them (a stats-only dump's, mostly) is
checked for order and added to the link table with a map per field, not a loop per record (`_plain`); any other block
is read a record at a time (`_block`).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from array import array
from bisect import bisect_right
from operator import attrgetter, le
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Iterator, cast

from aligner.core.errors import AlignerError
from aligner.core.nesting import NestingError
from aligner.dumping import manifest
from aligner.dumping.manifest import Kind, Record
from aligner.dumping.read.foreign.layout import inside
from aligner.dumping.read.source import Item, Source, link, read_source

MAX_PROBLEMS = 1000  # problem lines kept word for word (a manifest of garbage lines must not grow memory either)
CACHED_BLOCKS = 4    # blocks decoded again for links to records older than the previous block, kept at once
BLOCK = manifest.BLOCK  # bytes of record lines decoded at a time: the records in flight are two such blocks
BATCH = 1 << 14  # items in a batch of a dump read whole
CALL, PARAM = Kind.CALL, Kind.PARAM
_KIND, _FILE, _SAME_AS, _STEP = attrgetter("kind"), attrgetter("file"), attrgetter("same_as"), attrgetter("step")
_SEQ = attrgetter("seq")


class UnorderedError(Exception):
    """The manifest's records are not in execution order: a stream cannot give read_source's order (read it with
    read_source; nothing the stream yielded so far was out of order)."""


@dataclasses.dataclass
class Stream:
    """One dump read as a stream: what its header says, the problem lines met so far, and its items (iterate once,
    inside the `with` block)."""

    root: Path
    framework: str           # a Framework value, or what the manifest says ("unknown" without a header)
    mode: str                # "full" | "stats" | "npy" (plain directory of .npy files)
    problems: list[str]      # unparsable manifest lines, in file order (the first MAX_PROBLEMS)
    _batches: Iterator[list[Item]]  # the items, a block's at a time (iterate the stream or its batches, not both)
    _fh: BinaryIO | None = None
    # the call records that carry the module's attributes (its first call in a step), by (step, call id), met so
    # far: what compare's settings of a blamed module read (one per module and step, not one per call)
    calls: dict[tuple[int, int], Record] = dataclasses.field(default_factory=dict)
    size: int = 0  # bytes of the manifest (0 for a dump read whole): what a progress bar's total counts
    _reader: _Reader | None = None

    def __post_init__(self) -> None:
        self._items = itertools.chain.from_iterable(self._batches)

    def batches(self) -> Iterator[list[Item]]:
        """The items as iterating the stream gives them, in lists (a block of the manifest's at a time): what a
        caller that takes many at once reads without a call per item."""
        return self._batches

    @property
    def consumed(self) -> int:
        """Bytes of the manifest read so far (a block of lines at a time; 0 for a dump read whole)."""
        return self._reader.consumed if self._reader is not None else 0

    def __iter__(self) -> Iterator[Item]:
        return self._items

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the manifest (iteration ends)."""
        if self._fh is not None:
            self._fh.close()


def open_stream(path: str | os.PathLike, *, trust_pickle: bool = False) -> Stream:
    """The dump at `path` as a `Stream` (a directory with a manifest; anything else read_source reads, whole);
    AlignerError (one line) where read_source raises one before its first record: no such directory, a manifest
    that is a link out, a FIFO or not readable, a header nested too deep or of an unknown version."""
    root = Path(path)
    if not root.exists():
        raise AlignerError(f"{root}: no such directory")
    if not root.is_dir():
        raise AlignerError(f"{root}: not a directory (expected a dump directory or a directory of .npy files)")
    if not os.path.lexists(root / manifest.MANIFEST):
        return stream_source(read_source(root, trust_pickle=trust_pickle))
    real = root.resolve()
    _, why = inside(root, manifest.MANIFEST, real)
    if why is not None:
        raise AlignerError(f"{root}: {why}")
    try:
        fh = manifest.open_manifest(root)
    except OSError as exc:
        raise AlignerError(f"{root}: cannot read {manifest.MANIFEST}: {exc}") from exc
    try:
        reader = _Reader(root, real, fh)
    except BaseException:
        fh.close()
        raise
    return Stream(root, reader.framework, reader.mode, reader.problems, reader.batches(), fh, reader.calls,
                  os.fstat(fh.fileno()).st_size, reader)


def stream_source(source: Source) -> Stream:
    """A dump already read whole as a Stream: its items and parameter values in execution order."""
    items = sorted([*source.items, *source.params.values()], key=lambda it: (it.record.step, it.record.seq))
    return Stream(source.root, source.framework, source.mode, source.problems,
                  (items[n:n + BATCH] for n in range(0, len(items), BATCH)),
                  calls={key: rec for key, rec in source.calls.items() if rec.attrs})


class _Reader:
    """The manifest of one dump read block by block: its header at once, its items as `items()` is iterated."""

    def __init__(self, root: Path, real: Path, fh: BinaryIO) -> None:
        self.root, self.real, self.fh = root, real, fh
        self.problems: list[str] = []
        self.calls: dict[tuple[int, int], Record] = {}
        self.canonical_of: dict[str, str] = {}
        self.framework, self.mode = "unknown", "full"
        try:
            first = fh.readline()
        except (OSError, UnicodeDecodeError) as exc:
            raise AlignerError(f"{root}: cannot read {manifest.MANIFEST}: {exc}") from exc
        self.consumed = len(first)  # bytes read: the header, then each block as it is decoded
        self.first: list[Record | str] = []
        if first.strip():
            entry = manifest.decode_line(1, first)
            if isinstance(entry, NestingError):
                raise AlignerError(f"{root}: {entry}; not a manifest aligner wrote")
            if isinstance(entry, dict):
                version = entry.get("version")
                if version not in manifest.READABLE_VERSIONS:
                    raise AlignerError(f"{root}: dump format version {version!r}; this aligner reads versions "
                                       f"{', '.join(map(str, manifest.READABLE_VERSIONS))} (a newer aligner wrote it?)")
                self.framework, self.mode = str(entry.get("framework", "unknown")), str(entry.get("mode", "full"))
            else:
                self.first = [entry if isinstance(entry, Record) else str(entry)]

    def _blocks(self) -> Iterator[tuple[int, int, int, list[Record | str]]]:
        """(offset, length, first line number, decoded entries) of line 1 when it is a record (offset -1), then of
        each block of whole lines after it; AlignerError when the file cannot be read."""
        if self.first:
            yield -1, 0, 1, self.first
        try:
            for offset, lineno, block, lines in manifest.blocks(self.fh, BLOCK):
                self.consumed = offset + len(block)
                yield offset, len(block), lineno, manifest.decode_block(block, lineno, self.canonical_of, lines)
        except (OSError, UnicodeDecodeError) as exc:
            raise AlignerError(f"{self.root}: cannot read {manifest.MANIFEST}: {exc}") from exc

    def batches(self) -> Iterator[list[Item]]:
        """Every item in file order, a block's at a time, checked to be in execution order (`UnorderedError`, after
        the items before the record out of place); AlignerError at the end when none was a record read_source lists
        (parameter values are not)."""
        links = _Links(self)
        order = (-1 << 62, -1 << 62)  # (step, seq) of the last item
        listed = 0
        for offset, length, lineno, entries in self._blocks():
            links.new_block(offset, length, lineno)
            if not entries:
                continue
            plain = _plain(entries)
            if plain is not None and _ordered(plain[1], plain[2], order):
                records, steps, seqs = plain
                listed += len(records) - list(map(_KIND, records)).count(PARAM)
                items = self._plain_block(records, steps, seqs, links, order[0])
                order = steps[-1], seqs[-1]
                yield items
                continue
            items = []
            try:
                order, count = self._block(entries, links, order, items)
            except UnorderedError:
                if items:  # the items before the record out of place, then the error
                    yield items
                raise
            listed += count
            yield items
        if not listed:
            problems = self.problems
            why = f" ({len(problems)} unparsable manifest line(s): {problems[0]})" if problems else ""
            raise AlignerError(f"{self.root}: no records to compare{why}")

    def _plain_block(self, entries: list[Record], steps: list[int], seqs: list[int], links: _Links, step: int
                     ) -> list[Item]:
        """The items of a block of records only, none a call or a link, in execution order after the items before
        (`steps`, `seqs`: theirs; `step`: the last item's), added to the link table a step at a time."""
        items = list(map(self.item if any(map(_FILE, entries)) else Item, entries))  # (no file: nothing to confine)
        base = (len(links.blocks) - 1) << 32
        start = 0
        while start < len(entries):
            here = steps[start]
            end = bisect_right(steps, here, start) if here != steps[-1] else len(entries)
            if here != step:
                links.new_step()
                step, base = here, 0
            links.window += items[start:end]
            links.seqs.extend(seqs[start:end])
            links.where.extend(range(base | start, base | end))
            start = end
        return items

    def _block(self, entries: list[Record | str], links: _Links, order: tuple[int, int], out: list[Item]
               ) -> tuple[tuple[int, int], int]:
        """A block's items appended to `out` one record at a time (problem lines, calls and links among them), and
        ((step, seq) of the last item, how many are records read_source lists); UnorderedError at a record out of
        place, `out` holding the items before it."""
        step, seq = order
        listed = 0
        root, real, problems = self.root, self.real, self.problems
        window, seqs, where, base = links.window, links.seqs, links.where, (len(links.blocks) - 1) << 32
        for position, rec in enumerate(entries):
            if isinstance(rec, str):
                if len(problems) < MAX_PROBLEMS:
                    problems.append(rec)
                continue
            if rec.kind is CALL:
                if rec.attrs and rec.call is not None:
                    self.calls[(rec.step, rec.call)] = rec
                continue
            if rec.step != step:
                if rec.step < step:
                    raise UnorderedError(f"{root}: step {rec.step} comes after step {step}")
                step = rec.step
                links.new_step()
                window, seqs, where, base = links.window, links.seqs, links.where, 0
            elif rec.seq < seq:
                raise UnorderedError(f"{root}: record {rec.seq} comes after record {seq} in step {step}")
            seq = rec.seq
            item = Item(rec)
            if rec.file:
                item.path, item.error = inside(root, rec.file, real)
            if rec.same_as is not None:
                link(item, links.get(rec.same_as))
            window.append(item)
            seqs.append(seq)
            where.append(base | position)
            if rec.kind is not PARAM:
                listed += 1
            out.append(item)
        return (step, seq), listed

    def item(self, rec: Record) -> Item:
        """A record as an Item, its tensor file confined to the dump (not yet linked)."""
        item = Item(rec)
        if rec.file:
            item.path, item.error = inside(self.root, rec.file, self.real)
        return item

    def reread(self, offset: int, length: int, lineno: int) -> list[Record | str]:
        """A block decoded again (its line 1 when `offset` is -1)."""
        if offset < 0:
            return self.first
        try:
            block = os.pread(self.fh.fileno(), length, offset)
        except OSError as exc:
            raise AlignerError(f"{self.root}: cannot read {manifest.MANIFEST}: {exc}") from exc
        return manifest.decode_block(block, lineno, self.canonical_of)


def _plain(entries: list[Record | str]) -> tuple[list[Record], list[int], list[int]] | None:
    """A block of records none of which is a call or a link (`same_as`), the step and the seq of each; None for a
    block holding a problem line, a call or a link (read one record at a time)."""
    if set(map(type, entries)) != {Record}:
        return None
    records = cast(list[Record], entries)
    if CALL in set(map(_KIND, records)) or list(map(_SAME_AS, records)).count(None) != len(records):
        return None
    return records, list(map(_STEP, records)), list(map(_SEQ, records))


def _ordered(steps: list[int], seqs: list[int], after: tuple[int, int]) -> bool:
    """Whether the records are in execution order ((step, seq) never decreasing) after the record `after` was."""
    if not (after[0] <= steps[0] and all(map(le, steps, steps[1:]))):
        return False
    if all(map(le, seqs, seqs[1:])):  # (seqs that start again with each step: compared step by step)
        return after[0] < steps[0] or after[1] <= seqs[0]
    keys = list(zip(steps, seqs))
    return after <= keys[0] and all(map(le, keys, keys[1:]))


class _Links:
    """Where each record of the current step is, to resolve `same_as` links: `get(seq)` is the latest record read
    with that seq, as read_source's table gives it (a record of an earlier step fails its step check there, so only
    the current step's records are kept)."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.seqs = array("q")             # the step's records in order: seq, and (block index << 32 | position)
        self.where = array("q")
        self.window: list[Item] = []       # the step's items of the previous and the current block, in order
        self.start = 0                     # the step's index of window[0]
        self.current = 0                   # the step's index of the current block's first item
        self.blocks: list[tuple[int, int, int]] = []  # the step's blocks: (offset, length, first line number)
        self.cache: dict[int, dict[int, Item]] = {}   # block index -> its items decoded again, by position

    def new_block(self, offset: int, length: int, lineno: int) -> None:
        del self.window[:self.current - self.start]  # the block before the previous one is let go
        self.start, self.current = self.current, len(self.seqs)
        self.blocks.append((offset, length, lineno))

    def new_step(self) -> None:
        self.seqs, self.where, self.window = array("q"), array("q"), []
        self.start = self.current = 0
        self.blocks = self.blocks[-1:]
        self.cache.clear()

    def get(self, seq: int) -> Item | None:
        """The latest item read so far with this seq (None when the step has none): in the window, else its block
        decoded again (the step's seqs never decrease, so the latest is the last one bisect finds)."""
        i = bisect_right(self.seqs, seq) - 1
        if i < 0 or self.seqs[i] != seq:
            return None
        if i >= self.start:
            return self.window[i - self.start]
        return self._decoded(self.where[i] >> 32).get(self.where[i] & 0xFFFFFFFF)

    def _before(self, seq: int, block: int) -> Item | None:
        """The latest item with this seq in a block before `block`, decoded again."""
        i = bisect_right(self.seqs, seq) - 1
        while i >= 0 and self.seqs[i] == seq and self.where[i] >> 32 >= block:
            i -= 1
        if i < 0 or self.seqs[i] != seq:
            return None
        index, position = self.where[i] >> 32, self.where[i] & 0xFFFFFFFF
        return self._decoded(index).get(position)

    def _decoded(self, index: int) -> dict[int, Item]:
        """Block `index` of the step decoded again and its links resolved as when it was first read."""
        if index in self.cache:
            return self.cache[index]
        items: dict[int, Item] = {}
        local: dict[int, Item] = {}
        for position, entry in enumerate(self.reader.reread(*self.blocks[index])):
            if isinstance(entry, str) or entry.kind is CALL:
                continue
            item = self.reader.item(entry)
            if entry.same_as is not None:
                link(item, local.get(entry.same_as) or self._before(entry.same_as, index))
            local[entry.seq] = items[position] = item
        if len(self.cache) >= CACHED_BLOCKS:
            del self.cache[next(iter(self.cache))]
        self.cache[index] = items
        return items
