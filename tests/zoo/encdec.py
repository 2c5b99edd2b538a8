"""Encoder-decoder with relative position bias and cross-attention: transformers `T5ForConditionalGeneration` vs
mindone.transformers `T5ForConditionalGeneration`, tiny config (vocab 128, d_model 32, d_kv 8, d_ff 64, 2 encoder +
2 decoder layers, 4 heads, 32 relative-position buckets up to distance 128, ReLU feed-forward, dropout 0), random
init, encoder 12 tokens (the second sequence padded by 3), decoder 8 tokens, no KV cache.

Migration differences found:

* none in the config (same `transformers.T5Config`; the relative-position bias is computed in the first layer of each
  stack and handed to the others).
* MindSpore 2.10's CPU `ops.log` is off by one bucket at relative distance 16 in T5's log bucketing (log(16/8) /
  log(128/8) * 8 lands just under 2 on MindSpore's CPU): with 17+ tokens the encoder's bias table differs in the
  entries of distance 16. A real finding, kept as the catalogue entry `t5-ops-log-bucket` (17-token variant); the
  clean pair uses 12 encoder tokens (no distance reaches 16), so it is clean without a compat fix.
* feed_forward_proj 'relu' keeps tanh out (MindSpore's CPU tanh differs by up to 1e-4, which 'gated-gelu' would show).
* mindone needs CPU routes for mint Embedding (tests/zoo/ms_compat.py); names are identical (`shared`,
  `encoder.embed_tokens` and `decoder.embed_tokens` are tied on both sides: `--like` fills each).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
           relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
           feed_forward_proj="relu", use_cache=False, decoder_start_token_id=0, pad_token_id=0)


def build(seed: int = 0, batch: int = 2, seq: int = 12, dec_seq: int = 8) -> Pair:
    import transformers
    from mindone.transformers import T5ForConditionalGeneration as MsT5

    seed_all(seed)
    cfg = transformers.T5Config(**CFG)
    cfg._attn_implementation = "eager"
    pt = transformers.T5ForConditionalGeneration(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsT5(cfg)
    msm.set_train(False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CFG["vocab_size"], (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, seq - 3:] = 0
    dec = rng.integers(1, CFG["vocab_size"], (batch, dec_seq)).astype(np.int64)
    inputs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}
    return Pair(name="encdec_t5", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0])
