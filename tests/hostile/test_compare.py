"""Hostile dumps given to `align compare`: manifests naming files outside their directory, fields of the wrong type,
control characters in names, and a tensor file truncated while it is read (issue 13)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aligner.dumping import manifest
from tests.support.cli import run_align

SECRET = np.array([1234.5, 6789.25, 31337.0, 4242.125])  # values that must never appear in a report


def _dump(root: Path, records: list[dict], arrays: dict[str, np.ndarray]) -> Path:
    """A dump directory with the given raw manifest lines (written as is) and tensors/<name>.npy files."""
    (root / "tensors").mkdir(parents=True)
    manifest.write_header(root, "numpy", "test", "full")
    for name, array in arrays.items():
        np.save(root / "tensors" / f"{name}.npy", array)
    with open(root / manifest.MANIFEST, "a", encoding="utf-8") as fh:
        for line in records:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return root


def _rec(seq: int, module: str, file: str, **extra) -> dict:
    return {"seq": seq, "module": module, "kind": "forward", "dtype": "float64", "shape": [4], "file": file} | extra


def test_manifest_paths_are_confined_to_the_dump_directory(tmp_path):
    np.save(tmp_path / "secret.npy", SECRET)
    sides = []
    for side in ("a", "b"):
        root = tmp_path / side
        recs = [_rec(0, "ok", "tensors/x.npy"), _rec(1, "dotdot", "../secret.npy"),
                _rec(2, "absolute", str(tmp_path / "secret.npy")), _rec(3, "link_out", "tensors/out.npy"),
                _rec(4, "link_in", "tensors/in.npy"), _rec(5, "nested", "tensors/../../secret.npy")]
        _dump(root, recs, {"x": np.arange(4.0)})
        (root / "tensors" / "out.npy").symlink_to(tmp_path / "secret.npy")
        (root / "tensors" / "in.npy").symlink_to(root / "tensors" / "x.npy")  # stays inside: allowed
        sides.append(root)
    outputs = tmp_path / "out"
    outputs.mkdir()
    proc = run_align("compare", *sides, "--json", outputs / "r.json", "--csv", outputs / "r.csv",
                     "--html", outputs / "r.html")
    assert proc.returncode == 2, proc.stderr  # unreadable rows, no divergence among the readable ones
    report = json.loads((outputs / "r.json").read_text())
    status = {r["module"]: r["status"] for r in report["rows"]}
    assert status == {"ok": "ok", "link_in": "ok", "dotdot": "error", "absolute": "error", "link_out": "error",
                      "nested": "error"}
    for text in [proc.stdout, *(p.read_text() for p in outputs.iterdir())]:
        for value in ("1234.5", "6789.25", "31337", "4242.125", "1.23e+03", "3.13e+04"):
            assert value not in text  # nothing of the secret file reached any report


def test_plain_npy_directory_refuses_links_leading_out(tmp_path):
    np.save(tmp_path / "secret.npy", SECRET)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "0_fc.npy", np.arange(4.0))
        (tmp_path / side / "1_leak.npy").symlink_to(tmp_path / "secret.npy")
    proc = run_align("compare", tmp_path / "a", tmp_path / "b", "--json", "-")
    rows = {r["module"]: r for r in json.loads(proc.stdout)["rows"]}
    assert rows["fc"]["status"] == "ok" and rows["1_leak"]["status"] == "error"
    assert "outside the dump directory" in rows["1_leak"]["error"] and "31337" not in proc.stdout


@pytest.mark.parametrize("bad", [
    {"seq": "7"}, {"shape": [-1]}, {"shape": "4"}, {"shape": [4.0]}, {"index": None}, {"module": 3},
    {"file": 12}, {"stats": {"min": "x"}}, {"stats": [1]}, {"same_as": "0"}, {"step": True}, {"dtype": "complex999"},
])
def test_a_manifest_field_of_the_wrong_type_skips_that_line_only(tmp_path, bad):
    arrays = {"x": np.arange(4.0), "y": np.arange(4.0) * 2, "z": np.arange(4.0) * 3}
    good = [_rec(0, "first", "tensors/x.npy"), _rec(2, "last", "tensors/y.npy")]
    a = _dump(tmp_path / "a", [good[0], _rec(1, "broken", "tensors/z.npy") | bad, good[1]], arrays)
    b = _dump(tmp_path / "b", [good[0], _rec(1, "broken", "tensors/z.npy"), good[1]], arrays)
    proc = run_align("compare", a, b, "--json", "-")
    assert proc.returncode == 2 and "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert {r["module"]: r["status"] for r in report["rows"]} == {"first": "ok", "broken": "unmatched", "last": "ok"}
    assert len(report["manifest_problems"]) == 1 and "line 3" in report["manifest_problems"][0]


def test_control_characters_in_names_are_shown_escaped(tmp_path):
    evil = "blk\x1b[31m\x1b]0;owned\x07\r\u202eko"
    for side, shift in (("a", 1.0), ("b", 0.0)):
        _dump(tmp_path / side, [_rec(0, evil, "tensors/x.npy")], {"x": np.arange(4.0) + shift})
    proc = run_align("compare", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 1
    assert not any(c in proc.stdout for c in "\x1b\x07\r\u202e")
    assert "blk\\x1b[31m\\x1b]0;owned\\x07\\x0d\\u202eko" in proc.stdout  # visible, not acted on
    data = json.loads(run_align("compare", tmp_path / "a", tmp_path / "b", "--json", "-").stdout)
    assert data["rows"][0]["module"] == evil  # JSON keeps the exact name (escaped by JSON itself)


def test_a_tensor_file_truncated_while_it_is_read_is_an_error_not_a_crash(tmp_path):
    """A memory-mapped read of a file cut short under it dies of SIGBUS inside numpy; compare reads with readinto."""
    path = tmp_path / "big.npy"
    np.save(path, np.arange(3 << 20, dtype=np.float32))  # 12 MiB: read in blocks
    code = f"""
import sys
from pathlib import Path
from aligner.dumping.read.source import NpyStream, TensorError, read_npy_header
path = Path({str(path)!r})
stream = NpyStream(path, read_npy_header(path), "float32")
chunks = stream.chunks(1 << 18)
next(chunks)
with open(path, "r+b") as fh:
    fh.truncate(4 << 20)  # another process cuts the file while it is being compared
try:
    for _ in chunks:
        pass
except TensorError as exc:
    print("error:", exc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # -7 would be SIGBUS
    assert "big.npy: truncated while being compared" in proc.stdout


def test_a_mapped_file_cut_under_the_kernel_is_an_error_and_other_faults_still_kill(tmp_path):
    """The kernel folds large float32 files from their mapped pages and turns the SIGBUS of a page cut away under it
    into the row's error; a SIGBUS anywhere else (here numpy reading a cut memory map) still ends the process."""
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "big.npy", np.arange(3 << 20, dtype=np.float32))  # 12 MiB: mapped
    code = f"""
import numpy as np
from pathlib import Path
from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.read.source import read_source
from aligner.pipelines.compare.evaluate import evaluate
from aligner.dumping.pair.matching import match
root = Path({str(tmp_path)!r})
pairs = match(read_source(root / "a").items, read_source(root / "b").items, None, None)
with open(root / "b" / "big.npy", "r+b") as fh:
    fh.truncate(4 << 20)  # cut after listing: the pages past 4 MiB are gone
print("row:", evaluate(pairs[0], ToleranceSpec()).error, flush=True)
view = np.load(root / "a" / "big.npy", mmap_mode="r")
with open(root / "a" / "big.npy", "r+b") as fh:
    fh.truncate(0)
print(float(view.sum()))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "row: big.npy: truncated while being compared" in proc.stdout
    assert proc.returncode == -7, (proc.returncode, proc.stderr)  # SIGBUS, as without aligner's handler


def test_symlink_loops_are_refused_not_followed(tmp_path):
    for side in ("a", "b"):
        root = _dump(tmp_path / side, [_rec(0, "loop", "tensors/loop.npy")], {})
        os.symlink(root / "tensors" / "loop.npy", root / "tensors" / "loop.npy")
    proc = run_align("compare", tmp_path / "a", tmp_path / "b", "--json", "-")
    assert proc.returncode == 2 and json.loads(proc.stdout)["rows"][0]["status"] == "error"


def test_error_messages_naming_hostile_paths_stay_one_escaped_line(tmp_path):
    evil = tmp_path / "dir\nwith\x1b[31mnewline"
    proc = run_align("compare", evil, tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "\x1b" not in proc.stderr and "dir\\nwith\\x1b[31mnewline" in proc.stderr


def test_a_nul_character_in_a_file_field_is_a_row_error_not_a_crash(tmp_path):
    """A manifest `file` holding a NUL (JSON "\\u0000") names no possible file: that row is an error, the rest
    compared (os calls raise ValueError on it: `align repro` gave "internal error: embedded null byte")."""
    sides = [_dump(tmp_path / side, [_rec(0, "ok", "tensors/x.npy"), _rec(1, "nul", "tensors/x.npy\u0000.txt")],
                   {"x": np.arange(4.0)}) for side in ("a", "b")]
    proc = run_align("compare", *sides, "--json", "-")
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
    status = {r["module"]: (r["status"], r["error"]) for r in json.loads(proc.stdout)["rows"]}
    assert status["ok"] == ("ok", None) and status["nul"][0] == "error" and "NUL" in status["nul"][1]
    assert len(proc.stderr.strip().splitlines()) <= 1
