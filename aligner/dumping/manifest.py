"""The dump directory format shared by `aligner.dump` (writer) and `align compare` (reader).

A dump directory holds `manifest.jsonl` and `tensors/*.npy`:

* line 1, the header: ``{"format": "aligner-dump", "version": 2, "framework": "pytorch" | "mindspore" | "numpy",
  "framework_version": ..., "aligner_version": ..., "mode": "full" | "stats", "seed": {...} | null,
  "rank": null, "world_size": null}`` (rank layout: room for multi-rank dumps);
* one line per record, in execution order: ``{"seq", "step", "module", "type", "kind", "io", "index", "dtype",
  "shape", "stats", "file"}`` and, from version 2, ``"call", "parent", "same_as", "source"`` and, where they apply,
  ``"arg", "args", "attrs"`` (see `Record`).

Version 1 dumps (no call structure, no op/buffer records) are still read: their new fields are null.

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
VERSION = 2
READABLE_VERSIONS = (1, 2)
# forward/backward: module calls; param_grad: parameter gradients; probe: aligner.save; op: one tensor operation
# called inside a zoomed module (dump(ops=True)); buffer: a normalisation buffer after a training-mode forward;
# call: one module call's signature (no tensor: `args`, and `attrs` on a module's first call of a step), written with
# inputs for replay; param: a parameter's or buffer's value at the start of a step (dump(params=True)).
KINDS = ("forward", "backward", "param_grad", "probe", "op", "buffer", "param", "call")


@dataclasses.dataclass
class Record:
    """One dumped tensor.

    kind/io: forward -> io "input"|"output"; backward -> io "grad_input" (gradient w.r.t. the module's inputs, i.e.
    flowing out of it) | "grad_output"; param_grad -> module is the full parameter name, io "grad"; probe (aligner.save)
    -> module is the probe name, io "output"; op -> module is the module whose forward called the op, type the op as
    called ("torch.matmul", "Tensor.__mul__", "ops.BatchMatMul"), io "input"|"output"; buffer -> module is the
    normalisation module, io the buffer in PyTorch's words ("running_mean", "running_var"). `index` is the position
    within the flattened inputs/outputs.

    Version 2 fields (None in version 1 dumps):
    call: the id of the module or op call the record belongs to (a call's inputs and outputs share it);
    parent: the path of the innermost module whose forward was running when the call was made ("" the model itself,
    None called outside the model: the model's own inputs);
    same_as: for an input, the seq of the earlier record holding this very tensor (no file: the input is that
    record's output, unchanged); an input computed by code between module calls is stored with its own file;
    source: "file.py:line" of the code that called an op;
    arg: for an input, where the tensor sat in the call: "0" the first positional argument, "mask" a keyword,
    "1/0" the first element of a tuple passed second;
    args: for a call record, the call's arguments as JSON (`aligner.dumping.signature`): tensors as {"tensor": i}
    (i the input index), other values as they were, so a replay can call the module the same way;
    attrs: for a call record, the module's class and scalar attributes (on its first call in a step), so a repro can
    build the layer without the user's code.
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
    call: int | None = None
    parent: str | None = None
    same_as: int | None = None
    source: str | None = None
    arg: str | None = None
    args: dict[str, Any] | None = None
    attrs: dict[str, Any] | None = None

    def to_json(self) -> str:
        data = dict(vars(self))  # shallow: dataclasses.asdict deep-copies stats/args/attrs (10x slower per record)
        for name in _OPTIONAL:  # only call and input records carry these: no null on every other line
            if data[name] is None:
                del data[name]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Record":
        """A record from one parsed manifest line; a missing field or a field of the wrong type is a ValueError
        (the reader skips that line and reports it)."""
        missing = {"seq", "module", "kind", "dtype", "shape"} - data.keys()
        if missing:
            raise ValueError(f"missing field(s) {', '.join(sorted(missing))}")
        values: dict[str, Any] = {"type": "", "io": "output", "index": 0} | {
            k: v for k, v in data.items() if k in _FIELD_TYPES}
        for name, value in values.items():
            allowed = _FIELD_TYPES[name]
            if isinstance(value, bool) or not isinstance(value, allowed):
                if not (value is None and type(None) in allowed):
                    raise ValueError(f"field {name!r} is {type(value).__name__}, expected "
                                     f"{' or '.join(t.__name__ for t in allowed if t is not type(None))}")
        shape = values["shape"]
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
            raise ValueError(f"field 'shape' must list non-negative integers, got {shape!r}"[:200])
        stats = values.get("stats")
        if stats is not None and any(not isinstance(v, (int, float, type(None))) or isinstance(v, bool)
                                     for v in stats.values()):
            raise ValueError("field 'stats' must map names to numbers")
        rec = cls(**values)
        rec.dtype = canonical(rec.dtype) if rec.kind != "call" else ""
        return rec


_OPTIONAL = ("arg", "args", "attrs")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,), "module": (str,), "type": (str,), "kind": (str,), "io": (str,), "index": (int,), "dtype": (str,),
    "shape": (list,), "step": (int,), "stats": (dict, type(None)), "file": (str, type(None)),
    "call": (int, type(None)), "parent": (str, type(None)), "same_as": (int, type(None)),
    "source": (str, type(None)), "arg": (str, type(None)), "args": (dict, type(None)),
    "attrs": (dict, type(None))}


def write_header(path: str | os.PathLike, framework: str, framework_version: str, mode: str,
                 seed: dict[str, Any] | None = None) -> None:
    """Start a manifest with its header line (the dump writer appends records after it)."""
    header = {"format": FORMAT, "version": VERSION, "framework": framework, "framework_version": framework_version,
              "aligner_version": __version__, "mode": mode, "seed": seed, "rank": None, "world_size": None}
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
