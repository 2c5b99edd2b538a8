"""Progress bars: drawn by rich on a terminal once work outlasts the delay; never on a pipe."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
from rich.console import Console

from aligner.core.progress import SILENT
from aligner.pipelines.convert.checkpoint import convert
from aligner.render import progress as bars
from tests.support.cli import run_align
from tests.support.compare_fixtures import write_dump


def test_bar_appears_only_after_the_delay(monkeypatch) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with bars.TerminalProgress(console).task("comparing", total=3) as task:
        task.advance()
    assert out.getvalue() == ""  # finished well within DELAY_S: no bar at all
    monkeypatch.setattr(bars, "DELAY_S", 0.0)
    with bars.TerminalProgress(console).task("comparing", total=3) as task:
        for _ in range(3):
            task.advance()
    assert "comparing" in out.getvalue() and "3/3" in out.getvalue()


def test_nothing_on_a_pipe(tmp_path: Path) -> None:
    assert bars.terminal_progress() is SILENT  # pytest captures stderr: not a terminal
    x = np.ones(8, np.float32)
    a = write_dump(tmp_path / "a", "mindspore", [{"module": f"m{i}", "array": x} for i in range(300)])
    b = write_dump(tmp_path / "b", "pytorch", [{"module": f"m{i}", "array": x} for i in range(300)])
    proc = run_align("compare", a, b)
    assert proc.returncode == 0 and proc.stderr == ""


class _Recorder:
    """A Progress that remembers what it was told (the protocol needs nothing from rich)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, int]] = []
        self.advanced = 0

    @contextlib.contextmanager
    def task(self, description: str, total: int):
        self.tasks.append((description, total))
        yield self

    def advance(self, amount: int = 1) -> None:
        self.advanced += amount


def test_convert_reports_each_tensor_written(tmp_path: Path) -> None:
    import torch

    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict(), tmp_path / "m.pth")
    recorder = _Recorder()
    result = convert(str(tmp_path / "m.pth"), str(tmp_path / "m.ckpt"), progress=recorder)
    assert result.written and recorder.tasks == [("converting", len(result.plan.outputs))]
    assert recorder.advanced == len(result.plan.outputs) == 6  # weight, bias, gamma, beta, moving mean/variance
