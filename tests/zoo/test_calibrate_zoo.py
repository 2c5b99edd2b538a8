"""Calibrated tolerances on real zoo pairs: the torch reference recorded once in float64 (`aligner.noise_floor`),
then `align compare --calibrate`. A clean pair must stay clean, and an injected bug must still be named, with its
distance above the noise of its layer. Skipped when the zoo is not installed."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

import aligner  # noqa: E402
from aligner.core.progress import SILENT  # noqa: E402
from tests.zoo import localization as loc  # noqa: E402

BUGS = {b.id: b for b in loc.CATALOGUE}


@pytest.mark.parametrize("family,bug_id", [("vit", "vit-gelu-tanh"), ("encoder_lm", "bert-transposed-weight"),
                                           ("upsample", "segformer-layernorm-eps")])
def test_calibration_keeps_clean_pairs_clean_and_names_the_bug(pair_runs, family, bug_id):
    run = pair_runs(family)
    ref = run.reference("base")
    f64 = run.fresh("f64")
    aligner.noise_floor(run.pair.torch_model, run.pair.torch_tensors(), f64)
    clean = run.dump_ms(run.fresh("ms_clean_cal"))
    result = aligner.compare(clean, ref, calibrate=str(f64), progress=SILENT)
    assert result.passed, [f.message for f in result.verdict.findings][:2]
    assert result.calibration is not None and result.calibration.noise
    bug = BUGS[bug_id]
    restore = bug.inject(run.pair)
    try:
        buggy = run.dump_ms(run.fresh(f"ms_cal_{bug.id}"))
    finally:
        restore()
    result = aligner.compare(buggy, ref, calibrate=str(f64), progress=SILENT)
    finding = result.verdict.findings[0]
    assert finding.blame == bug.expected
    # the smallest of these bugs (segformer LayerNorm eps, 1.9e-5 at its output) is still well above the float32
    # noise of its layer: at least 10x (the calibrated tolerance is 3x the noise)
    assert finding.above_noise is not None and finding.above_noise > 10, finding.above_noise
