"""aligner: numerical alignment between PyTorch and MindSpore.

The library API (used inside training scripts) is imported lazily so `import aligner` stays cheap and works with only
one framework installed.
"""
from __future__ import annotations

from aligner.core import lazy
from aligner.core.version import __version__ as __version__
from aligner.render import words as _words  # noqa: F401  (registers how a pipeline's Words become text)

# public name -> module that defines it
_API = {
    "fix_random": "aligner.dumping.randomness",
    "disable_dropout": "aligner.dumping.randomness",
    "check_determinism": "aligner.dumping.determinism",
    "skip_batches": "aligner.dumping.data",
    "record_data": "aligner.dumping.data_record",
    "compare_data": "aligner.pipelines.data",
    "check_data": "aligner.pipelines.data",
    "inspect_model": "aligner.pipelines.inspect",
    "dump": "aligner.api",
    "compare": "aligner.api",
    "audit": "aligner.api",
    "doctor": "aligner.api",
    "save": "aligner.dumping.context",
    "wait_dumps": "aligner.dumping.pending",
    "save_grads": "aligner.dumping.ranks",
    "compare_ranks": "aligner.pipelines.compare.ranks",
    "check_ranks": "aligner.pipelines.check.ranks",
    "replay": "aligner.pipelines.replay.run",
    "assert_close": "aligner.pipelines.replay.assertion",
    "noise_floor": "aligner.dumping.noise",
    "repro": "aligner.pipelines.repro",
    "explain_updates": "aligner.pipelines.diff",
    "audit_optimizers": "aligner.pipelines.audit.optimizers",
    "convert_training_state": "aligner.pipelines.convert",
    "convert_state_dicts": "aligner.pipelines.convert",
    "check": "aligner.pipelines.check",
    "watch": "aligner.pipelines.check.watch",
    "native_dump_config": "aligner.dumping.read.foreign.native",
}

__all__ = sorted(_API)


__getattr__ = lazy.attributes(__name__, _API)
