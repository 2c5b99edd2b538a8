"""The audit's rules as data (mappings/audit_layers.yaml): layer kinds, and how each setting is read, normalised to
PyTorch's meaning, and set on each side."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from aligner.core.findings import Severity
from aligner.core.frameworks import Framework
from aligner.core.rules import ANY, ListOf, MapOf, OneOf, Opt, load_rules

RULES_FILE = "audit_layers.yaml"
_MISSING = object()

CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "one_minus": lambda x: None if x is None else 1.0 - float(x),
    "negative_is_none": lambda x: None if x is None or int(x) < 0 else int(x),
    "none_is_false": lambda x: bool(x),
}


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def short_class(base: str) -> str:
    """nn.MaxPool2d / mint.nn.GELU from a framework class's qualified name."""
    name = base.rpartition(".")[2]
    return f"mint.nn.{name}" if base.startswith("mindspore.mint") else f"nn.{name}"


def _fits(prefix: str | None, base: str) -> bool:
    """Whether a rule entry limited to `prefix` (a module or a class's qualified name) applies to class `base`."""
    return prefix is None or base == prefix or base.startswith(prefix + ".")


def _resolve(obj: Any, path: str) -> Any:
    """Follow `a.b.c` through attributes and dict keys; _MISSING where a step is absent."""
    for step in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(step, _MISSING)
        else:
            obj = getattr(obj, step, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


@dataclasses.dataclass(frozen=True)
class Fix:
    """How to set a setting on one side: a constructor argument (value converted from the neutral one) or a text."""

    arg: str | None = None
    convert: str | None = None
    values: dict[Any, Any] | None = None
    module: str | None = None
    text: str | None = None

    def argument(self, neutral: Any) -> Any:
        if self.values is not None and neutral in self.values:
            return self.values[neutral]
        return CONVERSIONS[self.convert](neutral) if self.convert else neutral


@dataclasses.dataclass(frozen=True)
class Side:
    """One framework's reading entries and fixes for a rule."""

    read: tuple[Any, ...]
    fixes: tuple[Fix, ...]

    def value(self, module: Any, base: str) -> Any:
        """The neutral value: the first entry that applies to `base` and yields something (None when none does)."""
        for entry in self.read:
            if isinstance(entry, str):
                entry = {"attr": entry}
            if not _fits(entry.get("module"), base):
                continue
            if "const" in entry:
                return entry["const"]
            if "present" in entry:
                return _resolve(module, entry["present"]) not in (None, _MISSING)
            raw = _resolve(module, entry["attr"])
            if raw is _MISSING:
                if "default" not in entry:
                    continue
                raw = entry["default"]
            if "values" in entry:
                if raw not in entry["values"]:
                    continue
                return entry["values"][raw]
            if raw is None and "convert" not in entry:
                continue
            value = CONVERSIONS[entry["convert"]](raw) if "convert" in entry else raw
            return value.item() if hasattr(value, "item") else value
        return None

    def fix_for(self, base: str) -> Fix | None:
        return next((f for f in self.fixes if _fits(f.module, base)), None)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One compared setting of some layer kinds."""

    id: str
    kinds: tuple[str, ...]
    attribute: str
    severity: Severity
    compare: str
    rtol: float | None
    sides: dict[Framework, Side]
    why: str


@dataclasses.dataclass(frozen=True)
class ProbeFix:
    """A framework layer tried in a probe: its class's qualified name and constructor arguments."""

    cls: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RuleBook:
    """Layer kinds per framework class name (and third-party class names), the rules, amp O1's float16 kinds, and
    the probe's tolerance, fix candidates and no-op settings."""

    kinds: dict[Framework, dict[str, str]]     # framework -> class name -> kind
    rules: tuple[Rule, ...]
    amp_o1_float16: frozenset[str]
    by_name: dict[str, str] = dataclasses.field(default_factory=dict)    # any class name -> kind
    probe_atol: float = 1e-5
    probe_rtol: float = 1e-5
    probe_fixes: dict[str, dict[Framework, tuple[ProbeFix, ...]]] = dataclasses.field(default_factory=dict)
    noop: dict[str, Any] = dataclasses.field(default_factory=dict)      # rule id -> neutral value of an identity

    def for_kind(self, kind: str) -> list[Rule]:
        return [r for r in self.rules if kind in r.kinds]

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def _side(data: dict[str, Any] | None) -> Side:
    data = data or {}
    fixes = data.get("fix") or []
    return Side(tuple(data.get("read") or ()),
                tuple(Fix(**f) for f in (fixes if isinstance(fixes, list) else [fixes])))


_READ = OneOf(str, {"attr": Opt(str), "convert": Opt(str), "module": Opt(str), "default": Opt(ANY),
                     "present": Opt(str), "const": Opt(ANY), "values": Opt(MapOf(ANY, keys=ANY))})
_FIX = {"arg": Opt(str), "convert": Opt(str), "values": Opt(MapOf(ANY, keys=ANY)), "module": Opt(str),
        "text": Opt(str)}
_SIDE = {"read": Opt(ListOf(_READ)), "fix": Opt(OneOf(_FIX, ListOf(_FIX)))}
_BY_FRAMEWORK = {fw.value: Opt(ListOf(str)) for fw in Framework if fw is not Framework.NUMPY}
SCHEMA = {
    "kinds": MapOf(_BY_FRAMEWORK),
    "rules": ListOf({"id": str, "kinds": ListOf(str), "attribute": str, "severity": Severity, "compare": Opt(str),
                     "rtol": Opt(float), "pytorch": Opt(_SIDE), "mindspore": Opt(_SIDE), "why": Opt(str)}),
    "by_name": Opt(MapOf(ListOf(str))),
    "probe_atol": Opt(float), "probe_rtol": Opt(float),
    "probe_fixes": Opt(MapOf(MapOf(ListOf({"class": str, "args": Opt(MapOf(ANY))})))),
    "noop": Opt(MapOf(ANY)),
    "amp_o1_float16": Opt(ListOf(str)),
}


@functools.cache
def load_rulebook(name: str = RULES_FILE) -> RuleBook:
    """The audit's rule book, parsed once from the shipped rules file."""
    data = load_rules(name, SCHEMA)
    kinds: dict[Framework, dict[str, str]] = {Framework.PYTORCH: {}, Framework.MINDSPORE: {}}
    for kind, per_fw in data["kinds"].items():
        for fw, names in per_fw.items():
            for cls in names:
                kinds[Framework(fw)][cls] = kind
    rules = tuple(Rule(r["id"], tuple(r["kinds"]), r["attribute"], Severity(r["severity"]), r.get("compare", "equal"),
                       r.get("rtol"), {fw: _side(r.get(fw.value)) for fw in (Framework.PYTORCH, Framework.MINDSPORE)},
                       r.get("why", "")) for r in data["rules"])
    by_name = {cls: kind for per_fw in kinds.values() for cls, kind in per_fw.items()}
    by_name.update({cls: kind for kind, names in (data.get("by_name") or {}).items() for cls in names})
    fixes = {kind: {Framework(fw): tuple(ProbeFix(f["class"], dict(f.get("args") or {})) for f in entries)
                    for fw, entries in per_fw.items()}
             for kind, per_fw in (data.get("probe_fixes") or {}).items()}
    return RuleBook(kinds, rules, frozenset(data.get("amp_o1_float16") or ()), by_name,
                    float(data.get("probe_atol", 1e-5)), float(data.get("probe_rtol", 1e-5)), fixes,
                    dict(data.get("noop") or {}))
