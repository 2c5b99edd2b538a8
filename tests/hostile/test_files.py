"""Every file a command opens is a regular file under a size cap, read only inside the folder the user named: FIFOs,
devices, directories, symlink loops and links leading out of a dump are refused in one line or mark their row; no
command hangs or grows without bound (aligner/core/files.py).

The regression tests run in a subprocess with a timeout (a FIFO whose other end is never opened would hang the old
code) and, where the old code read /dev/zero until memory ran out, under an address-space limit. The fuzz class runs
in-process: after the fix nothing there can block.
"""
from __future__ import annotations

import io
import json
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.core.errors import AlignerError
from aligner.dumping.read.foreign import native
from aligner.dumping.read.source import load_tensor, read_source
from aligner.mapping.usermap import load_user_map
from aligner.pipelines.audit.report import load_baseline
from aligner.pipelines.losses.parse import read_losses
from tests.support import paths
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.compare_fixtures import write_dump

DATA = paths.DATA / "msprobe"
SECRET = np.array([1234.5, 6789.25, 31337.0, 4242.125], np.float32)  # numbers that must never be read
_OP = "MatMul.Default_fc-Dense_MatMul-op0.1.0.100.output.0.DefaultFormat.float32.npy"
_LIMIT = 3 << 30  # address space of a child that would read /dev/zero until MemoryError on the old code


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_LIMIT, _LIMIT))


def _run(argv: list[str], limit: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A child that must finish within 20 s (a hang on a FIFO is a failure, not a stuck suite)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, preexec_fn=_limited if limit else None,
                              env=dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3", OPENBLAS_NUM_THREADS="1",
                                       **(env or {})))
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {' '.join(argv)}")


def _align(*args: object, limit: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "aligner.cli", *map(str, args)], limit, env)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _native(tmp: Path) -> Path:
    """A minimal MindSpore 2.10 native dump (the layout native.py documents): one Dense cell `fc`, one output."""
    rank = tmp / "native" / "rank_0"
    (rank / ".dump_metadata").mkdir(parents=True)
    (rank / ".dump_metadata" / "config.json").write_text(json.dumps({"device_target": "CPU", "ms_version": "2.10.0"}))
    (rank / "execution_order").mkdir()
    (rank / "execution_order" / "ms_execution_order_graph_0.csv").write_text("Default/fc-Dense/MatMul-op0\n")
    (rank / "graphs").mkdir()
    (rank / "graphs" / "ms_output_trace_code_graph_0.ir").write_text("")
    folder = rank / "Net" / "0" / "0"
    folder.mkdir(parents=True)
    np.save(folder / _OP, np.ones((1, 4), np.float32))
    return rank


# the native dump's files, relative to its rank folder
_NATIVE_FILES = {"config": ".dump_metadata/config.json", "order": "execution_order/ms_execution_order_graph_0.csv",
                 "ir": "graphs/ms_output_trace_code_graph_0.ir", "statistic": "Net/0/0/statistic.csv",
                 "tensor": f"Net/0/0/{_OP}"}

_READ_NATIVE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from aligner.core.errors import AlignerError
    from aligner.dumping.read.foreign import native
    try:
        dump = native.read(Path(sys.argv[1]))
    except AlignerError as exc:
        print(json.dumps({"error": str(exc)}))
    else:
        print(json.dumps({"problems": dump.problems, "errors": [e.error for e in dump.entries if e.error]}))
""")


def _read_native(rank: Path) -> dict:
    proc = _run([sys.executable, "-c", _READ_NATIVE, str(rank)], limit=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _outside(tmp: Path, name: str, text: str) -> Path:
    out = tmp / "elsewhere" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    return out


# --- FIFOs and devices that hung or exhausted memory -------------------------------------------------------------

def test_audit_source_skips_a_fifo_and_dev_zero_named_py(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    _fifo(tree / "pipe.py")
    (tree / "zero.py").symlink_to("/dev/zero")
    (tree / "ok.py").write_text("import mindspore\n")
    proc = _align("audit", "--source", tree, "--json", tmp_path / "r.json", limit=True)
    assert proc.returncode == 0, proc.stderr
    skipped = json.loads((tmp_path / "r.json").read_text())["skipped"]
    assert any("pipe.py" in s and "FIFO" in s for s in skipped) and any("zero.py" in s and "device" in s
                                                                     for s in skipped), skipped
    assert_one_line_error(_align("audit", "--source", tree / "zero.py", limit=True), "not a regular file (a device)")


def test_map_fifo_does_not_hang_compare_or_convert(tmp_path: Path) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "x.npy", np.zeros(3, np.float32))
    torch.save({"w": torch.zeros(2)}, tmp_path / "src.pth")
    fifo = _fifo(tmp_path / "map.yaml")
    assert_one_line_error(_align("compare", tmp_path / "a", tmp_path / "b", "--map", fifo), "a FIFO")
    assert_one_line_error(_align("convert", tmp_path / "src.pth", "-o", tmp_path / "o.ckpt", "--map", fifo), "a FIFO")


def test_convert_like_fifo_does_not_hang(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(2)}, tmp_path / "src.pth")
    proc = _align("convert", tmp_path / "src.pth", "-o", tmp_path / "o.ckpt", "--like", _fifo(tmp_path / "t.pth"))
    assert_one_line_error(proc, "a FIFO")
    assert not (tmp_path / "o.ckpt").exists()


@pytest.mark.parametrize("which", ["order", "tensor"])
def test_native_dump_fifo_does_not_hang(tmp_path: Path, which: str) -> None:
    rank = _native(tmp_path)
    target = rank / _NATIVE_FILES[which]
    target.unlink()
    _fifo(target)
    result = _read_native(rank)
    assert "a FIFO" in json.dumps(result), result


@pytest.mark.parametrize("which", ["order", "config"])
def test_native_dump_dev_zero_is_refused_not_read(tmp_path: Path, which: str) -> None:
    rank = _native(tmp_path)
    target = rank / _NATIVE_FILES[which]
    target.unlink()
    target.symlink_to("/dev/zero")
    result = _read_native(rank)
    assert "error" in result and "outside the dump directory" in json.dumps(result), result


def test_msprobe_pt_fifo_does_not_hang_under_trust_pickle(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA / "pt_L0_tensor_fc2" / "step0" / "rank0", run)
    target = run / "dump_tensor_data" / "Module.mlp.fc2.Linear.forward.0.output.0.pt"
    target.unlink()
    _fifo(target)
    code = ("import sys; from pathlib import Path; from aligner.dumping.read.source import load_tensor, "
            "read_source\nfor it in read_source(Path(sys.argv[1]), trust_pickle=True).items:\n"
            "    try: load_tensor(it)\n    except ValueError as exc: print(exc)")
    proc = _run([sys.executable, "-c", code, str(run)])
    assert proc.returncode == 0 and "a FIFO" in proc.stdout, proc.stderr[-2000:]


# --- reads outside the native dump ---------------------------------------------------------------------------------

def test_native_tensor_leading_out_is_never_read(tmp_path: Path) -> None:
    rank = _native(tmp_path)
    np.save(tmp_path / "secret.npy", SECRET.reshape(1, 4))
    (rank / _NATIVE_FILES["tensor"]).unlink()
    (rank / _NATIVE_FILES["tensor"]).symlink_to(tmp_path / "secret.npy")
    dump = native.read(rank)
    forward = [e for e in dump.entries if e.record.module == "fc"]
    assert forward and all(e.path is None and e.load is None and "outside the dump directory" in (e.error or "")
                           for e in forward)


def test_native_indices_leading_out_are_refused(tmp_path: Path) -> None:
    rank = _native(tmp_path)
    ir = rank / _NATIVE_FILES["ir"]
    ir.unlink()
    ir.symlink_to(_outside(tmp_path, "g.ir", "# nothing\n"))
    stat_rows = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value\n"
                 "MatMul,Default_fc-Dense_MatMul-op0,1,0,100,output,0,16,float32,\"(1,4)\",31337.0\n")
    (rank / _NATIVE_FILES["statistic"]).symlink_to(_outside(tmp_path, "statistic.csv", stat_rows))
    dump = native.read(rank)
    assert any("graphs/" in p and "outside" in p for p in dump.problems), dump.problems
    assert any("statistic.csv" in p and "outside" in p for p in dump.problems), dump.problems
    assert all(e.record.stats is None for e in dump.entries)  # 31337.0 was never read
    config = rank / _NATIVE_FILES["config"]
    config.unlink()
    config.symlink_to(_outside(tmp_path, "config.json", json.dumps({"ms_version": "2.10.0"})))
    with pytest.raises(AlignerError, match="outside the dump directory"):
        native.read(rank)


def test_native_execution_order_leading_out_is_refused(tmp_path: Path) -> None:
    rank = _native(tmp_path)
    order = rank / _NATIVE_FILES["order"]
    order.unlink()
    order.symlink_to(_outside(tmp_path, "order.csv", "Default/fc-Dense/MatMul-op0\n"))
    with pytest.raises(AlignerError, match="execution_order"):
        native.read(rank)


# --- sizes: caps and bombs -----------------------------------------------------------------------------------------

def test_audit_source_caps_a_file_before_parsing_it(tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    big.write_text("import mindspore\n" + "#" * 100 + "\n" * (3 << 20))  # 3 MiB: above the 2 MiB cap
    proc = _align("audit", "--source", big)
    assert_one_line_error(proc, "cap on Python source files", "ALIGNER_MAX_SOURCE_BYTES")
    raised = _align("audit", "--source", big, env={"ALIGNER_MAX_SOURCE_BYTES": str(4 << 20)})
    assert raised.returncode == 0, raised.stderr


def test_audit_source_deep_nesting_is_skipped_like_a_syntax_error(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "deep.py").write_text("import mindspore\nx = " + "-" * 20000 + "1\n")
    proc = align_in_process(capsys, "audit", "--source", tmp_path, "--json", tmp_path / "r.json")
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["skipped"] == [f"{tmp_path / 'deep.py'}:0: too deeply "
                                                                         "nested to parse"]


def test_text_caps_name_their_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "map.yaml").write_text("rename: {a: b}\n" + "#" * 2000 + "\n")
    (tmp_path / "base.yaml").write_text("[]\n" + "#" * 2000 + "\n")
    (tmp_path / "loss.json").write_text(json.dumps([{"step": i, "loss": 1.0} for i in range(100)]))
    monkeypatch.setenv("ALIGNER_MAX_TEXT_BYTES", "1000")
    monkeypatch.setenv("ALIGNER_MAX_INDEX_BYTES", "1000")
    with pytest.raises(AlignerError, match="ALIGNER_MAX_TEXT_BYTES"):
        load_user_map(str(tmp_path / "map.yaml"))
    with pytest.raises(AlignerError, match="ALIGNER_MAX_TEXT_BYTES"):
        load_baseline(tmp_path / "base.yaml")
    with pytest.raises(AlignerError, match="ALIGNER_MAX_INDEX_BYTES"):
        read_losses(tmp_path / "loss.json")


def _bomb(path: Path) -> Path:
    """A torch zip file whose storage is 70 MB of deflated zeros (about 70 KB on disk)."""
    raw = io.BytesIO()
    torch.save(torch.zeros(70 << 18), raw)
    with zipfile.ZipFile(raw) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for member in src.infolist():
            out.writestr(member.filename, src.read(member))
    return path


def test_a_deflate_bomb_pt_is_refused_before_torch_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = _bomb(tmp_path / "bomb.pth")
    assert bomb.stat().st_size < 1 << 20
    assert_one_line_error(align_in_process(capsys, "inspect", bomb, "--trust-pickle"), "decompression bomb")
    run = tmp_path / "run"
    shutil.copytree(DATA / "pt_L0_tensor_fc2" / "step0" / "rank0", run)
    target = run / "dump_tensor_data" / "Module.mlp.fc2.Linear.forward.0.output.0.pt"
    _bomb(target)
    item = next(it for it in read_source(run, trust_pickle=True).items
                if it.record.io == "output" and it.load is not None)
    with pytest.raises(ValueError, match="decompression bomb"):
        load_tensor(item)


# --- compare's own reads: aligner dumps, rank folders, plain .npy folders ----------------------------------------

def _dumps(tmp: Path, ranks: tuple[int, ...] = ()) -> tuple[Path, Path]:
    """Two one-record aligner dumps (`a` PyTorch, `b` MindSpore), or of each rank in `ranks` (rank{N}/ folders)."""
    sides = []
    for side, framework in (("a", "pytorch"), ("b", "mindspore")):
        for folder in [tmp / side / f"rank{r}" for r in ranks] or [tmp / side]:
            write_dump(folder, framework, [{"module": "fc", "array": np.ones(3, np.float32)}])
        sides.append(tmp / side)
    return sides[0], sides[1]


def _tensor(dump: Path) -> Path:
    return next((dump / "tensors").iterdir())


def test_a_dump_tensor_that_is_a_fifo_is_named_not_called_missing(tmp_path: Path) -> None:
    a, b = _dumps(tmp_path)
    tensor = _tensor(b)
    tensor.unlink()
    _fifo(tensor)
    proc = _align("compare", a, b)
    assert_one_line_error(proc, "compare incomplete", f"{tensor}: not a regular file (a FIFO)")
    assert "file missing" not in proc.stderr + proc.stdout


def test_a_tensor_swapped_for_a_fifo_after_listing_does_not_block(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))  # a plain .npy folder: its header is read while listing
    code = ("import os, sys; from pathlib import Path; from aligner.dumping.read.source import TensorError, "
            "open_tensor, read_source\nitem = read_source(Path(sys.argv[1])).items[0]\nitem.path.unlink(); "
            "os.mkfifo(item.path)\ntry: list(open_tensor(item).chunks(8))\nexcept TensorError as exc: print(exc)")
    proc = _run([sys.executable, "-c", code, str(tmp_path)])
    assert proc.returncode == 0 and "x.npy: not a regular file (a FIFO)" in proc.stdout, proc.stderr[-2000:]


def test_a_manifest_that_is_a_fifo_or_leads_outside_is_refused_by_name(tmp_path: Path) -> None:
    a, b = _dumps(tmp_path)
    manifest = b / "manifest.jsonl"
    elsewhere = tmp_path / "elsewhere.jsonl"
    manifest.rename(elsewhere)
    manifest.symlink_to(elsewhere)
    assert_one_line_error(_align("compare", a, b), f"{b}: 'manifest.jsonl' is a link leading outside the dump")
    manifest.unlink()
    _fifo(manifest)
    assert_one_line_error(_align("compare", a, b), f"{manifest}: not a regular file (a FIFO)")


def test_a_rank_manifest_that_is_a_fifo_does_not_hang_compare_or_check(tmp_path: Path) -> None:
    a, b = _dumps(tmp_path, ranks=(0, 1))
    (b / "rank1" / "manifest.jsonl").unlink()
    _fifo(b / "rank1" / "manifest.jsonl")
    proc = _align("compare", a, b)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert f"{b / 'rank1' / 'manifest.jsonl'}: not a regular file (a FIFO)" in proc.stdout, proc.stdout
    proc = _align("check", b)
    assert proc.returncode == 2 and "unreadable rank(s) 1" in proc.stdout, (proc.stdout, proc.stderr)


def test_check_ranks_falls_back_on_statistics_for_an_unreadable_gradient(tmp_path: Path) -> None:
    for rank in (0, 1):  # all-reduced gradients that differ: 1.0 on rank 0, 2.0 on rank 1
        write_dump(tmp_path / f"rank{rank}", "pytorch", [{"module": "fc.weight", "kind": "param_grad", "io": "reduced",
                                                          "array": np.full(3, rank + 1.0, np.float32)}])
    tensor = _tensor(tmp_path / "rank1")
    tensor.unlink()
    _fifo(tensor)
    proc = _align("check", tmp_path)
    assert proc.returncode == 1 and "internal error" not in proc.stderr, proc.stderr
    assert "FAILED: 1 cross-rank error(s)" in proc.stdout, proc.stdout  # found from the manifest's statistics


# --- msprobe's indices: confined to the dump folder, regular files ------------------------------------------------

def _msprobe(tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(DATA / "ms_L0_tensor" / "step0" / "rank0", run)
    return run


@pytest.mark.parametrize("name", ["dump.json", "construct.json"])
def test_msprobe_index_leading_outside_is_refused(tmp_path: Path, name: str) -> None:
    run = _msprobe(tmp_path)
    outside = _outside(tmp_path, name, (run / name).read_text())
    (run / name).unlink()
    (run / name).symlink_to(outside)
    with pytest.raises(AlignerError, match=f"'{name}' is a link leading outside the dump directory"):
        read_source(run)


def test_msprobe_tensor_folder_leading_outside_is_never_read(tmp_path: Path) -> None:
    run = _msprobe(tmp_path)
    (run / "dump_tensor_data").rename(tmp_path / "tensors_elsewhere")
    (run / "dump_tensor_data").symlink_to(tmp_path / "tensors_elsewhere")
    items = [it for it in read_source(run).items if it.record.file]
    assert items and all(it.path is None and "leading outside the dump directory" in (it.error or "")
                         for it in items)


def test_msprobe_dump_json_that_is_a_fifo_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _msprobe(tmp_path)
    (run / "dump.json").unlink()
    _fifo(run / "dump.json")
    proc = align_in_process(capsys, "compare", run, run)
    assert_one_line_error(proc, f"{run / 'dump.json'}: not a regular file (a FIFO)")


# --- JSON and YAML nested deeper than any parser takes ------------------------------------------------------------

def test_a_repro_marker_nested_too_deep_is_not_an_internal_error(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _dumps(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "repro.json").write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    proc = align_in_process(capsys, "repro", a, b, "--module", "fc", "-o", out, "--force")
    assert_one_line_error(proc, "repro.json (missing or unreadable)")


def test_a_baseline_nested_too_deep_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(AlignerError, match="--baseline .*nested more than 64 lists or objects deep"):
        load_baseline(tmp_path / "deep.yaml")


# --- legacy (non-zip) torch files declaring storages larger than themselves ---------------------------------------

def _legacy(path: Path, numel: int) -> Path:
    """A legacy torch.save of {"w": 100 float32 zeros} whose pickle declares the storage as `numel` elements."""
    raw = io.BytesIO()
    torch.save({"w": torch.zeros(100)}, raw, _use_new_zipfile_serialization=False)
    # the storage's persistent id ends with its location 'cpu' (then a memo opcode) and its size, BININT1 100 ('Kd')
    data, found = re.subn(rb"(cpuq.)Kd", lambda m: m[1] + b"\x8a\x08" + struct.pack("<q", numel), raw.getvalue(),
                          count=1)
    assert found == 1
    path.write_bytes(data)
    return path


def test_a_legacy_torch_file_declaring_more_than_it_holds_is_refused_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forged = _legacy(tmp_path / "forged.pth", 1 << 31)  # 8 GiB of float32 declared by a file of under 1 KB
    assert forged.stat().st_size < 1024
    proc = _align("inspect", forged, limit=True)
    assert_one_line_error(proc, "its storages declare 2,147,483,648 elements, more than the")
    weights = torch.arange(12.0).reshape(3, 4)  # a real legacy file, a view sharing a storage included, still loads
    torch.save({"w": weights, "row": weights[1], "b": torch.ones(2, dtype=torch.int8)}, tmp_path / "real.pth",
               _use_new_zipfile_serialization=False)
    for trust in ((), ("--trust-pickle",)):
        proc = align_in_process(capsys, "inspect", tmp_path / "real.pth", *trust)
        assert proc.returncode == 0 and "3 tensors" in proc.stdout, proc.stderr
    run = tmp_path / "run"
    shutil.copytree(DATA / "pt_L0_tensor_fc2" / "step0" / "rank0", run)
    _legacy(run / "dump_tensor_data" / "Module.mlp.fc2.Linear.forward.0.output.0.pt", 1 << 31)
    item = next(it for it in read_source(run, trust_pickle=True).items
                if it.record.io == "output" and it.load is not None)
    with pytest.raises(ValueError, match="its storages declare"):
        load_tensor(item)


@pytest.mark.parametrize("head", [b"\x96", b"\x80\x05\x95", b"\x80\x04\x8e", b"\x80\x04\x8d"],
                         ids=["bytearray8", "frame", "binbytes8", "binunicode8"])
def test_a_pickle_declaring_an_8_byte_length_is_one_error(tmp_path: Path, head: bytes) -> None:
    """A .pth opening with a protocol 4/5 opcode that declares an 8-byte length (hypothesis found a 10-byte file
    starting BYTEARRAY8): the legacy pre-check's C unpickler printed "SystemError: deallocated bytearray object has
    exported buffers" beside the one-line error, in most runs. Several runs, each one line and exit 2."""
    bad = tmp_path / "a.pth"
    bad.write_bytes(head + b"O\x8e\x82\xb8\xd2\xb5\x99\x1f\x10")
    other = tmp_path / "b.npy"
    np.save(other, np.zeros(3, np.float32))
    for _ in range(3):
        assert_one_line_error(_align("diff", bad, other))


# --- fuzz: every kind of substitute for every file kind ------------------------------------------------------------

_SUBSTITUTES = ("fifo", "/dev/zero", "/dev/null", "loop", "directory")


def _substitute(path: Path, kind: str) -> None:
    """Put `kind` where the regular file `path` is (or would be)."""
    if path.is_file() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(kind)


def _cli_case(tmp: Path, case: str) -> tuple[Path, list[object]]:
    """(the file to substitute, the command that reads it) for one kind of file a command opens."""
    torch.save({"w": torch.zeros(2)}, tmp / "src.pth")
    for side in ("a", "b"):
        (tmp / side).mkdir(exist_ok=True)
        np.save(tmp / side / "x.npy", np.zeros(3, np.float32))
    (tmp / "run.log").write_text("step 1 loss 1.0\n")
    dump = write_dump(tmp / "d", "pytorch", [{"module": "x", "array": np.zeros(3, np.float32)}])
    run = _msprobe(tmp)
    target = tmp / {"source": "x.py", "map": "m.yaml", "like": "t.pth", "checkpoint": "c.pth", "log": "l.log",
                    "input": "in.npy", "npz": "in.npz", "manifest": "d/manifest.jsonl", "dump.json": "run/dump.json",
                    "construct.json": "run/construct.json"}[case]
    return target, {"source": ["audit", "--source", target],
                    "map": ["compare", tmp / "a", tmp / "b", "--map", target],
                    "like": ["convert", tmp / "src.pth", "-o", tmp / "o.ckpt", "--like", target],
                    "checkpoint": ["inspect", target],
                    "log": ["losses", target, tmp / "run.log"],
                    "input": ["inspect", target],
                    "npz": ["diff", target, target],
                    "manifest": ["compare", dump, tmp / "a"],
                    "dump.json": ["compare", run, tmp / "a"],
                    "construct.json": ["compare", run, tmp / "a"]}[case]


class TestFuzzFileKinds:
    """Any command, any file kind, any substitute: exit 2 with one line, no traceback, no internal error."""

    @settings()
    @given(case=st.sampled_from(["source", "map", "like", "checkpoint", "log", "input", "npz", "manifest", "dump.json",
                                 "construct.json"]),
           kind=st.sampled_from(_SUBSTITUTES))
    def test_commands(self, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
                      case: str, kind: str) -> None:
        if case == "source" and kind == "directory":
            kind = "fifo"  # a directory named x.py is a source tree, scanned
        tmp = tmp_path_factory.mktemp("cli")
        target, args = _cli_case(tmp, case)
        _substitute(target, kind)
        proc = align_in_process(capsys, *args)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert_one_line_error(proc)

    @settings()
    @given(which=st.sampled_from(sorted(_NATIVE_FILES)), kind=st.sampled_from((*_SUBSTITUTES, "outside")))
    def test_native_dump(self, tmp_path_factory: pytest.TempPathFactory, which: str, kind: str) -> None:
        tmp = tmp_path_factory.mktemp("native")
        rank = _native(tmp)
        target = rank / _NATIVE_FILES[which]
        if kind == "outside":
            if target.exists():
                target.unlink()
            np.save(tmp / "secret.npy", SECRET.reshape(1, 4))
            target.symlink_to(tmp / "secret.npy")
        else:
            _substitute(target, kind)
        try:
            dump = native.read(rank)
        except AlignerError as exc:
            assert len(str(exc).splitlines()) == 1
            return
        said = json.dumps([*dump.problems, *(e.error or "" for e in dump.entries)])
        stats = [v for e in dump.entries for v in (e.record.stats or {}).values()]
        assert not any(v in SECRET for v in stats)
        if which == "tensor":
            assert all(e.path is None for e in dump.entries) and dump.entries, said
        elif which in ("config", "order"):
            pytest.fail(f"read a {kind} as {which}: {said}")
