"""What a replay returns: per module call, its own (local) error next to the error it inherited and the error its
own run showed; the verdict says whether one layer is wrong or the error grows a little at every layer."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from aligner.core.errors import ExitCode
from aligner.core.result import PassedByExitCode, typed
from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.core.words import Text
from aligner.metrics.measure import Metrics


class ReplayStatus(str, enum.Enum):
    """One replayed call's verdict."""

    OK = "ok"                  # its own output agrees, and so did its run's
    LOCAL = "local"            # replayed on the reference's inputs, it still differs: its own error
    INHERITED = "inherited"    # its run differs, but on the reference's inputs it agrees: the error came in
    SKIPPED = "skipped"        # not replayable by design (`reason` says why: a value kept only as its repr, ...)
    ERROR = "error"            # could not be replayed: the dump is damaged (unreadable tensor, malformed call)

    def __str__(self) -> str:
        return self.value


class ReplayVerdict(str, enum.Enum):
    """What the whole replay found."""

    MATCH = "match"                # every module agrees on the reference's inputs and in its own run
    LAYER = "layer"                # a module makes its own error: `ReplayResult.culprit`
    PARENT_CODE = "parent_code"    # a module's input differs though no earlier output did: its parent's own code
    ACCUMULATED = "accumulated"    # runs differ, yet no module does on the reference's inputs: error accumulates

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class ReplayRow:
    """One module call: replayed on the reference's recorded inputs (`local`), compared with what the replayed side's
    own run recorded at its inputs (`inherited`) and output (`total`)."""

    module: str                 # the reference side's path
    module_b: str               # the replayed side's path
    type: str                   # reference type
    type_b: str
    step: int
    call: int                   # the reference's call id
    phase: str = "forward"      # "forward" | "backward"
    parent: str | None = None   # the reference path of the module whose forward made the call
    tolerance: Tolerance | None = None
    local: Metrics | None = None
    inherited: Metrics | None = None
    total: Metrics | None = None
    reason: Text | None = None  # why it was not replayed (Words, or the text of the dump's error)
    damaged: bool = False       # ... because the dump is damaged

    @property
    def status(self) -> ReplayStatus:
        if self.local is None:
            return ReplayStatus.ERROR if self.damaged else ReplayStatus.SKIPPED
        if self.local.diverged:
            return ReplayStatus.LOCAL
        return ReplayStatus.INHERITED if self.total is not None and self.total.diverged else ReplayStatus.OK

    def to_dict(self) -> dict[str, Any]:
        def metrics(m: Metrics | None) -> dict[str, Any] | None:
            return None if m is None else m.to_dict()

        return {"module": self.module, "module_b": self.module_b, "type": self.type, "type_b": self.type_b,
                "step": self.step, "call": self.call, "phase": self.phase, "parent": self.parent,
                "status": self.status.value,
                "tolerance": self.tolerance.to_dict() if self.tolerance else None, "local": metrics(self.local),
                "inherited": metrics(self.inherited), "total": metrics(self.total), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayRow:
        """The row `to_dict` gave, back (a row whose status says "error" was not replayed for a damaged dump)."""
        def metrics(m: Mapping[str, Any] | None) -> Metrics | None:
            return None if m is None else Metrics.from_dict(m)

        tolerance = data["tolerance"]
        return cls(typed(data["module"], str, "module"), typed(data["module_b"], str, "module_b"),
                   typed(data["type"], str, "type"), typed(data["type_b"], str, "type_b"),
                   typed(data["step"], int, "step"), typed(data["call"], int, "call"),
                   typed(data["phase"], str, "phase"),
                   data["parent"] if data["parent"] is None else typed(data["parent"], str, "parent"),
                   None if tolerance is None else Tolerance(**tolerance), metrics(data["local"]),
                   metrics(data["inherited"]), metrics(data["total"]),
                   data["reason"] if data["reason"] is None else typed(data["reason"], str, "reason"),
                   ReplayStatus(data["status"]) is ReplayStatus.ERROR)


@dataclasses.dataclass(frozen=True)
class ReplayResult(PassedByExitCode):
    """Every replayed call in execution order; `culprit` is the first whose own error exceeds its tolerance (a
    `Result`: `passed` when every module agrees and every call could be replayed)."""

    reference: str              # "dumps_pt/ (pytorch)"
    replayed: str               # "dumps_ms/ (mindspore), re-run from make_ms"
    rows: list[ReplayRow]
    tolerance: ToleranceSpec = dataclasses.field(default_factory=ToleranceSpec)
    step: int = 0                                         # the step replayed
    steps: list[int] = dataclasses.field(default_factory=list)   # the steps the reference dump holds
    problems: list[str] = dataclasses.field(default_factory=list)  # manifest lines that did not parse, both sides
    # the module whose code computed the differing input, where the compare verdict over the same dumps knows it
    # better than the first differing call's parent (a mask computed once in the model, routing in an MoE block
    # whose experts only forward it); None: that parent
    scope: str | None = None

    @property
    def culprit(self) -> int | None:
        """Index of the first row whose local error exceeds its tolerance (forward before backward)."""
        for phase in ("forward", "backward"):
            for i, row in enumerate(self.rows):
                if row.phase == phase and row.status is ReplayStatus.LOCAL:
                    return i
        return None

    @property
    def parent_code(self) -> int | None:
        """Index of the first forward row whose input differs while no earlier row's output or own error did: the
        difference was computed between module calls, by its parent's code (`rows[i].parent`)."""
        for i, row in enumerate(self.rows):
            if row.phase != "forward":
                continue
            if (row.total is not None and row.total.diverged) or row.status is ReplayStatus.LOCAL:
                return i if row.inherited is not None and row.inherited.diverged else None
            if row.inherited is not None and row.inherited.diverged:
                return i
        return None

    @property
    def first_total(self) -> int | None:
        """Index of the first row whose own run differs from the reference (what compare would name)."""
        return next((i for i, r in enumerate(self.rows) if r.total is not None and r.total.diverged), None)

    @property
    def largest_local(self) -> int | None:
        """Index of the row with the largest local error relative to its allowed error."""
        scored = [(r.local.max_abs_err / max(r.local.atol + r.local.rtol, 1e-30), i) for i, r in enumerate(self.rows)
                  if r.local is not None and r.local.max_abs_err is not None]
        return max(scored)[1] if scored else None

    @property
    def blame(self) -> str | None:
        """The reference path to blame: the culprit module, or the parent whose code made the difference."""
        if self.verdict is ReplayVerdict.LAYER and self.culprit is not None:
            return self.rows[self.culprit].module
        if self.verdict is ReplayVerdict.PARENT_CODE and self.parent_code is not None:
            return self.scope if self.scope is not None else self.rows[self.parent_code].parent
        return None

    @property
    def verdict(self) -> ReplayVerdict:
        glue = self.parent_code
        if glue is not None and (self.culprit is None or glue < self.culprit):
            return ReplayVerdict.PARENT_CODE
        if self.culprit is not None:
            return ReplayVerdict.LAYER
        return ReplayVerdict.ACCUMULATED if self.first_total is not None else ReplayVerdict.MATCH

    @property
    def skipped(self) -> list[int]:
        """Rows not replayed: by design (SKIPPED) or because the dump is damaged (ERROR)."""
        return [i for i, r in enumerate(self.rows) if r.status in (ReplayStatus.SKIPPED, ReplayStatus.ERROR)]

    @property
    def errors(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r.status is ReplayStatus.ERROR]

    @property
    def exit_code(self) -> ExitCode:
        """1 a module differs (or the error accumulates); else 2 when the dump was damaged (rows that could not be
        replayed, manifest lines that did not parse): what was not checked is not reported as agreeing; else 0."""
        if self.verdict is not ReplayVerdict.MATCH:
            return ExitCode.FOUND
        return ExitCode.USAGE if self.errors or self.problems else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "replayed": self.replayed, "verdict": self.verdict.value,
                "passed": self.passed, "exit_code": int(self.exit_code), "culprit": self.culprit,
                "parent_code": self.parent_code, "blame": self.blame, "step": self.step, "steps": self.steps,
                "first_total": self.first_total, "tolerance": self.tolerance.to_dict(), "problems": self.problems,
                "scope": self.scope, "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayResult:
        """The result `to_dict` gave (as --json saved it), back; the verdict and the indices are derived again."""
        scope = data["scope"]
        return cls(typed(data["reference"], str, "reference"), typed(data["replayed"], str, "replayed"),
                   [ReplayRow.from_dict(r) for r in data["rows"]], ToleranceSpec.from_dict(data["tolerance"]),
                   typed(data["step"], int, "step"), [typed(s, int, "steps") for s in data["steps"]],
                   [str(p) for p in data["problems"]], scope if scope is None else typed(scope, str, "scope"))
