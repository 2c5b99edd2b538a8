"""A torch tensor on an accelerator is recorded queued (aligner.dumping.session.QUEUE_DEVICES): its statistics or its
host copy are queued on the device and read back at the flush. No accelerator here, so the path is forced onto the
CPU: what it checks is the bookkeeping (order, links, flushes, bounds) and the statistics' arithmetic; the device run
of scripts/bench_dump.py --device cuda --check checks the same records on a GPU, where the queue is asynchronous."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import msgspec
import numpy as np
import pytest
import torch

import aligner
from aligner.dumping import fstats, session
from aligner.dumping.fstats import QueuedStats, StatsStage, read_queued, torch_stats_queued
from aligner.dumping.manifest import Record, iter_manifest
from aligner.metrics import triton_stats
from aligner.metrics.stats import Stats, tensor_stats
from tests.support.twin_models import example_input, make_twins


def records(directory: Path) -> list[dict]:
    """Every record of a dump as a dict (tensor files are named by their content: same data, same name)."""
    items = [item for _, item in iter_manifest(directory)][1:]
    assert all(isinstance(item, Record) for item in items)
    return [msgspec.structs.asdict(item) for item in items]


def train_step(model: torch.nn.Module, x: np.ndarray) -> None:
    """Forward, backward and an SGD update (which changes every parameter in place)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.from_numpy(x)).square().mean().backward()
    opt.step()


def dump(tmp_path: Path, name: str, kind: str, queued: bool, monkeypatch: pytest.MonkeyPatch,
         **options: object) -> list[dict]:
    """One training step of a fresh twin dumped with the CPU treated as a queueing device (`queued`) or not."""
    model, _ = make_twins(kind)
    with monkeypatch.context() as m:
        m.setattr(session, "QUEUE_DEVICES", frozenset({"cpu"} if queued else session.QUEUE_DEVICES))
        with aligner.dump(model, tmp_path / name, **options):
            train_step(model, example_input(kind))
    return records(tmp_path / name)


def same_stats(a: dict | None, b: dict | None) -> bool:
    """Counts, fractions and extrema exactly; mean and L2 to float64 rounding of a float32 sum (torch and numpy
    add in different orders: 1e-9 relative is ~1e7 ulps of float64 above that, far below any float32 difference)."""
    if a is None or b is None:
        return a is b
    exact = {k: v for k, v in a.items() if k not in ("mean", "l2")}
    if exact != {k: v for k, v in b.items() if k not in ("mean", "l2")}:
        return False
    return all(a[k] == b[k] if a[k] is None or b[k] is None else a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12)
               for k in ("mean", "l2") if k in a)


def assert_same_records(at_once: list[dict], queued: list[dict]) -> None:
    """Every field equal, statistics as `same_stats` says (a stats-only block record of a full dump, too)."""
    for a, b in zip(at_once, queued):
        assert {k: v for k, v in a.items() if k != "stats"} == {k: v for k, v in b.items() if k != "stats"}
        assert same_stats(a["stats"] and a["stats"].to_dict(), b["stats"] and b["stats"].to_dict()), a["module"]


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_a_full_dump_copies_at_once_and_queues_its_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              kind: str) -> None:
    """Its tensors' files are copied as the hooks run; its stats-only records (a block's inputs and outputs) are
    queued, and the records behind them wait in order."""
    monkeypatch.setattr(session, "DEFER_RECORDS", 3)
    at_once = dump(tmp_path, "now", kind, False, monkeypatch, params=True)
    queued = dump(tmp_path, "queued", kind, True, monkeypatch, params=True)
    assert len(queued) == len(at_once) > 30
    assert_same_records(at_once, queued)  # files (content-addressed), links, order: all the same
    assert sum(r["file"] is not None for r in queued) > 30
    assert any(r["stats"] is not None for r in queued)  # stats-only records among them, queued
    assert any(r["same_as"] is not None for r in queued)  # links kept


# (records waiting before a flush, elements a stage buffer holds, the largest tensor staged): the cnn's tensors
# have 64 to 4,608 elements, so the middle case stages some, reads the stage when full, and reduces others alone
@pytest.mark.parametrize("limit, stage, largest", [(1, 0, 0), (7, 3000, 1500), (1 << 16, 1 << 22, 1 << 18)],
                         ids=["each-alone", "stage-full", "all-staged"])
def test_queued_statistics_are_those_read_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int,
                                                  stage: int, largest: int) -> None:
    monkeypatch.setattr(session, "DEFER_RECORDS", limit)
    monkeypatch.setattr(fstats, "STAGE_ELEMENTS", stage)
    monkeypatch.setattr(fstats, "STAGE_MAX", largest)
    at_once = dump(tmp_path, "now", "cnn", False, monkeypatch, stats_only=True, params=True)
    queued = dump(tmp_path, "queued", "cnn", True, monkeypatch, stats_only=True, params=True)
    assert len(queued) == len(at_once) > 30
    assert_same_records(at_once, queued)
    assert sum(r["stats"] is not None for r in queued) > 30


@pytest.mark.parametrize("kind, records, table_bytes", [("cnn", 7, 1 << 28), ("block", 7, 1 << 28),
                                                        ("cnn", 1 << 16, 300)],
                         ids=["cnn-every-7-records", "block-every-7-records", "cnn-every-300-table-bytes"])
def test_kernel_statistics_are_those_read_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                                                  records: int, table_bytes: int) -> None:
    """Through the Triton kernel (by its interpreter here, tests/metrics/test_triton_stats.py): the same records as the
    statistics read at once, the parameters updated in place after their hooks included, whether the flush comes after
    so many records or once the kernel's table rows reach DEFER_BYTES (88 bytes a row: every 4 small tensors)."""
    monkeypatch.setattr(triton_stats, "DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(triton_stats, "_failed", [])
    monkeypatch.setattr(session, "DEFER_RECORDS", records)
    monkeypatch.setattr(session, "DEFER_BYTES", table_bytes)
    at_once = dump(tmp_path, "now", kind, False, monkeypatch, stats_only=True, params=True)
    queued = dump(tmp_path, "queued", kind, True, monkeypatch, stats_only=True, params=True)
    assert triton_stats.why_not() is None
    assert len(queued) == len(at_once) > 30
    assert_same_records(at_once, queued)


CASES = {
    "float32": np.array([[1.5, -2.0, 0.0], [1e-9, 0.995, 3.0]], np.float32),
    "nan_inf": np.array([np.nan, 1.0, -np.inf, 2.5, np.inf, 0.0, np.nan], np.float32),
    "all_nan": np.full(5, np.nan, np.float32),
    "float64": np.random.default_rng(1).standard_normal(1000),
    "int64": np.array([3, -7, 0, 1], np.int64),
    "bool": np.array([True, False, True]),
    "float16": np.array([6e-5, -1e-7, 65504.0, 0.5], np.float16),
    "bfloat16": np.array([1.0, -3.5, 1e-3, 0.0], ml_dtypes.bfloat16),
    "empty": np.zeros((0, 3), np.float32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_queued_statistics_of_every_dtype_match_numpy(name: str) -> None:
    array = CASES[name]
    tensor = (torch.from_numpy(array.view(np.int16)).view(torch.bfloat16) if name == "bfloat16"
              else torch.from_numpy(array))
    got = torch_stats_queued(tensor)
    read = read_queued([got])[0] if isinstance(got, QueuedStats) else got
    assert isinstance(read, Stats)
    assert same_stats(read.to_dict(), tensor_stats(array).to_dict())


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n].dtype.kind == "f" or n == "bfloat16"])
def test_staged_statistics_of_every_float_match_numpy(name: str) -> None:
    array = CASES[name]
    tensor = (torch.from_numpy(array.view(np.int16)).view(torch.bfloat16) if name == "bfloat16"
              else torch.from_numpy(array))
    stage = StatsStage()
    staged = [stage.add(tensor), stage.add(torch.ones(3)), stage.add(tensor.reshape(-1)[:1])]  # segments around
    read = stage.read()
    if array.size == 0:
        assert staged[0] is None  # an empty tensor is not staged (its statistics need no reduction)
        return
    assert all(s is not None for s in staged)
    got = [read[s.key][s.index] for s in staged if s is not None]
    assert same_stats(got[0].to_dict(), tensor_stats(array).to_dict())
    assert same_stats(got[2].to_dict(), tensor_stats(array.reshape(-1)[:1]).to_dict())
    assert stage.read() == {}  # read once


def test_queued_statistics_are_read_in_their_order() -> None:
    tensors = [torch.full((3,), float(i)) for i in range(5)]
    read = read_queued([q for q in map(torch_stats_queued, tensors) if isinstance(q, QueuedStats)])
    assert [s.max for s in read] == [0.0, 1.0, 2.0, 3.0, 4.0]
