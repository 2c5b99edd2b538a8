"""Replay: each module's own error on the reference's inputs, next to the error it inherited (see replay/run.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.replay.assertion import assert_close
    from aligner.pipelines.replay.result import ReplayResult, ReplayRow
    from aligner.pipelines.replay.run import replay, replay_dumps

# public name -> the module holding it (imported on first use)
_LAZY = {"replay": "aligner.pipelines.replay.run", "replay_dumps": "aligner.pipelines.replay.run",
         "ReplayResult": "aligner.pipelines.replay.result", "ReplayRow": "aligner.pipelines.replay.result",
         "assert_close": "aligner.pipelines.replay.assertion"}

__all__ = ["ReplayResult", "ReplayRow", "assert_close", "replay", "replay_dumps"]


__getattr__ = lazy.attributes(__name__, _LAZY)
