"""The audit's result: paired and unpaired layers, findings (new and accepted by a baseline), and the exit code."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import yaml

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.files import TEXT, read_text
from aligner.core.findings import Finding, Severity
from aligner.core.frameworks import Framework
from aligner.core.nesting import NestingError, yaml_loads
from aligner.core.result import PassedByExitCode
from aligner.core.words import Text
from aligner.pipelines.audit.optimizers import OptimizerAudit


@dataclasses.dataclass(frozen=True)
class PairRecord:
    """A PyTorch layer and the MindSpore layer it was compared with, their kind, and how they were paired."""

    torch_path: str
    ms_path: str
    kind: str
    how: str
    probe: Text = ""     # what running both showed ("outputs equal within 1e-5 (max 2.4e-07)", ...), "" when not run

    def to_dict(self) -> dict[str, Any]:
        return {"torch_path": self.torch_path, "ms_path": self.ms_path, "kind": self.kind, "how": self.how,
                "probe": self.probe}


@dataclasses.dataclass(frozen=True)
class Unpaired:
    """A layer of a known kind that has no counterpart on the other side."""

    framework: Framework
    path: str
    kind: str
    class_name: str

    def to_dict(self) -> dict[str, Any]:
        return {"framework": self.framework.value, "path": self.path, "kind": self.kind,
                "class_name": self.class_name}


@dataclasses.dataclass(frozen=True)
class NotAudited:
    """A layer of a kind the rules cover that nothing checked: unpaired, or taken by its class name and not probed."""

    torch_path: str | None
    ms_path: str | None
    kind: str
    class_name: str
    why: Text

    def to_dict(self) -> dict[str, Any]:
        return {"torch_path": self.torch_path, "ms_path": self.ms_path, "kind": self.kind,
                "class_name": self.class_name, "why": self.why}


@dataclasses.dataclass(frozen=True)
class FindingGroup:
    """Findings that say the same thing (rule, severity, text and fix without the paths) at several places."""

    rule: str
    severity: Severity
    text: Text                    # the finding itself when alone, else what they share
    fix: Text
    where: tuple[str, ...]        # "torch path / MindSpore path" of each

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity.value, "text": self.text, "fix": self.fix,
                "where": list(self.where)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FindingGroup":
        return cls(data["rule"], Severity(data["severity"]), data["text"], data["fix"], tuple(data["where"]))


def finding_key(f: Finding) -> tuple[str, str | None, str | None, str | None]:
    """What identifies a finding across runs (a baseline entry): rule, both paths, attribute."""
    return f.rule, f.torch_path, f.ms_path, f.attribute


@dataclasses.dataclass(frozen=True)
class AuditReport(PassedByExitCode):
    """Everything `align audit` found. `findings` are the new ones; `accepted` the ones a baseline lists."""

    torch_model: str
    ms_model: str
    reference: Framework
    inputs: dict[str, list[int]] | None
    pairs: tuple[PairRecord, ...]
    unpaired: tuple[Unpaired, ...]
    findings: tuple[Finding, ...]
    accepted: tuple[Finding, ...] = ()
    notes: tuple[Text, ...] = ()
    optimizer: OptimizerAudit | None = None     # what the optimizer audit compared; its findings are in `findings`
    not_audited: tuple[NotAudited, ...] = ()    # covered layers nothing checked: the audit is no pass while any is
    groups: tuple[FindingGroup, ...] = ()       # `findings` with the repeated ones grouped, in order

    @property
    def migrated(self) -> Framework:
        return self.reference.other

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    @property
    def exit_code(self) -> ExitCode:
        """1 on an error finding, or when a layer of a covered kind was not audited (never a silent pass)."""
        return ExitCode.FOUND if self.errors or self.not_audited else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"torch_model": self.torch_model, "ms_model": self.ms_model, "reference": self.reference.value,
                "inputs": self.inputs, "pairs": [p.to_dict() for p in self.pairs],
                "unpaired": [u.to_dict() for u in self.unpaired], "findings": [f.to_dict() for f in self.findings],
                "accepted": [f.to_dict() for f in self.accepted], "notes": list(self.notes),
                "optimizer": self.optimizer.to_dict() if self.optimizer is not None else None,
                "not_audited": [n.to_dict() for n in self.not_audited], "groups": [g.to_dict() for g in self.groups],
                "exit_code": int(self.exit_code)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AuditReport":
        return cls(data["torch_model"], data["ms_model"], Framework(data["reference"]), data["inputs"],
                   tuple(PairRecord(**p) for p in data["pairs"]),
                   tuple(Unpaired(Framework(u["framework"]), u["path"], u["kind"], u["class_name"])
                         for u in data["unpaired"]),
                   tuple(Finding.from_dict(f) for f in data["findings"]),
                   tuple(Finding.from_dict(f) for f in data["accepted"]), tuple(data["notes"]),
                   OptimizerAudit.from_dict(data["optimizer"]) if data.get("optimizer") else None,
                   tuple(NotAudited(**n) for n in data.get("not_audited", ())),
                   tuple(FindingGroup.from_dict(g) for g in data.get("groups", ())))


def load_baseline(path: str | os.PathLike) -> set[tuple[str, str | None, str | None, str | None]]:
    """The accepted findings' keys from a baseline file: an earlier `--json` report (its findings and accepted ones)
    or a YAML/JSON list of {rule, where: [torch path, MindSpore path], attribute}."""
    try:
        data = yaml_loads(read_text(path, TEXT))
    except NestingError as exc:
        raise AlignerError(f"--baseline {path}: {exc} (expected an audit --json report or YAML)") from None
    except AlignerError as exc:  # not a regular file, or above the cap
        raise AlignerError(f"--baseline {exc}") from None
    except OSError as exc:
        raise AlignerError(f"--baseline {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AlignerError(f"--baseline {path}: not UTF-8 text (expected an audit --json report or YAML)") from None
    except yaml.YAMLError as exc:
        raise AlignerError(f"--baseline {path}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if isinstance(data, dict):
        parts = [data.get("findings") or [], data.get("accepted") or []]
        data = [d for part in parts if isinstance(part, list) for d in part] \
            if all(isinstance(part, list) for part in parts) else None
    expected = AlignerError(f"--baseline {path}: expected an audit --json report or a list of findings ({{rule, "
                            "where, attribute})")
    if not isinstance(data, list) or not all(isinstance(d, dict) and "rule" in d for d in data):
        raise expected
    keys = set()
    for d in data:
        where, attribute = d.get("where") or [], d.get("attribute")
        if not isinstance(where, list) or not all(w is None or isinstance(w, str) for w in where) \
                or not (attribute is None or isinstance(attribute, str)):
            raise expected
        pair = list(where) + [None, None]
        keys.add((str(d["rule"]), pair[0], pair[1], attribute))
    return keys


def apply_baseline(findings: list[Finding], accepted_keys: set) -> tuple[list[Finding], list[Finding]]:
    """(new findings, accepted findings)."""
    new = [f for f in findings if finding_key(f) not in accepted_keys]
    return new, [f for f in findings if finding_key(f) in accepted_keys]


__all__ = ["AuditReport", "FindingGroup", "NotAudited", "PairRecord", "Unpaired", "Severity", "apply_baseline",
           "finding_key", "load_baseline"]
