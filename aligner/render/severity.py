"""How the findings of a report look by severity (audit, check): listed most severe first, each severity in one
colour. Apart from render/console.py, so that a command printing no findings does not load them."""
from __future__ import annotations

from aligner.core.findings import Severity

SEVERITY_ORDER = (Severity.ERROR, Severity.WARNING, Severity.INFO)
SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "dim"}
