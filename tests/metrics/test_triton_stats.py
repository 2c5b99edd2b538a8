"""The one-pass Triton statistics kernel (`aligner.metrics.triton_stats`), run here by Triton's interpreter
(TRITON_INTERPRET=1) on CPU tensors: no GPU on this machine, so what this checks is the kernel's arithmetic (masks,
program and iteration boundaries, NaN/Inf, thresholds in the tensor's width, layouts) and the table bookkeeping
against `tensor_stats`, numpy's reference. The device run of `scripts/bench_dump.py --device cuda --check` checks the
same records compiled for a GPU."""
from __future__ import annotations

from typing import Iterator

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aligner.dumping import fstats
from aligner.dumping.fstats import StatsStage
from aligner.metrics import triton_stats
from aligner.metrics.stats import NEAR_ONE, NEAR_ZERO, TINY, tensor_stats
from tests.dumping.test_queued import same_stats

# the interpreter computes in numpy, which warns where a GPU overflows silently (squares of 1e300 are inf on both)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The kernel defined under Triton's interpreter (tests/conftest.py turns it on), for CPU tensors, with no failure
    remembered."""
    import triton  # a test dependency (pyproject's dev extra): this suite must not skip

    assert triton.knobs.runtime.interpret
    monkeypatch.setattr(triton_stats, "DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(triton_stats, "_failed", [])
    triton_stats._kernel.cache_clear()
    yield
    triton_stats._kernel.cache_clear()


def as_tensor(array: np.ndarray) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def kernel_stats(*tensors: torch.Tensor) -> list[dict]:
    """Each tensor's statistics through a StatsStage by the kernel alone (the test fails if any took another way)."""
    stage = StatsStage()
    staged = [stage.reduce(t) for t in tensors]
    assert all(s is not None and s.key[1] == fstats.KERNEL for s in staged), triton_stats.why_not()
    read = stage.read()
    return [read[s.key][s.index].to_dict() for s in staged if s is not None]


def assert_matches(got: dict, array: np.ndarray) -> None:
    want = tensor_stats(array).to_dict()
    assert same_stats(got, want), (got, want)


# on both sides of every threshold in each width, and the values that need care: -0.0, subnormals, the extremes
EDGES = [0.0, -0.0, NEAR_ZERO, -NEAR_ZERO, NEAR_ONE, -NEAR_ONE, TINY, -TINY, 1e-45, 1e-300, 65504.0, 3e38,
         np.nan, np.inf, -np.inf]
WIDTHS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", WIDTHS, ids=lambda d: np.dtype(d).name)
def test_edge_values_and_thresholds_in_each_width(interpreted: None, dtype: type) -> None:
    """Each threshold compared in the tensor's width (float32 for 16-bit floats): a float16 0.01 rounds above float32's
    0.01, so it is not near zero in either `tensor_stats` or the kernel."""
    with np.errstate(over="ignore"):
        edges = np.array(EDGES, np.float64).astype(dtype)
        around = np.concatenate([edges, np.nextafter(edges.astype(np.float32), np.float32(np.inf)).astype(dtype)])
    for array in (edges, around, edges[:-3]):  # with NaN/Inf, and finite only
        assert_matches(kernel_stats(as_tensor(array))[0], array)


@pytest.mark.parametrize("numel", [1, 1023, 1024, 1025, 1024 * 256, 1024 * 256 + 1, 1024 * 513 + 7])
def test_program_and_iteration_boundaries(interpreted: None, numel: int) -> None:
    """Sizes around a block, the largest single-iteration grid (MAX_PROGRAMS blocks) and past it (several iterations
    a program, a ragged last program): every element counted once."""
    count, iters = triton_stats.programs(numel)
    assert count <= triton_stats.MAX_PROGRAMS and count * iters * triton_stats.BLOCK >= numel
    array = np.random.default_rng(numel).standard_normal(numel).astype(np.float32)
    array[[0, numel // 2, numel - 1]] = [np.nan, -np.inf, 0.005]
    assert_matches(kernel_stats(torch.from_numpy(array))[0], array)


def test_layouts_each_element_once(interpreted: None) -> None:
    """A permuted dense tensor is read in place (one span), a sliced or expanded one through a copy, a view at a
    storage offset from there; channels-last too."""
    base = torch.from_numpy(np.random.default_rng(3).standard_normal((4, 6, 5, 7)).astype(np.float32))
    views = [base.permute(0, 2, 3, 1), base[:, ::2], base[1:], base.contiguous(memory_format=torch.channels_last),
             base[0, 0, 0].expand(3, 7), base.transpose(1, 2)[:, :, 1:]]
    for view, got in zip(views, kernel_stats(*views)):
        assert_matches(got, view.numpy())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(array=hnp.arrays(st.sampled_from([np.float16, np.float32, np.float64]),
                        hnp.array_shapes(max_dims=3, max_side=40),
                        elements={"allow_nan": True, "allow_infinity": True, "allow_subnormal": True}))
def test_any_float_array_matches_numpy(interpreted: None, array: np.ndarray) -> None:
    if array.size == 0:
        return  # empty tensors are not staged: their statistics need no reduction (test_queued)
    assert_matches(kernel_stats(torch.from_numpy(array))[0], array)


def test_tensors_across_full_tables_keep_their_rows(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table with no room left is followed by another, without a read: each tensor's rows stay its own."""
    monkeypatch.setattr(fstats, "TABLE_ROWS", 5)  # a 3-program tensor leaves 2 rows: the next one starts a table
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(n).astype(np.float32) * (i + 1) for i, n in enumerate([3000, 10, 5000, 1, 2500])]
    staged = StatsStage().reduce(torch.from_numpy(arrays[2]))
    assert staged is not None and staged.table_bytes == 5 * triton_stats.COLUMNS * 8  # what DEFER_BYTES counts
    for got, array in zip(kernel_stats(*map(torch.from_numpy, arrays)), arrays):
        assert_matches(got, array)


def test_a_failing_kernel_is_dropped_for_torch_reductions(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that cannot run (here a block Triton refuses; on a GPU machine, a first compile without a C compiler)
    is not tried again in the process; the tensor and those after it take the copy stage or torch's reductions, with
    the same statistics."""
    monkeypatch.setattr(triton_stats, "BLOCK", 1000)  # tl.arange needs a power of two
    stage = StatsStage()
    small = torch.linspace(-1, 1, 9)
    staged = [stage.reduce(t) or stage.add(t) for t in (small, small * 2)]  # the session's order
    assert all(s is not None and s.key[1] != fstats.KERNEL for s in staged)
    why = triton_stats.why_not()
    assert why is not None and "power of 2" in why, why
    read = stage.read()
    assert_matches(read[staged[1].key][staged[1].index].to_dict(), (small * 2).numpy())


def test_a_negated_view_is_read_as_its_values(interpreted: None) -> None:
    """A float view whose memory holds the negated values (torch's neg bit): the imaginary part of a conjugate (one
    element, so contiguous: read in place), and a contiguous negated view of many."""
    z = torch.complex(torch.linspace(-1, 2, 50), torch.linspace(-3, 1, 50))
    views = [z[1:2].conj().imag, torch._neg_view(torch.linspace(0.5, 3, 5000))]
    assert all(v.is_neg() and v.is_contiguous() for v in views)
    for view, got in zip(views, kernel_stats(*views)):
        assert_matches(got, view.resolve_neg().numpy())


class Tagged(torch.Tensor):
    """A tensor subclass (as DTensor or a quantised wrapper are): its data may not be its own memory."""


def test_not_used_off_its_devices_or_for_integers(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert triton_stats.usable(torch.ones(3))
    assert triton_stats.usable(torch.nn.Parameter(torch.ones(3)))
    assert not triton_stats.usable(torch.ones(3).as_subclass(Tagged))
    assert not triton_stats.usable(torch.ones(3, dtype=torch.int64))
    assert StatsStage().add(torch.ones(0)) is None  # nothing to reduce: its statistics are made at once
    assert StatsStage().reduce(torch.ones(0)) is None
    monkeypatch.setattr(triton_stats, "DEVICES", frozenset({"cuda"}))
    assert not triton_stats.usable(torch.ones(3))
