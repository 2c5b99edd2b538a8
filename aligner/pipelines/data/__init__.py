"""`align data`: two input pipelines' recorded samples compared (compare_data), or one checked (check_data).
Rules and limits: mappings/data_rules.yaml; recording: aligner.record_data (aligner/dumping/data_record.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.data.check import check_data
    from aligner.pipelines.data.compare import compare_data
    from aligner.pipelines.data.result import DataCheckResult, DataCompareResult, DataFinding

# public name -> the module holding it (imported on first use)
_LAZY = {"check_data": "aligner.pipelines.data.check", "compare_data": "aligner.pipelines.data.compare",
         "DataCheckResult": "aligner.pipelines.data.result", "DataCompareResult": "aligner.pipelines.data.result",
         "DataFinding": "aligner.pipelines.data.result"}

__all__ = ["DataCheckResult", "DataCompareResult", "DataFinding", "check_data", "compare_data"]


__getattr__ = lazy.attributes(__name__, _LAZY)
