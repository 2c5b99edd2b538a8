"""`align repro`: a standalone directory that rebuilds one module in both frameworks from two dumps and shows
whether they agree on the reference side's recorded inputs (`python DIR/repro.py`: exit 0 agree, 1 differ)."""
from aligner.pipelines.repro.layers import Build
from aligner.pipelines.repro.run import ReproResult, repro

__all__ = ["Build", "ReproResult", "repro"]
