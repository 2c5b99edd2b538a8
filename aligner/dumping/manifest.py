"""The dump directory format shared by `aligner.dump` (writer) and `align compare` (reader).

A dump directory holds `manifest.jsonl` and `tensors/*.npy`:

* line 1, the header: ``{"format": "aligner-dump", "version": 1, "framework": "pytorch" | "mindspore" | "numpy",
  "framework_version": ..., "aligner_version": ..., "mode": "full" | "stats", "seed": {...} | null}``
* one line per record, in execution order: ``{"seq", "step", "module", "type", "kind", "io", "index", "dtype",
  "shape", "stats", "file"}`` (see `Record`).

Tensor files are content-addressed (`tensors/<digest>.npy`) so identical tensors are written once; bfloat16 tensors are
stored as their uint16 bit patterns (lossless) and the record's canonical `dtype` says how to view them.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterator

from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.core.version import __version__

MANIFEST = "manifest.jsonl"
TENSOR_DIR = "tensors"
FORMAT = "aligner-dump"
VERSION = 1
KINDS = ("forward", "backward", "param_grad", "probe")


@dataclasses.dataclass
class Record:
    """One dumped tensor.

    kind/io: forward -> io "input"|"output"; backward -> io "grad_input" (gradient w.r.t. the module's inputs, i.e.
    flowing out of it) | "grad_output"; param_grad -> module is the full parameter name, io "grad"; probe (aligner.save)
    -> module is the probe name, io "output". `index` is the position within the flattened inputs/outputs.
    """

    seq: int
    module: str
    type: str
    kind: str
    io: str
    index: int
    dtype: str
    shape: list[int]
    step: int = 0
    stats: dict[str, Any] | None = None
    file: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Record":
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = {"seq", "module", "kind", "dtype", "shape"} - data.keys()
        if missing:
            raise ValueError(f"missing field(s) {', '.join(sorted(missing))}")
        rec = cls(**{k: v for k, v in data.items() if k in fields} | {
            "type": data.get("type", ""), "io": data.get("io", "output"), "index": data.get("index", 0)})
        rec.dtype = canonical(rec.dtype)
        rec.shape = [int(s) for s in rec.shape]
        return rec


def write_header(path: str | os.PathLike, framework: str, framework_version: str, mode: str,
                 seed: dict[str, Any] | None = None) -> None:
    """Start a manifest with its header line (the dump writer appends records after it)."""
    header = {"format": FORMAT, "version": VERSION, "framework": framework, "framework_version": framework_version,
              "aligner_version": __version__, "mode": mode, "seed": seed}
    with open(Path(path) / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")


def iter_manifest(directory: str | os.PathLike) -> Iterator[tuple[int, Record | dict[str, Any] | ValueError]]:
    """Yield (line number, header dict | Record | ValueError) per line; a bad line yields its error, never raises."""
    with open(Path(directory) / MANIFEST, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
                yield lineno, (data if lineno == 1 and data.get("format") == FORMAT else Record.from_dict(data))
            except (ValueError, TypeError, AlignerError) as exc:
                yield lineno, ValueError(f"{MANIFEST} line {lineno}: {exc}")
