"""Verdicts on synthetic dumps written with numpy: origin vs accumulation, inherited labels, NaN origin, bisect."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aligner.pipelines.compare.run import compare
from aligner.render.compare import to_json
from tests.support.compare_fixtures import chain, write_dump

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 64)).astype(np.float32)
WEIGHTS = [np.linalg.qr(RNG.standard_normal((64, 64)))[0].astype(np.float32) for _ in range(12)]
LAYERS = [lambda h, w=w: h @ w for w in WEIGHTS]


def _run(tmp: Path, ref: list[dict[str, Any]], other: list[dict[str, Any]], **kw: Any) -> tuple[int, dict[str, Any]]:
    a, b = write_dump(tmp / "a", "mindspore", other), write_dump(tmp / "b", "pytorch", ref)
    result = compare(str(a), str(b), **kw)
    return int(result.exit_code), json.loads(json.dumps(to_json(result)))


def _rows(result: dict[str, Any], module: str) -> list[dict[str, Any]]:
    return [r for r in result["rows"] if r["module"] == module and r["io"] == "output"]


def test_origin_is_where_error_is_introduced_not_where_it_crosses_tolerance(tmp_path: Path) -> None:
    noise = RNG.standard_normal(X.shape).astype(np.float32)
    # layer 2 adds an error below tolerance; every later layer adds a little more until it crosses tolerance
    bug = {2: lambda h: h @ WEIGHTS[2] + 3e-6 * noise}
    bug.update({i: (lambda h, i=i: h @ WEIGHTS[i] + 2e-6 * noise) for i in range(3, 12)})
    code, result = _run(tmp_path, chain(X, LAYERS), chain(X, LAYERS, bug))
    f = result["findings"][0]
    first = result["rows"][f["first"]]
    assert code == 1 and first["module"] != "layer2" and first["label"] == "inherited"
    assert f["origin_module"] == "layer2"
    assert "error starts at layer2" in result["summary"] and "below tolerance" in result["summary"]


def test_introduced_then_inherited_labels(tmp_path: Path) -> None:
    code, result = _run(tmp_path, chain(X, LAYERS), chain(X, LAYERS, {4: lambda h: h @ WEIGHTS[4] * 1.01}))
    assert code == 1 and result["findings"][0]["origin_module"] == "layer4"
    assert _rows(result, "layer4")[0]["label"] == "introduced"
    assert [_rows(result, f"layer{i}")[0]["label"] for i in range(5, 12)] == ["inherited"] * 7
    assert [_rows(result, f"layer{i}")[0]["status"] for i in range(4)] == ["ok"] * 4
    # a second, much larger bug downstream is a new origin of error too, not just inherited
    _, result2 = _run(tmp_path / "two", chain(X, LAYERS),
                      chain(X, LAYERS, {4: lambda h: h @ WEIGHTS[4] * 1.001, 8: lambda h: h @ WEIGHTS[8] + 1.0}))
    assert _rows(result2, "layer8")[0]["label"] == "introduced"


def test_without_input_records_the_previous_record_is_the_input(tmp_path: Path) -> None:
    code, result = _run(tmp_path, chain(X, LAYERS, inputs=False),
                        chain(X, LAYERS, {6: lambda h: h @ WEIGHTS[6] * 1.01}, inputs=False))
    assert code == 1 and result["findings"][0]["origin_module"] == "layer6"
    assert _rows(result, "layer7")[0]["label"] == "inherited"


def test_nan_origin_is_first_non_finite_output_from_finite_inputs(tmp_path: Path) -> None:
    def log(h: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.log(h)  # negative inputs give NaN
    same = {3: lambda h: np.log(np.abs(h) + 1)}
    code, result = _run(tmp_path, chain(X, LAYERS, same), chain(X, LAYERS, {3: log}))
    nan = result["nan_origin"]
    assert code == 1 and nan["side"] == "a" and result["rows"][nan["row"]]["module"] == "layer3"
    assert result["findings"][0]["origin_module"] == "layer3"
    assert "First NaN/Inf: layer3" in result["summary"]


def test_identical_nan_on_both_sides_is_a_match_but_still_reported(tmp_path: Path) -> None:
    both = {3: lambda h: np.where(h > 0, h, np.nan)}
    code, result = _run(tmp_path, chain(X, LAYERS, both), chain(X, LAYERS, both))
    assert code == 0 and result["findings"] == []
    assert result["rows"][result["nan_origin"]["row"]]["module"] == "layer3"


@pytest.mark.parametrize("at", [0, 5, 11])
def test_bisect_reads_log_n_pairs_and_finds_the_same_record(tmp_path: Path, at: int) -> None:
    layers = LAYERS * 10  # 120 layers, 240 records
    ref = chain(X, layers)
    other = chain(X, layers, {10 * at + 3: lambda h: h * 1.01})
    full_code, full = _run(tmp_path / "full", ref, other)
    code, result = _run(tmp_path / "bisect", ref, other, bisect=True)
    assert code == full_code == 1
    assert result["findings"][0]["first"] == full["findings"][0]["first"]
    # the reads prove the answer is the first divergence only when every record before it was read (issue 27: the
    # record before it matching proves nothing about records it does not depend on)
    assert result["bisect_confirmed"] is (result["bisect_unread"] == 0)
    n = len(result["rows"])
    # the last record, a binary search (log2 n), the samples before the answer (about isqrt n), the walk up its
    # inputs
    assert result["bisect_reads"] <= 1 + math.ceil(math.log2(n)) + math.isqrt(n) + 4
    assert sum(r["status"] != "unread" for r in result["rows"]) == result["bisect_reads"]
    assert ("not ruled out" in result["summary"]) is (not result["bisect_confirmed"])


def test_bisect_on_a_clean_pair_reads_about_sqrt_n_pairs(tmp_path: Path) -> None:
    """A matching last record no longer ends the search: evenly spaced samples (every isqrt(n)-th) must also match,
    since a divergence a later layer evens out would otherwise pass unseen."""
    code, result = _run(tmp_path, chain(X, LAYERS), chain(X, LAYERS), bisect=True)
    n = len(result["rows"])
    assert code == 0 and result["findings"] == []
    assert result["bisect_reads"] <= -(-n // math.isqrt(n)) + 1  # n / isqrt(n) samples and the last record


def test_bisect_finds_a_divergence_that_does_not_last_to_the_end(tmp_path: Path) -> None:
    layers = LAYERS * 10  # 240 records
    ref = chain(X, layers)
    other = chain(X, layers, {53: lambda h: h * 1.01, 80: lambda h: h / 1.01})  # parts at 53, rejoins at 80
    full_code, full = _run(tmp_path / "full", ref, other)
    code, result = _run(tmp_path / "bisect", ref, other, bisect=True)
    assert code == full_code == 1 and result["findings"][0]["first"] == full["findings"][0]["first"]
    n = len(result["rows"])
    assert result["bisect_reads"] <= -(-n // math.isqrt(n)) + 12  # samples, binary search, confirmation, inputs
