"""The one finding type that audits and health checks return: what rule fired, where, how bad, and what to do."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Severity(enum.Enum):
    """How a finding affects the exit code: an error fails the command (exit 1); warnings and info do not."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One observation: `rule` fired at `where` (each side's path, when there are two sides), with a fix."""

    rule: str
    severity: Severity
    message: str
    where: tuple[str | None, ...] = ()
    step: int | None = None
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity.value, "message": self.message,
                "where": list(self.where), "step": self.step, "fix": self.fix}
