"""The statistics computed inside the framework (aligner.dumping.fstats) against the numpy path (tensor_stats), in
PyTorch and MindSpore: counts and min/max exactly, mean and L2 to 1e-12 relative (float64 sums in both)."""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
import torch

from aligner.dumping.fstats import fast_stats_of, mindspore_stats, stats_of, torch_stats
from aligner.dumping.tensors import to_host
from aligner.metrics.stats import STAT_KEYS, TINY, Stats, tensor_stats

ms.set_context(mode=ms.PYNATIVE_MODE)
RTOL = 1e-12  # mean and L2: float64 sums in a different order
_rng = np.random.default_rng(0)
CASES = {
    "normal": _rng.standard_normal((64, 33)).astype(np.float32),
    "large": _rng.standard_normal(200_003).astype(np.float32) * 1e3,
    "nonfinite": np.array([1.0, np.nan, -np.inf, 0.0, 1e-6, 0.5, np.inf, -0.995], np.float32),
    "all_nan": np.full(4, np.nan, np.float32),
    "empty": np.zeros((0, 3), np.float32),
    "zeros": np.zeros(10, np.float32),
    "float64": _rng.standard_normal(100),
    "float16": (_rng.standard_normal(300) * 1e-4).astype(np.float16),
    "thresholds": np.array([0.0, TINY, np.nextafter(np.float32(TINY), 0), 0.01, 0.0100001, 0.99, 0.98999, -1.0],
                           np.float32),
    "int64": _rng.integers(-5, 5, 100).astype(np.int64),
    "int32": _rng.integers(0, 3, (4, 5)).astype(np.int32),
    "bool": np.array([True, False, True]),
}


def agree(got_stats: Stats, want_stats: Stats) -> None:
    got, want = got_stats.to_dict(), want_stats.to_dict()
    assert list(got) == list(want) == list(STAT_KEYS)
    for key in STAT_KEYS:
        a, b = got[key], want[key]
        if key in ("mean", "l2") and a is not None and b is not None:
            assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-300), (key, a, b)
        else:
            assert a == b, (key, a, b)


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_ops_agree_with_numpy(name):
    array = CASES[name]
    agree(torch_stats(torch.from_numpy(array)), tensor_stats(array))
    agree(stats_of(torch.from_numpy(array)), tensor_stats(array))


@pytest.mark.parametrize("name", sorted(CASES))
def test_mindspore_ops_agree_with_numpy(name):
    array = CASES[name]
    agree(mindspore_stats(ms.Tensor(array)), tensor_stats(array))
    agree(stats_of(ms.Tensor(array)), tensor_stats(array))


def test_bfloat16_in_both_frameworks():
    values = _rng.standard_normal(1000).astype(np.float32) * 1e-3
    t = torch.from_numpy(values).to(torch.bfloat16)
    agree(torch_stats(t), tensor_stats(to_host(t)))
    agree(stats_of(t), tensor_stats(to_host(t)))
    m = ms.Tensor(values).astype(ms.bfloat16)
    agree(mindspore_stats(m), tensor_stats(to_host(m)))
    agree(stats_of(m), tensor_stats(to_host(m)))


def test_non_contiguous_and_requires_grad_tensors():
    base = torch.randn(8, 6, requires_grad=True)
    view = base.t()[1:]
    agree(torch_stats(view), tensor_stats(view.detach().numpy()))
    agree(stats_of(view), tensor_stats(view.detach().numpy()))


def test_a_negated_view_is_recorded_by_its_values():
    """torch's neg bit (the imaginary part of a conjugate; `_neg_view`): the memory holds -v, and numpy() refuses such
    a tensor. Every statistics path reads the values; before, the dump's one-pass path skipped the record."""
    values = np.linspace(0.5, 3, 50, dtype=np.float32)
    negated = -values
    for view in (torch._neg_view(torch.from_numpy(values)),
                 torch.complex(torch.zeros(50), torch.from_numpy(values)).conj().imag):
        assert view.is_neg()
        for stats in (fast_stats_of, stats_of, torch_stats):
            agree(stats(view), tensor_stats(negated))
        assert np.array_equal(to_host(view), negated)


def test_new_keys_mean_what_they_say():
    s = tensor_stats(np.array([0.0, 0.0, 1e-6, 0.005, 0.5, 0.995, -2.0, np.nan], np.float32))
    assert s.numel == 8 and s.nan == 1
    assert s.zeros == 2 / 8 and s.near_zero == 4 / 8 and s.near_one == 2 / 8
    assert s.tiny == 1 / 6  # of the 6 nonzero elements (NaN is nonzero), one is below float16's smallest normal
    assert tensor_stats(np.zeros(5, np.float32)).tiny == 0.0


def _ms_kinds() -> dict[str, ms.Tensor]:
    """MindSpore tensors of every layout and origin a deferred record holds at the flush."""
    from mindspore import mint

    x = _rng.standard_normal((6, 5)).astype(np.float32)
    base = mint.add(ms.Tensor(x), 1.0)
    kinds = {"fresh": ms.Tensor(x), "computed": base, "parameter": ms.Parameter(ms.Tensor(x), name="w"),
             "slice": base[2:], "row": base[3], "transposed": base.transpose(1, 0), "scalar": base.sum(),
             "empty": ms.Tensor(np.zeros((0, 3), np.float32)), "bfloat16": base.astype(ms.bfloat16)}
    for dtype in (ms.float16, ms.float64, ms.int32, ms.int64, ms.uint8, ms.bool_, ms.int8):
        kinds[str(dtype)] = (base * 3).astype(dtype)
    return kinds


@pytest.mark.parametrize("kind", list(_ms_kinds()))
def test_a_mindspore_view_reads_what_asnumpy_reads(kind: str) -> None:
    """`ms_view` wraps a contiguous tensor's memory from its data pointer (asnumpy for the rest): the same values,
    dtype and shape as asnumpy, for every dtype and layout (a slice's pointer starts at its offset)."""
    from aligner.core.dtypes import to_numpy
    from aligner.dumping.fstats import ms_views

    tensor = _ms_kinds()[kind]
    want = tensor.asnumpy()
    if tensor.dtype == ms.bfloat16:
        want = want.view(np.uint16).view(to_numpy("bfloat16"))
    got = ms_views()(tensor)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))


def test_a_mindspore_view_keeps_its_tensor_alive() -> None:
    """The view is the only reference left to a computed tensor: its memory must not go back to MindSpore's pool
    (later tensors of the same size would overwrite it)."""
    import gc

    from mindspore import mint

    from aligner.dumping.fstats import ms_views

    x = ms.Tensor(_rng.standard_normal((64, 64)).astype(np.float32))
    view = ms_views()(mint.mul(x, 2.0))
    assert view.flags.owndata is False
    want = x.asnumpy() * 2
    gc.collect()
    others = [mint.mul(x, -7.0) for _ in range(20)]  # same size: the pool would hand them a freed block
    assert others[-1].asnumpy()[0, 0] == pytest.approx(x.asnumpy()[0, 0] * -7)
    assert np.array_equal(view, want)
