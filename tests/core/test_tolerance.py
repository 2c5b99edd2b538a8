"""The one Tolerance type: torch.testing's rules (both or neither, per-dtype defaults), Polygraphy-style overrides."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aligner.core.errors import AlignerError
from aligner.core.tolerance import Tolerance, ToleranceSpec
from tests.support.cli import assert_one_line_error, run_align
from tests.support.compare_fixtures import write_dump

FINITE = st.floats(-1e6, 1e6, allow_nan=False, width=64)


@given(FINITE, FINITE, st.floats(0, 1), st.floats(0, 1))
def test_allows_is_torch_isclose(a: float, b: float, rtol: float, atol: float) -> None:
    expected = bool(torch.isclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                                  rtol=rtol, atol=atol))
    assert Tolerance(rtol, atol).allows(a, b) == expected


def test_defaults_are_torch_testings() -> None:
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32),
                               ("float64", torch.float64), ("int64", torch.int64)):
        x = torch.zeros(1, dtype=torch_dtype)
        rtol, atol = torch.testing._comparison.default_tolerances(x, x)
        assert Tolerance.for_dtype(dtype) == Tolerance(rtol, atol), dtype
    assert Tolerance.for_dtype("float16", "float32") == Tolerance(1e-3, 1e-5)  # the looser of two dtypes


def test_both_or_neither() -> None:
    assert Tolerance.of(None, None) is None
    with pytest.raises(AlignerError, match="rtol was given without atol"):
        Tolerance.of(1e-3, None)
    with pytest.raises(AlignerError, match="--atol for 'fc.*' was given without --rtol"):
        ToleranceSpec.parse(["1e-3"], ["1e-5", "fc.*:1e-4"])
    with pytest.raises(AlignerError, match="finite number >= 0"):
        ToleranceSpec.parse(["-1"], ["0"])
    with pytest.raises(AlignerError, match="must be a number"):
        ToleranceSpec.parse(["abc"], ["0"])


def test_overrides_last_match_wins() -> None:
    spec = ToleranceSpec.parse(["1e-4 layer*:1e-2", "layer1:0.5"], ["1e-6, layer*:1e-3", "layer1:0"])
    assert spec.resolve("head", "float32") == Tolerance(1e-4, 1e-6)
    assert spec.resolve("layer2", "float32") == Tolerance(1e-2, 1e-3)
    assert spec.resolve("layer1", "float32") == Tolerance(0.5, 0)
    assert ToleranceSpec().resolve("x", "bfloat16") == Tolerance(1.6e-2, 1e-5)


def test_compare_per_name_override_and_lone_rtol(tmp_path: Path) -> None:
    x = np.linspace(1, 2, 32, dtype=np.float32)
    ref = [{"module": "body", "array": x}, {"module": "head", "array": x * 2}]
    other = [{"module": "body", "array": x}, {"module": "head", "array": x * 2 * (1 + 1e-3)}]
    a, b = write_dump(tmp_path / "a", "mindspore", other), write_dump(tmp_path / "b", "pytorch", ref)
    assert run_align("compare", a, b).returncode == 1  # 1e-3 relative is far above float32's 1.3e-6
    loose = run_align("compare", a, b, "--rtol", "head:2e-3", "--atol", "head:0")
    assert loose.returncode == 0 and "head: rtol=0.002, atol=0" in loose.stdout
    assert_one_line_error(run_align("compare", a, b, "--rtol", "1e-3"), "--rtol was given without --atol")


def test_raised_never_lowers() -> None:
    tol = Tolerance(1e-3, 1e-5, symmetric=True)
    assert tol.raised(2e-3, 1e-6) == Tolerance(2e-3, 1e-5, symmetric=True)
    assert tol.raised(0, 0) == tol


def test_calibrated_tolerance_yields_to_the_users_own() -> None:
    calibrated = {(0, 7): Tolerance(5e-3, 4e-3)}
    spec = ToleranceSpec(calibrated=calibrated, calibrated_from="f64/", calibration_k=3.0)
    assert spec.chosen("fc1", (0, 7)) == Tolerance(5e-3, 4e-3)  # the record's calibrated tolerance
    assert spec.chosen("fc1", (0, 8)) is None and spec.chosen("fc1") is None  # not calibrated: per dtype
    assert "calibrated per record to 3x" in spec.describe() and "(1 records)" in spec.describe()
    assert spec.to_dict()["calibration"] == {"from": "f64/", "k": 3.0, "records": 1}
    user = ToleranceSpec.parse(["fc*:1e-6"], ["fc*:1e-7"])
    mixed = ToleranceSpec(user.default, user.overrides, calibrated=calibrated, calibration_k=3.0)
    assert mixed.chosen("fc1", (0, 7)) == Tolerance(1e-6, 1e-7)  # an explicit --rtol/--atol still wins
    assert mixed.chosen("head", (0, 7)) == Tolerance(5e-3, 4e-3)
    assert ToleranceSpec().to_dict()["calibration"] is None
