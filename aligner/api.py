"""The library API's entry points that show progress: the pipelines with a terminal progress bar wired in.

This module sits above render/ (like the CLI), so that `aligner.dump(...)` and `aligner.compare(...)` draw a bar on
a terminal while the layers below only know core's Progress protocol.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from aligner.core.progress import Progress
from aligner.dumping import dump as _dump
from aligner.dumping.context import DumpContext
from aligner.pipelines.audit import audit as audit
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.run import compare as _compare
from aligner.render.progress import terminal_progress


@functools.wraps(_dump)
def dump(model: Any, directory: str | os.PathLike, *, progress: Progress | None = None,
         **options: Any) -> DumpContext:
    return _dump(model, directory, progress=progress or terminal_progress(), **options)


@functools.wraps(_compare)
def compare(dumps_a: str | os.PathLike, dumps_b: str | os.PathLike, *, progress: Progress | None = None,
            **options: Any) -> CompareResult:
    return _compare(str(dumps_a), str(dumps_b), progress=progress or terminal_progress(), **options)


def doctor(make_torch: Any, make_ms: Any, example_inputs: Any = None, *, progress: Progress | None = None,
           **options: Any) -> Any:
    """aligner.pipelines.doctor.doctor with a progress bar on a terminal, then every stage's report and doctor.html
    written into `result.out`; returns the DoctorResult. (Imported here, on first call: `aligner.dump` stays light.)"""
    from aligner.pipelines.doctor import doctor as run
    from aligner.render.doctor import write_reports

    result = run(make_torch, make_ms, example_inputs, progress=progress or terminal_progress(), **options)
    write_reports(result)
    return result


__all__ = ["dump", "compare", "audit", "doctor"]
