"""Fuzzing `align compare` manifests and `align diff` inputs (issue 13): generated manifest lines (any JSON value in any
field, broken JSON, links to anywhere) and generated checkpoints never give an internal error, a traceback, or a
read outside the named directories. Budget from the hypothesis profile (conftest: bounded, or --fuzz-long)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.dumping import manifest
from tests.support.cli import align_in_process

SECRET = np.array([31337.0, 4242.125])
FIELDS = ("seq", "module", "type", "kind", "io", "index", "dtype", "shape", "step", "stats", "file", "call",
          "parent", "same_as", "source")
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 65), 1 << 65) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["tensors/x.npy", "../secret.npy", "/etc/passwd", "tensors/link.npy", "forward", "input",
                       "float32", "op", "buffer"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=10)
GOOD = {"seq": 0, "module": "m", "type": "Linear", "kind": "forward", "io": "output", "index": 0, "dtype": "float64",
        "shape": [2], "step": 0, "stats": None, "file": "tensors/x.npy"}
LINE = st.one_of(
    st.builds(lambda changes: GOOD | changes, st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4)),
    st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=len(FIELDS)),
    st.text(max_size=40))


def _dump(root: Path, lines: list, header: dict | None = None) -> None:
    (root / "tensors").mkdir(parents=True)
    np.save(root / "tensors" / "x.npy", np.arange(2.0))
    (root / "tensors" / "link.npy").symlink_to(root.parent / "secret.npy")
    head = {"format": "aligner-dump", "version": 2, "framework": "numpy"} | (header or {})
    text = [json.dumps(head)] + [line if isinstance(line, str) else json.dumps(line) for line in lines]
    (root / manifest.MANIFEST).write_text("\n".join(text) + "\n")


def _check(proc) -> None:
    assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) <= 1, proc.stderr
    assert "31337" not in proc.stdout and "4242.1" not in proc.stdout  # nothing of the file outside was read


@settings()
@given(lines_a=st.lists(LINE, max_size=6), lines_b=st.lists(LINE, max_size=6),
       header=st.dictionaries(st.sampled_from(["version", "framework", "mode", "format"]), VALUES, max_size=2))
def test_generated_manifests(capsys: pytest.CaptureFixture[str], lines_a, lines_b, header) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.save(root / "secret.npy", SECRET)
        _dump(root / "a", lines_a, header)
        _dump(root / "b", lines_b)
        for extra in ([], ["--bisect"], ["--json", "-"]):
            _check(align_in_process(capsys, "compare", root / "a", root / "b", *extra))


@settings()
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".npy", ".safetensors", ".ckpt", ".pth", ".npz"]))
def test_generated_files_given_to_diff(capsys: pytest.CaptureFixture[str], data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / f"a{suffix}").write_bytes(data)
        np.save(root / "b.npy", np.arange(4.0))
        _check(align_in_process(capsys, "diff", root / f"a{suffix}", root / "b.npy"))


FACTORIES = '''
import mindspore as ms
import torch


def make_torch():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())


class _Net(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc, self.act = ms.nn.Dense(4, 4), ms.nn.GELU()

    def construct(self, x):
        return self.act(self.fc(x))


def make_ms():
    return _Net()
'''


@settings()
@given(data=st.binary(max_size=160), kind=st.sampled_from(["input.npy", "input.npz", "baseline.json",
                                                           "baseline.yaml", "input-shape"]))
def test_generated_files_given_to_audit(capsys: pytest.CaptureFixture[str], data: bytes, kind: str) -> None:
    """`align audit` with a generated --input array, --baseline file or --input-shape text (the factories are code
    the user names, so they are fixed)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "facts.py").write_text(FACTORIES)
        args = [f"{root / 'facts.py'}:make_torch", f"{root / 'facts.py'}:make_ms"]
        if kind == "input-shape":
            args += ["--input-shape", data.decode("latin-1")]
        else:
            name, _, suffix = kind.partition(".")
            (root / kind).write_bytes(data)
            args += ["--input" if name == "input" else "--baseline", root / kind]
        _check(align_in_process(capsys, "audit", *args))
