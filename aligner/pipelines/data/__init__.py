"""`align data`: two input pipelines' recorded samples compared (compare_data), or one checked (check_data).
Rules and limits: mappings/data_rules.yaml; recording: aligner.record_data (aligner/dumping/data_record.py)."""
from __future__ import annotations

from aligner.pipelines.data.check import check_data
from aligner.pipelines.data.compare import compare_data
from aligner.pipelines.data.result import DataCheckResult, DataCompareResult, DataFinding

__all__ = ["check_data", "compare_data", "DataCheckResult", "DataCompareResult", "DataFinding"]
