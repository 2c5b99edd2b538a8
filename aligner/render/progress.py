"""rich progress bars behind core's Progress protocol: on stderr, only on a terminal, only after about a second."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Iterator

from rich.console import Console

from aligner.core.progress import SILENT, Progress
from aligner.core.text import printable
from aligner.render.console import make_console

if TYPE_CHECKING:
    from rich.progress import Progress as RichBar
    from rich.progress import TaskID

DELAY_S = 1.0  # work shorter than this shows no bar at all


def _start_bar(description: str, total: int, completed: int, console: Console) -> tuple[RichBar, TaskID]:
    """A transient rich bar, started. rich.progress (and rich.live under it) is imported here, when the first bar
    appears, not by every run that could show one: most end before DELAY_S, and on a pipe none shows a bar."""
    from rich import progress as bars

    bar = bars.Progress(bars.TextColumn("{task.description}", markup=False), bars.BarColumn(),
                        bars.MofNCompleteColumn(), bars.TimeRemainingColumn(), transient=True, console=console)
    bar.start()
    return bar, bar.add_task(printable(description), total=total, completed=completed)


class _DelayedTask:
    """Counts work; a bar appears once the task has run DELAY_S seconds, and is removed when it ends."""

    def __init__(self, description: str, total: int, console: Console) -> None:
        self.description, self.total, self.done, self.console = description, total, 0, console
        self.start = time.monotonic()
        self.bar: RichBar | None = None
        self.task_id: TaskID | None = None
        self.lock = threading.Lock()

    def advance(self, amount: int = 1) -> None:
        with self.lock:
            self.done += amount
            if self.bar is None and time.monotonic() - self.start >= DELAY_S:
                self.bar, self.task_id = _start_bar(self.description, self.total, self.done, self.console)
            elif self.bar is not None and self.task_id is not None:
                self.bar.update(self.task_id, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class TerminalProgress:
    """Progress bars (on stderr unless given a console) for work that runs longer than about a second."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[_DelayedTask]:
        task = _DelayedTask(description, total, self.console or make_console(stderr=True))
        try:
            yield task
        finally:
            task.close()


def terminal_progress() -> Progress:
    """Bars when stderr is a terminal; nothing on a pipe or a file."""
    return TerminalProgress() if sys.stderr.isatty() else SILENT
