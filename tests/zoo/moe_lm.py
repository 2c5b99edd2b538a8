"""Sparse mixture-of-experts decoder: transformers `MixtralForCausalLM` vs mindone.transformers `MixtralForCausalLM`,
tiny config (vocab 128, hidden 32, 2 layers, 4 query heads / 2 key-value heads, 4 experts of intermediate 32, top-2
routing with renormalised top-k weights, RoPE theta 10000), eager attention, random init, no KV cache.

Migration differences found:

* none in the config (same `transformers.MixtralConfig`): router softmax -> top-2 -> renormalise, SwiGLU experts
  (`act_fn(w1(x)) * w3(x)`, then `w2`), RMSNorm eps 1e-5 agree.
* transformers loops over the experts that received tokens; mindone over every expert (an expert with no token runs on
  an empty [0, hidden] batch). With 24 tokens and top-2 of 4 experts every expert gets tokens here (the builder
  asserts it), so both sides record the same expert calls.
* mindone needs CPU routes for mint Embedding/arange (tests/zoo/ms_compat.py); names are identical (`--like` copies
  every tensor).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
           tie_word_embeddings=False, use_cache=False, router_jitter_noise=0.0, attention_dropout=0.0)


def build(seed: int = 0, batch: int = 2, seq: int = 12) -> Pair:
    import transformers
    from mindone.transformers import MixtralForCausalLM as MsMixtral

    seed_all(seed)
    cfg = transformers.MixtralConfig(**CFG)
    cfg._attn_implementation = "eager"
    pt = transformers.MixtralForCausalLM(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsMixtral(cfg)
    msm.set_train(False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG["vocab_size"], (batch, seq)).astype(np.int64)
    inputs = {"input_ids": ids}
    return Pair(name="moe_mixtral", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0])
