"""`align check DUMP` / `aligner.check`: read one dump directory (one framework, any number of steps, stats-only or
full) and report what looks unhealthy: NaN/Inf origins, float16 range, vanishing/exploding gradients, frozen weights
and update ratios, dead or saturated activations, loss-scale mistakes, and trend breaks over steps.

Rules and thresholds: mappings/check_rules.yaml; a rule that cannot be evaluated on the dump is skipped with its
reason (listed in the report), never counted as healthy. `evaluate` is the same check on in-memory records.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.check.config import RuleConfig
    from aligner.pipelines.check.report import CheckReport, Verdict
    from aligner.pipelines.check.rules import RULES, Evaluation, evaluate
    from aligner.pipelines.check.run import check, check_source
    from aligner.pipelines.check.view import GRAD_NORM, GRAD_NORM_CLIPPED, LOSS, LOSS_SCALE

# public name -> the module holding it (imported on first use)
_LAZY = {"check": "aligner.pipelines.check.run", "check_source": "aligner.pipelines.check.run",
         "CheckReport": "aligner.pipelines.check.report", "Verdict": "aligner.pipelines.check.report",
         "RuleConfig": "aligner.pipelines.check.config", "Evaluation": "aligner.pipelines.check.rules",
         "evaluate": "aligner.pipelines.check.rules", "RULES": "aligner.pipelines.check.rules",
         "LOSS": "aligner.pipelines.check.view", "LOSS_SCALE": "aligner.pipelines.check.view",
         "GRAD_NORM": "aligner.pipelines.check.view", "GRAD_NORM_CLIPPED": "aligner.pipelines.check.view"}

__all__ = ["CheckReport", "Evaluation", "GRAD_NORM", "GRAD_NORM_CLIPPED", "LOSS", "LOSS_SCALE", "RULES", "RuleConfig",
           "Verdict", "check", "check_source", "evaluate"]


__getattr__ = lazy.attributes(__name__, _LAZY)
