"""Decoder LM: transformers `LlamaForCausalLM` vs mindone.transformers `LlamaForCausalLM`, tiny config (vocab 128,
hidden 32, 2 layers, 4 query heads / 2 key-value heads (GQA), intermediate 64, RoPE theta 10000), eager attention,
random init, no KV cache (`use_cache=False`).

Migration differences found:

* none in the config: both read the same `transformers.LlamaConfig`; RMSNorm eps, SiLU, RoPE agree.
* mindone 0.5.0 uses `mindspore.mint` ops without CPU kernels (Embedding, arange, ...): tests/zoo/ms_compat.py.
* naming is identical (`mint.nn.Linear` keeps `weight`), so `align convert --like` copies every tensor.
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)


def build(seed: int = 0, batch: int = 2, seq: int = 12) -> Pair:
    import transformers
    from mindone.transformers import LlamaForCausalLM as MsLlama

    seed_all(seed)
    cfg = transformers.LlamaConfig(**CFG)
    cfg._attn_implementation = "eager"
    pt = transformers.LlamaForCausalLM(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsLlama(cfg)
    msm.set_train(False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG["vocab_size"], (batch, seq)).astype(np.int64)
    inputs = {"input_ids": ids}
    return Pair(name="decoder_llama", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0])
