"""The result of `align check`: findings, skipped rules with their reasons, and the series the HTML report charts."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from aligner.core.errors import ExitCode
from aligner.core.findings import Finding, Severity
from aligner.pipelines.check.rules import Evaluation


class Verdict(enum.Enum):
    """ERRORS: an error-severity finding (exit 1); WARNINGS: findings, none an error; CLEAN: no finding from the rules
    that ran (never 'healthy' for the skipped ones)."""

    ERRORS = "errors"
    WARNINGS = "warnings"
    CLEAN = "clean"


@dataclasses.dataclass
class CheckReport:
    """One dump's health check."""

    directory: str
    framework: str
    mode: str                       # "full" | "stats"
    records: int
    evaluation: Evaluation
    thresholds: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # the rules as run
    problems: list[str] = dataclasses.field(default_factory=list)  # manifest lines that did not parse

    @property
    def findings(self) -> list[Finding]:
        return self.evaluation.findings

    @property
    def skipped(self) -> dict[str, str]:
        return self.evaluation.skipped

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    @property
    def verdict(self) -> Verdict:
        if self.errors:
            return Verdict.ERRORS
        return Verdict.WARNINGS if self.findings else Verdict.CLEAN

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FOUND if self.errors else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        ev = self.evaluation
        return {"directory": self.directory, "framework": self.framework, "mode": self.mode, "records": self.records,
                "steps": ev.steps, "verdict": self.verdict.value, "exit_code": int(self.exit_code),
                "findings": [f.to_dict() for f in self.findings], "checked": ev.checked, "skipped": ev.skipped,
                "notes": ev.notes, "problems": self.problems, "thresholds": self.thresholds,
                "series": {"grad_norms": ev.grad_norms, "update_ratios": ev.update_ratios, "loss": ev.loss,
                           "update_ratios_exact": ev.exact_updates}}
