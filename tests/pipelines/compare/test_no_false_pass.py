"""Nothing compared is never a pass; records that cannot be compared are listed like one-side records (issue 28):
compare's exit codes and JSON on hand-made dumps."""
from __future__ import annotations

import json

import numpy as np

from aligner.dumping.fstats import fast_stats_of
from tests.hostile.test_compare import _dump
from tests.support.cli import run_align


def _rec(seq: int, module: str, **extra) -> dict:
    return {"seq": seq, "module": module, "kind": "forward", "io": "output", "dtype": "float64", "shape": [4]} | extra


def test_two_dumps_with_nothing_in_common_are_not_a_pass(tmp_path):
    """Every record on one side only: 0 compared. It said "No divergence: every compared record matches", exit 0."""
    x = np.arange(4.0)
    a = _dump(tmp_path / "a", [_rec(0, "encoder.fc", file="tensors/x.npy")], {"x": x})
    b = _dump(tmp_path / "b", [_rec(0, "decoder.proj", file="tensors/y.npy", shape=[2, 2])], {"y": x.reshape(2, 2)})
    proc = run_align("compare", a, b, "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is False and report["counts"]["compared"] == 0 and report["exit_code"] == 1
    text = run_align("compare", a, b)
    assert text.returncode == 1
    assert "No divergence" not in text.stdout and "Nothing was compared" in text.stdout, text.stdout


def test_statistics_on_one_side_only_are_listed_not_an_input_error(tmp_path):
    """A record whose twin holds no statistics to compare its statistics with (msprobe keeps none for a boolean
    mask): counted and listed like a one-side record, exit 0 (it was exit 2 with `passed: true`), 1 with --strict."""
    x = np.arange(4.0)
    a = _dump(tmp_path / "a", [_rec(0, "fc", file="tensors/x.npy"),
                               _rec(1, "mask", stats=fast_stats_of(x).to_dict())], {"x": x})
    b = _dump(tmp_path / "b", [_rec(0, "fc", file="tensors/x.npy"), _rec(1, "mask", file="tensors/m.npy")],
              {"x": x, "m": x})
    proc = run_align("compare", a, b, "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    status = {r["module"]: r["status"] for r in report["rows"]}
    assert status == {"fc": "ok", "mask": "skipped"} and report["passed"] is True
    assert report["counts"]["compared"] == 1 and report["counts"]["skipped"] == 1
    strict = run_align("compare", a, b, "--strict", "--json", "-")
    assert strict.returncode == 1 and json.loads(strict.stdout)["passed"] is False
    text = run_align("compare", a, b)
    assert text.returncode == 0 and "1 record(s) could not be compared" in text.stdout, text.stdout


def test_an_unreadable_tensor_is_never_a_pass(tmp_path):
    """A record whose file is gone: exit 2 (input error) and `passed` false in the JSON (it said true)."""
    x = np.arange(4.0)
    a = _dump(tmp_path / "a", [_rec(0, "fc", file="tensors/x.npy"), _rec(1, "gone", file="tensors/gone.npy")],
              {"x": x})
    b = _dump(tmp_path / "b", [_rec(0, "fc", file="tensors/x.npy"), _rec(1, "gone", file="tensors/x.npy")], {"x": x})
    proc = run_align("compare", a, b, "--json", "-")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["passed"] is False
    # the report is written, and exit 2 still says why in one stderr line (it said nothing)
    assert proc.stderr.startswith("align: error: compare incomplete: 1 record(s) could not be read (first: gone")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_an_order_only_difference_is_reported_not_blamed(tmp_path):
    """A record holding the same rows in another order (tokens routed to an expert, sorted stably on one side only)
    and an identical record after it: exit 0 (the expert was blamed, 'introduced here'), the summary says what
    differs."""
    rows = np.random.default_rng(3).standard_normal((6, 4))
    out = rows.sum(axis=0)
    recs = [_rec(0, "experts.0", file="tensors/x.npy", shape=[6, 4]), _rec(1, "moe", file="tensors/y.npy")]
    a = _dump(tmp_path / "a", recs, {"x": rows[[5, 3, 1, 0, 2, 4]], "y": out})
    b = _dump(tmp_path / "b", recs, {"x": rows, "y": out})
    proc = run_align("compare", a, b)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 record(s) hold the same rows in another order" in proc.stdout and "introduced here" not in proc.stdout
