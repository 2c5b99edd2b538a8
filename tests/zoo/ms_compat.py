"""Route `mindspore.mint` ops that have no CPU kernel in MindSpore 2.10 to equivalents that do (test side only).

mindone 0.5.0 is written against `mindspore.mint` (the torch-like API), whose "Ext" kernels are Ascend-first: on the
CPU build of MindSpore 2.10, `mint.nn.Embedding`, `mint.nn.LayerNorm`, `mint.nn.Conv2d`, `mint.nn.functional.gelu`,
`mint.addmm`, `mint.baddbmm`, `mint.arange`, `mint.randn`, `mint.topk`, `mint.nn.functional.one_hot`, one-argument
`mint.where`, `ops.rms_norm`, `Tensor.index_add_`, `Tensor.clone`, ... fail with "The kernel <Op> unregistered".
`install()` swaps those entry points (module attributes and the `construct` of the affected cells) for compositions
of ops that have CPU kernels. Each replacement computes the same function, so the outputs are what the Ascend
kernels would give up to float32 rounding; nothing here changes parameter names or shapes (checkpoints are unaffected).

This file changes process-global state of MindSpore; it is imported only by tests/zoo.
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import mint, ops

_INSTALLED = False
PATCHED: list[str] = []  # what install() replaced, for the record


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _np_dtype(dtype, default):
    if dtype is None:
        return default
    return ms.dtype_to_nptype(dtype)


# ---- functional replacements -------------------------------------------------------------------------------
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    out = ops.gather(weight, input, 0)
    if padding_idx is None:
        return out
    # the padding row gets no gradient (torch's and the Ascend kernel's padding_idx): same values, gradient stopped
    keep = (input != padding_idx).expand_dims(-1)
    return ops.where(keep, out, ops.stop_gradient(out))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(shape)
    if weight is None:
        weight = ops.ones(shape, input.dtype)
    if bias is None:
        bias = ops.zeros(shape, input.dtype)
    return ops.LayerNorm(begin_norm_axis=-n, begin_params_axis=-n, epsilon=float(eps))(input, weight, bias)[0]


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    out_ch, _, kh, kw = weight.shape
    if isinstance(padding, str):
        pad_mode, pad = padding.lower(), 0
    else:
        ph, pw = _pair(padding)
        pad_mode, pad = "pad", (ph, ph, pw, pw)
    prim = ops.Conv2D(out_ch, (kh, kw), mode=1, pad_mode=pad_mode, pad=pad, stride=_pair(stride),
                      dilation=_pair(dilation), group=groups)
    out = prim(input, weight)
    if bias is not None:
        out = ops.bias_add(out, bias)
    return out


def gelu(input, approximate="none"):
    if approximate == "tanh":  # ops.gelu's CPU kernel is within 5e-7 of the exact tanh form on N(0, 9) values; the
        return ops.gelu(input, approximate="tanh")  # composition with CPU mint.tanh (1e-4 off near |x| = 5) was 2e-4
    return 0.5 * input * (1.0 + mint.erf(input * (1.0 / math.sqrt(2.0))))


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    out = mint.matmul(mat1, mat2)
    if alpha != 1:
        out = out * alpha
    return out + (input if beta == 1 else input * beta)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    out = mint.bmm(batch1, batch2)
    if alpha != 1:
        out = out * alpha
    return out + (input if beta == 1 else input * beta)


def arange(start=0, end=None, step=1, *, dtype=None):
    vals = [v.item() if isinstance(v, ms.Tensor) else v for v in (start, end, step)]
    start, end, step = vals
    if end is None:
        start, end = 0, start
    is_float = any(isinstance(v, float) for v in (start, end, step))
    default = np.float32 if is_float else np.int64
    return ms.Tensor(np.arange(start, end, step).astype(_np_dtype(dtype, default)))


def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def randn(*size, generator=None, dtype=None):
    return ms.Tensor(np.random.standard_normal(_size(size)).astype(_np_dtype(dtype, np.float32)))


def rand(*size, generator=None, dtype=None):
    return ms.Tensor(np.random.random_sample(_size(size)).astype(_np_dtype(dtype, np.float32)))


def pad(input, pad, mode="constant", value=None):
    if mode != "constant":
        raise NotImplementedError(f"ms_compat pad: mode {mode!r}")
    pad = [int(p) for p in pad]
    nd = input.ndim
    pairs = [[0, 0] for _ in range(nd)]
    for i in range(len(pad) // 2):  # torch order: last dim first
        pairs[nd - 1 - i] = [pad[2 * i], pad[2 * i + 1]]
    if any(p < 0 for pr in pairs for p in pr):  # negative padding crops
        index = tuple(slice(-b if b < 0 else None, (input.shape[d] + a) if a < 0 else None)
                      for d, (b, a) in enumerate(pairs))
        input = input[index]
        pairs = [[max(b, 0), max(a, 0)] for b, a in pairs]
    prim = ops.Pad(tuple(tuple(p) for p in pairs))
    out = prim(input)
    if value is None or value == 0:
        return out
    inside = prim(ops.ones_like(input)) > 0
    return mint.where(inside, out, ops.fill(out.dtype, out.shape, value))


_ORIGINAL_INTERPOLATE = mint.nn.functional.interpolate


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                antialias=False):
    """bilinear via ops.ResizeBilinearV2 (torch align_corners=False == half_pixel_centers); other modes unchanged."""
    if mode != "bilinear" or antialias:
        return _ORIGINAL_INTERPOLATE(input, size, scale_factor, mode, align_corners, recompute_scale_factor,
                                     antialias)
    if size is None:
        sf = _pair(scale_factor) if not isinstance(scale_factor, float) else (scale_factor, scale_factor)
        size = (int(math.floor(input.shape[-2] * sf[0])), int(math.floor(input.shape[-1] * sf[1])))
        exact = all(float(s).is_integer() for s in sf)
        if not exact and not recompute_scale_factor:
            raise NotImplementedError("ms_compat interpolate: non-integer scale_factor without recompute")
    size = _pair(size) if isinstance(size, int) else tuple(int(s) for s in size)
    ac = bool(align_corners)
    return ops.ResizeBilinearV2(align_corners=ac, half_pixel_centers=not ac)(input, size)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Inference-mode batch norm via the legacy ops.BatchNorm (the zoo models run in eval mode)."""
    if training:
        raise NotImplementedError("ms_compat batch_norm: training mode")
    c = input.shape[1]
    weight = ops.ones((c,), input.dtype) if weight is None else weight
    bias = ops.zeros((c,), input.dtype) if bias is None else bias
    shape = input.shape
    x = input if input.ndim == 4 else input.reshape(shape[0], c, -1, 1)
    out = ops.BatchNorm(is_training=False, epsilon=float(eps))(x, weight, bias, running_mean, running_var)[0]
    return out if input.ndim == 4 else out.reshape(shape)


def linspace(start, end, steps, *, dtype=None):
    return ms.Tensor(np.linspace(start, end, steps).astype(_np_dtype(dtype, np.float32)))


def topk(input, k, dim=-1, largest=True, sorted=True):
    """Via the legacy TopK (MoE routing)."""
    return ops.topk(input, k, dim=dim, largest=largest, sorted=sorted)


def one_hot(tensor, num_classes=-1):
    """Via the legacy OneHot (MoE expert masks; OneHotExt has no CPU kernel)."""
    num_classes = int(tensor.max().item()) + 1 if num_classes == -1 else num_classes
    return ops.one_hot(tensor, num_classes, ms.Tensor(1, tensor.dtype), ms.Tensor(0, tensor.dtype))


def rms_norm(x, gamma, epsilon=1e-6):
    """`ops.rms_norm` (RmsNorm has no CPU kernel): (x * rsqrt(mean(x^2) + eps) * gamma, rstd), as transformers'
    RMSNorm computes it."""
    rstd = ops.rsqrt(x.pow(2).mean(-1, keep_dims=True) + epsilon)
    return gamma * (x * rstd), rstd


_ORIGINAL_WHERE = mint.where


def where(condition, *args):
    """One argument: the indices of the non-zero entries per dimension (NonZeroExt has no CPU kernel)."""
    if args:
        return _ORIGINAL_WHERE(condition, *args)
    idx = ops.nonzero(condition)
    return tuple(idx[:, d] for d in range(condition.ndim))


FUNCTIONAL = {"interpolate": interpolate, "pad": pad, "embedding": embedding, "layer_norm": layer_norm,
              "conv2d": conv2d, "gelu": gelu, "one_hot": one_hot}
MINT = {"linspace": linspace, "addmm": addmm, "baddbmm": baddbmm, "arange": arange, "randn": randn, "rand": rand,
        "topk": topk, "where": where}


# ---- cell replacements -------------------------------------------------------------------------------------
def _embedding_construct(self, input):
    return embedding(input, self.weight, getattr(self, "padding_idx", None))


def _layer_norm_construct(self, input):
    return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


def _conv2d_construct(self, input):
    if self.padding_mode != "zeros":
        raise NotImplementedError("ms_compat conv2d: only padding_mode='zeros'")
    return conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _gelu_construct(self, input):
    return gelu(input, self.approximate)


def _tensor_repeat(self, *repeats):
    """torch `Tensor.repeat(*sizes)` (= tile); the CPU build's torch-style overload raises 'not supported'."""
    if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)):
        repeats = tuple(repeats[0])
    return ops.tile(self, tuple(int(r) for r in repeats))


def _tensor_index_add_(self, dim, index, source, *, alpha=1):
    """In-place `index_add_` along dim 0 (the MoE's scatter of expert outputs) via tensor_scatter_add."""
    if dim != 0:
        raise NotImplementedError("ms_compat index_add_: dim 0 only")
    self.assign_value(ops.tensor_scatter_add(self, index.reshape(-1, 1), source if alpha == 1 else source * alpha))
    return self


_SAVED: list[tuple[object, str, object]] = []
_SENTINEL = object()


def _swap(owner, name, value, label):
    _SAVED.append((owner, name, owner.__dict__.get(name, _SENTINEL)))
    setattr(owner, name, value)
    PATCHED.append(label)


def install() -> None:
    """Idempotent; `uninstall()` restores everything (the zoo tests share worker processes with the rest)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _SAVED.append((None, "mode", ms.get_context("mode")))
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the dump hooks need PyNative
    for name, fn in FUNCTIONAL.items():
        _swap(mint.nn.functional, name, fn, f"mint.nn.functional.{name}")
    _swap(mint.functional, "batch_norm", batch_norm, "mint.functional.batch_norm")
    _swap(ops, "rms_norm", rms_norm, "ops.rms_norm")
    for name, fn in MINT.items():
        _swap(mint, name, fn, f"mint.{name}")
    for cls, fn in ((mint.nn.Embedding, _embedding_construct), (mint.nn.LayerNorm, _layer_norm_construct),
                    (mint.nn.Conv2d, _conv2d_construct), (mint.nn.GELU, _gelu_construct)):
        _swap(cls, "construct", fn, f"{cls.__module__}.{cls.__name__}.construct")
    _swap(ms.Tensor, "repeat", _tensor_repeat, "mindspore.Tensor.repeat")
    _swap(ms.Tensor, "index_add_", _tensor_index_add_, "mindspore.Tensor.index_add_")
    _swap(ms.Tensor, "clone", lambda self: ops.deepcopy(self), "mindspore.Tensor.clone")
    _INSTALLED = True


def uninstall() -> None:
    global _INSTALLED
    while _SAVED:
        owner, name, old = _SAVED.pop()
        if owner is None:
            ms.set_context(mode=old)
        elif old is _SENTINEL:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
    PATCHED.clear()
    _INSTALLED = False
