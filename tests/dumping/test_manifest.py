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
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.dumping import manifest
from aligner.dumping.manifest import Record
from aligner.metrics.stats import Stats

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


_FLOATS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64))


@settings(max_examples=300, deadline=None)
@given(module=st.text(max_size=8), values=st.tuples(_FLOATS, _FLOATS, _FLOATS, _FLOATS),
       args=st.one_of(st.none(), st.dictionaries(st.text(max_size=3), _FLOATS, max_size=2)))
def test_a_record_line_reads_back_as_the_record_whatever_its_values(module: str, values: tuple, args: Any) -> None:
    """to_json writes with msgspec where it can and with json where a value needs it (NaN or an infinity, which
    msgspec would write as null): either way the line decodes to the same record, and says what json would."""
    lo, hi, mean, l2 = values
    rec = Record(seq=3, module=module, kind=manifest.Kind.FORWARD, dtype="float32", shape=[2], args=args,
                 stats=Stats(min=lo, max=hi, mean=mean, l2=l2, nan=0, numel=2), file="tensors/a.npy")
    line = rec.to_json()
    back = manifest._decode(line.encode("utf-8", "surrogatepass"))
    assert (back.seq, back.module, back.file) == (3, module, "tensors/a.npy")
    kept = [(a is None and b is None) or a == b or (a != a and b != b)  # NaN stays NaN
            for a, b in zip(values, (back.stats.min, back.stats.max, back.stats.mean, back.stats.l2))]
    assert all(kept), (line, back.stats)
    assert json.loads(line, parse_constant=str) == json.loads(_json_line(rec), parse_constant=str)


_TEXT = st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)), max_size=4))


@settings(max_examples=300, deadline=None)
@given(module=_TEXT.filter(lambda t: t is not None), arg=_TEXT, skipped=_TEXT, scope=_TEXT, source=_TEXT,
       same_as=st.one_of(st.none(), st.integers(0, 2**40)), with_stats=st.booleans())
def test_a_record_line_is_the_line_of_its_fields_less_the_optional_nulls_byte_for_byte(
        module: str, arg: str | None, skipped: str | None, scope: str | None, source: str | None,
        same_as: int | None, with_stats: bool) -> None:
    """A record with no call arguments is encoded as the struct with its optional fields' nulls cut from the end:
    the line is byte for byte the one a dict of its fields less those nulls gives, whichever of them are set."""
    stats = Stats(min=-1.0, max=2.5, mean=0.25, l2=3.0, nan=0, numel=6) if with_stats else None
    rec = Record(seq=7, module=module, type="Conv2d", kind=manifest.Kind.FORWARD, io=manifest.Io.INPUT,
                 dtype="float32", shape=[2, 3], stats=stats,
                 file=None if same_as is not None else "tensors/a.npy", call=4, parent="", same_as=same_as,
                 source=source, arg=arg, skipped=skipped, scope=scope)
    fields = {k: v for k, v in msgspec.structs.asdict(rec).items() if not (k in manifest._OPTIONAL and v is None)}
    assert rec.to_json() == msgspec.json.encode(fields).decode()


def _json_line(rec: Record) -> str:
    """The line as json alone wrote it (the encoder before msgspec took the plain lines)."""
    data = msgspec.structs.asdict(rec) | {"stats": rec.stats and rec.stats.to_dict()}
    return json.dumps({k: v for k, v in data.items() if not (k in manifest._OPTIONAL and v is None)})


_PLAIN = st.recursive(
    st.one_of(_FLOATS, st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(args=st.dictionaries(st.text(max_size=3), _PLAIN, max_size=3),
       attrs=st.one_of(st.none(), st.dictionaries(st.text(max_size=3), _PLAIN, max_size=4)))
def test_a_call_record_line_says_what_json_would_whatever_its_arguments(args: dict, attrs: Any) -> None:
    """A call record's arguments and settings go through msgspec only when no float anywhere in them is a NaN or an
    infinity (nested in lists and dicts too), no string is a lone surrogate and no integer overflows it; the line
    says what json alone would have written."""
    rec = Record(seq=1, module="m", type="Conv2d", kind=manifest.Kind.CALL, io=manifest.Io.SIGNATURE, dtype="",
                 shape=[], call=1, args=args, attrs=attrs)
    line = rec.to_json()
    assert json.loads(line, parse_constant=str) == json.loads(_json_line(rec), parse_constant=str)
