"""`open_stream`: the items `read_source` gives, in its order, read block by block; same refusals, same lines."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aligner.core.errors import AlignerError
from aligner.dumping import manifest
from aligner.dumping.manifest import Kind
from aligner.dumping.read import stream as streaming
from aligner.dumping.read.source import Item, read_source
from aligner.dumping.read.stream import UnorderedError, open_stream

HEADER = {"format": manifest.FORMAT, "version": 2, "framework": "pytorch", "mode": "stats"}


def _write(root: Path, lines: list[Any], header: dict[str, Any] | None = HEADER) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = [json.dumps(header)] if header is not None else []
    text += [line if isinstance(line, str) else json.dumps(line) for line in lines]
    (root / manifest.MANIFEST).write_text("\n".join(text) + "\n")
    return root


def _rec(seq: int, step: int = 0, same_as: int | None = None, **fields: Any) -> dict[str, Any]:
    value = float(seq)
    out = {"seq": seq, "step": step, "module": f"m{seq}", "type": "Linear", "kind": "forward", "io": "output",
           "index": 0, "dtype": "float32", "shape": [2, 3],
           "stats": {"min": -value, "max": value, "mean": 0.0, "l2": value, "nan": 0, "inf": 0}, "file": None}
    if same_as is not None:
        out.update(same_as=same_as, stats=None, io="input")
    return out | fields


def _seen(item: Item) -> tuple:
    rec = item.record
    stats = None if rec.stats is None else msgspec.json.encode(rec.stats)
    return rec.step, rec.seq, rec.kind, rec.module, rec.dtype, rec.file, stats, rec.skipped, item.path, item.error


def _same_as_read_source(root: Path) -> int:
    """Assert the stream gives read_source's items, order, parameter values (the last of each), problems and
    header; return how many items."""
    source = read_source(root)
    with open_stream(root) as stream:
        got = list(stream)
        problems, framework, mode = stream.problems, stream.framework, stream.mode
    params: dict[tuple[int, str], Item] = {}
    for item in got:
        if item.record.kind == Kind.PARAM:
            params[(item.record.step, item.record.module)] = item
    assert [_seen(i) for i in got if i.record.kind != Kind.PARAM] == [_seen(i) for i in source.items]
    assert [_seen(i) for i in params.values()] == [_seen(i) for i in source.params.values()]
    assert (problems, framework, mode) == (source.problems, source.framework, source.mode)
    return len(got)


def _hostile_lines(seed: int) -> list[Any]:
    """Three steps of records: links near, far (blocks back), to later records, to themselves and to the step before;
    bad and blank lines, parameter values, call records, a file outside the dump, repeated seqs."""
    rng = random.Random(seed)
    lines: list[Any] = []
    seq = 0
    for step in range(3):
        for i in range(400):
            r = rng.random()
            if seq and r < 0.3:
                lines.append(_rec(seq, step, same_as=rng.randrange(max(0, seq - 300), seq + 2)))
            elif r < 0.33:
                lines.append(_rec(seq, step, same_as=rng.randrange(0, seq + 1)))
            elif r < 0.35:
                lines.append('{"seq": ' + str(seq) + ', "module": "cut')  # a line cut short
            elif r < 0.37:
                lines.append(_rec(seq, step, kind="param", io="value", module=f"p{i % 5}"))
            elif r < 0.39:
                lines.append(_rec(seq, step, file="../outside.npy"))
            elif r < 0.40:
                lines.append(_rec(seq, step, kind="call", io="signature", dtype="", shape=[]))
            elif r < 0.41:
                lines.append("")
            else:
                lines.append(_rec(seq, step))
            seq += rng.random() > 0.03  # now and then the next record repeats this seq
    return lines


@pytest.mark.parametrize("block", [1500, 1 << 23])  # tiny blocks: links reach blocks that must be decoded again
def test_the_stream_gives_read_sources_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(streaming, "BLOCK", block)
    decoded_again: list[int] = []
    decode = streaming._Links._decoded
    monkeypatch.setattr(streaming._Links, "_decoded", lambda self, i: decoded_again.append(i) or decode(self, i))
    for seed in range(3):
        assert _same_as_read_source(_write(tmp_path / str(seed), _hostile_lines(seed))) > 1000
    if block < 4096:  # the test can fail: links to records blocks back were followed
        assert len(set(decoded_again)) > 10


def _plain_steps(seed: int) -> list[Any]:
    """Five steps whose seqs start again at 0, of records none a call or a link (blocks read without a loop per
    record: `_plain`) but for a few links in each step, to records of this step blocks back and to one of the step
    before (a seq this step has not reached); parameter values, a file outside the dump."""
    rng = random.Random(seed)
    lines: list[Any] = []
    for step in range(5):
        for seq in range(300):
            r = rng.random()
            if seq == 150:  # (a link to the step's first records: a table holding the step before's would miss it)
                lines += [_rec(seq, step, same_as=rng.randrange(5)), _rec(seq, step, same_as=seq + 5)]
            elif r < 0.03:
                lines.append(_rec(seq, step, kind="param", io="value", module=f"p{seq % 3}"))
            elif r < 0.04:
                lines.append(_rec(seq, step, file="../outside.npy"))
            else:
                lines.append(_rec(seq, step))
    return lines


@pytest.mark.parametrize("block", [1, 3000, 20_000])  # a line a block (steps start blocks), steps across blocks
def test_blocks_without_calls_or_links_give_read_sources_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               block: int) -> None:
    monkeypatch.setattr(streaming, "BLOCK", block)
    plain: list[int] = []
    take = streaming._Reader._plain_block
    monkeypatch.setattr(streaming._Reader, "_plain_block",
                        lambda self, *args: plain.append(len(args[0])) or take(self, *args))
    for seed in range(3):
        lines = _plain_steps(seed)
        assert _same_as_read_source(_write(tmp_path / str(seed), lines)) == len(lines)
    assert len(plain) > 10 and sum(plain) > 1500  # the test can fail: most records were read a block at a time


def test_line_one_may_be_a_record_and_a_producer(tmp_path: Path) -> None:
    root = _write(tmp_path, [_rec(0), _rec(1, same_as=0), _rec(2, same_as=1)], header=None)
    assert _same_as_read_source(root) == 3
    with open_stream(root) as stream:
        assert [i.record.stats for i in stream][2] is not None  # linked through line 1


def test_a_manifest_out_of_execution_order_is_unordered_before_the_record_out_of_place(tmp_path: Path) -> None:
    for lines, first in (([_rec(0), _rec(2), _rec(1)], [0, 2]), ([_rec(0, step=1), _rec(1, step=0)], [0])):
        with open_stream(_write(tmp_path / str(len(first)), lines)) as stream:
            seen = []
            with pytest.raises(UnorderedError):
                for item in stream:
                    seen.append(item.record.seq)
        assert seen == first


def test_refusals_are_read_sources_lines(tmp_path: Path) -> None:
    """No records, a header of an unknown version or nested too deep, a FIFO: the same one-line AlignerError."""
    cases = {
        "empty": ["{not json", "{also not"],
        "version": [],
        "deep": [],
        "params-only": [_rec(0, kind="param", io="value")],
    }
    headers = {"version": HEADER | {"version": 99}}
    for name, lines in cases.items():
        root = _write(tmp_path / name, lines, headers.get(name, HEADER))
        if name == "deep":
            (root / manifest.MANIFEST).write_text('{"format": "aligner-dump", "seed": ' + "[" * 10_000
                                                  + "]" * 10_000 + "}\n")
        with pytest.raises(AlignerError) as want:
            read_source(root)
        with pytest.raises(AlignerError) as got:
            with open_stream(root) as stream:
                list(stream)
        assert str(got.value) == str(want.value) and "\n" not in str(got.value)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / manifest.MANIFEST)
    with pytest.raises(AlignerError, match="not a regular file \\(a FIFO\\)"):
        open_stream(fifo)


def test_a_directory_without_a_manifest_is_read_whole(tmp_path: Path) -> None:
    import numpy as np

    np.save(tmp_path / "1_x.npy", np.ones(3, np.float32))
    np.save(tmp_path / "2_y.npy", np.zeros(3, np.float32))
    with open_stream(tmp_path) as stream:
        assert stream.mode == "npy" and [i.record.module for i in stream] == ["x", "y"]
