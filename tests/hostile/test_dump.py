"""What `aligner.dump` may delete and where it may write, and dumping from two threads at once (issue 13)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _dump(directory: Path, **options) -> None:
    net = _net()
    with aligner.dump(net, directory, progress=SILENT, **options):
        net(torch.ones(3, 4)).sum().backward()


def _dump_elsewhere(directory: Path) -> None:
    """A previous dump written by another process (a directory this process has not claimed: overwrite applies)."""
    code = ("import torch, aligner; net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
            f"with aligner.dump(net, {str(directory)!r}):\n    net(torch.ones(3, 4)).sum().backward()")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under root (not following links): file bytes, or a link's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


@pytest.mark.parametrize("plant", ["user_npy", "symlink_file", "symlink_tensors", "foreign_manifest", "extra_file"])
def test_overwrite_deletes_nothing_aligner_did_not_write(tmp_path, plant):
    target, outside = tmp_path / "dump", tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.npy").write_bytes(b"user data")
    _dump_elsewhere(target)
    if plant == "user_npy":  # a user's own file among the tensors, named like aligner's, not in the manifest
        (target / "tensors" / ("0" * 32 + ".npy")).write_bytes(b"mine")
    elif plant == "symlink_file":
        (target / "tensors" / ("1" * 32 + ".npy")).symlink_to(outside / "keep.npy")
    elif plant == "symlink_tensors":
        shutil.rmtree(target / "tensors")
        (target / "tensors").symlink_to(outside)
    elif plant == "foreign_manifest":
        (target / "manifest.jsonl").write_text('{"format": "something-else"}\n')
    else:
        (target / "notes.txt").write_text("x")
    before = _tree(tmp_path)
    with pytest.raises(AlignerError, match="not an aligner dump's own file") as info:
        _dump(target, overwrite=True)
    assert "\n" not in str(info.value)
    assert _tree(tmp_path) == before  # refused as a whole: nothing deleted, nothing written


def test_overwrite_replaces_exactly_a_previous_dump(tmp_path):
    _dump_elsewhere(tmp_path / "d")
    first = set(os.listdir(tmp_path / "d" / "tensors"))
    net = torch.nn.Linear(4, 1)
    with aligner.dump(net, tmp_path / "d", overwrite=True, progress=SILENT, backward=False):
        net(torch.full((2, 4), 3.0))
    lines = (tmp_path / "d" / "manifest.jsonl").read_text().splitlines()
    files = {json.loads(line)["file"].split("/")[1] for line in lines[1:] if json.loads(line).get("file")}
    assert set(os.listdir(tmp_path / "d" / "tensors")) == files and not first & files


def test_a_directory_removed_and_dumped_again_in_the_same_process_starts_afresh(tmp_path):
    _dump(tmp_path / "d")
    shutil.rmtree(tmp_path / "d")
    _dump(tmp_path / "d")  # not "already holds a dump from this process", not a missing-file error
    lines = (tmp_path / "d" / "manifest.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["format"] == "aligner-dump" and json.loads(lines[1])["seq"] == 0


def test_two_threads_dumping_two_models_keep_their_records_apart(tmp_path):
    errors: list[BaseException] = []

    def work(name: str, seed: int) -> None:
        try:
            torch.manual_seed(seed)
            net = _net()
            for step in range(15):
                with aligner.dump(net, tmp_path / name, step=step, progress=SILENT):
                    out = net(torch.randn(4, 4, requires_grad=True))
                    aligner.save("out", out)
                    out.sum().backward()
        except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(name, i)) for i, name in enumerate("ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    counts = []
    for name in "ab":
        recs = [json.loads(line) for line in (tmp_path / name / "manifest.jsonl").read_text().splitlines()[1:]]
        assert [r["seq"] for r in recs] == list(range(len(recs)))
        counts.append(Counter((r["kind"], r["io"]) for r in recs))
    # per step: 3 leaf calls + the model input; 2 probes would mean another thread's probe landed here
    assert counts[0] == counts[1] == Counter({
        ("forward", "input"): 15 * 4, ("forward", "output"): 15 * 3, ("probe", "output"): 15,
        ("call", "signature"): 15 * 4, ("block", "output"): 15,  # the model's own output (it has children)
        ("backward", "grad_output"): 15 * 3, ("backward", "grad_input"): 15 * 3, ("param_grad", "grad"): 15 * 4})
