"""Property fuzzing of every reader in io/ (pth, ckpt, safetensors, npy, npz) and of map files, through `align inspect
--stats` and `align convert` run in-process: mutated valid files and generated headers. Whatever the bytes, the exit
code is 0, 1 or 2; a 2 is one stderr line; never "internal error" or a traceback; no pickle runs; nothing is written
but the named output. The example count comes from the profile (`bounded` by default, `pytest --fuzz-long`)."""
from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hostile.test_readers import MARKER, Evil, ckpt_bytes, npy_header, safetensors_bytes, tree
from tests.support.cli import align_in_process

TENSORS = {"conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
           "bn.running_mean": np.ones(2, np.float16), "fc.bias": np.array([1, -2], np.int64)}


def _seeds() -> dict[str, bytes]:
    """Small valid files of each format (and a pickle that would run code): the material mutations start from."""
    out = {}
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(v) for k, v in TENSORS.items()}, buf)
    out["pth"] = buf.getvalue()
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "x": Evil()}, buf)
    out["evil.pth"] = buf.getvalue()
    out["ckpt"] = b"".join(ckpt_bytes(k, list(v.shape) or [0], {"float32": "Float32", "float16": "Float16",
                                                                  "int64": "Int64"}[str(v.dtype)], v.tobytes())
                           for k, v in TENSORS.items())
    header, data = {}, b""
    for k, v in TENSORS.items():
        header[k] = {"dtype": {"float32": "F32", "float16": "F16", "int64": "I64"}[str(v.dtype)],
                     "shape": list(v.shape), "data_offsets": [len(data), len(data) + v.nbytes]}
        data += v.tobytes()
    out["safetensors"] = safetensors_bytes(header, data)
    buf = io.BytesIO()
    np.save(buf, TENSORS["conv.weight"])
    out["npy"] = buf.getvalue()
    for name, save in (("npz", np.savez), ("compressed.npz", np.savez_compressed)):
        buf = io.BytesIO()
        save(buf, **TENSORS)
        out[name] = buf.getvalue()
    return out


SEEDS = _seeds()


def _check(proc_list: list, workdir: Path, before: dict, output: str) -> None:
    """The properties every run must keep."""
    for proc in proc_list:
        assert proc.returncode in (0, 1, 2), (proc.args, proc.returncode, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, (proc.args, proc.stderr)
        if proc.returncode == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, (proc.args, proc.stderr)
    after = tree(workdir)
    stray = set(after) - set(before) - {output}
    assert not stray, stray
    assert {k: v for k, v in after.items() if k in before} == before
    assert not (workdir / MARKER).exists()


def _run_on(capsys: pytest.CaptureFixture[str], name: str, data: bytes,
            extra: tuple[tuple[str, str], ...] = ()) -> None:
    """Write `data` as `name` in a fresh directory (also the current one), then inspect --stats and convert it (with
    the map file among the `extra` (name, text) files, if any)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        os.chdir(workdir)
        try:
            (workdir / name).write_bytes(data)
            for fname, text in extra:
                (workdir / fname).write_text(text)
            before = tree(workdir)
            procs = [align_in_process(capsys, "inspect", "--stats", name),
                     align_in_process(capsys, "convert", name, "-o", "out.safetensors", "--allow-incomplete",
                                      *(("--map", extra[0][0]) if extra else ()))]
            _check(procs, workdir, before, "out.safetensors")
        finally:
            os.chdir(old)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """The seed with a few bytes flipped or overwritten, cut short, or with a run of bytes inserted."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, ord("{"), ord("-"), ord("9")]))
        elif kind == "cut":
            del data[pos:]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@pytest.mark.parametrize("seed,name", [("pth", "m.pth"), ("evil.pth", "m.pth"), ("ckpt", "m.ckpt"),
                                       ("safetensors", "m.safetensors"), ("npy", "m.npy"), ("npz", "m.npz"),
                                       ("compressed.npz", "m.npz")])
def test_mutated_files(capsys: pytest.CaptureFixture[str], seed: str, name: str) -> None:
    """Byte-level mutations of a valid file of each format keep every property."""
    @settings()
    @given(data=mutated(SEEDS[seed]))
    def run(data: bytes) -> None:
        _run_on(capsys, name, data)
    run()


NAMES = st.text(max_size=6)  # any name, leading dots included (tests/hostile/test_readers.py)
INTS = st.one_of(st.integers(-3, 40), st.sampled_from([1 << 31, 1 << 32, (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 63)]))
JSON_ANY = st.recursive(st.none() | st.booleans() | INTS | st.floats(allow_nan=False) | st.text(max_size=4),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                   max_size=3), max_leaves=8)


@settings()
@given(entries=st.dictionaries(
    NAMES,
    st.one_of(JSON_ANY, st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "BF16", "I64", "BOOL", "X"]),
                                               "shape": st.lists(INTS, max_size=3) | JSON_ANY,
                                               "data_offsets": st.lists(INTS, min_size=2, max_size=2) | JSON_ANY})),
    max_size=3),
    data_len=st.integers(0, 64), meta=JSON_ANY)
def test_generated_safetensors_headers(capsys: pytest.CaptureFixture[str], entries: dict, data_len: int,
                                       meta: object) -> None:
    """Any JSON header (entries, shapes, offsets, metadata of any type or size) keeps every property."""
    _run_on(capsys, "g.safetensors", safetensors_bytes({"__metadata__": meta, **entries}, bytes(data_len)))


@settings()
@given(values=st.lists(st.tuples(NAMES, st.lists(INTS, max_size=4),
                                 st.sampled_from(["Float32", "Float16", "BFloat16", "Int8", "Bool", "Str"]),
                                 st.binary(max_size=40)), min_size=1, max_size=3))
def test_generated_ckpt_values(capsys: pytest.CaptureFixture[str], values: list) -> None:
    """Checkpoint values with any dims (negative, huge, empty), types and content lengths keep every property."""
    _run_on(capsys, "g.ckpt", b"".join(ckpt_bytes(*v) for v in values))


SHAPES = st.one_of(st.lists(INTS, max_size=3).map(lambda s: "(" + "".join(f"{d}, " for d in s) + ")"),
                   st.text(max_size=8).map(repr), st.sampled_from(["(2,", "None", "[2]", "(2.5,)", "((1,),)"]))


@settings()
@given(descr=st.sampled_from(["<f4", ">f4", "<f2", "|b1", "<i8", "|O", "<c8", "<U3", "V4", "<f4'"]), shape=SHAPES,
       payload=st.binary(max_size=64), version=st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x00"]),
       in_npz=st.booleans(), compressed=st.booleans())
def test_generated_npy_headers(capsys: pytest.CaptureFixture[str], descr: str, shape: str, payload: bytes,
                               version: bytes, in_npz: bool, compressed: bool) -> None:
    """.npy headers declaring any dtype and shape, alone or as an .npz member, keep every property."""
    raw = npy_header(descr, shape, version) + payload
    if not in_npz:
        _run_on(capsys, "g.npy", raw)
        return
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as zf:
        zf.writestr("w.npy", raw)
    _run_on(capsys, "g.npz", buf.getvalue())


SECTION_VALUES = st.one_of(JSON_ANY, st.dictionaries(st.sampled_from(["conv.weight", "fc.bias", "x"]), JSON_ANY,
                                                     max_size=2),
                           st.lists(st.fixed_dictionaries({"op": st.sampled_from(["split", "concat", "reshape",
                                                                                  "transpose", "nope"])},
                                                          optional={"source": JSON_ANY, "pattern": JSON_ANY,
                                                                    "sources": JSON_ANY, "axis": JSON_ANY,
                                                                    "targets": JSON_ANY, "target": JSON_ANY,
                                                                    "shape": JSON_ANY, "perm": JSON_ANY}),
                                    max_size=2))


@settings()
@given(sections=st.dictionaries(st.sampled_from(["rename", "regex", "drop", "transforms", "other"]), SECTION_VALUES,
                                max_size=3) | JSON_ANY)
def test_generated_map_files(capsys: pytest.CaptureFixture[str], sections: object) -> None:
    """Map files whose sections hold values of any type keep every property through `align convert --map`."""
    _run_on(capsys, "m.pth", SEEDS["pth"], (("map.yaml", yaml.safe_dump(sections)),))


def test_seeds_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """The unmutated seeds convert (exit 0), so the fuzzing starts from files that work; the evil one is refused."""
    for seed, name in [("pth", "m.pth"), ("ckpt", "m.ckpt"), ("safetensors", "m.safetensors"), ("npy", "m.npy"),
                       ("npz", "m.npz"), ("compressed.npz", "m.npz")]:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_bytes(SEEDS[seed])
            proc = align_in_process(capsys, "inspect", "--stats", "--json", "-", str(Path(tmp) / name))
            assert proc.returncode == 0, (seed, proc.stderr)
            assert {t["name"] for t in json.loads(proc.stdout)["tensors"]} <= set(TENSORS) | {"m"}, seed
