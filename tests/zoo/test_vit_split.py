"""A real fused-vs-separate pair: timm ViT (fused `attn.qkv`) converted with `align convert --like` alone (no map)
into mindone's `ViTModel` (separate query/key/value); the split is detected, reported, and the outputs agree.

Skipped when the zoo is not installed (scripts/install_zoo.sh).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401,E402  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from tests.zoo import ms_compat, vit_split  # noqa: E402
from tests.zoo.common import run_align  # noqa: E402

# float32 on both sides; kernels sum in different orders: measured max |torch - ms| 2.7e-6 over outputs of
# magnitude ~1..5. A wrong split order (query <-> key in one block) moves them by > 0.1, so 2e-5 (the zoo pairs'
# tolerance, tests/zoo/test_zoo_pairs.py) separates the two by orders of magnitude either way.
ATOL = 2e-5


@pytest.fixture(scope="module", autouse=True)
def mindspore_cpu_routes():
    ms_compat.install()
    yield
    ms_compat.uninstall()


def test_timm_fused_qkv_split_into_mindone_query_key_value(tmp_path):
    pair = vit_split.build(seed=0)
    before = pair.max_abs_diff()
    assert before > 1e-2, f"outputs agree before conversion ({before}); the comparison proves nothing"

    converted = pair.make_equal(tmp_path)   # align convert --like, no --map; strict load into the MindSpore model
    after = pair.max_abs_diff()
    print(f"vit_split: max|torch - ms| = {after:.3g} (before conversion {before:.3g})")
    assert after <= ATOL
    for block in range(vit_split.DEPTH):
        assert (f"split blocks.{block}.attn.qkv.weight -> encoder.layer.{block}.attention.attention.query.weight, "
                "...key.weight, ...value.weight (axis 0)") in pair.convert_stdout
    assert "unexpected" not in pair.convert_stdout and "missing" not in pair.convert_stdout

    plan = json.loads(run_align("convert", str(tmp_path / "vit_split_torch.pth"), "-o", str(tmp_path / "again.ckpt"),
                                "--like", str(tmp_path / "vit_split_ms_init.ckpt"), "--json", "-").stdout)
    assert len(plan["splits"]) == 2 * vit_split.DEPTH and plan["counts"] == {"structural": 26, "transformed": 12}

    # the order matters and the comparison sees it: query and key of block 0 swapped -> the outputs part
    params = ms.load_checkpoint(str(converted))
    prefix = "encoder.layer.0.attention.attention."
    for leaf in ("weight", "bias"):
        q, k = params[f"{prefix}query.{leaf}"].asnumpy(), params[f"{prefix}key.{leaf}"].asnumpy()
        params[f"{prefix}query.{leaf}"] = ms.Parameter(ms.Tensor(k), name=f"{prefix}query.{leaf}")
        params[f"{prefix}key.{leaf}"] = ms.Parameter(ms.Tensor(q), name=f"{prefix}key.{leaf}")
    ms.load_param_into_net(pair.ms_model, params, strict_load=True)
    swapped = pair.max_abs_diff()
    assert swapped > 1e-2, swapped
    assert np.isfinite(swapped)
