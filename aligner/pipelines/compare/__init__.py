"""`align compare`: read two dumps, pair their records, compute metrics and find the first divergence.

The names below are imported on first use, so a comparison loads only the parts it runs: multi-rank dumps
(compare_ranks), the --calibrate pass, a cluster engine's batches (evaluate_on, measure_on) and the worker pools of
a run big enough to split (evaluate_parallel) and the audit's rules that name a blamed module's differing settings
(with_settings: only for a finding in dumps with call records), and reading a saved result back (load_result)
stay unloaded otherwise, which keeps the start of `align compare` short.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.compare.calibrate import calibrate as calibrate_pairs
    from aligner.pipelines.compare.distributed import evaluate_on, measure_on
    from aligner.pipelines.compare.parallel import evaluate_parallel
    from aligner.pipelines.compare.ranks import compare_ranks
    from aligner.pipelines.compare.run import compare
    from aligner.pipelines.compare.saved import load as load_result
    from aligner.pipelines.compare.settings import with_settings

# public name -> (module, its name there)
_LAZY = {"compare": ("aligner.pipelines.compare.run", "compare"),
         "compare_ranks": ("aligner.pipelines.compare.ranks", "compare_ranks"),
         "calibrate_pairs": ("aligner.pipelines.compare.calibrate", "calibrate"),
         "evaluate_on": ("aligner.pipelines.compare.distributed", "evaluate_on"),
         "measure_on": ("aligner.pipelines.compare.distributed", "measure_on"),
         "evaluate_parallel": ("aligner.pipelines.compare.parallel", "evaluate_parallel"),
         "with_settings": ("aligner.pipelines.compare.settings", "with_settings"),
         "load_result": ("aligner.pipelines.compare.saved", "load")}

__all__ = ["calibrate_pairs", "compare", "compare_ranks", "evaluate_on", "evaluate_parallel", "load_result",
           "measure_on", "with_settings"]


__getattr__ = lazy.attributes(__name__, _LAZY)
