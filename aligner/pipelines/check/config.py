"""The thresholds of `align check`'s rules: defaults from mappings/check_rules.yaml, overridden per run."""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Mapping

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.core.rules import ListOf, MapOf, OneOf, Opt, load_rules

RULES_FILE = "check_rules.yaml"
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


# rule -> {enabled, severity, and its thresholds: numbers, true/false or lists of names}
SCHEMA = MapOf({"enabled": bool, "severity": Severity,
                **{key: Opt(OneOf(bool, float, ListOf(str))) for key in (
                    "depth_ratio", "factor", "fraction", "growth_steps", "high", "jump", "low", "max_abs",
                    "min_layers", "min_numel", "min_scale", "min_steps", "negligible", "ratio", "rtol", "sigmoid",
                    "spike", "step_growth", "tanh", "tiny_fraction", "types", "zeros")}})


def _defaults() -> dict[str, dict[str, Any]]:
    """The shipped rules and their default thresholds (a broken file is one AlignerError line)."""
    return load_rules(RULES_FILE, SCHEMA)


def _coerce(rule: str, key: str, value: Any, default: Any) -> Any:
    """`value` (a string from the command line, or a Python value) as the default's type; AlignerError when not."""
    where = f"rule {rule}.{key}"
    if key == "severity":
        try:
            return Severity(str(value).strip().lower()).value
        except ValueError:
            raise AlignerError(f"{where}: expected error, warning or info, got {value!r}") from None
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise AlignerError(f"{where}: expected true or false, got {value!r}")
    if isinstance(default, (int, float)):
        if isinstance(value, bool):
            raise AlignerError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(default, float) else int(str(value).strip())
        except (TypeError, ValueError):
            kind = "a number" if isinstance(default, float) else "a whole number"
            raise AlignerError(f"{where}: expected {kind}, got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise AlignerError(f"{where}: expected a finite number >= 0, got {value!r}")
        return number
    if isinstance(default, list):
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        names = [str(v).strip() for v in items if str(v).strip()]
        if not names:
            raise AlignerError(f"{where}: expected comma-separated names, got {value!r}")
        return names
    return str(value)


@dataclasses.dataclass(frozen=True)
class RuleConfig:
    """Each rule's thresholds (rule -> key -> value), the defaults of check_rules.yaml with any overrides applied."""

    rules: Mapping[str, Mapping[str, Any]]

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> "RuleConfig":
        """Defaults with `overrides` as {"rule.key": value} or {"rule": {"key": value}}; an unknown rule or key or a
        value of the wrong type is one AlignerError line."""
        rules = copy.deepcopy(_defaults())
        for name, value in (overrides or {}).items():
            if not isinstance(name, str):
                raise AlignerError(f"rule override names must be strings, got {name!r}")
            if isinstance(value, Mapping):
                pairs = [(name, str(k), v) for k, v in value.items()]
            elif "." in name:
                rule, key = name.split(".", 1)
                pairs = [(rule, key, value)]
            else:
                raise AlignerError(f"rule override {name!r}: expected NAME.KEY=VALUE or NAME: {{KEY: VALUE}}")
            for rule, key, raw in pairs:
                if rule not in rules:
                    raise AlignerError(f"unknown rule {rule!r} (rules: {', '.join(rules)})")
                if key not in rules[rule]:
                    raise AlignerError(f"rule {rule!r} has no key {key!r} (keys: {', '.join(rules[rule])})")
                rules[rule][key] = _coerce(rule, key, raw, rules[rule][key])
        return cls(rules)

    @staticmethod
    def parse(texts: list[str] | tuple[str, ...]) -> dict[str, str]:
        """`--rule NAME.KEY=VALUE` texts as an overrides dict (a text without '=' or '.' is one AlignerError line)."""
        out: dict[str, str] = {}
        for text in texts:
            name, sep, value = text.partition("=")
            if not sep or "." not in name or not name.split(".", 1)[1] or not value.strip():
                raise AlignerError(f"--rule {text!r}: expected NAME.KEY=VALUE, e.g. update-ratio.high=0.05")
            out[name.strip()] = value.strip()
        return out

    def __call__(self, rule: str, key: str) -> Any:
        """One threshold."""
        return self.rules[rule][key]

    def enabled(self, rule: str) -> bool:
        return bool(self.rules[rule].get("enabled", True))

    def severity(self, rule: str) -> Severity:
        return Severity(self.rules[rule].get("severity", "warning"))

    @property
    def names(self) -> list[str]:
        return list(self.rules)
