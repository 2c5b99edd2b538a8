"""`align audit`: find the settings whose defaults or conventions differ between a PyTorch model and its MindSpore
port, before any tensor is compared."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.pipelines.audit.model import audit, example_from_shape
    from aligner.pipelines.audit.report import AuditReport, PairRecord, Unpaired

# public name -> the module holding it (imported on first use)
_LAZY = {"audit": "aligner.pipelines.audit.model", "example_from_shape": "aligner.pipelines.audit.model",
         "AuditReport": "aligner.pipelines.audit.report", "PairRecord": "aligner.pipelines.audit.report",
         "Unpaired": "aligner.pipelines.audit.report"}

__all__ = ["AuditReport", "PairRecord", "Unpaired", "audit", "example_from_shape"]


__getattr__ = lazy.attributes(__name__, _LAZY)
