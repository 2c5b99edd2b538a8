"""What `align data` returns: findings as data (rule, field, evidence; render/data.py writes the sentences from the
rule's templates), per-field agreement, and the first differing sample."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from aligner.core.errors import ExitCode
from aligner.core.findings import Severity
from aligner.core.result import PassedByExitCode
from aligner.pipelines.data.rules import DataRule, RuleText, Section, rule


@dataclasses.dataclass(frozen=True)
class DataFinding:
    """One rule that fired: on a field (None: the samples as a whole), with the values its templates name."""

    rule: DataRule
    section: Section
    field: str | None
    evidence: dict[str, Any]

    @property
    def text(self) -> RuleText:
        return rule(self.section, self.rule)

    @property
    def severity(self) -> Severity:
        return self.text.severity

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.value, "severity": self.severity.value, "checklist": self.text.checklist,
                "field": self.field, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, data: dict[str, Any], section: Section) -> "DataFinding":
        """A finding read back from `to_dict` (severity and checklist come from the rules file again)."""
        return cls(DataRule(data["rule"]), section, data.get("field"), dict(data.get("evidence") or {}))


@dataclasses.dataclass(frozen=True)
class SamplePosition:
    """Where a sample sat in a recorded run: its index in the dump, epoch, batch and row."""

    index: int
    epoch: int
    batch: int
    row: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplePosition":
        return cls(int(data["index"]), int(data["epoch"]), int(data["batch"]), int(data["row"]))


@dataclasses.dataclass(frozen=True)
class FirstDifference:
    """The first sample (in side A's order) where a field differs, with its place on both sides."""

    field: str
    a: SamplePosition
    b: SamplePosition

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a.to_dict(), "b": self.b.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FirstDifference":
        return cls(data["field"], SamplePosition.from_dict(data["a"]), SamplePosition.from_dict(data["b"]))


class Pairing(str, enum.Enum):
    """How samples were paired across the sides."""

    CONTENT = "content"    # by the digests of the fields that agree
    POSITION = "position"  # by position (no field agrees enough to pair by content)


@dataclasses.dataclass(frozen=True)
class FieldComparison:
    """One field: how many paired samples are identical, and the size of the differences where tensors tell it."""

    name: str
    kind_a: str
    kind_b: str
    same: int
    paired: int
    psnr: float | None = None        # median over the differing samples (dB), from tensors
    max_error: float | None = None   # largest absolute error, as a fraction of side A's value range

    @property
    def identical(self) -> bool:
        return self.same == self.paired

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"identical": self.identical}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FieldComparison":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{k: v for k, v in data.items() if k in names})


class RankedFindings(PassedByExitCode):
    """Mixin of the data results: their own findings and, for a multi-rank dump, each rank's result's decide the exit
    code (1 on an error-severity finding)."""

    __slots__ = ()
    findings: tuple[DataFinding, ...]
    ranks: tuple[tuple[int, RankedFindings], ...]

    @property
    def all_findings(self) -> tuple[DataFinding, ...]:
        """The result's findings, then each rank's, in rank order."""
        return self.findings + tuple(f for _, r in self.ranks for f in r.all_findings)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FOUND if any(f.severity == Severity.ERROR for f in self.all_findings) else ExitCode.OK


@dataclasses.dataclass(frozen=True)
class DataCompareResult(RankedFindings):
    """Two data dumps compared (for multi-rank dumps: the ranks' results in `ranks`, sharding in `findings`)."""

    a: str
    b: str
    framework_a: str
    framework_b: str
    samples_a: int
    samples_b: int
    pairing: Pairing
    identical: int                   # paired samples equal in every field
    fields: tuple[FieldComparison, ...]
    first_difference: FirstDifference | None
    findings: tuple[DataFinding, ...]
    ranks: tuple[tuple[int, "DataCompareResult"], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "framework_a": self.framework_a, "framework_b": self.framework_b,
                "samples_a": self.samples_a, "samples_b": self.samples_b, "pairing": self.pairing.value,
                "identical": self.identical, "fields": [f.to_dict() for f in self.fields],
                "first_difference": self.first_difference.to_dict() if self.first_difference else None,
                "findings": [f.to_dict() for f in self.findings], "passed": self.passed,
                "exit_code": int(self.exit_code), "ranks": {str(r): res.to_dict() for r, res in self.ranks}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DataCompareResult":
        """A result read back from `to_dict` (or the JSON report)."""
        first = data.get("first_difference")
        return cls(data["a"], data["b"], data["framework_a"], data["framework_b"], data["samples_a"],
                   data["samples_b"], Pairing(data["pairing"]), data["identical"],
                   tuple(FieldComparison.from_dict(f) for f in data["fields"]),
                   FirstDifference.from_dict(first) if first else None,
                   tuple(DataFinding.from_dict(f, Section.COMPARE) for f in data["findings"]),
                   tuple((int(r), cls.from_dict(sub)) for r, sub in data.get("ranks", {}).items()))


@dataclasses.dataclass(frozen=True)
class FieldSummary:
    """One field of one data dump: its kind, and for labels the class histogram."""

    name: str
    kind: str
    histogram: tuple[tuple[int, int], ...] = ()   # (class, samples), by class

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "histogram": {str(c): n for c, n in self.histogram}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FieldSummary":
        return cls(data["name"], data["kind"], tuple((int(c), int(n)) for c, n in data["histogram"].items()))


@dataclasses.dataclass(frozen=True)
class DataCheckResult(RankedFindings):
    """One data dump checked."""

    directory: str
    framework: str
    samples: int
    fields: tuple[FieldSummary, ...]
    findings: tuple[DataFinding, ...]
    ranks: tuple[tuple[int, "DataCheckResult"], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "framework": self.framework, "samples": self.samples,
                "fields": [f.to_dict() for f in self.fields], "findings": [f.to_dict() for f in self.findings],
                "passed": self.passed, "exit_code": int(self.exit_code),
                "ranks": {str(r): res.to_dict() for r, res in self.ranks}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DataCheckResult":
        """A result read back from `to_dict` (or the JSON report)."""
        return cls(data["directory"], data["framework"], data["samples"],
                   tuple(FieldSummary.from_dict(f) for f in data["fields"]),
                   tuple(DataFinding.from_dict(f, Section.CHECK) for f in data["findings"]),
                   tuple((int(r), cls.from_dict(sub)) for r, sub in data.get("ranks", {}).items()))
