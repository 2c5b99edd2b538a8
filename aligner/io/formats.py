"""Picking the checkpoint reader or writer of a file (re-exported by aligner.io).

Formats: "pytorch" (.pth/.pt/.bin), "mindspore" (.ckpt), "safetensors", "npy" (.npy/.npz, read only).
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from aligner.core.atomic import atomic_open
from aligner.core.errors import AlignerError
from aligner.core.files import open_input
from aligner.io.base import TensorInfo, TensorSource
from aligner.io.mindspore_ckpt import MindSporeCkptSource, write_ckpt
from aligner.io.npy_files import open_npy
from aligner.io.pytorch_pth import TorchSource, write_pth
from aligner.io.safetensors_format import SafetensorsSource, write_safetensors

EXTENSIONS = {".pth": "pytorch", ".pt": "pytorch", ".bin": "pytorch", ".tar": "pytorch", ".ckpt": "mindspore",
              ".safetensors": "safetensors", ".npy": "npy", ".npz": "npy"}
WRITABLE = ("pytorch", "mindspore", "safetensors")



def _sniff(path: str) -> str | None:
    """The format told by a regular file's first bytes (None when they say nothing)."""
    with open_input(path) as fh:
        head = fh.read(16)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "pytorch"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if head[:1] == b"\x0a":
        return "mindspore"
    return None


def detect_format(path: str, for_output: bool = False) -> str:
    """The format of `path`, from its extension, or for inputs without a known one from its first bytes."""
    ext = os.path.splitext(path)[1].lower()
    if ext in EXTENSIONS:
        return EXTENSIONS[ext]
    if not for_output and os.path.isfile(path):
        found = _sniff(path)
        if found:
            return found
    known = ", ".join(sorted(EXTENSIONS))
    raise AlignerError(f"{path}: unknown checkpoint format (expected one of {known})")


def open_checkpoint(path: str, allow_pickle: bool = False, fmt: str | None = None) -> TensorSource:
    """Open any supported checkpoint for lazy reading."""
    if not os.path.exists(path):
        raise AlignerError(f"{path}: no such file")
    if os.path.isdir(path):
        raise AlignerError(f"{path}: is a directory, expected a checkpoint file")
    if not os.path.isfile(path):
        raise AlignerError(f"{path}: not a regular file (a device, pipe or socket), expected a checkpoint file")
    if not os.access(path, os.R_OK):
        raise AlignerError(f"{path}: permission denied")
    fmt = fmt or detect_format(path)
    if fmt == "pytorch":
        return TorchSource(path, allow_pickle=allow_pickle)
    if fmt == "mindspore":
        return MindSporeCkptSource(path)
    if fmt == "safetensors":
        return SafetensorsSource(path)
    return open_npy(path)


def write_checkpoint(path: str, fmt: str, items: Iterable[tuple[str, np.ndarray]], infos: dict[str, TensorInfo],
                     framework: str | None = None) -> None:
    """Write tensors atomically (temp file + rename). `infos` lists every name in order, before the data streams."""
    if fmt not in WRITABLE:
        raise AlignerError(f"cannot write format {fmt!r} (writable: {', '.join(WRITABLE)})")
    try:
        with atomic_open(path) as fh:
            if fmt == "pytorch":
                write_pth(fh, items)
            elif fmt == "mindspore":
                write_ckpt(fh, items)
            else:
                write_safetensors(fh, items, infos, framework)
    except OSError as exc:
        raise AlignerError(f"cannot write {path}: {exc.strerror or exc}") from None
