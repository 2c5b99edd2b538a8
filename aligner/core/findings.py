"""The one finding type that audits and health checks return: what rule fired, where, how bad, and what to do."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from aligner.core.words import Text


class Severity(enum.Enum):
    """How a finding affects the exit code: an error fails the command (exit 1); warnings and info do not."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One observation: `rule` fired at `where` (each side's path, when there are two sides), with a fix.

    Two-sided findings (the model audit) put the PyTorch path first in `where` and the compared setting in
    `attribute`, with `values` = (PyTorch value, MindSpore value) in each framework's own convention.
    `message` and `fix` are `Words` where a pipeline made the finding (render/ words them, and writes the JSON's
    sentence), text where it was read back from a saved report; a fix that is a line of code is text.
    """

    rule: str
    severity: Severity
    message: Text
    where: tuple[str | None, ...] = ()
    step: int | None = None
    fix: Text = ""
    attribute: str | None = None
    values: tuple[Any, ...] = ()

    @property
    def torch_path(self) -> str | None:
        """The PyTorch module path of a two-sided finding (`where[0]`)."""
        return self.where[0] if self.where else None

    @property
    def ms_path(self) -> str | None:
        """The MindSpore cell path of a two-sided finding (`where[1]`)."""
        return self.where[1] if len(self.where) > 1 else None

    @property
    def torch_value(self) -> Any:
        return self.values[0] if self.values else None

    @property
    def ms_value(self) -> Any:
        return self.values[1] if len(self.values) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity.value, "message": self.message,
                "where": list(self.where), "step": self.step, "fix": self.fix, "attribute": self.attribute,
                "values": [_plain(v) for v in self.values]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return cls(data["rule"], Severity(data["severity"]), data.get("message", ""), tuple(data.get("where", ())),
                   data.get("step"), data.get("fix", ""), data.get("attribute"),
                   tuple(_frozen(v) for v in data.get("values", ())))


def _frozen(value: Any) -> Any:
    """A setting read back from JSON (lists become tuples again)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _plain(value: Any) -> Any:
    """A JSON-friendly form of one setting (tuples become lists)."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value
