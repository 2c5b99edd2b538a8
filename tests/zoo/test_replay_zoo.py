"""Replay on the localization corpus: for every injected bug of tests/zoo/localization.py (real timm/transformers
models against their mindcv/mindone ports), `align replay` re-runs each MindSpore module on the torch reference's
recorded inputs and must blame the module the bug is in (its own error), or for a bug in a parent's forward code the
parent (the first module whose input differs while no earlier output does); the modules after it only inherit.
On the clean pairs (eval mode, and ResNet-50 in training mode) nothing may be blamed.

Skipped when the zoo is not installed (scripts/install_zoo.sh)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from aligner.pipelines.replay.result import ReplayStatus, ReplayVerdict  # noqa: E402
from tests.zoo import localization as loc  # noqa: E402

# bugs whose difference is computed in a parent's forward between module calls (functional ops, residuals, scales,
# wiring, routing, masks, shifts, position tables computed in a block); the scope replay names for them comes from
# compare's verdict over the same dumps (a routing weight computed in the MoE block and only forwarded by its experts)
PARENT_CODE = {"vit-glue-scale", "vit-attn-scale", "vit-softmax-axis", "bert-missing-residual",
               "llama-missing-residual", "llama-attn-scale", "llama-softmax-axis", "segformer-align-corners",
               "moe-expert-gate-up-swap", "moe-top1", "moe-no-renormalise", "moe-capacity-drop", "moe-missing-residual",
               "t5-bucket-unidirectional", "t5-num-buckets", "t5-max-distance", "t5-cross-attention-mask",
               "t5-encoder-ff-missing-residual", "t5-ops-log-bucket", "qwen2-gate-up-swap", "qwen2-causal-mask",
               "swin-shift-direction", "swin-shift-size", "swin-mask-off", "swin-missing-mlp-residual",
               "cnn-inplace-mask", "vit-inplace-mask"}


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.id) for b in loc.CATALOGUE])
def test_replay_blames_the_module_with_the_bug(pair_runs, bug):
    result = loc.replay_bug(pair_runs(bug.family), bug)
    expected = ReplayVerdict.PARENT_CODE if bug.id in PARENT_CODE else ReplayVerdict.LAYER
    assert (result.verdict, result.blame) == (expected, bug.expected), \
        [(r.module, r.status.value, r.reason) for r in result.rows if r.status is not ReplayStatus.OK][:6]
    assert not result.skipped, [(result.rows[i].module, result.rows[i].reason) for i in result.skipped]
    if expected is ReplayVerdict.LAYER:
        row = result.rows[result.culprit]
        # its own error, from inputs that agree: what compare alone cannot prove
        assert row.inherited is not None and not row.inherited.diverged
    # later calls of other modules are right on the reference's inputs: nothing else makes its own error
    first = result.culprit if expected is ReplayVerdict.LAYER else result.parent_code
    assert first is not None
    own = {r.module for r in result.rows[first + 1:] if r.status is ReplayStatus.LOCAL}
    assert own <= {bug.expected}, own


@pytest.mark.parametrize("family,train", [(f, False) for f in loc.FAMILIES] + [("cnn", True)])
def test_clean_pair_replays_clean(pair_runs, family, train):
    result = loc.replay_bug(pair_runs(family), None, train=train)
    assert result.verdict is ReplayVerdict.MATCH, \
        [(r.module, r.status.value, r.local and r.local.max_abs_err) for r in result.rows
         if r.status is not ReplayStatus.OK][:6]
    assert not result.skipped
