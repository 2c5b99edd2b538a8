"""The update step explained: fit the optimizer rule each side applied over k steps and say which term differs.

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
    from aligner.pipelines.update_rule.explain import compare_sides
    from aligner.pipelines.update_rule.fit import FIT_RTOL, ParamFit
    from aligner.pipelines.update_rule.rules import MIN_STEPS, UpdateRule
    from aligner.pipelines.update_rule.run import UpdateReport, explain_updates, read_dump
    from aligner.pipelines.update_rule.side import ClipKind, Clipping, RuleGroup, SideFit, fit_side

# public name -> the module holding it (imported on first use)
_LAZY = {"explain_updates": "aligner.pipelines.update_rule.run", "UpdateReport": "aligner.pipelines.update_rule.run",
         "read_dump": "aligner.pipelines.update_rule.run", "compare_sides": "aligner.pipelines.update_rule.explain",
         "fit_side": "aligner.pipelines.update_rule.side", "SideFit": "aligner.pipelines.update_rule.side",
         "RuleGroup": "aligner.pipelines.update_rule.side", "Clipping": "aligner.pipelines.update_rule.side",
         "ClipKind": "aligner.pipelines.update_rule.side", "UpdateRule": "aligner.pipelines.update_rule.rules",
         "MIN_STEPS": "aligner.pipelines.update_rule.rules", "Family": "aligner.mapping.optimizers",
         "ParamFit": "aligner.pipelines.update_rule.fit", "FIT_RTOL": "aligner.pipelines.update_rule.fit"}

__all__ = ["FIT_RTOL", "MIN_STEPS", "ClipKind", "Clipping", "Family", "ParamFit", "RuleGroup", "SideFit",
           "UpdateReport", "UpdateRule", "compare_sides", "explain_updates", "fit_side", "read_dump"]


__getattr__ = lazy.attributes(__name__, _LAZY)
