"""The verdict names the differing setting on a zoo pair (issue 27, item 6): timm vs mindcv ViT with a migration bug
injected as tests/zoo/localization.py injects it."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.zoo import localization as loc


def _finding(run: Any, bug: Callable[[Any], Any], label: str) -> Any:
    restore = bug(run.pair)
    try:
        ms_dir = run.dump_ms(run.fresh(label))
    finally:
        restore()
    result = loc.compare(ms_dir, run.reference("eval"))
    return result, result.verdict.findings[0]


def test_vit_gelu_tanh_names_approximate(pair_runs: Callable[[str], Any]) -> None:
    """vit-gelu-tanh: blocks.0.mlp.act is blamed, and its approximate setting is named with both values (MindSpore's
    nn.GELU(approximate=True) is the tanh form, timm's nn.GELU 'none')."""
    result, f = _finding(pair_runs("vit"), loc.vit_gelu_tanh, "gelu_tanh")
    assert result.module(f.origin) == "blocks.0.mlp.act"
    assert [(s.name, s.value_a, s.meaning_a, s.value_b) for s in f.settings] == [("approximate", True, "tanh", "none")]


def test_vit_layernorm_eps_names_eps(pair_runs: Callable[[str], Any]) -> None:
    """vit-layernorm-eps sets epsilon on the ops.LayerNorm operator the cell computes with (`layer_norm`), not the
    cell's own `epsilon` copy: the dump records the operator's settings, and the verdict names eps with both values
    (both sides' cell attributes agree; only the operator's does not)."""
    result, f = _finding(pair_runs("vit"), loc.vit_layernorm_eps, "ln_eps")
    assert result.module(f.origin) == "blocks.0.norm1"
    assert [(s.name, s.value_a, s.value_b) for s in f.settings] == [("eps", pytest.approx(1e-7), pytest.approx(1e-6))]
