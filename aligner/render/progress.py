"""rich progress bars behind core's Progress protocol: on stderr, only on a terminal, only after about a second."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichBar

from aligner.core.progress import SILENT, Progress
from aligner.render.console import make_console

DELAY_S = 1.0  # work shorter than this shows no bar at all


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
                self.bar = RichBar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                   TimeRemainingColumn(), transient=True, console=self.console)
                self.bar.start()
                self.task_id = self.bar.add_task(self.description, total=self.total, completed=self.done)
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
