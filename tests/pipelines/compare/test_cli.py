"""`align compare` end to end through the real entry point: exit codes, reports, bad input, bad files."""
from __future__ import annotations

import csv
import json
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import run_align
from tests.support.compare_fixtures import write_dump

RNG = np.random.default_rng(1)


def align(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`align compare ARGS...` through the suite's harness."""
    return run_align("compare", *args, cwd=cwd)


def _npy_dirs(tmp: Path, n: int = 6, bug_at: int | None = None) -> tuple[Path, Path]:
    a, b = tmp / "a", tmp / "b"
    a.mkdir()
    b.mkdir()
    h = RNG.standard_normal((4, 8)).astype(np.float32)
    for i in range(n):
        h = np.tanh(h * 1.5).astype(np.float32)
        np.save(b / f"{i}_layer{i}.npy", h)
        np.save(a / f"{i}_layer{i}.npy", h + np.float32(0.05) if i == bug_at else h)
    return a, b


def test_clean_pair_exits_0(tmp_path: Path) -> None:
    a, b = _npy_dirs(tmp_path)
    res = align(str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert "No divergence" in res.stdout and res.stderr == ""


def test_divergence_exits_1_and_writes_every_report(tmp_path: Path) -> None:
    a, b = _npy_dirs(tmp_path, n=12, bug_at=10)  # files 10 and 11 sort after 2..9 by number, not by name
    out = tmp_path / "out"
    out.mkdir()
    res = align(str(a), str(b), "--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--html",
                str(out / "r.html"))
    assert res.returncode == 1, res.stderr
    assert "First forward divergence at layer10" in res.stdout.replace("\n", " ")
    result = json.loads((out / "r.json").read_text())
    assert [r["module"] for r in result["rows"]] == [f"layer{i}" for i in range(12)]
    assert result["findings"][0]["origin_module"] == "layer10"
    assert result["rows"][10]["max_abs_err"] == pytest.approx(0.05, rel=1e-3)
    rows = list(csv.DictReader((out / "r.csv").open()))
    assert len(rows) == 12 and rows[10]["status"] == "diverged" and rows[10]["label"] == "introduced"
    page = (out / "r.html").read_text()
    assert "Plotly.newPlot" in page  # the interactive chart (the browser test checks it draws)
    assert '<tr id="row-10" class="diverged origin"><td class="num">10</td><td class="mod">layer10' in page
    assert sorted(p.name for p in out.iterdir()) == ["r.csv", "r.html", "r.json"]  # no temp files left


def test_json_to_stdout_is_pure_json(tmp_path: Path) -> None:
    a, b = _npy_dirs(tmp_path, bug_at=2)
    res = align(str(a), str(b), "--json", "-")
    assert res.returncode == 1
    assert json.loads(res.stdout)["findings"][0]["module"] == "layer2"


def _bad(tmp: Path) -> dict[str, list[str]]:
    a, b = _npy_dirs(tmp)
    (tmp / "empty").mkdir()
    (tmp / "afile").write_text("x")
    (tmp / "exists.json").write_text("{}")
    return {
        "missing directory": [str(tmp / "nope"), str(b)],
        "empty directory": [str(tmp / "empty"), str(b)],
        "not a directory": [str(tmp / "afile"), str(b)],
        "same directory": [str(a), str(a)],
        "rtol not a number": [str(a), str(b), "--rtol", "abc"],
        "negative atol": [str(a), str(b), "--atol", "-1"],
        "nan rtol": [str(a), str(b), "--rtol", "nan"],
        "workers zero": [str(a), str(b), "--workers", "0"],
        "bad ref": [str(a), str(b), "--ref", "tensorflow"],
        "ref framework absent": [str(a), str(b), "--ref", "mindspore"],
        "map missing": [str(a), str(b), "--map", str(tmp / "nomap.yaml")],
        "json exists": [str(a), str(b), "--json", str(tmp / "exists.json")],
        "html to stdout": [str(a), str(b), "--html", "-"],
        "two stdout reports": [str(a), str(b), "--json", "-", "--csv", "-"],
        "csv into missing dir": [str(a), str(b), "--csv", str(tmp / "no" / "r.csv")],
        "same report file": [str(a), str(b), "--csv", str(tmp / "r.x"), "--json", str(tmp / "r.x")],
    }


@pytest.mark.parametrize("case", [
    "missing directory", "empty directory", "not a directory", "same directory", "rtol not a number",
    "negative atol", "nan rtol", "workers zero", "bad ref", "ref framework absent", "map missing", "json exists",
    "html to stdout", "two stdout reports", "csv into missing dir", "same report file"])
def test_bad_input_is_one_line_exit_2_no_output(tmp_path: Path, case: str) -> None:
    args = _bad(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    res = align(*args, cwd=tmp_path)
    assert res.returncode == 2, (case, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("align: error: "), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_bad_files_mark_their_rows_and_the_rest_is_compared(tmp_path: Path) -> None:
    a, b = _npy_dirs(tmp_path, n=6)
    (a / "1_layer1.npy").write_bytes((a / "1_layer1.npy").read_bytes()[:100])  # truncated
    (a / "2_layer2.npy").write_bytes(b"this is not numpy")  # corrupted
    with open(a / "3_layer3.npy", "wb") as fh:  # a pickled object array must never be unpickled
        np.lib.format.write_array(fh, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    marker = tmp_path / "pwned"
    with open(a / "4_layer4.npy", "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        fh.write(pickle.dumps(__import__("pathlib").Path(marker)))
    res = align(str(a), str(b), "--json", "-")
    assert res.returncode == 2, res.stderr  # nothing diverged, but not everything could be compared
    rows = {r["module"]: r for r in json.loads(res.stdout)["rows"]}
    assert "truncated" in rows["layer1"]["error"]
    assert "not a .npy" in rows["layer2"]["error"]
    assert "pickled" in rows["layer3"]["error"] and "pickled" in rows["layer4"]["error"]
    assert rows["layer0"]["status"] == rows["layer5"]["status"] == "ok"
    assert not marker.exists()


def test_unparsable_manifest_line_and_missing_tensor_file(tmp_path: Path) -> None:
    x = RNG.standard_normal(16).astype(np.float32)
    recs = [{"module": f"m{i}", "array": x * (i + 1)} for i in range(4)]
    b = write_dump(tmp_path / "b", "pytorch", recs)
    a = write_dump(tmp_path / "a", "mindspore", recs)
    lines = (a / "manifest.jsonl").read_text().splitlines()
    lines[2] = lines[2][:25]  # record m1 cut mid-line
    (a / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    missing = json.loads(lines[3])["file"]
    (a / missing).unlink()
    res = align(str(a), str(b), "--json", "-")
    result = json.loads(res.stdout)
    assert res.returncode == 2  # m2's tensor file is missing: not everything could be compared
    assert "manifest.jsonl line 3" in result["manifest_problems"][0]
    rows = {r["module"]: r for r in result["rows"]}
    assert rows["m1"]["status"] == "unmatched" and "file missing" in rows["m2"]["error"]
    assert rows["m0"]["status"] == rows["m3"]["status"] == "ok"


def test_dtype_spellings_are_canonical_and_pytorch_is_the_default_reference(tmp_path: Path) -> None:
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    recs = [{"module": "fc", "type": "Linear", "array": x}]
    pt = write_dump(tmp_path / "pt", "pytorch", recs, dtype_spelling="torch.float32")
    msd = write_dump(tmp_path / "ms", "mindspore", recs, dtype_spelling="Float32")
    res = align(str(pt), str(msd), "--json", "-")
    result = json.loads(res.stdout)
    assert res.returncode == 0 and result["rows"][0]["dtype_a"] == result["rows"][0]["dtype_b"] == "float32"
    assert result["reference"].startswith(str(pt))  # PyTorch, although it is the first argument
    flipped = json.loads(align(str(pt), str(msd), "--json", "-", "--ref", "second").stdout)
    assert flipped["reference"].startswith(str(msd))


def test_relative_error_divides_by_the_reference(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    np.save(a / "x.npy", np.array([2.0], np.float32))
    np.save(b / "x.npy", np.array([1.0], np.float32))
    rel = json.loads(align(str(a), str(b), "--json", "-").stdout)["rows"][0]["max_rel_err"]
    rel_first = json.loads(align(str(a), str(b), "--json", "-", "--ref", "first").stdout)["rows"][0]["max_rel_err"]
    assert (rel, rel_first) == (1.0, 0.5)


def test_map_renames_the_first_side_and_unmatched_are_reported(tmp_path: Path) -> None:
    x = RNG.standard_normal(8).astype(np.float32)
    ref = [{"module": "encoder.fc", "array": x}, {"module": "head", "array": 2 * x},
           {"module": "extra", "array": 3 * x}]
    other = [{"module": "enc.fc", "array": x}, {"module": "head", "array": 2 * x}]
    a = write_dump(tmp_path / "a", "mindspore", other)
    b = write_dump(tmp_path / "b", "pytorch", ref)
    (tmp_path / "map.yaml").write_text("regex:\n  - ['^enc\\.', 'encoder.']\n")
    mapped = align(str(a), str(b), "--json", "-", "--map", str(tmp_path / "map.yaml"))
    result = json.loads(mapped.stdout)
    by = {r["module"]: (r["matched_by"], r["status"]) for r in result["rows"]}
    assert by == {"encoder.fc": ("name", "ok"), "head": ("name", "ok"), "extra": (None, "unmatched")}
    assert mapped.returncode == 0 and result["counts"]["unmatched_b"] == 1  # listed, not a failure
    strict = align(str(a), str(b), "--map", str(tmp_path / "map.yaml"), "--strict")
    assert strict.returncode == 1 and "1 only in the reference (a failure under --strict)" in strict.stdout
    res = align(str(a), str(b), "--json", "-")
    assert res.returncode == 0
    assert json.loads(res.stdout)["rows"][0]["matched_by"] == "content"  # without the map: by content and shape
    (tmp_path / "bad.yaml").write_text("rename: [1, 2\n")
    bad = align(str(a), str(b), "--map", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_help_lists_every_option() -> None:
    res = align("--help")
    for opt in ("--ref", "--map", "--rtol", "--atol", "--bisect", "--json", "--csv", "--html", "--all", "--workers",
                "--force", "--strict"):
        assert opt in res.stdout
