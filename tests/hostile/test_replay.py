"""Hostile dumps fed to the commands that call modules back (`align replay`, `align repro`) and to `align check`:
every manifest field a replay or repro reads (call signatures, attributes, input places, parameter records) replaced
by something malformed, links pointing nowhere, tensor files missing. Each run ends in a verdict, a skipped row or one
`align: error:` line with exit 2; never a traceback, an internal error, or code named by the dump being run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mindspore as ms
import pytest
import torch

import aligner
from tests.support.cli import align_in_process
from tests.support.paths import ROOT
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)

# (name, how to change one record of the MindSpore dump's manifest)
MUTATIONS = {
    "args not an object": lambda r: r.update(args=[1, 2]) if r["kind"] == "call" else None,
    "args list of garbage": lambda r: r.update(args={"args": [{"tensor": "x"}, {"weird": 1}], "kwargs": 3})
    if r["kind"] == "call" else None,
    "placeholder out of range": lambda r: r.update(args={"args": [{"tensor": 99}], "kwargs": {}})
    if r["kind"] == "call" else None,
    "opaque argument": lambda r: r.update(args={"args": [{"tensor": 0}, {"repr": "<object>", "type": "Foo"}],
                                                "kwargs": {}}) if r["kind"] == "call" else None,
    "class names os.system": lambda r: r.update(attrs={"class": "os.system", "training": False})
    if r["kind"] == "call" else None,
    "class names a torch function": lambda r: r.update(attrs={"class": "mindspore.load_checkpoint"})
    if r["kind"] == "call" else None,
    "attrs of wrong types": lambda r: r.update(attrs={"class": 5, "training": "yes", "kernel_size": {"tuple": 3}})
    if r["kind"] == "call" else None,
    "dtype tag names an attribute": lambda r: r.update(
        attrs={"class": "mindspore.nn.Dense", "in_channels": {"dtype": "load_checkpoint"}})
    if r["kind"] == "call" else None,
    "arg of wrong type": lambda r: r.update(arg=7) if r.get("io") == "input" else None,
    "link to nowhere": lambda r: r.update(same_as=10**6) if r.get("io") == "input" else None,
    "call id a string": lambda r: r.update(call="one") if r["kind"] == "forward" else None,
    "param shape lies": lambda r: r.update(shape=[1, 2, 3]) if r["kind"] == "param" else None,
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_replay")
    tnet, mnet = make_twins("cnn", train=False)
    x = example_input("cnn")
    with aligner.dump(tnet, root / "pt", params=True), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, root / "ms", params=True):
        mnet(ms.Tensor(x))
    ms.save_checkpoint(mnet, str(root / "ms.ckpt"))
    (root / "factory.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.support.twin_models import mindspore_model\n\n"
        "def make():\n    m = mindspore_model('cnn')\n    m.set_train(False)\n    return m\n")
    return root


def _mutated(clean: Path, tmp_path: Path, name: str) -> Path:
    out = tmp_path / "ms"
    shutil.copytree(clean / "ms", out)
    lines = (out / "manifest.jsonl").read_text().splitlines()
    changed = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        MUTATIONS[name](record)
        changed.append(json.dumps(record))
    (out / "manifest.jsonl").write_text("\n".join(changed) + "\n")
    return out


def _assert_handled(proc, what: str) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, (what, proc.stderr)
    assert proc.returncode in (0, 1, 2), (what, proc.returncode, proc.stderr)
    if proc.returncode == 2:  # one error line, also after a report that says what could not be checked
        assert len(proc.stderr.strip().splitlines()) == 1, (what, proc.stderr)
        assert proc.stderr.startswith("align: error: "), (what, proc.stderr)


# what `align replay` must answer: 2 where the damage leaves something unchecked; 0 where the damaged field is
# one replay does not read (the MindSpore side's own input places and links only feed the "inherited" column)
REPLAY_EXIT = {"args not an object": 2, "args list of garbage": 2, "placeholder out of range": 2,
               "opaque argument": 0, "class names os.system": 0, "class names a torch function": 0,
               "attrs of wrong types": 0, "dtype tag names an attribute": 0, "arg of wrong type": 2,
               "link to nowhere": 0, "call id a string": 2, "param shape lies": 0}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_hostile_manifest_fields_are_handled(clean, tmp_path, capsys, name, monkeypatch):
    ms_dir = _mutated(clean, tmp_path, name)
    ran: list[str] = []
    monkeypatch.setattr("os.system", lambda *a: ran.append(str(a)) or 0)
    proc = align_in_process(capsys, "replay", clean / "pt", ms_dir, "--factory", f"{clean / 'factory.py'}:make",
                            "--weights", clean / "ms.ckpt")
    _assert_handled(proc, f"replay: {name}")
    assert proc.returncode == REPLAY_EXIT[name], (name, proc.returncode, proc.stdout[-600:], proc.stderr)
    for module in ("conv1", "bn1", "fc"):
        proc = align_in_process(capsys, "repro", clean / "pt", ms_dir, "--module", module, "-o",
                                tmp_path / f"repro_{module}")
        _assert_handled(proc, f"repro {module}: {name}")
    proc = align_in_process(capsys, "check", ms_dir)
    _assert_handled(proc, f"check: {name}")
    assert not ran, ran  # nothing the dump named was run


def test_missing_tensor_files_are_handled(clean, tmp_path, capsys):
    ms_dir = tmp_path / "ms"
    shutil.copytree(clean / "ms", ms_dir)
    pt_dir = tmp_path / "pt"
    shutil.copytree(clean / "pt", pt_dir)
    for directory in (ms_dir, pt_dir):
        for i, f in enumerate(sorted((directory / "tensors").iterdir())):
            if i % 3 == 0:
                f.unlink()
    proc = align_in_process(capsys, "replay", pt_dir, ms_dir, "--factory", f"{clean / 'factory.py'}:make",
                            "--weights", clean / "ms.ckpt")
    _assert_handled(proc, "replay: missing files")
    proc = align_in_process(capsys, "repro", pt_dir, ms_dir, "--module", "conv2", "-o", tmp_path / "r")
    _assert_handled(proc, "repro: missing files")
    proc = align_in_process(capsys, "check", ms_dir)
    _assert_handled(proc, "check: missing files")
