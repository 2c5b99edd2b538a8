"""Which modules, parameters and directions a dump records."""
from __future__ import annotations

import dataclasses
import re

from aligner.core.errors import AlignerError


def compile_pattern(pattern: str | None, what: str) -> re.Pattern[str] | None:
    """A user's regex (None stays None); a bad one is one line naming the option (`what`) it came from."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AlignerError(f"{what}={pattern!r} is not a valid regular expression: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Options:
    """Selection shared by the torch and MindSpore hook installers."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None
    leaves_only: bool = True
    forward: bool = True
    backward: bool = True
    inputs: bool | None = None  # True: every input's data; None: a link, or data no record holds; False: none
    ops: bool = False           # record every tensor operation inside `scope`'s forward
    scope: str | None = None    # the module path whose forward ops=True zooms into ("" the whole model)
    params: bool = False        # record every parameter's and buffer's value at the start of each step
    module_backward: bool = True  # with backward: modules' grad_output/grad_input too (False: parameter gradients only)
    calls: bool = True  # each module call's signature (a `call` record): what replay and repro call it back with
    param_grads: bool = True  # with backward: a hook on each parameter (False: the caller hands gradients over)

    @property
    def module_hooks(self) -> bool:
        """Whether modules need hooks at all (False: only parameter gradients are recorded, no per-call cost)."""
        return self.forward or self.ops or (self.backward and self.module_backward)

    @classmethod
    def build(cls, include: str | None, exclude: str | None, leaves_only: bool, forward: bool, backward: bool,
              inputs: bool | None, ops: bool = False, scope: str | None = None, params: bool = False) -> "Options":
        """Validate user arguments into Options."""
        if not (forward or backward):
            raise AlignerError("aligner.dump with forward=False and backward=False records nothing; enable one")
        if inputs not in (None, True, False):
            raise AlignerError(f"aligner.dump inputs must be True, False or None (automatic), got {inputs!r}")
        if scope is not None and not isinstance(scope, str):
            raise AlignerError(f"aligner.dump scope must be a module path string, got {type(scope).__name__}")
        if scope is not None and not ops:
            raise AlignerError("aligner.dump scope= names the module whose operations ops=True records; pass ops=True")
        return cls(compile_pattern(include, "aligner.dump include"), compile_pattern(exclude, "aligner.dump exclude"),
                   leaves_only, forward, backward, inputs, bool(ops), "" if ops and scope is None else scope,
                   bool(params))

    def selects_name(self, name: str) -> bool:
        """Whether a module path or parameter name passes include (re.search) and exclude."""
        if self.include is not None and not self.include.search(name):
            return False
        return self.exclude is None or not self.exclude.search(name)

    def selects_module(self, path: str, is_leaf: bool) -> bool:
        """Whether a module/cell at `path` ("" is the model itself) gets hooks."""
        return (is_leaf or not self.leaves_only) and self.selects_name(path)
