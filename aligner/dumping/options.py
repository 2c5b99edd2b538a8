"""Which modules, parameters and directions a dump records."""
from __future__ import annotations

import dataclasses
import re

from aligner.core.errors import AlignerError


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AlignerError(f"aligner.dump {what}={pattern!r} is not a valid regular expression: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class Options:
    """Selection shared by the torch and MindSpore hook installers."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None
    leaves_only: bool = True
    forward: bool = True
    backward: bool = True
    inputs: bool = False

    @classmethod
    def build(cls, include: str | None, exclude: str | None, leaves_only: bool, forward: bool, backward: bool,
              inputs: bool) -> "Options":
        """Validate user arguments into Options."""
        if not (forward or backward):
            raise AlignerError("aligner.dump with forward=False and backward=False records nothing; enable one")
        return cls(_compile(include, "include"), _compile(exclude, "exclude"), leaves_only, forward, backward, inputs)

    def selects_name(self, name: str) -> bool:
        """Whether a module path or parameter name passes include (re.search) and exclude."""
        if self.include is not None and not self.include.search(name):
            return False
        return self.exclude is None or not self.exclude.search(name)

    def selects_module(self, path: str, is_leaf: bool) -> bool:
        """Whether a module/cell at `path` ("" is the model itself) gets hooks."""
        return (is_leaf or not self.leaves_only) and self.selects_name(path)
