"""`make demo` (scripts/demo.py) runs end to end and names the injected LayerNorm epsilon bug's layer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_names_the_bug() -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py")], capture_output=True, text=True,
                          env=env, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "First forward divergence at ln1 (LayerNorm)" in proc.stdout
    assert "Step 1 differs: the forward pass differs" in proc.stdout
    compare = json.loads((ROOT / "demo_out" / "bug" / "compare.json").read_text())
    assert compare["findings"][0]["origin_module"] == "ln1"
    diff = json.loads((ROOT / "demo_out" / "clean" / "diff.json").read_text())
    assert diff["equal"] and diff["frozen_both"] == ["attn.k.bias"]  # softmax ignores a per-query shift of k
