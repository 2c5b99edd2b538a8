"""The progress bar of a streamed `align compare` has a total: the bytes of both manifests, advanced by the bytes
read as the rows are made, so it ends at its total and moves along the way."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest

from aligner.dumping.read import stream as read_stream
from aligner.pipelines.compare import stream
from aligner.pipelines.compare.stream import compare_streamed
from tests.pipelines.compare.test_stream import _stats_dump


class _Task:
    def __init__(self, description: str, total: int) -> None:
        self.description, self.total, self.done = description, total, 0

    def advance(self, amount: int = 1) -> None:
        assert amount >= 0
        self.done += amount


class _Recorder:
    """A Progress that keeps its tasks."""

    def __init__(self) -> None:
        self.tasks: list[_Task] = []

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[_Task]:
        self.tasks.append(_Task(description, total))
        yield self.tasks[-1]


class _Seen:
    """A row sink noting how far the bar was when each row came."""

    def __init__(self, progress: _Recorder) -> None:
        self.progress, self.at = progress, []

    def add(self, index: int, row: object) -> None:
        self.at.append(self.progress.tasks[-1].done)

    def settled(self, index: int) -> None:
        pass

    def restart(self) -> None:
        self.at.clear()


def test_the_bar_counts_the_manifests_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_stream, "BLOCK", 1 << 16)  # ~170 records a block: the bytes come in many steps
    monkeypatch.setattr(stream, "BLOCK", 256)
    a = _stats_dump(tmp_path / "a", "mindspore", 3000, 2000)
    b = _stats_dump(tmp_path / "b", "pytorch", 3000, 3000)
    progress = _Recorder()
    seen = _Seen(progress)
    result = compare_streamed(str(a), str(b), sink=seen, progress=progress)
    assert result.streamed.fallback is None and len(result.rows) == 3000
    (task,) = progress.tasks
    size = (a / "manifest.jsonl").stat().st_size + (b / "manifest.jsonl").stat().st_size
    assert task.total == size and task.done == size
    assert seen.at == sorted(seen.at)  # never back
    assert 0 < seen.at[1500] < size * 0.75  # half the rows made: about half the bytes read (a block ahead of them)


def test_dumps_without_a_manifest_count_rows(tmp_path: Path) -> None:
    """A folder of .npy files is read whole (no bytes to count): the bar counts the rows, with no total."""
    import numpy as np

    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        for k in range(5):
            np.save(tmp_path / side / f"t{k}.npy", np.arange(4, dtype=np.float32) + k)
    progress = _Recorder()
    result = compare_streamed(str(tmp_path / "a"), str(tmp_path / "b"), progress=progress)
    (task,) = progress.tasks
    assert result.streamed.fallback is None and task.total == 0 and task.done == len(result.rows) == 5
