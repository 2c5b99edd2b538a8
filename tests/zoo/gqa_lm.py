"""Rotary decoder with grouped-query attention: transformers `Qwen2ForCausalLM` vs mindone.transformers
`Qwen2ForCausalLM`, tiny config (vocab 128, hidden 32, 2 layers, 4 query heads / 1 key-value head (GQA: each
key-value head serves 4 query heads), intermediate 64, q/k/v biases, RoPE theta 10000), eager attention, random
init, no KV cache. (decoder_lm's Llama already uses GQA with 2 key-value heads; this pair adds Qwen2's biased q/k/v
projections and a single key-value head.)

Migration differences found:

* none in the config (same `transformers.Qwen2Config`; SwiGLU MLP, RMSNorm eps 1e-6, rotary tables agree).
* mindone needs CPU routes for mint Embedding/arange (tests/zoo/ms_compat.py); names are identical.
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False,
           attention_dropout=0.0, use_sliding_window=False)


def build(seed: int = 0, batch: int = 2, seq: int = 12) -> Pair:
    import transformers
    from mindone.transformers import Qwen2ForCausalLM as MsQwen2

    seed_all(seed)
    cfg = transformers.Qwen2Config(**CFG)
    cfg._attn_implementation = "eager"
    pt = transformers.Qwen2ForCausalLM(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsQwen2(cfg)
    msm.set_train(False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG["vocab_size"], (batch, seq)).astype(np.int64)
    inputs = {"input_ids": ids}
    return Pair(name="gqa_qwen2", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0])
