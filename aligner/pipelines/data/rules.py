"""The rules of `align data` as data (mappings/data_rules.yaml): each rule's severity, checklist items, the text
templates render/data.py fills with a finding's evidence, and the limits its detector reads."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.core.rules import ListOf, MapOf, OneOf, Opt, load_rules

RULES_FILE = "data_rules.yaml"


class DataRule(str, enum.Enum):
    """Every rule of data_rules.yaml; the file must define exactly these (compare and check sections)."""

    SAMPLES_MISSING = "samples-missing"
    DROP_LAST = "drop-last"
    BATCH_COMPOSITION = "batch-composition"
    SHUFFLE_ONE_SIDE = "shuffle-one-side"
    SHUFFLE_SEED = "shuffle-seed"
    RESHUFFLE_PER_EPOCH = "reshuffle-per-epoch"
    ORDER_DIFFERS = "order-differs"
    LAYOUT = "layout"
    IMAGE_SIZE = "image-size"
    VALUE_RANGE = "value-range"
    NORMALIZATION_MISSING = "normalization-missing"
    NORMALIZATION_TWICE = "normalization-twice"
    NORMALIZATION_CONSTANTS = "normalization-constants"
    CHANNEL_ORDER = "channel-order"
    INTERPOLATION = "interpolation"
    AUGMENTATION = "augmentation"
    DTYPE = "dtype"
    VALUES_DIFFER = "values-differ"
    ONE_HOT = "one-hot"
    LABEL_OFFSET = "label-offset"
    LABEL_PERMUTATION = "label-permutation"
    LABELS_DIFFER = "labels-differ"
    PAD_SIDE = "pad-side"
    PAD_VALUE = "pad-value"
    TRUNCATION = "truncation"
    PAD_LENGTH = "pad-length"
    TOKENS_DIFFER = "tokens-differ"
    SAME_SHARD = "same-shard"
    SHARD_OVERLAP = "shard-overlap"
    SHARD_MISSING = "shard-missing"
    SHARD_ASSIGNMENT = "shard-assignment"
    MISSING_VALUES = "missing-values"
    SENTINEL = "sentinel"
    CLASS_IMBALANCE = "class-imbalance"
    RARE_CLASS = "rare-class"
    DUPLICATES = "duplicates"
    CONSTANT_FIELD = "constant-field"
    LABEL_RANGE = "label-range"
    RANDOM_TRANSFORM = "random-transform"
    SPECIAL_TOKENS = "special-tokens"


class Section(str, enum.Enum):
    """Which command a rule belongs to."""

    COMPARE = "compare"
    CHECK = "check"


_RULE = {"severity": Severity, "checklist": str, "says": str, "fix": str,
         "limits": Opt(MapOf(OneOf(float, ListOf(float))))}
SCHEMA = {"compare": MapOf(_RULE, keys=DataRule), "check": MapOf(_RULE, keys=DataRule)}


@dataclasses.dataclass(frozen=True)
class RuleText:
    """One rule as the file gives it."""

    rule: DataRule
    severity: Severity
    checklist: str
    says: str
    fix: str
    limits: dict[str, Any]


def rule(section: Section, name: DataRule) -> RuleText:
    """One rule of one section (AlignerError when the shipped file lacks it)."""
    data = load_rules(RULES_FILE, SCHEMA)[section.value]
    if name.value not in data:
        raise AlignerError(f"{RULES_FILE}: no rule {name.value!r} under {section.value}")
    entry = data[name.value]
    return RuleText(name, Severity(entry["severity"]), entry["checklist"], " ".join(entry["says"].split()),
                    " ".join(entry["fix"].split()), dict(entry.get("limits") or {}))


def limit(section: Section, name: DataRule, key: str) -> Any:
    """One threshold of one rule."""
    limits = rule(section, name).limits
    if key not in limits:
        raise AlignerError(f"{RULES_FILE}: rule {name.value!r} has no limit {key!r}")
    return limits[key]
