"""`align repro`: a standalone directory that rebuilds one module in both frameworks from two dumps and shows
whether they agree on the reference side's recorded inputs (`python DIR/repro.py`: exit 0 agree, 1 differ)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.repro.layers import Build
    from aligner.pipelines.repro.run import ReproResult, repro

# public name -> the module holding it (imported on first use)
_LAZY = {"Build": "aligner.pipelines.repro.layers", "ReproResult": "aligner.pipelines.repro.run",
         "repro": "aligner.pipelines.repro.run"}

__all__ = ["Build", "ReproResult", "repro"]


__getattr__ = lazy.attributes(__name__, _LAZY)
