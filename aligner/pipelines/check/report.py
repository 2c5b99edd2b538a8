"""The result of `align check`: findings, skipped rules with their reasons, and the series the HTML report charts."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from aligner.core.errors import ExitCode
from aligner.core.findings import Finding, Severity
from aligner.core.result import PassedByExitCode, number, typed
from aligner.pipelines.check.rules import Evaluation


class Verdict(enum.Enum):
    """ERRORS: an error-severity finding (exit 1); WARNINGS: findings, none an error; CLEAN: no finding from the rules
    that ran (never 'healthy' for the skipped ones)."""

    ERRORS = "errors"
    WARNINGS = "warnings"
    CLEAN = "clean"


@dataclasses.dataclass(frozen=True)
class CheckReport(PassedByExitCode):
    """One dump's health check (a `Result`: `passed` when no finding is an error)."""

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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckReport:
        """The report `to_dict` gave (as --json saved it), back; `verdict` and `exit_code` are derived again."""
        series = data["series"]
        evaluation = Evaluation(
            [Finding.from_dict(f) for f in data["findings"]], {str(k): str(v) for k, v in data["skipped"].items()},
            [str(c) for c in data["checked"]], [str(n) for n in data["notes"]],
            [typed(s, int, "steps") for s in data["steps"]], _series(series["grad_norms"]),
            _series(series["update_ratios"]), _steps(series["loss"]),
            typed(series["update_ratios_exact"], bool, "update_ratios_exact"))
        return cls(typed(data["directory"], str, "directory"), typed(data["framework"], str, "framework"),
                   typed(data["mode"], str, "mode"), typed(data["records"], int, "records"), evaluation,
                   {str(rule): dict(values) for rule, values in data["thresholds"].items()},
                   [str(p) for p in data["problems"]])


def _steps(values: Mapping[str, Any]) -> dict[int, float]:
    """{step: value} read back from JSON (whose keys are strings; a value may be "nan")."""
    out = {int(step): number(value) for step, value in values.items()}
    if any(v is None for v in out.values()):
        raise ValueError("a series holds null")
    return out  # type: ignore[return-value]


def _series(data: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """A saved {name: {step: value}} series, back with its integer steps."""
    return {str(name): _steps(values) for name, values in data.items()}
