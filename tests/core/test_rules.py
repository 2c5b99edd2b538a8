"""The shipped rules files (mappings/*.yaml) read through one loader, `aligner.core.rules.load_rules(name, schema)`:
every file passes its reader's schema, one spelling of the sides (`pytorch:`/`mindspore:`) and of explanations
(`why:`), and a file that breaks its schema is refused with the place named."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from aligner.core import rules
from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.mapping import ops as ops_table
from aligner.mapping import optimizers
from aligner.mapping import rules as layer_rules
from aligner.pipelines.audit import initlaw, optsides, source
from aligner.pipelines.audit import rules as audit_rules
from aligner.pipelines.check import config
from tests.support.paths import ROOT

MAPPINGS = ROOT / "mappings"
PACKAGE = ROOT / "aligner"
# every shipped file -> the schema its reader declares
SCHEMAS = {"torch_mindspore.yaml": layer_rules.SCHEMA, "ops_torch_mindspore.yaml": ops_table.SCHEMA,
           "audit_layers.yaml": audit_rules.SCHEMA, "defaults_mindspore_torch.yaml": source.SCHEMA,
           "audit_init.yaml": initlaw.SCHEMA, "check_rules.yaml": config.SCHEMA,
           "optimizers.yaml": optimizers.SCHEMA, "audit_optimizers.yaml": optsides.SCHEMA}


def _keys(data: Any) -> set[str]:
    """Every mapping key anywhere in `data`, except inside a `fix` (audit_layers.yaml's {text: ...} is the fix)."""
    if isinstance(data, dict):
        return {str(k) for k in data} | {k for key, v in data.items() if key != "fix" for k in _keys(v)}
    if isinstance(data, list):
        return {k for v in data for k in _keys(v)}
    return set()


def test_every_shipped_file_is_read_by_load_rules() -> None:
    """No second loader: each file under mappings/ is named by a module of aligner that reads it with load_rules."""
    readers = [p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")]
    for path in MAPPINGS.glob("*.yaml"):
        assert any(f'"{path.name}"' in text and "load_rules(" in text for text in readers), path.name
    for text in readers:
        assert "safe_load(resources" not in text and 'files("aligner.mappings")' not in text


def test_every_file_passes_its_schema() -> None:
    for name, schema in SCHEMAS.items():
        assert rules.load_rules(name, schema) == yaml.safe_load((MAPPINGS / name).read_text(encoding="utf-8"))


def test_one_spelling_of_the_sides_and_of_explanations() -> None:
    for path in MAPPINGS.glob("*.yaml"):
        keys = _keys(yaml.safe_load(path.read_text(encoding="utf-8")))
        assert not keys & {"torch", "ms", "text", "note", "notes"}, (path.name, keys)


def test_a_misspelled_key_is_refused_with_its_place() -> None:
    data = yaml.safe_load((MAPPINGS / "defaults_mindspore_torch.yaml").read_text(encoding="utf-8"))
    data["rules"][2]["torch"] = data["rules"][2].pop("pytorch")
    with pytest.raises(rules.SchemaError, match=r"^rules\[2\]: unknown key 'torch'"):
        rules.validate(source.SCHEMA, data)
    data = yaml.safe_load((MAPPINGS / "check_rules.yaml").read_text(encoding="utf-8"))
    data["nonfinite"]["severity"] = "fatal"
    with pytest.raises(rules.SchemaError, match=r"^nonfinite.severity: expected one of 'error', 'warning', 'info'"):
        rules.validate(config.SCHEMA, data)


def test_schema_forms() -> None:
    schema = {"a": int, "b": rules.Opt(rules.OneOf("x", rules.ListOf(float))), "c": rules.MapOf(Severity)}
    rules.validate(schema, {"a": 1, "b": [1, 2.5], "c": {"r": "error"}})
    rules.validate(schema, {"a": 1, "c": {}})
    for bad, where in (({"a": True, "c": {}}, "a: expected int"), ({"a": 1, "b": "y", "c": {}}, "b: expected 'x'"),
                       ({"a": 1, "c": {"r": "fatal"}}, "c.r: expected one of"), ({"c": {}}, "missing key 'a'"),
                       ({"a": 1, "b": [1, "2"], "c": {}}, "b: expected 'x' or a list")):
        with pytest.raises(rules.SchemaError, match=where):
            rules.validate(schema, bad)


def test_an_unreadable_file_is_one_line() -> None:
    with pytest.raises(AlignerError, match=r"^no_such_rules\.yaml: cannot read the rules: ") as info:
        rules.load_rules("no_such_rules.yaml", {})
    assert "\n" not in str(info.value)
