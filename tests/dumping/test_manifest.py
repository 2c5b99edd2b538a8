"""`manifest.decode_block` (a block of record lines in one msgspec call, the per-record pass skipped where no record
needs it) gives what decoding each line alone gives (`decode_line`): the same records, field for field, and the same
problem lines; and `blocks` numbers and counts the lines it cuts."""
from __future__ import annotations

import io
import json
import random
from typing import Any

import msgspec
import pytest

from aligner.dumping import manifest
from aligner.dumping.manifest import Record

ODD = ["call", "skipped", "alias", "unknown", "args", "deep args", "deep attrs", "attrs", "bfloat16"]


def _line(rng: random.Random, seq: int, plain: bool, what: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"seq": seq, "step": 0, "module": f"m{seq % 7}", "type": "Linear", "kind": "forward",
                           "io": "output", "index": 0, "dtype": "float32", "shape": [2, 3],
                           "stats": {"min": -1.0, "max": 1.0, "mean": 0.0, "l2": 2.0, "nan": 0, "inf": 0},
                           "file": None}
    if plain:
        return rec
    what = what or rng.choice(ODD)
    if what == "call":  # a call record's dtype is "" whatever the line says
        rec |= {"kind": "call", "io": "signature", "dtype": "float32"}
    elif what == "skipped":  # keeps the name of the dtype no reader supports (or the one it was given)
        rec |= rng.choice([{"dtype": "complex64", "skipped": "unsupported dtype complex64"},
                           {"dtype": "torch.float32", "skipped": "RuntimeError: a hook failed"}]) | {"stats": None}
    elif what == "alias":  # a spelling of a supported dtype: its canonical name
        rec |= {"dtype": rng.choice(["torch.float16", "Float32", "mindspore.float32", "half"])}
    elif what == "unknown":  # a problem line
        rec |= {"dtype": "complex64"}
    elif what == "args":
        rec |= {"args": {"p": [1, 2, {"q": None}]}}
    elif what.startswith("deep"):  # a problem line (nested too deep)
        deep: Any = 0
        for _ in range(80):
            deep = [deep]
        rec |= {what.split()[1]: {"x": deep}}
    elif what == "attrs":
        rec |= {"attrs": {"class": "Linear", "in_features": 3}}
    else:
        rec |= {"dtype": "bfloat16"}
    return rec


def _one_at_a_time(block: bytes, lineno: int) -> list[Any]:
    out = []
    for n, line in enumerate(io.BytesIO(block), lineno):
        if line.strip():
            entry = manifest.decode_line(n, line)
            out.append(msgspec.json.encode(entry) if isinstance(entry, Record) else str(entry))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_a_block_decodes_as_its_lines_one_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    odd = rng.choice([0.0, 0.002, 0.05, 0.3])  # blocks of plain records only, and with a few or many others
    lines = [json.dumps(_line(rng, seq, rng.random() >= odd)) for seq in range(rng.randrange(1, 400))]
    block = ("\n".join(lines) + "\n").encode()
    canonical_of: dict[str, str] = {}
    got = manifest.decode_block(block, 5, canonical_of, len(lines))
    assert [msgspec.json.encode(e) if isinstance(e, Record) else e for e in got] == _one_at_a_time(block, 5)
    again = manifest.decode_block(block, 5, canonical_of)  # the dtype names cached, the lines counted here
    assert [msgspec.json.encode(e) if isinstance(e, Record) else e for e in again] == _one_at_a_time(block, 5)


@pytest.mark.parametrize("what", ODD)
def test_one_line_that_needs_a_look_among_plain_ones_gets_it(what: str) -> None:
    rng = random.Random(0)
    lines = [json.dumps(_line(rng, seq, seq != 150, what)) for seq in range(300)]
    block = ("\n".join(lines) + "\n").encode()
    got = manifest.decode_block(block, 2, {}, len(lines))
    assert [msgspec.json.encode(e) if isinstance(e, Record) else e for e in got] == _one_at_a_time(block, 2)


def test_blocks_cut_whole_lines_numbered_and_counted() -> None:
    text = b"".join(b'{"line": %d}\n' % n for n in range(1, 500)) + b'{"line": 500}'  # the last line unterminated
    fh = io.BytesIO(text)
    fh.readline()  # line 1: the header
    cut = list(manifest.blocks(fh, 100))
    assert b"".join(block for _, _, block, _ in cut) == text[len(b'{"line": 1}\n'):]
    for offset, lineno, block, lines in cut:
        assert text[offset:offset + len(block)] == block and block.endswith((b"\n", b"}"))
        assert json.loads(block.splitlines()[0]) == {"line": lineno} and lines == len(block.splitlines())
