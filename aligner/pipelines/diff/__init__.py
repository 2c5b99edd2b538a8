"""`align diff`: two checkpoints compared parameter by parameter (`checkpoints.py`), and with --grads the update step
explained (`grads.py` and the fit it runs: `rules.py`, `fit.py`, `side.py`, `explain.py`).

`diff_checkpoints(a, b, ...)` pairs the names through the conversion rules and returns a `DiffResult`.
`explain_updates(a_k, b_k, grads_a, grads_b, init_a=..., init_b=...)` reads two checkpoints after k steps, the weights
before step 1 (per side, or one init both sides were converted from) and both sides' gradient dumps, fits per
parameter SGD (momentum, dampening, nesterov, L2), Adam, AdamW, MindSpore nn.Adam or nn.AdamWeightDecay with
global-norm clipping, groups parameters whose fits agree, and returns an `UpdateReport` whose `findings` name the
terms that differ. `fit_side` and `compare_sides` do the same from arrays. When the dumps hold per-step parameter
values (records of kind "param"), the fit uses the whole trajectory instead of the endpoints.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.mapping.optimizers import Family
    from aligner.pipelines.diff.checkpoints import DiffResult, DiffStatus, ParamDiff, SideCounts, diff_checkpoints
    from aligner.pipelines.diff.explain import compare_sides
    from aligner.pipelines.diff.fit import FIT_RTOL, ParamFit
    from aligner.pipelines.diff.grads import DiffUpdates, UpdateReport, explain_updates, read_dump
    from aligner.pipelines.diff.rules import MIN_STEPS, UpdateRule
    from aligner.pipelines.diff.side import ClipKind, Clipping, RuleGroup, SideFit, fit_side

# public name -> the module holding it (imported on first use)
_LAZY = {"diff_checkpoints": "aligner.pipelines.diff.checkpoints", "DiffResult": "aligner.pipelines.diff.checkpoints",
         "DiffStatus": "aligner.pipelines.diff.checkpoints", "ParamDiff": "aligner.pipelines.diff.checkpoints",
         "SideCounts": "aligner.pipelines.diff.checkpoints",
         "explain_updates": "aligner.pipelines.diff.grads", "DiffUpdates": "aligner.pipelines.diff.grads",
         "UpdateReport": "aligner.pipelines.diff.grads",
         "read_dump": "aligner.pipelines.diff.grads", "compare_sides": "aligner.pipelines.diff.explain",
         "fit_side": "aligner.pipelines.diff.side", "SideFit": "aligner.pipelines.diff.side",
         "RuleGroup": "aligner.pipelines.diff.side", "Clipping": "aligner.pipelines.diff.side",
         "ClipKind": "aligner.pipelines.diff.side", "UpdateRule": "aligner.pipelines.diff.rules",
         "MIN_STEPS": "aligner.pipelines.diff.rules", "Family": "aligner.mapping.optimizers",
         "ParamFit": "aligner.pipelines.diff.fit", "FIT_RTOL": "aligner.pipelines.diff.fit"}

__all__ = ["ClipKind", "Clipping", "DiffResult", "DiffStatus", "DiffUpdates", "FIT_RTOL", "Family", "MIN_STEPS",
           "ParamDiff", "ParamFit", "RuleGroup", "SideCounts", "SideFit", "UpdateReport", "UpdateRule", "compare_sides",
           "diff_checkpoints", "explain_updates", "fit_side", "read_dump"]


__getattr__ = lazy.attributes(__name__, _LAZY)
