"""Helpers for the compare tests: write aligner dump directories from numpy arrays (no tests here)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.dtypes import canonical, to_storable
from aligner.dumping import manifest
from aligner.metrics.stats import tensor_stats


def write_dump(root: Path, framework: str, records: list[dict[str, Any]], mode: str = "full",
               dtype_spelling: str | None = None) -> Path:
    """A dump directory like aligner.dump writes: header, one line per record, content-addressed tensors.

    Each record dict has module, array and optionally type, kind, io, index, step. `dtype_spelling` writes the
    dtype field as e.g. "Float32" or "torch.float32" (the reader canonicalizes it).
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / manifest.TENSOR_DIR).mkdir(exist_ok=True)
    manifest.write_header(root, framework, "test", mode)
    with open(root / manifest.MANIFEST, "a", encoding="utf-8") as fh:
        for seq, spec in enumerate(records):
            array = np.asarray(spec["array"])
            rec = manifest.Record(seq=seq, module=spec["module"], type=spec.get("type", "Layer"),
                                  kind=spec.get("kind", "forward"), io=spec.get("io", "output"),
                                  index=spec.get("index", 0), dtype=canonical(array.dtype), shape=list(array.shape),
                                  step=spec.get("step", 0), stats=tensor_stats(array))
            if mode == "full":
                stored = to_storable(array)
                digest = hashlib.sha256(stored.tobytes() + str(stored.shape).encode()).hexdigest()[:16]
                rec.file = f"{manifest.TENSOR_DIR}/{digest}.npy"
                if not (root / rec.file).exists():
                    np.save(root / rec.file, stored)
            line = json.loads(rec.to_json())
            if dtype_spelling:
                line["dtype"] = dtype_spelling
            fh.write(json.dumps(line) + "\n")
    return root


def chain(x: np.ndarray, layers: list, bug: dict[int, Any] | None = None, inputs: bool = True) -> list[dict[str, Any]]:
    """Records of a sequential model: layer i applies layers[i] (or bug[i] instead); with input records if asked."""
    bug = bug or {}
    out = []
    h = x
    for i, fn in enumerate(layers):
        if inputs:
            out.append({"module": f"layer{i}", "io": "input", "array": h})
        h = bug.get(i, fn)(h).astype(np.float32)
        out.append({"module": f"layer{i}", "array": h})
    return out
