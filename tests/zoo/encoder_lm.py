"""Encoder LM: transformers `BertForMaskedLM` vs mindone.transformers `BertForMaskedLM`, tiny config (vocab 128,
hidden 32, 2 layers, 4 heads, intermediate 64), random init, eval mode (dropout off).

Migration differences found:

* none in the config: mindone reads the same `transformers.BertConfig` (exact erf GELU, LayerNorm eps 1e-12).
* mindone 0.5.0 uses `mindspore.mint` ops that have no CPU kernel in MindSpore 2.10 (Embedding, LayerNorm, gelu,
  ...): tests/zoo/ms_compat.py routes them to CPU ops.
* tied weights: `cls.predictions.decoder.weight` is `bert.embeddings.word_embeddings.weight` on both sides;
  `align convert` drops the torch aliases (`cls.predictions.decoder.weight/bias`) and reports them as tied.
* a real mindone 0.5.0 bug: `BertLMPredictionHead` builds `self.decoder = nn.Dense(..., has_bias=False)` and then
  assigns `self.decoder.bias = self.bias`; legacy `nn.Dense.construct` only adds the bias when `has_bias` is set,
  so the MLM bias is never applied on the MindSpore side (logits differ by exactly the bias, max ~0.31 here with
  randomised biases; 0 with the all-zero default init, which is why it hides). The pair builder sets
  `decoder.has_bias = True` and gives it the `ops.BiasAdd()` a biased Dense would have (two lines).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           max_position_embeddings=64, type_vocab_size=2)


def build(seed: int = 0, batch: int = 2, seq: int = 12) -> Pair:
    import transformers
    from mindone.transformers import BertForMaskedLM as MsBert
    from mindspore import ops

    seed_all(seed)
    cfg = transformers.BertConfig(**CFG)
    pt = transformers.BertForMaskedLM(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsBert(cfg)
    msm.cls.predictions.decoder.has_bias = True  # the mindone bug above (Dense only makes bias_add when has_bias)
    msm.cls.predictions.decoder.bias_add = ops.BiasAdd()
    msm.set_train(False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG["vocab_size"], (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, seq - 3:] = 0  # padding in the second sequence exercises the attention mask
    inputs = {"input_ids": ids, "attention_mask": mask}
    return Pair(name="encoder_bert", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0],
                notes=["mindone BertLMPredictionHead decoder.has_bias=False while a bias is attached: set True"])
