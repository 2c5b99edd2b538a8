"""Localization benchmark: does `align compare` name the module where a migration bug was put?

    .venv/bin/python -m tests.zoo.localization [WORKDIR] [--only FAMILY ...] [--markdown OUT.md]

For every real zoo pair of tests/zoo (cnn, vit, encoder_lm, decoder_lm, mha, upsample): build, `make_equal`
(align convert --like), dump the torch side once (`aligner.dump(model, dir)`, default options: forward outputs of
leaf modules), then put ONE bug at a time into the MindSpore model (an attribute, a primitive, a cell, a weight or
a `construct` of one instance, or a module-level function of the zoo package; always undone afterwards), dump the
MindSpore side and run `aligner.compare(ms_dump, pt_dump)` (the library form of `align compare ms pt`).

A bug is a *hit* when `result.verdict.findings[0].blame` (the module the verdict blames, as the reference torch path:
the origin row's module, or for a differing input computed between module calls the parent whose code computed it)
is exactly `Bug.expected`: the module whose own forward holds the bug (for a bug in a parent's forward code --
"glue code", a functional op such as softmax / interpolate / a residual add -- that parent). Otherwise a *miss*
(what was named instead, or "nothing" when compare found no divergence), or an *error* (the injection or a dump
raised).

`CATALOGUE` is the bug list as data; `Bug.now` / `Bug.why` record the current outcome and, for a miss, what aligner
would need to get it right (tests/zoo/test_localization.py turns the misses into strict xfails). Each clean pair is
also compared in both argument orders (`clean_orders`): exit 1 there is a false divergence.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import math
import shutil
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers)

FAMILIES = ["cnn", "vit", "encoder_lm", "decoder_lm", "mha", "upsample", "moe_lm", "encdec", "gqa_lm", "swin"]
ALL_MODES = ["moe_lm", "encdec", "gqa_lm", "swin"]  # clean in eval and training mode, leaves_only True and False

Restore = Callable[[], None]


# ---- injection helpers (each returns the function that undoes it) -----------------------------------------------
def _get(root: Any, path: str) -> Any:
    obj = root
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def set_attr(obj: Any, name: str, value: Any) -> Restore:
    """`obj.name = value`; undo puts the old value back (or removes an instance attribute that was not there, e.g. a
    per-instance `construct`)."""
    had = name in vars(obj)
    old = getattr(obj, name)
    setattr(obj, name, value)

    def restore() -> None:
        if had or not isinstance(old, types.MethodType):
            setattr(obj, name, old)
        else:
            delattr(obj, name)
    return restore


def set_construct(cell: Any, fn: Callable) -> Restore:
    """Replace one cell instance's `construct` (the class and every other instance are untouched)."""
    return set_attr(cell, "construct", types.MethodType(fn, cell))


def transpose_weight(param: Any) -> Restore:
    import mindspore as ms

    old = param.asnumpy().copy()
    assert old.ndim == 2 and old.shape[0] == old.shape[1], f"not a square weight: {old.shape}"
    param.set_data(ms.Tensor(np.ascontiguousarray(old.T)))
    return lambda: param.set_data(ms.Tensor(old))


def _chain(*restores: Restore) -> Restore:
    def restore() -> None:
        for r in reversed(restores):
            r()
    return restore


# ---- the injections, one per bug ---------------------------------------------------------------------------------
def cnn_pool_pad_same(pair) -> Restore:
    """mindcv's own stem pool (TF 'same' padding: 0 before, 1 after) instead of timm's padding=1 on every side."""
    from mindspore import nn
    return set_attr(pair.ms_model, "max_pool", nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same"))


def cnn_pool_ceil_mode(pair) -> Restore:
    from mindspore import nn
    return set_attr(pair.ms_model, "max_pool",
                    nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1, ceil_mode=True))


def cnn_conv_pad_same(pair) -> Restore:
    """layer2.0.conv2 (3x3, stride 2): pad_mode='same' (pads 0 before / 1 after) instead of padding=1."""
    from mindspore import ops
    conv = pair.ms_model.layer2[0].conv2
    prim = ops.Conv2D(out_channel=conv.out_channels, kernel_size=conv.kernel_size, mode=1, pad_mode="same", pad=0,
                      stride=conv.stride, dilation=conv.dilation, group=conv.group)
    return set_attr(conv, "conv2d", prim)


def cnn_bn_momentum(pair) -> Restore:
    """Stem BatchNorm built with torch's momentum value: `nn.BatchNorm2d(momentum=0.1)` means a moving-average
    weight of 0.1 on the OLD statistics in MindSpore (0.9 on the batch). Only the running statistics differ."""
    from mindspore import ops
    bn = pair.ms_model.bn1
    prim = ops.BatchNorm(is_training=True, epsilon=bn.eps, momentum=0.9, data_format=bn.format)
    return set_attr(bn, "bn_train", prim)


def cnn_avgpool_variant(pair) -> Restore:
    """Variant of the cnn pair (no zoo pair has a padded average pool): the stem pool becomes a 3x3/2 average pool
    with padding 1 on BOTH sides (torch default count_include_pad=True); needs its own torch reference dump."""
    import torch
    from mindspore import nn
    return _chain(set_attr(pair.torch_model, "maxpool", torch.nn.AvgPool2d(3, 2, 1)),
                  set_attr(pair.ms_model, "max_pool",
                           nn.AvgPool2d(3, 2, pad_mode="pad", padding=1, count_include_pad=True)))


def cnn_avgpool_count_include_pad(pair) -> Restore:
    from mindspore import nn
    return set_attr(pair.ms_model, "max_pool", nn.AvgPool2d(3, 2, pad_mode="pad", padding=1, count_include_pad=False))


def cnn_inplace_mask(pair) -> Restore:
    """layer1.0's own construct zeroes the first 8 channels of bn3's output in place before the residual add."""
    block = pair.ms_model.layer1[0]

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out[:, :8] = 0.0  # BUG: a write in place into the child's output
        if self.down_sample is not None:
            identity = self.down_sample(x)
        return self.relu(out + identity)
    return set_construct(block, construct)


def vit_glue_scale(pair) -> Restore:
    """blocks.0's own construct scales the attention branch by 0.5 before the residual add (between the attn and
    norm2 child calls)."""
    block = pair.ms_model.blocks[0]

    def construct(self, x):
        x = x + 0.5 * self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x
    return set_construct(block, construct)


def vit_inplace_mask(pair) -> Restore:
    """blocks.0's own construct zeroes the class token's attention update in place (`a[:, 0] = 0` on the tensor
    its attn child returned, before the residual add)."""
    block = pair.ms_model.blocks[0]

    def construct(self, x):
        a = self.attn(self.norm1(x))
        a[:, 0] = 0.0  # BUG: a write in place into the child's output
        x = x + self.drop_path1(self.ls1(a))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x
    return set_construct(block, construct)


def vit_attn_scale(pair) -> Restore:
    """embed_dim ** -0.5 (the wrong dim) instead of head_dim ** -0.5."""
    import mindspore as ms
    attn = pair.ms_model.blocks[0].attn
    return set_attr(attn, "scale", ms.Tensor(float(attn.num_heads * attn.head_dim) ** -0.5))


def _vit_attention_construct(axis: int) -> Callable:
    def construct(self, x):  # mindcv.models.vit.Attention.construct with the softmax axis as a parameter
        import mindspore as ms
        from mindspore import ops
        b, n, c = x.shape
        qkv = self.qkv(x)
        qkv = self.reshape(qkv, (b, n, 3, self.num_heads, self.head_dim))
        qkv = self.transpose(qkv, (2, 0, 3, 1, 4))
        q, k, v = self.unstack(qkv)
        q, k = self.q_norm(q), self.k_norm(k)
        attn = self.mul(self.q_matmul_k(q, k), self.scale).astype(ms.float32)
        attn = self.attn_drop(ops.softmax(attn, axis=axis))
        out = self.attn_matmul_v(attn, v)
        out = self.reshape(self.transpose(out, (0, 2, 1, 3)), (b, n, c))
        return self.proj_drop(self.proj(out))
    return construct


def vit_softmax_axis(pair) -> Restore:
    return set_construct(pair.ms_model.blocks[0].attn, _vit_attention_construct(axis=-2))


def vit_transposed_weight(pair) -> Restore:
    return transpose_weight(pair.ms_model.blocks[0].attn.proj.weight)


def vit_gelu_tanh(pair) -> Restore:
    """MindSpore's nn.GELU default (approximate=True, tanh) instead of exact erf."""
    return set_attr(pair.ms_model.blocks[0].mlp.act, "approximate", "tanh")


def vit_layernorm_eps(pair) -> Restore:
    """MindSpore's nn.LayerNorm default epsilon 1e-7 instead of timm's 1e-6."""
    from mindspore import ops
    return set_attr(pair.ms_model.blocks[0].norm1, "layer_norm",
                    ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7))


def bert_missing_residual(pair) -> Restore:
    """BertSelfOutput: LayerNorm(dense(h)) without `+ input_tensor`."""
    out = pair.ms_model.bert.encoder.layer[0].attention.output

    def construct(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)))
    return set_construct(out, construct)


def bert_transposed_weight(pair) -> Restore:
    return transpose_weight(pair.ms_model.bert.encoder.layer[0].attention.self.query.weight)


def segformer_layernorm_eps(pair) -> Restore:
    """encoder block 0's layer_norm_1 with legacy nn.LayerNorm's default epsilon 1e-7 instead of 1e-5 (not BERT:
    there eps 1e-5 instead of 1e-12 moves the logits by only 1.7e-6, inside float32 rounding of this pair)."""
    return set_attr(pair.ms_model.segformer.encoder.block[0][0].layer_norm_1, "eps", 1e-7)


def llama_missing_residual(pair) -> Restore:
    """model.layers.0: the residual add after self-attention is dropped."""
    layer = pair.ms_model.model.layers[0]

    def construct(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                  output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          output_attentions=output_attentions, use_cache=use_cache,
                                          cache_position=cache_position, position_embeddings=position_embeddings,
                                          **kwargs)
        residual = hidden_states  # BUG: `hidden_states = residual + hidden_states` is missing above
        hidden_states = residual + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states
    return set_construct(layer, construct)


def llama_attn_scale(pair) -> Restore:
    """hidden_size ** -0.5 instead of head_dim ** -0.5."""
    attn = pair.ms_model.model.layers[0].self_attn
    return set_attr(attn, "scaling", float(pair.ms_model.config.hidden_size) ** -0.5)


def llama_softmax_axis(pair) -> Restore:
    """eager_attention_forward (module-level, looked up at call time) with softmax over dim=-2, layer 0 only."""
    import mindone.transformers.models.llama.modeling_llama as ml
    from mindspore import mint
    target = pair.ms_model.model.layers[0].self_attn
    original = ml.eager_attention_forward

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if module is not target:
            return original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        key_states = ml.repeat_kv(key, module.num_key_value_groups)
        value_states = ml.repeat_kv(value, module.num_key_value_groups)
        w = mint.matmul(query, key_states.swapaxes(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask[:, :, :, : key_states.shape[-2]]
        w = mint.nn.functional.softmax(w, dim=-2, dtype=query.dtype)  # BUG: dim=-1
        return mint.matmul(w, value_states).swapaxes(1, 2).contiguous(), w
    return set_attr(ml, "eager_attention_forward", eager)


def siglip_mha_scale(pair) -> Restore:
    """mindone's MultiheadAttention port: 1/sqrt(embed_dim) instead of 1/sqrt(head_dim) (module-level
    `_scaled_dot_product_attention`; only the pooling head uses MultiheadAttention)."""
    from mindspore import mint

    mha_mod = sys.modules[type(pair.ms_model.vision_model.head.attention).__module__]
    original = mha_mod._scaled_dot_product_attention
    embed_dim = pair.ms_model.vision_model.head.attention.embed_dim

    def sdpa(query, key, value, attn_mask, dropout_p, is_causal, is_training, dtype):
        assert not is_causal and dropout_p == 0.0
        attn = mint.matmul(query, key.swapaxes(-2, -1) * (1 / math.sqrt(embed_dim)))  # BUG: head dim
        if attn_mask is not None:
            attn = attn + attn_mask
        attn = mint.softmax(attn, -1)
        return mint.matmul(attn, value), attn
    assert original.__code__.co_varnames[:8] == sdpa.__code__.co_varnames[:8]
    return set_attr(mha_mod, "_scaled_dot_product_attention", sdpa)


def siglip_transposed_weight(pair) -> Restore:
    return transpose_weight(pair.ms_model.vision_model.encoder.layers[0].self_attn.out_proj.weight)


def segformer_align_corners(pair) -> Restore:
    """decode_head upsamples with align_corners=True (the call site passes False): mint.nn.functional.interpolate
    is wrapped for the duration (only the decode head resizes)."""
    from mindspore import mint
    original = mint.nn.functional.interpolate

    def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None, *args, **kwargs):
        if mode == "bilinear":
            align_corners = True
        return original(input, size, scale_factor, mode, align_corners, *args, **kwargs)
    return set_attr(mint.nn.functional, "interpolate", interpolate)


def segformer_gelu_tanh(pair) -> Restore:
    """Mix-FFN activation of encoder block 0: tanh-approximate GELU instead of exact erf."""
    from mindspore import mint
    act = pair.ms_model.segformer.encoder.block[0][0].mlp.intermediate_act_fn
    return set_attr(act, "act", lambda x: mint.nn.functional.gelu(x, approximate="tanh"))


# ---- moe_lm: Mixtral (sparse mixture of experts) -------------------------------------------------------------------
def _moe(pair, layer: int = 0) -> Any:
    return pair.ms_model.model.layers[layer].block_sparse_moe


def _moe_construct(renormalise: bool = True, capacity: int | None = None) -> Callable:
    """mindone's MixtralSparseMoeBlock.construct (jitter off) with the renormalisation of the top-k weights and a
    per-expert capacity (tokens beyond it dropped, in token order) as parameters."""
    def construct(self, hidden_states):
        import mindspore as ms
        from mindspore import mint
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = mint.softmax(router_logits, dim=1, dtype=ms.float32)
        routing_weights, selected_experts = mint.topk(routing_weights, self.top_k, dim=-1)
        if renormalise:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = mint.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype)
        expert_mask = mint.nn.functional.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            idx, top_x = mint.where(expert_mask[expert_idx])
            if capacity is not None:
                idx, top_x = idx[:capacity], top_x[:capacity]
            current = hidden_states[None, top_x].reshape(-1, hidden_dim)
            out = self.experts[expert_idx](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, out.to(hidden_states.dtype))
        return final.reshape(batch_size, sequence_length, hidden_dim), router_logits
    return construct


def moe_expert_gate_up_swap(pair) -> Restore:
    """experts.1 of layer 0: act_fn(w3(x)) * w1(x) -- the gate and up projections swapped around the SwiGLU."""
    def construct(self, hidden_states):
        return self.w2(self.act_fn(self.w3(hidden_states)) * self.w1(hidden_states))
    return set_construct(_moe(pair).experts[1], construct)


def moe_top1(pair) -> Restore:
    """layer 0's MoE block routes each token to its top-1 expert (`top_k` read by the block's own forward)."""
    return set_attr(_moe(pair), "top_k", 1)


def moe_no_renormalise(pair) -> Restore:
    """layer 0's MoE block keeps the softmax weights of the top-2 experts as they are (no division by their sum)."""
    return set_construct(_moe(pair), _moe_construct(renormalise=False))


def moe_capacity_drop(pair) -> Restore:
    """layer 0's MoE block with a per-expert capacity of 8 tokens (24 tokens x top-2 / 4 experts = 12 on average):
    the tokens past it are dropped (the reference has no capacity: every routed token is computed)."""
    return set_construct(_moe(pair), _moe_construct(capacity=8))


def moe_missing_residual(pair) -> Restore:
    """model.layers.0.construct without the residual add after the MoE block (its output is not recorded with the
    default leaves_only dump: the next records are layer 1's)."""
    def construct(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                  output_attentions=False, output_router_logits=False, use_cache=False, cache_position=None,
                  position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, position_ids=position_ids,
                                          past_key_value=past_key_value, output_attentions=output_attentions,
                                          use_cache=use_cache, cache_position=cache_position, **kwargs)
        hidden_states = residual + hidden_states
        hidden_states, _ = self.block_sparse_moe(self.post_attention_layernorm(hidden_states))  # BUG: no residual
        return (hidden_states,)
    return set_construct(pair.ms_model.model.layers[0], construct)


# ---- gqa_lm: Qwen2 (rotary, grouped-query attention) ----------------------------------------------------------------
def qwen2_gate_up_swap(pair) -> Restore:
    """layers.0.mlp: down(act(up(x)) * gate(x)) -- the gate and up projections swapped around the SwiGLU."""
    def construct(self, hidden_state):
        return self.down_proj(self.act_fn(self.up_proj(hidden_state)) * self.gate_proj(hidden_state))
    return set_construct(pair.ms_model.model.layers[0].mlp, construct)


def qwen2_rope_base(pair) -> Restore:
    """The rotary table computed once by model.rotary_emb with base 1e6 (Qwen2's released configs) instead of the
    config's 1e4."""
    import mindspore as ms
    rot = pair.ms_model.model.rotary_emb
    dim = rot.inv_freq.shape[0] * 2
    inv = 1.0 / (1e6 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    return set_attr(rot, "inv_freq", ms.Tensor(inv.astype(np.float32)))


def qwen2_causal_mask_off_by_one(pair) -> Restore:
    """model's causal mask lets each position see the next token too (diagonal off by one): mindone's
    `create_causal_mask` as looked up by modeling_qwen2 (called from Qwen2Model.construct) is wrapped."""
    import mindspore as ms
    mq = sys.modules[type(pair.ms_model.model).__module__]
    original = mq.create_causal_mask

    def create_causal_mask(**kwargs):
        mask = original(**kwargs).asnumpy().copy()
        q = np.arange(mask.shape[-2] - 1)
        mask[..., q, q + 1] = 0.0  # BUG: position i may read i + 1
        return ms.Tensor(mask)
    return set_attr(mq, "create_causal_mask", create_causal_mask)


def qwen2_rmsnorm_eps(pair) -> Restore:
    """layers.0.input_layernorm with eps 1e-3 instead of 1e-6 (a config's rms_norm_eps read as another model's)."""
    return set_attr(pair.ms_model.model.layers[0].input_layernorm, "variance_epsilon", 1e-3)


# ---- encdec: T5 (relative position bias, cross-attention) -----------------------------------------------------------
def _t5_enc_attn(pair) -> Any:
    return pair.ms_model.encoder.block[0].layer[0].SelfAttention


def t5_bucket_unidirectional(pair) -> Restore:
    """The encoder's relative-position buckets computed as a decoder's (bidirectional=False: every later key falls
    in bucket 0); the bias is computed once in block 0's self-attention and handed to block 1."""
    return set_attr(_t5_enc_attn(pair), "is_decoder", True)


def t5_num_buckets(pair) -> Restore:
    """The encoder's relative-position bias bucketed with num_buckets=16 instead of 32 (table rows unchanged)."""
    return set_attr(_t5_enc_attn(pair), "relative_attention_num_buckets", 16)


def t5_max_distance(pair) -> Restore:
    """The encoder's relative-position buckets with max_distance=32 instead of 128 (distances 8..11 here land in
    other logarithmic buckets)."""
    return set_attr(_t5_enc_attn(pair), "relative_attention_max_distance", 32)


def t5_cross_attention_mask(pair) -> Restore:
    """The decoder's first cross-attention ignores the encoder padding mask (its forward adds the mask to the
    position bias it hands to the later blocks, so every cross-attention loses it)."""
    attn = pair.ms_model.decoder.block[0].layer[1].EncDecAttention
    original = attn.construct

    def construct(self, hidden_states, mask=None, *args, **kwargs):
        return original(hidden_states, None, *args, **kwargs)  # BUG: mask dropped
    return set_construct(attn, construct)


def t5_encoder_ff_missing_residual(pair) -> Restore:
    """encoder.block.1.layer.1 (T5LayerFF) without its residual add: the encoder output diverges while the
    decoder's first records (embeddings, first self-attention) do not read it."""
    def construct(self, hidden_states):
        return self.dropout(self.DenseReluDense(self.layer_norm(hidden_states)))  # BUG: + hidden_states
    return set_construct(pair.ms_model.encoder.block[1].layer[1], construct)


def t5_long_input_variant(pair) -> Restore:
    """Variant of the encdec pair: 18 encoder tokens (relative distances up to 17) on both sides."""
    old = (pair.torch_inputs, pair.ms_inputs)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 128, (2, 18)).astype(np.int64)
    mask = np.ones((2, 18), np.int64)
    mask[1, 15:] = 0
    inputs = dict(pair.torch_inputs, input_ids=ids, attention_mask=mask)
    pair.torch_inputs, pair.ms_inputs = inputs, dict(inputs)

    def restore() -> None:
        pair.torch_inputs, pair.ms_inputs = old
    return restore


def t5_ops_log_bucket(pair) -> Restore:
    """No injection: MindSpore 2.10's CPU ops.log puts relative distance 16 in bucket 9 instead of 10 (18 tokens)."""
    return lambda: None


# ---- swin: timm vs mindcv Swin (window attention, cyclic shift) ----------------------------------------------------
def _swin_block_construct(shift: int | None = None, mlp_residual: bool = True, mask: bool = True) -> Callable:
    """mindcv's SwinTransformerBlock.construct with the cyclic shift done inline (numpy.roll by -shift before the
    window attention, +shift after; None: the block's own shift_size), the MLP residual and the attention mask as
    parameters."""
    def construct(self, x):
        from mindspore import numpy as mnp
        from mindspore import ops
        h, w = self.input_resolution
        b, _, c = x.shape
        s = self.shift_size if shift is None else shift
        shortcut = x
        x = ops.reshape(self.norm1(x), (b, h, w, c))
        shifted = mnp.roll(x, (-s, -s), (1, 2)) if s else x
        windows = ops.reshape(self.window_partition(shifted), (-1, self.window_size * self.window_size, c))
        attn = self.attn(windows, mask=self.attn_mask if mask else None)
        attn = ops.reshape(attn, (-1, self.window_size, self.window_size, c))
        shifted = self.window_reverse(attn, self.window_size, h, w)
        x = mnp.roll(shifted, (s, s), (1, 2)) if s else shifted
        x = shortcut + self.drop_path(ops.reshape(x, (b, h * w, c)))
        y = self.drop_path(self.mlp(self.norm2(x)))
        return x + y if mlp_residual else y
    return construct


def _swin_block(pair, layer: int, block: int) -> Any:
    return pair.ms_model.layers[layer].blocks[block]


def swin_shift_direction(pair) -> Restore:
    """layers.0.blocks.1 shifts by +2 before the window attention and -2 after (the direction reversed)."""
    return set_construct(_swin_block(pair, 0, 1), _swin_block_construct(shift=-2))


def swin_shift_size(pair) -> Restore:
    """layers.0.blocks.1 shifts by 1 instead of window_size // 2 = 2 (the mask is still built for 2)."""
    return set_construct(_swin_block(pair, 0, 1), _swin_block_construct(shift=1))


def swin_mask_off(pair) -> Restore:
    """layers.0.blocks.1 calls its window attention without the shifted-window mask."""
    return set_construct(_swin_block(pair, 0, 1), _swin_block_construct(mask=False))


def swin_missing_mlp_residual(pair) -> Restore:
    """layers.0.blocks.0 returns the MLP branch without adding it to its input."""
    return set_construct(_swin_block(pair, 0, 0), _swin_block_construct(mlp_residual=False))


def swin_gelu_tanh(pair) -> Restore:
    """layers.0.blocks.0.mlp.act left at MindSpore's default (tanh-approximate GELU): a small error that later
    blocks' projections and residuals bring back under tolerance."""
    return set_attr(_swin_block(pair, 0, 0).mlp.act, "approximate", "tanh")


# ---- the catalogue -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bug:
    id: str
    family: str                    # tests/zoo/<family>.py
    kind: str                      # bug kind (a column of the matrix)
    expected: str                  # torch module path compare must name
    inject: Callable[[Any], Restore]
    how: str                       # the injection in words
    train: bool = False            # one forward in training mode on both sides (running statistics change)
    variant: Callable[[Any], Restore] | None = None   # changes BOTH sides first (own torch reference dump)
    now: str = "hit"               # current outcome: "hit" | "miss" (test_localization.py asserts / xfails it)
    why: str = ""                  # for a miss: why, and what aligner would need


KINDS = ["glue code", "attention scale", "softmax axis", "transposed weight", "pad_mode same", "GELU approximate",
         "LayerNorm eps", "BatchNorm momentum", "ceil_mode", "align_corners", "count_include_pad", "missing residual",
         "wiring swap", "routing", "position table", "shift/roll", "mask", "RMSNorm eps"]

CATALOGUE: list[Bug] = [
    # cnn: timm resnet50 vs mindcv resnet50
    Bug("cnn-pool-pad-same", "cnn", "pad_mode same", "maxpool", cnn_pool_pad_same,
        "max_pool = nn.MaxPool2d(3, 2, pad_mode='same') (mindcv's own) instead of padding=1"),
    Bug("cnn-conv-pad-same", "cnn", "pad_mode same", "layer2.0.conv2", cnn_conv_pad_same,
        "layer2.0.conv2 primitive Conv2D(pad_mode='same') instead of pad=1 (3x3, stride 2)"),
    Bug("cnn-ceil-mode", "cnn", "ceil_mode", "maxpool", cnn_pool_ceil_mode,
        "max_pool = nn.MaxPool2d(3, 2, padding=1, ceil_mode=True)"),
    Bug("cnn-bn-momentum", "cnn", "BatchNorm momentum", "bn1", cnn_bn_momentum,
        "bn1.bn_train = ops.BatchNorm(momentum=0.9) (nn.BatchNorm2d(momentum=0.1) in MindSpore terms); one "
        "training-mode forward on both sides", train=True),
    Bug("cnn-avgpool-count-include-pad", "cnn", "count_include_pad", "maxpool", cnn_avgpool_count_include_pad,
        "VARIANT: stem pool -> AvgPool2d(3, 2, padding=1) on both sides; MS count_include_pad=False",
        variant=cnn_avgpool_variant),
    Bug("cnn-inplace-mask", "cnn", "mask", "layer1.0", cnn_inplace_mask,
        "layer1.0.construct: out[:, :8] = 0 in place on bn3's output, before the residual add"),
    # vit: timm vs mindcv ViT
    Bug("vit-glue-scale", "vit", "glue code", "blocks.0", vit_glue_scale,
        "blocks.0.construct: x + 0.5 * attn-branch (extra scale between the attn and norm2 calls)"),
    Bug("vit-inplace-mask", "vit", "mask", "blocks.0", vit_inplace_mask,
        "blocks.0.construct: a[:, 0] = 0 in place on attn's output (the class token's update), before the residual"),
    Bug("vit-attn-scale", "vit", "attention scale", "blocks.0.attn", vit_attn_scale,
        "blocks.0.attn.scale = embed_dim**-0.5 instead of head_dim**-0.5"),
    Bug("vit-softmax-axis", "vit", "softmax axis", "blocks.0.attn", vit_softmax_axis,
        "blocks.0.attn.construct with ops.softmax(axis=-2)"),
    Bug("vit-transposed-weight", "vit", "transposed weight", "blocks.0.attn.proj", vit_transposed_weight,
        "blocks.0.attn.proj.weight (64x64) transposed"),
    Bug("vit-gelu-tanh", "vit", "GELU approximate", "blocks.0.mlp.act", vit_gelu_tanh,
        "blocks.0.mlp.act.approximate = 'tanh'"),
    Bug("vit-layernorm-eps", "vit", "LayerNorm eps", "blocks.0.norm1", vit_layernorm_eps,
        "blocks.0.norm1 epsilon 1e-7 (MS default) instead of 1e-6"),
    # encoder_lm: BERT
    Bug("bert-missing-residual", "encoder_lm", "missing residual", "bert.encoder.layer.0.attention.output",
        bert_missing_residual, "layer.0.attention.output.construct: LayerNorm(dense(h)) without + input_tensor"),
    Bug("bert-transposed-weight", "encoder_lm", "transposed weight", "bert.encoder.layer.0.attention.self.query",
        bert_transposed_weight, "layer.0.attention.self.query.weight (32x32) transposed"),
    # decoder_lm: Llama
    Bug("llama-missing-residual", "decoder_lm", "missing residual", "model.layers.0", llama_missing_residual,
        "model.layers.0.construct without the post-attention residual add"),
    Bug("llama-attn-scale", "decoder_lm", "attention scale", "model.layers.0.self_attn", llama_attn_scale,
        "layers.0.self_attn.scaling = hidden_size**-0.5 instead of head_dim**-0.5"),
    Bug("llama-softmax-axis", "decoder_lm", "softmax axis", "model.layers.0.self_attn", llama_softmax_axis,
        "eager_attention_forward with softmax(dim=-2) for layers.0 only"),
    # mha: Siglip with nn.MultiheadAttention pooling head
    Bug("siglip-mha-scale", "mha", "attention scale", "vision_model.head.attention", siglip_mha_scale,
        "MultiheadAttention port: 1/sqrt(embed_dim) instead of 1/sqrt(head_dim)"),
    Bug("siglip-transposed-weight", "mha", "transposed weight", "vision_model.encoder.layers.0.self_attn.out_proj",
        siglip_transposed_weight, "encoder.layers.0.self_attn.out_proj.weight (32x32) transposed"),
    # upsample: Segformer
    Bug("segformer-align-corners", "upsample", "align_corners", "decode_head", segformer_align_corners,
        "decode_head's bilinear interpolate with align_corners=True"),
    Bug("segformer-gelu-tanh", "upsample", "GELU approximate",
        "segformer.encoder.block.0.0.mlp.intermediate_act_fn", segformer_gelu_tanh,
        "encoder block 0 Mix-FFN GELU approximate='tanh'"),
    Bug("segformer-layernorm-eps", "upsample", "LayerNorm eps", "segformer.encoder.block.0.0.layer_norm_1",
        segformer_layernorm_eps, "encoder block 0 layer_norm_1 eps 1e-7 (legacy nn.LayerNorm default) instead of 1e-5"),
    # moe_lm: Mixtral (sparse mixture of experts)
    Bug("moe-expert-gate-up-swap", "moe_lm", "wiring swap", "model.layers.0.block_sparse_moe.experts.1",
        moe_expert_gate_up_swap, "layers.0 MoE experts.1.construct: act_fn(w3(x)) * w1(x) (gate and up swapped)"),
    Bug("moe-top1", "moe_lm", "routing", "model.layers.0.block_sparse_moe", moe_top1,
        "layers.0 MoE block top_k = 1 instead of 2"),
    Bug("moe-no-renormalise", "moe_lm", "routing", "model.layers.0.block_sparse_moe", moe_no_renormalise,
        "layers.0 MoE block construct without the renormalisation of the top-2 weights"),
    Bug("moe-capacity-drop", "moe_lm", "routing", "model.layers.0.block_sparse_moe", moe_capacity_drop,
        "layers.0 MoE block construct with an expert capacity of 8 tokens (the rest dropped)"),
    Bug("moe-missing-residual", "moe_lm", "missing residual", "model.layers.0", moe_missing_residual,
        "model.layers.0.construct without the residual add after the MoE block (layer output not recorded)"),
    # gqa_lm: Qwen2 (rotary, grouped-query attention)
    Bug("qwen2-gate-up-swap", "gqa_lm", "wiring swap", "model.layers.0.mlp", qwen2_gate_up_swap,
        "layers.0.mlp.construct: down(act(up(x)) * gate(x)) (gate and up swapped)"),
    Bug("qwen2-rope-base", "gqa_lm", "position table", "model.rotary_emb", qwen2_rope_base,
        "rotary_emb.inv_freq from base 1e6 instead of 1e4 (the table computed once, read by every layer)"),
    Bug("qwen2-causal-mask", "gqa_lm", "mask", "model", qwen2_causal_mask_off_by_one,
        "model's causal mask off by one (each position also sees the next token)"),
    Bug("qwen2-rmsnorm-eps", "gqa_lm", "RMSNorm eps", "model.layers.0.input_layernorm", qwen2_rmsnorm_eps,
        "layers.0.input_layernorm eps 1e-3 instead of 1e-6"),
    # encdec: T5 (relative position bias, cross-attention)
    Bug("t5-bucket-unidirectional", "encdec", "position table", "encoder.block.0.layer.0.SelfAttention",
        t5_bucket_unidirectional, "encoder relative-position buckets with bidirectional=False (is_decoder=True)"),
    Bug("t5-num-buckets", "encdec", "position table", "encoder.block.0.layer.0.SelfAttention", t5_num_buckets,
        "encoder relative-position buckets with num_buckets=16 instead of 32"),
    Bug("t5-max-distance", "encdec", "position table", "encoder.block.0.layer.0.SelfAttention", t5_max_distance,
        "encoder relative-position buckets with max_distance=32 instead of 128"),
    Bug("t5-cross-attention-mask", "encdec", "mask", "decoder.block.0.layer.1.EncDecAttention",
        t5_cross_attention_mask, "decoder block 0 cross-attention ignores the encoder padding mask"),
    Bug("t5-encoder-ff-missing-residual", "encdec", "missing residual", "encoder.block.1.layer.1",
        t5_encoder_ff_missing_residual, "encoder.block.1.layer.1 (T5LayerFF) without its residual add"),
    Bug("t5-ops-log-bucket", "encdec", "position table", "encoder.block.0.layer.0.SelfAttention", t5_ops_log_bucket,
        "VARIANT: 18 encoder tokens on both sides; no injection: MindSpore 2.10 CPU ops.log puts distance 16 in "
        "bucket 9, torch in 10 (a real MindSpore finding)", variant=t5_long_input_variant),
    # swin: timm vs mindcv Swin
    Bug("swin-shift-direction", "swin", "shift/roll", "layers.0.blocks.1", swin_shift_direction,
        "layers.0.blocks.1 cyclic shift +2 before / -2 after the window attention (direction reversed)"),
    Bug("swin-shift-size", "swin", "shift/roll", "layers.0.blocks.1", swin_shift_size,
        "layers.0.blocks.1 cyclic shift by 1 instead of 2"),
    Bug("swin-mask-off", "swin", "mask", "layers.0.blocks.1", swin_mask_off,
        "layers.0.blocks.1 window attention called without the shifted-window mask"),
    Bug("swin-missing-mlp-residual", "swin", "missing residual", "layers.0.blocks.0", swin_missing_mlp_residual,
        "layers.0.blocks.0 without the MLP residual add (block output not recorded)"),
    Bug("swin-gelu-tanh", "swin", "GELU approximate", "layers.0.blocks.0.mlp.act", swin_gelu_tanh,
        "layers.0.blocks.0.mlp.act tanh-approximate GELU (MindSpore's default) instead of erf"),
]


# ---- running -----------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    bug: Bug
    status: str                    # hit | miss | error
    named: str | None = None       # torch path of the named origin (None: nothing named)
    named_ms: str | None = None    # the MindSpore path of that row
    first: str | None = None       # first divergent record (before the upstream walk)
    exit_code: int | None = None
    disagreements: list[str] = field(default_factory=list)  # `pt ms` or a confirmed bisect blaming another module
    unconfirmed: list[str] = field(default_factory=list)    # bisect answers naming another module, not confirmed
    false_claims: list[str] = field(default_factory=list)   # "introduced here" / "confirms" said of a wrong answer
    culprit: str | None = None     # what the verdict blames: module | parent_code | op | model_input
    zoom: str | None = None        # for parent code: the first divergent op of the op-level zoom-in, with sources
    detail: str = ""
    seconds: float = 0.0

    def cell(self) -> str:
        if self.status == "hit":
            return "hit"
        if self.status == "error":
            return f"error ({self.detail})"
        if self.named == self.bug.expected:
            return f"miss ({self.detail})"
        return f"miss (named `{self.named}`)" if self.named else "miss (nothing named, exit 0)"

    def strict_problems(self) -> list[str]:
        """Why a right first answer is still a miss under strict scoring (empty: a hit)."""
        problems = [f"{d} instead" for d in self.disagreements] + self.false_claims
        if self.culprit == "parent_code" and not (self.zoom or "").startswith("op: "):
            problems.append(f"zoom-in names no op ({self.zoom})")
        return problems


@dataclass
class PairRun:
    """One built, converted pair with its torch reference dumps (shared by all bugs of the pair)."""
    family: str
    pair: Any
    work: Path
    refs: dict[str, Path] = field(default_factory=dict)
    options: dict = field(default_factory=dict)    # extra aligner.dump options (both sides); default: none
    _n: int = 0

    def fresh(self, label: str) -> Path:
        self._n += 1
        return self.work / f"{self._n:02d}_{label}"

    # -- dumping -----------------------------------------------------------------------------------------------
    def dump_torch(self, directory: Path, train: bool = False, **extra: Any) -> Path:
        import torch

        import aligner
        from aligner.core.progress import SILENT
        model = self.pair.torch_model
        saved = copy.deepcopy(model.state_dict()) if train else None
        model.train(train)
        try:
            with aligner.dump(model, directory, progress=SILENT, **self.options, **extra), torch.no_grad():
                model(**self.pair.torch_tensors())
        finally:
            model.eval()
            if saved is not None:
                model.load_state_dict(saved)
        return directory

    def dump_ms(self, directory: Path, train: bool = False, **extra: Any) -> Path:
        import mindspore as ms

        import aligner
        from aligner.core.progress import SILENT
        model = self.pair.ms_model
        saved = {p.name: p.asnumpy().copy() for p in model.get_parameters()} if train else None
        model.set_train(train)
        try:
            with aligner.dump(model, directory, progress=SILENT, **self.options, **extra):
                model(**self.pair.ms_tensors())
        finally:
            model.set_train(False)
            if saved is not None:
                for p in model.get_parameters():
                    p.set_data(ms.Tensor(saved[p.name]))
        return directory

    def reference(self, key: str, train: bool = False) -> Path:
        """The torch reference dump for this (variant, mode), made once."""
        if key not in self.refs:
            self.refs[key] = self.dump_torch(self.fresh(f"pt_{key}"), train)
        return self.refs[key]


def build_pair(family: str, work: Path, options: dict | None = None) -> PairRun:
    pair = importlib.import_module(f"tests.zoo.{family}").build(seed=0)
    work = Path(work) / family
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pair.make_equal(work / "convert")
    return PairRun(family, pair, work, options=dict(options or {}))


def compare(ms_dir: Path, pt_dir: Path):
    import aligner
    from aligner.core.progress import SILENT
    return aligner.compare(ms_dir, pt_dir, progress=SILENT)


def run_bug(run: PairRun, bug: Bug, zoom: bool = True) -> Outcome:
    t0 = time.perf_counter()
    restores: list[Restore] = []
    try:
        try:
            if bug.variant is not None:
                restores.append(bug.variant(run.pair))
            key = (bug.variant.__name__ if bug.variant else "base") + ("_train" if bug.train else "")
            ref = run.reference(key, bug.train)
            restores.append(bug.inject(run.pair))
            ms_dir = run.dump_ms(run.fresh(f"ms_{bug.id}"), bug.train)
        finally:
            for r in reversed(restores):
                r()
        result = compare(ms_dir, ref)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''}"
        return Outcome(bug, "error", detail=msg, seconds=time.perf_counter() - t0)
    out = Outcome(bug, "miss", exit_code=int(result.exit_code), seconds=time.perf_counter() - t0)
    findings = result.verdict.findings
    if findings:
        f = findings[0]
        row = result.rows[f.origin]
        out.named = f.blame
        out.named_ms = row.pair.a.record.module if row.pair.a is not None else None
        out.first = result.module(f.first)
        out.status = "hit" if out.named == bug.expected else "miss"
        out.culprit = str(f.culprit)
        if out.status == "hit" and str(f.culprit) == "parent_code" and zoom:
            out.zoom = zoom_in(run, bug, f.blame, row.pair.a.record.parent if row.pair.a is not None else f.blame)
    out.false_claims = false_claims("ms pt", result, bug.expected)
    out.disagreements, out.unconfirmed, claims = _other_answers(ms_dir, ref, bug.expected)
    out.false_claims += claims
    if out.status == "hit" and out.strict_problems():
        out.status, out.detail = "miss", "; ".join(out.strict_problems())
    return out


FALSE_IF_WRONG = ("introduced here", "confirms", "No divergence")


def false_claims(label: str, result: Any, expected: str) -> list[str]:
    """The claims of certainty in the rendered summary (aligner.render.compare.summary) of a result whose answer is
    not `expected`: each is false there ("introduced here" of another module, "confirms" of a wrong bisect answer,
    "No divergence" while a bug is in)."""
    from aligner.render.compare import summary

    found = result.verdict.findings
    if found and found[0].blame == expected:
        return []
    text = summary(result)
    return [f"{label} says '{claim}' of {found[0].blame if found else 'nothing'}" for claim in FALSE_IF_WRONG
            if claim in text]


def zoom_in(run: PairRun, bug: Bug, scope_pt: str, scope_ms: str) -> str:
    """The zoom-in the report prints, run: op-level dumps of the blamed module on both sides (bug injected on the
    MindSpore side), compared; returns the first divergent op with both sides' source lines, in words."""
    restores: list[Restore] = []
    try:
        if bug.variant is not None:
            restores.append(bug.variant(run.pair))
        pt_dir = run.dump_torch(run.fresh(f"zoom_pt_{bug.id}"), bug.train, ops=True, scope=scope_pt)
        restores.append(bug.inject(run.pair))
        ms_dir = run.dump_ms(run.fresh(f"zoom_ms_{bug.id}"), bug.train, ops=True, scope=scope_ms)
    finally:
        for r in reversed(restores):
            r()
    result = compare(ms_dir, pt_dir)
    if not result.verdict.findings:
        return "no divergent op"
    f = result.verdict.findings[0]
    row = result.rows[f.origin]
    a = row.pair.a.record if row.pair.a is not None else None
    ref = row.pair.ref.record
    here = f"{ref.type if ref.kind == 'op' else 'an op with no twin'} @ {_short(f.source)}"
    there = f"{a.type} @ {_short(a.source)}" if a is not None and a.kind == "op" else "-"
    return f"{f.culprit}: {here} / {there}"


def _short(source: str | None) -> str:
    """`site-packages/timm/models/vision_transformer.py:123` -> `vision_transformer.py:123`."""
    return source.rsplit("/", 1)[-1] if source else "?"


def _other_answers(ms_dir: Path, pt_dir: Path, expected: str) -> tuple[list[str], list[str], list[str]]:
    """`align compare pt ms` and `--bisect` in both orders, scored strictly against `expected`: (misses, bisect
    answers that name another module without confirming it, false claims in their summaries). `pt ms` must name
    `expected`; a bisect must name it too or not confirm its answer (`bisect_confirmed` not true, no "confirms" or
    "introduced here" in its text)."""
    import aligner
    from aligner.core.progress import SILENT
    misses: list[str] = []
    unconfirmed: list[str] = []
    claims: list[str] = []
    for label, a, b, bisect in (("pt ms", pt_dir, ms_dir, False), ("ms pt --bisect", ms_dir, pt_dir, True),
                                ("pt ms --bisect", pt_dir, ms_dir, True)):
        result = aligner.compare(a, b, bisect=bisect, progress=SILENT)
        found = result.verdict.findings
        other = found[0].blame if found else None
        if other == expected:
            continue
        said = false_claims(label, result, expected)
        claims += said
        if bisect and other is not None and result.verdict.bisect_confirmed is not True and not said:
            unconfirmed.append(f"{label}: {other} (not confirmed)")
        else:
            misses.append(f"{label}: {other}" + (" (confirmed)" if bisect and result.verdict.bisect_confirmed else ""))
    return misses, unconfirmed, claims


def clean_orders(run: PairRun, train: bool = False, leaves_only: bool = True) -> list[tuple[str, int, str | None]]:
    """The clean pair compared as `ms pt` and `pt ms`: (order, exit code, named origin or None). With `train`, after
    one training-mode forward on both sides (the dumps the BatchNorm-momentum bug is compared against); with
    `leaves_only=False`, both sides dumped with every module's output recorded (own torch reference)."""
    extra = {} if leaves_only else {"leaves_only": False}
    key = ("base_train" if train else "base") + ("" if leaves_only else "_all")
    if key not in run.refs:
        run.refs[key] = run.dump_torch(run.fresh(f"pt_{key}"), train, **extra)
    ref = run.refs[key]
    ms_dir = run.dump_ms(run.fresh(f"ms_clean_{key}"), train, **extra)
    rows = []
    mode = (" (train mode)" if train else "") + ("" if leaves_only else " (leaves_only=False)")
    for order, (a, b) in (("ms_dump pt_dump", (ms_dir, ref)), ("pt_dump ms_dump", (ref, ms_dir))):
        result = compare(a, b)
        f = result.verdict.findings
        rows.append((order + mode, int(result.exit_code), f[0].blame if f else None))
    return rows


def replay_bug(run: PairRun, bug: Bug | None, train: bool = False):
    """`align replay` on one bug (None: the clean pair): the MindSpore side dumped with the bug in, then each of its
    modules re-run on the torch reference's recorded inputs while the bug is still in (what the user's factory would
    build). Returns the ReplayResult."""
    from aligner.pipelines.replay.run import replay_dumps

    restores: list[Restore] = []
    train = bug.train if bug is not None else train
    try:
        if bug is not None and bug.variant is not None:
            restores.append(bug.variant(run.pair))
        key = (bug.variant.__name__ if bug is not None and bug.variant else "base") + ("_train" if train else "")
        ref = run.reference(key, train)
        if bug is not None:
            restores.append(bug.inject(run.pair))
        ms_dir = run.dump_ms(run.fresh(f"replay_{bug.id if bug else 'clean'}"), train)
        run.pair.ms_model.set_train(train)
        return replay_dumps(ms_dir, ref, run.pair.ms_model)
    finally:
        run.pair.ms_model.set_train(False)
        for r in reversed(restores):
            r()


def run_catalogue(work: Path, families: list[str] | None = None, bugs: list[Bug] | None = None,
                  clean: bool = True, log: Callable[[str], None] = print, options: dict | None = None):
    """Every bug of the chosen families (one build per family); returns (outcomes, clean rows per family)."""
    from tests.zoo import ms_compat

    bugs = bugs if bugs is not None else CATALOGUE
    families = families or [f for f in FAMILIES if any(b.family == f for b in bugs)]
    outcomes: list[Outcome] = []
    cleans: dict[str, list] = {}
    ms_compat.install()
    try:
        for family in families:
            t0 = time.perf_counter()
            run = build_pair(family, work, options)
            log(f"[{family}] built + converted in {time.perf_counter() - t0:.1f}s")
            if clean:
                cleans[family] = clean_orders(run)
                if any(b.train for b in bugs if b.family == family):
                    cleans[family] += clean_orders(run, train=True)
                if family in ALL_MODES:
                    cleans[family] += (clean_orders(run, train=True) + clean_orders(run, leaves_only=False)
                                       + clean_orders(run, train=True, leaves_only=False))
                log(f"[{family}] clean: {cleans[family]}")
            for bug in (b for b in bugs if b.family == family):
                o = run_bug(run, bug)
                outcomes.append(o)
                log(f"[{family}] {bug.id}: {o.cell()} (first {o.first}, exit {o.exit_code}, {o.seconds:.1f}s)")
            del run
    finally:
        ms_compat.uninstall()
    return outcomes, cleans


# ---- reporting ---------------------------------------------------------------------------------------------------
def matrix(cells: dict[str, str]) -> list[str]:
    """The pairs x bug kinds table (markdown lines) from {bug id: cell text}."""
    bugs = [b for b in CATALOGUE if b.id in cells]
    fams = [f for f in FAMILIES if any(b.family == f for b in bugs)]
    kinds = [k for k in KINDS if any(b.kind == k for b in bugs)]
    lines = ["| pair | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for fam in fams:
        row = []
        for k in kinds:
            here = [cells[b.id] for b in bugs if b.family == fam and b.kind == k]
            row.append("<br>".join(here))
        lines.append(f"| {fam} | " + " | ".join(row) + " |")
    return lines


def catalogue_matrix() -> str:
    """The table docs/compare.md shows: the catalogue's current outcomes (tests/zoo/test_localization.py asserts each,
    and that docs/compare.md holds exactly this table)."""
    return "\n".join(matrix({b.id: b.now for b in CATALOGUE}))


def markdown(outcomes: list[Outcome], cleans: dict[str, list]) -> str:
    lines = matrix({o.bug.id: o.cell() for o in outcomes})
    hits = sum(o.status == "hit" for o in outcomes)
    lines += ["", f"**{hits} / {len(outcomes)} hits** "
              f"({sum(o.status == 'miss' for o in outcomes)} misses, {sum(o.status == 'error' for o in outcomes)} "
              "errors).", "",
              "| bug | pair | kind | injection | expected (torch path) | result | named origin (torch / MS path) "
              "| first divergent | exit | `pt ms` and `--bisect` (both orders) "
              "| zoom-in: first divergent op (torch / MS) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        named = f"`{o.named}` / `{o.named_ms}`" if o.named else "-"
        agree = "; ".join(o.disagreements + o.unconfirmed + o.false_claims) or "same"
        lines.append(f"| {o.bug.id} | {o.bug.family} | {o.bug.kind} | {o.bug.how} | `{o.bug.expected}` | "
                     f"{o.status}{' (' + o.detail + ')' if o.detail else ''} | {named} | "
                     f"{'`' + o.first + '`' if o.first else '-'} | {o.exit_code if o.exit_code is not None else '-'} "
                     f"| {agree} | {o.zoom or '-'} |")
    if cleans:
        false = sum(rc == 1 for rows in cleans.values() for _, rc, _ in rows)
        total = sum(len(rows) for rows in cleans.values())
        lines += ["", f"Clean pairs (no bug), both argument orders: **{false} / {total} false divergences** "
                  "(exit 1).", "", "| pair | order | exit | named |", "|---|---|---|---|"]
        for fam, rows in cleans.items():
            for order, rc, named in rows:
                lines.append(f"| {fam} | `align compare {order}` | {rc} | {'`' + named + '`' if named else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", nargs="?", default=None)
    ap.add_argument("--only", nargs="*", default=None, help="families, or bug ids")
    ap.add_argument("--no-clean", action="store_true")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--inputs", action="store_true",
                    help="diagnostic: dump with inputs=True, leaves_only=False (default: aligner.dump's defaults)")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="aligner_loc_"))
    bugs = CATALOGUE
    if args.only:
        bugs = [b for b in CATALOGUE if b.family in args.only or b.id in args.only]
    t0 = time.perf_counter()
    outcomes, cleans = run_catalogue(work, bugs=bugs, clean=not args.no_clean, log=lambda s: print(s, flush=True),
                                     options={"inputs": True, "leaves_only": False} if args.inputs else None)
    table = markdown(outcomes, cleans)
    print(f"\n{table}\n\ntotal {time.perf_counter() - t0:.0f}s, dumps under {work}")
    for o in outcomes:
        if o.status != o.bug.now:
            print(f"NOTE: {o.bug.id} is now {o.status}, the catalogue says {o.bug.now}")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
