"""Long comparisons run in forked worker processes; their verdicts must equal the single-worker path's exactly."""
from __future__ import annotations

import json

import numpy as np


def test_worker_processes_give_the_same_report(tmp_path, align):
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    n = 1 << 20  # 12 pairs x 2 sides x 1M elements: above the 16M-element threshold for worker processes
    for i in range(12):
        ref = rng.standard_normal(n, dtype=np.float32)
        other = ref.copy()
        if i >= 6:
            other[i * 1000] += 0.5       # diverging from pair 6 on
        if i == 9:
            other[7] = np.nan
        np.save(a / f"{i:03d}_layer{i}.npy", other)
        np.save(b / f"{i:03d}_layer{i}.npy", ref)
    (a / "010_layer10.npy").write_bytes(b"\x93NUMPY truncated")  # a bad file marks its row only
    single = align("compare", a, b, "--workers", "1", "--json", tmp_path / "one.json")
    multi = align("compare", a, b, "--workers", "2", "--json", tmp_path / "two.json")
    assert single.returncode == multi.returncode == 1, (single.stderr, multi.stderr)
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert one["rows"] == two["rows"]
    assert [r["status"] for r in one["rows"]] == ["ok"] * 6 + ["diverged"] * 4 + ["error", "diverged"]
    assert one["rows"][6]["label"] == "introduced" and one["rows"][9]["nan_a"] == 1
