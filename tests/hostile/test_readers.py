"""Hand-made malicious and broken inputs for every reader aligner owns in io/ (pth, ckpt, safetensors, npy, npz) and
for map files, through `align inspect` and `align convert`: each is one `align: error:` line (exit 2), never an
internal error, never a pickle executed, never a write outside the named output. Files are built here, byte by byte."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from aligner.core.errors import AlignerError
from aligner.io import open_checkpoint, write_checkpoint
from aligner.io.base import TensorInfo
from tests.support.cli import align_in_process, assert_one_line_error

MARKER = "pickle_ran"


class Evil:
    """A pickle payload that would create MARKER in the current directory if it ever ran."""

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {MARKER}",))


# ---- byte-level builders -------------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """Protobuf varint (two's complement for negatives, as int64 fields are written)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def ckpt_bytes(name: str, dims: list[int], ttype: str, content: bytes) -> bytes:
    """One MindSpore checkpoint Value holding a tensor with these raw dims, type and content."""
    tensor = b"".join(b"\x08" + varint(d) for d in dims) + field(2, ttype.encode()) + field(3, content)
    return field(1, field(1, name.encode()) + field(2, tensor))


def safetensors_bytes(header: object, data: bytes = b"") -> bytes:
    """A safetensors file with this (possibly malformed) JSON header."""
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def npy_header(descr: str, shape: str, version: bytes = b"\x01\x00") -> bytes:
    """A .npy header written by hand (so it can declare anything)."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (-(len(text) + 11) % 64) + "\n"
    data = text.encode("latin1", "backslashreplace")
    return b"\x93NUMPY" + version + struct.pack("<H", len(data)) + data


def deflate_bomb(path: Path, nbytes: int) -> None:
    """An .npz whose one member honestly declares `nbytes` of float32 zeros, deflated to about nbytes / 1000."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("w.npy", "w", force_zip64=True) as fh:
            fh.write(npy_header("<f4", f"({nbytes // 4},)"))
            zeros = bytes(16 << 20)
            for _ in range(nbytes // len(zeros)):
                fh.write(zeros)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime: compared before and after a run to catch stray writes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            full = Path(dirpath, entry)
            st = full.lstat()
            out[str(full.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


HWM = ("import atexit, sys\n"
       "atexit.register(lambda: print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')), "
       "file=sys.stderr))\n")


def peak_rss_mb(code: str, cwd: Path) -> tuple[int, float]:
    """(exit code, peak RSS in MiB) of `python -c code` in a child, from its own VmHWM at exit (ru_maxrss would
    carry this test process's RSS over the fork)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", HWM + code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    line = [x for x in proc.stderr.splitlines() if x.startswith("VmHWM")][-1]
    return proc.returncode, int(line.split()[1]) / 1024


# ---- the corpus: (file name, builder, words the one-line error must contain) -----------------------------------


def _pth(obj: object) -> Callable[[Path], None]:
    return lambda p: torch.save(obj, p)


def _raw(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _npz(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> Callable[[Path], None]:
    def build(p: Path) -> None:
        with zipfile.ZipFile(p, "w", method) as zf:
            for name, data in members.items():
                zf.writestr(zipfile.ZipInfo(name or "\0"), data, method)  # "\0" writes an empty name
    return build


def _newer_zip(build: Callable[[Path], None]) -> Callable[[Path], None]:
    """A valid archive whose central directory says its members need zip version 25.5 to extract: Python's zipfile
    raises NotImplementedError on opening it (a case found by tests/fuzz/test_readers.py)."""
    def patched(p: Path) -> None:
        build(p)
        data = bytearray(p.read_bytes())
        at = data.find(b"PK\x01\x02")
        assert at >= 0
        data[at + 6:at + 8] = (255).to_bytes(2, "little")  # "version needed to extract" of the first member
        p.write_bytes(bytes(data))
    return patched


def _recursive_nest() -> dict:
    outer: dict = {"epoch": 3}
    outer["model"] = outer
    return outer


F4 = np.arange(2, dtype=np.float32).tobytes()
CORPUS: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
    # pth
    ("evil.pth", _pth({"w": torch.ones(2), "x": Evil()}), ("(it imports posix.system)", "--trust-pickle")),
    ("evil_main.pth", _pth({"x": Evil}), ("it imports tests.hostile.test_readers.Evil", "--trust-pickle")),
    ("zipver.npz", _newer_zip(_npz({"w.npy": b""})), ("zipver.npz",)),
    ("int_keys.pth", _pth({1: torch.ones(2), "b": torch.ones(2)}), ("key 1", "has type int")),
    ("sparse.pth", _pth({"s": torch.eye(3).to_sparse()}), ("'s'", "sparse_coo", "to_dense")),
    ("meta.pth", _pth({"m": torch.empty(3, 3, device="meta")}), ("'m'", "meta")),
    ("complex.pth", _pth({"c": torch.ones(2, dtype=torch.complex64)}), ("'c'", "unsupported dtype")),
    ("nest_loop.pth", _pth(_recursive_nest()), ("no tensors found",)),
    ("garbage.pth", _raw(b"\x80\x02garbage" * 10), ("safe unpickler cannot read it", "--trust-pickle")),
    ("zip_garbage.pth", _npz({"archive/data.pkl": b"\x80\x02}q\x00."}), ("cannot read pytorch file",)),
    # ckpt
    ("neg_dims.ckpt", _raw(ckpt_bytes("w", [-1, -2], "Float32", F4)), ("'w'", "negative dimension", "(-1, -2)")),
    ("huge_dims.ckpt", _raw(ckpt_bytes("w", [1 << 32, 1 << 32, 4], "Float32", b"")), ("'w'", "impossible shape")),
    ("zero_huge.ckpt", _raw(ckpt_bytes("w", [0, 1 << 40, 1 << 40], "Float32", b"")), ("impossible shape",)),
    ("short_data.ckpt", _raw(ckpt_bytes("w", [4], "Float32", F4)), ("'w'", "8 bytes", "needs 16")),
    ("bad_type.ckpt", _raw(ckpt_bytes("w", [2], "Complex64", F4)), ("unsupported type",)),
    ("split_elem.ckpt", _raw(ckpt_bytes("w", [2], "Float32", F4[:3]) + ckpt_bytes("w", [2], "Float32", F4[3:])),
     ("split inside an element",)),
    ("mixed_pieces.ckpt", _raw(ckpt_bytes("w", [2], "Float32", F4[:4]) + ckpt_bytes("w", [3], "Float32", F4[4:])),
     ("disagree",)),
    ("cut.ckpt", _raw(ckpt_bytes("w", [2], "Float32", F4)[:-3]), ("not a readable mindspore checkpoint",)),
    ("bad_utf8.ckpt", _raw(field(1, field(1, b"\xff\xfe") + field(2, b""))), ("not a readable mindspore",)),
    # safetensors
    ("list.safetensors", _raw(safetensors_bytes([1, 2])), ("a json list, expected an object",)),
    ("string.safetensors", _raw(safetensors_bytes("x")), ("a json str",)),
    ("entry.safetensors", _raw(safetensors_bytes({"w": [1]})), ("malformed header entry", "'w'")),
    ("meta.safetensors", _raw(safetensors_bytes({"__metadata__": [1]})), ("__metadata__",)),
    ("overflow.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [1 << 32, 1 << 32],
                                                              "data_offsets": [0, 0]}})), ("impossible shape",)),
    ("wrap.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [0, 1 << 31, 1 << 31],
                                                          "data_offsets": [0, 0]}})), ("impossible shape",)),
    ("neg_offset.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [1],
                                                                "data_offsets": [-4, 0]}}, b"\0" * 4)),
     ("bytes -4..0",)),
    ("past_end.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [4],
                                                              "data_offsets": [0, 16]}}, b"\0" * 8)),
     ("bytes 0..16 of a 8-byte data section",)),
    ("reversed.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [1],
                                                              "data_offsets": [8, 4]}}, b"\0" * 8)), ("8..4",)),
    ("float_shape.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [1.5],
                                                                 "data_offsets": [0, 4]}}, b"\0" * 4)),
     ("malformed shape",)),
    ("neg_shape.safetensors", _raw(safetensors_bytes({"w": {"dtype": "F32", "shape": [-1],
                                                               "data_offsets": [0, 4]}}, b"\0" * 4)),
     ("negative dimension",)),
    ("hlen.safetensors", _raw(struct.pack("<Q", 1 << 62) + b"{}"), ("header length",)),
    ("deep.safetensors", _raw(struct.pack("<Q", 200_000) + b"[" * 200_000), ("corrupted safetensors header",)),
    # npy
    ("flip.npy", _raw(npy_header("<f4", "(2,)").replace(b"'<f4'", b'"<f4\'') + F4), ("corrupted header",)),
    ("token.npy", _raw(npy_header("<f4", "(2,)").replace(b"(2,)", b"(2,'") + F4), ("corrupted header",)),
    ("object.npy", _raw(npy_header("|O", "(2,)") + b"\0" * 16), ("pickled objects",)),
    ("struct.npy", lambda p: np.save(p, np.zeros(2, [("a", "<f4")])), ("structured dtype",)),
    ("neg.npy", _raw(npy_header("<f4", "(-2,)") + F4), ("negative dimension",)),
    ("short.npy", _raw(npy_header("<f4", "(1000,)") + F4), ("truncated .npy",)),
    ("complex.npy", lambda p: np.save(p, np.ones(2, np.complex64)), ("unsupported dtype",)),
    # npz
    ("text.npz", _npz({"a.npy": b"hello world"}), ("member 'a.npy'", "corrupted header")),
    ("tib.npz", _npz({"a.npy": npy_header("<f4", "(1099511627776,)")}), ("member 'a.npy'", "4398046511104 bytes")),
    ("lying.npz", _npz({"a.npy": npy_header("<f4", "(4,)") + F4}, zipfile.ZIP_DEFLATED), ("16 bytes", "holds 8")),
    ("noname.npz", _npz({"": b"x", "a.npy": b"y"}), ("member 'a.npy'", "corrupted header")),
    ("notzip.npz", _raw(b"PK\x03\x04" + b"\0" * 40), ("not a readable .npz",)),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh current directory (a pickle that ran would leave MARKER here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name,build,needles", CORPUS, ids=[c[0] for c in CORPUS])
def test_hostile_file_is_one_line_error(workdir: Path, capsys: pytest.CaptureFixture[str], name: str,
                                        build: Callable[[Path], None], needles: tuple[str, ...]) -> None:
    """inspect, inspect --stats and convert each refuse the file in one line naming the problem; nothing is
    written, nothing runs."""
    build(workdir / name)
    before = tree(workdir)
    for args in (("inspect", name), ("inspect", "--stats", name), ("convert", name, "-o", "out.safetensors")):
        proc = align_in_process(capsys, *args)
        assert_one_line_error(proc, name, *needles)
        assert "internal error" not in proc.stderr
    assert tree(workdir) == before
    assert not (workdir / MARKER).exists()


def test_a_newer_zip_version_is_left_to_torch(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint whose zip directory asks for version 25.5: the size check cannot open it (zipfile raises
    NotImplementedError) and leaves it to torch's own reader, which reads it; it was an internal error."""
    _newer_zip(_pth({"w": torch.ones(2)}))(workdir / "zipver.pth")
    for args in (("inspect", "--stats", "zipver.pth"), ("convert", "zipver.pth", "-o", "out.safetensors")):
        proc = align_in_process(capsys, *args)
        assert proc.returncode == 0 and "internal error" not in proc.stderr, (args, proc.stderr)


def test_self_recursive_dict_with_tensors_is_read(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A state dict that contains itself: its tensors are read and the loop is skipped as a non-tensor entry."""
    state: dict = {"w": torch.arange(3.0)}
    state["self"] = state
    torch.save(state, workdir / "loop.pth")
    proc = align_in_process(capsys, "inspect", "--stats", "loop.pth", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [t["name"] for t in out["tensors"]] == ["w"] and out["tensors"][0]["max"] == 2.0
    assert "skipped 1 non-tensor entry: self" in out["summary"]["notes"]


def test_pickle_runs_only_with_trust_flag_and_hidden_alias(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal names the global and the flag, whole (not "upported global"); --trust-pickle, and its hidden
    old spelling --allow-pickle, are the only opt-in."""
    torch.save({"w": torch.ones(2), "x": Evil()}, workdir / "evil.pth")
    proc = align_in_process(capsys, "inspect", "evil.pth")
    assert "upported" not in proc.stderr.replace("unsupported", "")
    assert not (workdir / MARKER).exists()
    assert align_in_process(capsys, "inspect", "evil.pth", "--trust-pickle").returncode == 0
    assert (workdir / MARKER).exists()
    (workdir / MARKER).unlink()
    assert align_in_process(capsys, "inspect", "evil.pth", "--allow-pickle").returncode == 0
    assert (workdir / MARKER).exists()


@pytest.mark.parametrize("command", ["inspect", "convert", "diff"])
def test_every_command_names_the_pickle_flag_the_same(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Each command that reads checkpoints documents --trust-pickle, and only it (--allow-pickle is hidden)."""
    out = align_in_process(capsys, command, "--help").stdout
    assert "--trust-pickle" in out and "--allow-pickle" not in out


def test_deflate_bomb_is_refused_before_allocating(workdir: Path) -> None:
    """A 512 MiB zero member deflated to ~0.5 MiB: refused, and peak RSS stays within 64 MiB of reading a tiny .npz
    (unpacking it would add 512 MiB)."""
    deflate_bomb(workdir / "bomb.npz", 512 << 20)
    np.savez(workdir / "tiny.npz", w=np.zeros(4, np.float32))
    code = "from aligner.cli import main; main(['inspect', '--stats', {!r}])"
    _, base = peak_rss_mb(code.format("tiny.npz"), workdir)
    rc, peak = peak_rss_mb(code.format("bomb.npz"), workdir)
    assert rc == 2 and peak - base < 64, (rc, base, peak)


def test_npz_members_are_streamed_and_byte_order_fixed(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A compressed .npz with a big-endian and a Fortran-order member converts to the same values (a big-endian
    array once went into a .ckpt byte for byte: wrong numbers with success); a non-.npy member is skipped, noted."""
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    fortran = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    np.savez_compressed(workdir / "m.npz", big=big, fortran=fortran)
    with zipfile.ZipFile(workdir / "m.npz", "a") as zf:
        zf.writestr("README.txt", "hello")
    proc = align_in_process(capsys, "convert", "m.npz", "-o", "m.ckpt")
    assert proc.returncode == 0, proc.stderr
    with open_checkpoint(str(workdir / "m.ckpt")) as src:
        np.testing.assert_array_equal(src.get("big"), big)
        np.testing.assert_array_equal(src.get("fortran"), fortran)
    with open_checkpoint(str(workdir / "m.npz")) as src:
        assert any("README.txt" in note for note in src.notes)


def test_empty_vector_and_scalar_survive_ckpt(workdir: Path) -> None:
    """A shape-(0,) tensor stays (0,) through a .ckpt (MindSpore's scalar marker is dims [0] with one element)."""
    (workdir / "e.ckpt").write_bytes(ckpt_bytes("e", [0], "Float32", b"") + ckpt_bytes("s", [0], "Float32", F4[4:]))
    with open_checkpoint(str(workdir / "e.ckpt")) as src:
        assert src.get("e").shape == (0,) and src.get("s").shape == () and src.get("s") == 1.0


def test_leading_dot_name_converts(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tensor named '.a' (found by tests/fuzz/test_readers.py) converts or is refused in one line, never an internal
    error."""
    (workdir / "dot.ckpt").write_bytes(ckpt_bytes(".a", [1], "Float32", F4[:4]))
    proc = align_in_process(capsys, "convert", "dot.ckpt", "-o", "out.safetensors")
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    from safetensors.numpy import load_file
    assert list(load_file(workdir / "out.safetensors")) == [".a"]  # the name kept exactly


TRUNCATE = textwrap.dedent("""
    import os, sys
    from aligner.core.errors import AlignerError
    from aligner.io import open_checkpoint
    path, how = sys.argv[1], sys.argv[2]
    with open_checkpoint(path) as src:
        name = src.names[0]
        os.truncate(path, 100)
        try:
            list(src.chunks(name, 1 << 16)) if how == "chunks" else src.get(name).sum()
        except AlignerError as exc:
            print("ERROR", exc)
""")


@pytest.mark.parametrize("how", ["get", "chunks"])
@pytest.mark.parametrize("fmt", ["safetensors", "ckpt", "npy", "pth"])
def test_truncated_while_read_is_an_error_not_sigbus(tmp_path: Path, fmt: str, how: str) -> None:
    """A file cut short after it was opened: a clear error (a mapped read would die of SIGBUS, exit -7)."""
    data = np.arange(1 << 20, dtype=np.float32)
    path = tmp_path / f"big.{fmt}"
    if fmt == "npy":
        np.save(path, data)
    elif fmt == "pth":
        torch.save({"w": torch.from_numpy(data)}, path)
    else:
        write_checkpoint(str(path), "safetensors" if fmt == "safetensors" else "mindspore", [("w", data)],
                         {"w": TensorInfo(data.shape, "float32")})
    proc = subprocess.run([sys.executable, "-c", TRUNCATE, str(path), how], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ERROR"), (proc.returncode, proc.stdout, proc.stderr)
    assert "truncated" in proc.stdout or "ended early" in proc.stdout


def test_inspect_stats_memory_is_bounded(tmp_path: Path) -> None:
    """--stats on a 256 MiB tensor streams it: peak RSS exceeds inspect without --stats by under 64 MiB (the whole
    tensor once would be 256 MiB; the old in-memory statistics took about 5x)."""
    for fmt in ("npy", "safetensors"):
        path = tmp_path / f"big.{fmt}"
        data = np.random.default_rng(0).standard_normal(64 << 20, dtype=np.float32)
        if fmt == "npy":
            np.save(path, data)
        else:
            write_checkpoint(str(path), fmt, [("w", data)], {"w": TensorInfo(data.shape, "float32")})
        del data
        code = "from aligner.cli import main; main(['inspect', {!r}{}])"
        _, plain = peak_rss_mb(code.format(str(path), ""), tmp_path)
        rc, stats = peak_rss_mb(code.format(str(path), ", '--stats'"), tmp_path)
        assert rc == 0 and stats - plain < 64, (fmt, plain, stats)
        path.unlink()


MAPS = [
    ("rename: foo", "section rename: must be a mapping"),
    ("rename: [a, b]", "section rename: must be a mapping"),
    ("regex: 5", "section regex: must be a list"),
    ("drop: {a: 1}", "section drop: must be a list"),
    ("drop: [1]", "regex string"),
    ("transforms: x", "section transforms: must be a list"),
    ("transforms: [{op: [1]}]", "needs op one of"),
    ("regex: [[{a: 1}, b]]", "two strings"),
    ("rename: {a: [1, 2]}", "must give a name or a list of names"),
    ("- a", "expected a mapping with sections"),
    ('"x\\ry": 1', "unknown section(s) 'x\\ry'"),
]


@pytest.mark.parametrize("text,needle", MAPS, ids=[m[0] for m in MAPS])
def test_map_file_section_types(workdir: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str) -> None:
    """Every section of a map file is type-checked: one line naming the section, never an internal error."""
    torch.save({"w": torch.ones(2)}, workdir / "m.pth")
    (workdir / "m.yaml").write_text(text + "\n")
    proc = align_in_process(capsys, "convert", "m.pth", "-o", "out.ckpt", "--map", "m.yaml")
    assert_one_line_error(proc, "m.yaml", needle)
    assert not (workdir / "out.ckpt").exists()


def test_map_file_not_utf8(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": torch.ones(2)}, workdir / "m.pth")
    (workdir / "m.yaml").write_bytes(b"rename: {\xff: a}\n")
    assert_one_line_error(align_in_process(capsys, "convert", "m.pth", "-o", "o.ckpt", "--map", "m.yaml"), "UTF-8")


def test_non_regular_input_is_refused(workdir: Path) -> None:
    """A FIFO named like a checkpoint is refused at once (opening it would block forever)."""
    os.mkfifo(workdir / "pipe.npy")
    with pytest.raises(AlignerError, match="not a regular file"):
        open_checkpoint(str(workdir / "pipe.npy"))
