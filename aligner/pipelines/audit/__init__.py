"""`align audit`: find the settings whose defaults or conventions differ between a PyTorch model and its MindSpore
port, before any tensor is compared."""
from aligner.pipelines.audit.model import audit, example_from_shape
from aligner.pipelines.audit.report import AuditReport, PairRecord, Unpaired

__all__ = ["AuditReport", "PairRecord", "Unpaired", "audit", "example_from_shape"]
