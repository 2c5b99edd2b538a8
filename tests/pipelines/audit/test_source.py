"""`align audit --source`: each rule of mappings/defaults_mindspore_torch.yaml found once on its line with its fix, an
aligned file clean, imports resolved in every spelling, broken files skipped with their line, directories walked; and
every default in the table proven against the installed MindSpore and torch."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.findings import Severity
from aligner.pipelines.audit.source import RULE_PREFIX, Side, SourceAuditReport, audit_source, load_defaults
from aligner.render.jsonout import dumps
from aligner.render.words import say

HEADER = "from mindspore import nn, ops\n"
# rule id -> (a call that fires that rule and no other, the fix the audit must give for it)
ONE_PER_RULE = {
    "conv.has_bias": ("nn.Conv2d(3, 64, 3, pad_mode='valid')", "nn.Conv2d(3, 64, 3, pad_mode='valid', has_bias=True)"),
    "conv.pad_mode": ("nn.Conv1d(3, 64, 3, 2, has_bias=True)",
                      "nn.Conv1d(3, 64, 3, 2, has_bias=True, pad_mode='pad', padding=1)"),
    "conv_transpose.pad_mode": ("nn.Conv2dTranspose(3, 4, 2, 2, has_bias=True)",
                                "nn.Conv2dTranspose(3, 4, 2, 2, has_bias=True, pad_mode='valid')"),
    "pool.stride": ("nn.AvgPool2d(3)", "nn.AvgPool2d(3, stride=3)"),
    "pool.same_stride": ("nn.MaxPool2d(kernel_size=3, stride=2, pad_mode='same')",
                         "nn.MaxPool2d(kernel_size=3, stride=2, pad_mode='pad', padding=1)"),
    "conv.same_stride": ("nn.Conv2d(3, 64, (3, 5), 2, 'same', has_bias=True)",
                         "nn.Conv2d(3, 64, (3, 5), 2, 'pad', has_bias=True, padding=(1, 2))"),
    "layernorm.epsilon": ("nn.LayerNorm((768,))", "nn.LayerNorm((768,), epsilon=1e-5)"),
    "gelu.approximate": ("nn.GELU()", "nn.GELU(approximate=False)"),
    "leaky_relu.alpha": ("ops.leaky_relu(x)", "ops.leaky_relu(x, alpha=0.01)"),
    "resize_bilinear.half_pixel_centers": ("ops.ResizeBilinearV2()", "ops.ResizeBilinearV2(half_pixel_centers=True)"),
    "smooth_l1.reduction": ("nn.SmoothL1Loss(beta=0.5)", "nn.SmoothL1Loss(beta=0.5, reduction='mean')"),
    "softmax_cross_entropy.reduction": ("nn.SoftmaxCrossEntropyWithLogits(sparse=True)",
                                        "nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')"),
    "std.ddof": ("ops.var(x, 0)", "ops.var(x, 0, ddof=1)"),
    "flatten.start_dim": ("ops.flatten(x)", "ops.flatten(x, start_dim=0)"),
    "softmax.axis": ("nn.Softmax()", "nn.Softmax(axis=1)"),
    "batchnorm.momentum": ("nn.BatchNorm2d(64, momentum=0.1)", "nn.BatchNorm2d(64, momentum=0.9)"),
    "dropout.keep_prob": ("nn.Dropout(keep_prob=0.8)", "nn.Dropout(p=0.2)"),
    "dropout.keep_prob_low": ("nn.Dropout(0.1)", "nn.Dropout(p=0.1)"),
    "instance_norm.affine": ("nn.InstanceNorm2d(64)", "nn.InstanceNorm2d(64, affine=False)"),
    "embedding.init": ("nn.Embedding(1000, 64)", "nn.Embedding(1000, 64, embedding_table=Normal(sigma=1.0))"),
}
# Every call explicit, and calls that look alike but must not fire: kernel size 1, pools with a stride, corner-aligned
# resizing, values in MindSpore's own convention, mint (torch's defaults), torch itself, a local class, *args/**kwargs.
ALIGNED = """\
import torch
from mindspore import mint, nn, ops

class Conv2d:
    pass

nn.Conv2d(3, 64, 3, has_bias=True, pad_mode='valid')
nn.Conv2d(3, 64, 3, 1, 'pad', 1, 1, 1, True)
nn.Conv2d(64, 64, 1, has_bias=False)
nn.Conv2dTranspose(3, 4, 2, stride=2, pad_mode='valid', has_bias=True)
nn.MaxPool2d(3, 2, pad_mode='valid')
nn.MaxPool2d(3, 1, pad_mode='same')
nn.Conv2d(3, 64, 3, pad_mode='same', has_bias=True)
nn.Conv2d(3, 64, 1, stride=2, pad_mode='same', has_bias=True)
nn.MaxPool2d(kernel_size=1)
nn.AvgPool1d()
ops.avg_pool2d(x, 2, 2)
nn.LayerNorm((768,), epsilon=1e-5)
ops.LayerNorm(-1, -1, 1e-5)
nn.GELU(approximate=False)
nn.LeakyReLU(0.01)
ops.ResizeBilinearV2(align_corners=True)
ops.ResizeBilinearV2(half_pixel_centers=True)
nn.SmoothL1Loss(reduction='mean')
nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')
ops.std(x, ddof=1)
ops.flatten(x, start_dim=0)
nn.Softmax(axis=-1)
nn.BatchNorm2d(64)
nn.BatchNorm2d(64, momentum=0.9)
nn.BatchNorm2d(64, 1e-5, 0.97)
nn.Dropout()
nn.Dropout(p=0.1)
nn.InstanceNorm2d(64, affine=False)
nn.Embedding(1000, 64, embedding_table=init)
nn.Dense(3, 4)
mint.nn.Conv2d(3, 64, 3)
mint.nn.GELU()
torch.nn.Conv2d(3, 64, 3)
Conv2d(3, 64, 3)
nn.Conv2d(*args)
nn.Conv2d(3, 64, 3, **kwargs)
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _lines(report: SourceAuditReport) -> list[tuple[str, int]]:
    """(rule id without the prefix, line) of every finding."""
    out = []
    for f in report.findings:
        line = str(f.where[0]).rpartition(":")[2]
        out.append((f.rule.removeprefix(RULE_PREFIX), int(line)))
    return out


def test_every_rule_found_once_on_its_line_with_its_fix(tmp_path: Path) -> None:
    assert set(ONE_PER_RULE) == {rule.id for rule in load_defaults().rules}, "a rule without a line in this test"
    source = _write(tmp_path / "model.py", HEADER + "".join(f"{call}\n" for call, _ in ONE_PER_RULE.values()))
    report = audit_source(source)
    assert _lines(report) == [(rule, line) for line, rule in enumerate(ONE_PER_RULE, start=2)]
    for line, (finding, (call, fix)) in enumerate(zip(report.findings, ONE_PER_RULE.values()), start=2):
        assert finding.where == (f"{source}:{line}",)
        assert say(finding.fix) == fix
        assert say(finding.message).startswith(f"{call}: "), say(finding.message)
        compile(fix, "fix", "eval")                     # each fix is valid Python
    assert report.skipped == [] and report.files == 1
    assert report.exit_code == ExitCode.FOUND and not report


def test_one_call_several_defaults_gets_one_fix_for_all() -> None:
    """Both Conv2d defaults reported, each with the call that fixes both (stride 2: 'same' is not a torch padding)."""
    tree_text = HEADER + "layer = nn.Conv2d(3, 64, 3, stride=2)\n"
    report = _audit_text(tree_text)
    assert _lines(report) == [("conv.has_bias", 2), ("conv.pad_mode", 2)]
    assert {say(f.fix) for f in report.findings} == {"nn.Conv2d(3, 64, 3, stride=2, has_bias=True, pad_mode='pad', "
                                                "padding=1)"}
    assert "has_bias defaults to False" in say(report.findings[0].message)
    assert "bias=True" in say(report.findings[0].message)
    assert "pad_mode defaults to 'same'" in say(report.findings[1].message)


def test_values_passed_positionally_are_rewritten_in_place() -> None:
    report = _audit_text(HEADER + "nn.BatchNorm2d(64, 1e-5, 0.03)\nnn.Dropout(0.2, dtype=x)\n"
                         "nn.Dropout(keep_prob=rate)\nnn.MaxPool2d((3, 3))\nnn.MaxPool2d(k)\n"
                         "ops.flatten(x, 'C', end_dim=2)\n")
    assert [say(f.fix) for f in report.findings] == [
        "nn.BatchNorm2d(64, 1e-5, 0.97)", "nn.Dropout(dtype=x, p=0.2)", "nn.Dropout(p=1 - rate)",
        "nn.MaxPool2d((3, 3), stride=(3, 3))", "nn.MaxPool2d(k, stride=k)",
        "ops.flatten(x, 'C', end_dim=2, start_dim=0)"]
    assert "momentum=0.03 is torch.nn.BatchNorm2d(momentum=0.97)" in say(report.findings[0].message)


def test_aligned_file_gives_no_finding(tmp_path: Path) -> None:
    report = audit_source(_write(tmp_path / "aligned.py", ALIGNED))
    assert report.findings == [] and report.skipped == []
    assert report.exit_code == ExitCode.OK and report


@pytest.mark.parametrize(("imports", "call"), [
    ("from mindspore import nn", "nn.Conv2d"),
    ("import mindspore.nn as nn", "nn.Conv2d"),
    ("from mindspore.nn import Conv2d", "Conv2d"),
    ("from mindspore.nn import Conv2d as C", "C"),
    ("import mindspore as ms", "ms.nn.Conv2d"),
    ("import mindspore", "mindspore.nn.Conv2d"),
    ("import mindspore.nn", "mindspore.nn.Conv2d"),
    ("from mindspore.nn import *", "Conv2d"),
    ("from mindspore import nn as msnn", "msnn.Conv2d"),
    ("from mindspore.nn.layer.conv import Conv2d", "Conv2d"),
    ("from mindspore import nn\nimport numpy as np", "nn.layer.Conv2d"),
])
def test_import_spellings_resolve(imports: str, call: str) -> None:
    report = _audit_text(f"{imports}\n\n\nlayer = {call}(3, 64, 3, pad_mode='valid')\n")
    assert _lines(report) == [("conv.has_bias", imports.count("\n") + 4)]
    assert say(report.findings[0].fix) == f"{call}(3, 64, 3, pad_mode='valid', has_bias=True)"


@pytest.mark.parametrize(("imports", "call", "rule"), [
    ("from mindspore import ops", "ops.std(x)", "std.ddof"),
    ("import mindspore.ops as ops", "ops.flatten(x)", "flatten.start_dim"),
    ("from mindspore.ops import operations as P", "P.ResizeBilinearV2()", "resize_bilinear.half_pixel_centers"),
    ("import mindspore.ops.operations as P", "P.ResizeBilinearV2()", "resize_bilinear.half_pixel_centers"),
    ("from mindspore.ops import function as F", "F.std(x)", "std.ddof"),
    ("import mindspore as ms", "ms.ops.leaky_relu(x)", "leaky_relu.alpha"),
])
def test_ops_spellings_resolve(imports: str, call: str, rule: str) -> None:
    assert _lines(_audit_text(f"{imports}\ny = {call}\n")) == [(rule, 2)]


def test_imports_inside_functions_count() -> None:
    report = _audit_text("def build():\n    from mindspore import nn\n    return nn.GELU()\n")
    assert _lines(report) == [("gelu.approximate", 3)]


@pytest.mark.parametrize("text", [
    "import torch.nn as nn\nnn.Conv2d(3, 64, 3)\n",                     # torch, not MindSpore
    "from mindspore import mint\nmint.nn.Conv2d(3, 64, 3)\n",            # mint follows torch's defaults
    "import mindspore\nnn.Conv2d(3, 64, 3)\n",                           # `nn` is not bound to MindSpore here
    "from mindspore import nn\nnn.Conv2d.__init__(self, 3, 64, 3)\n",    # not a constructor call the table knows
    "from mindspore import nn\nlayer = nn.Conv2d\n",                     # named, not called
])
def test_calls_that_are_not_mindspore_defaults_are_left_alone(text: str) -> None:
    assert _audit_text(text).findings == []


def test_file_that_does_not_parse_is_skipped_with_its_line(tmp_path: Path) -> None:
    _write(tmp_path / "pkg" / "good.py", HEADER + "nn.GELU()\n")
    bad = _write(tmp_path / "pkg" / "bad.py", "from mindspore import nn\n\ndef f(:\n    nn.GELU()\n")
    report = audit_source(tmp_path)
    assert len(report.skipped) == 1 and say(report.skipped[0]).startswith(f"{bad}:3: "), report.skipped
    assert [f.where for f in report.findings] == [(f"{tmp_path / 'pkg' / 'good.py'}:2",)]
    (tmp_path / "pkg" / "gone.py").symlink_to(tmp_path / "nowhere.py")
    assert say(audit_source(tmp_path).skipped[1]).startswith(f"{tmp_path / 'pkg' / 'gone.py'}:0: cannot be read")
    alone = audit_source(bad)
    assert alone.findings == [] and alone.skipped == report.skipped and alone.exit_code == ExitCode.OK


def test_directory_is_scanned_recursively(tmp_path: Path) -> None:
    _write(tmp_path / "a.py", HEADER + "nn.GELU()\n")
    _write(tmp_path / "models" / "deep" / "b.py", HEADER + "\nnn.LayerNorm((8,))\n")
    _write(tmp_path / "models" / "notes.txt", HEADER + "nn.GELU()\n")              # not Python
    _write(tmp_path / ".venv" / "lib" / "c.py", HEADER + "nn.GELU()\n")           # hidden: a virtualenv
    _write(tmp_path / "x" / "site-packages" / "d.py", HEADER + "nn.GELU()\n")     # installed packages
    _write(tmp_path / "plain.py", "print('no MindSpore here')\n")
    report = audit_source(tmp_path)
    assert [(f.where, f.rule) for f in report.findings] == [
        ((f"{tmp_path / 'a.py'}:2",), "source.gelu.approximate"),
        ((f"{tmp_path / 'models' / 'deep' / 'b.py'}:3",), "source.layernorm.epsilon")]
    assert report.files == 3


def test_report_round_trips_and_exit_code_follows_errors_only(tmp_path: Path) -> None:
    warnings = audit_source(_write(tmp_path / "w.py", HEADER + "nn.BatchNorm2d(8, momentum=0.1)\nnn.Dropout(0.9)\n"))
    assert [f.severity for f in warnings.findings] == [Severity.WARNING, Severity.INFO]
    assert warnings.exit_code == ExitCode.OK and warnings
    saved = dumps(warnings.to_dict())   # render/ writes the words as sentences; read back, the same text
    data = json.loads(saved)
    assert data["counts"] == {"error": 0, "warning": 1, "info": 1} and data["passed"] is True
    assert dumps(SourceAuditReport.from_dict(data).to_dict()) == saved
    errors = audit_source(_write(tmp_path / "e.py", HEADER + "nn.GELU()\n"))
    assert errors.exit_code == ExitCode.FOUND and errors.to_dict()["exit_code"] == 1
    assert SourceAuditReport.from_dict(errors.to_dict()) == errors


def test_bad_paths_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(AlignerError, match="no such file") as missing:
        audit_source(tmp_path / "nope")
    assert missing.value.exit_code == ExitCode.USAGE
    with pytest.raises(AlignerError, match="not a Python file"):
        audit_source(_write(tmp_path / "model.ckpt", "x"))


def test_scanner_imports_neither_framework(tmp_path: Path) -> None:
    source = _write(tmp_path / "m.py", HEADER + "nn.GELU()\n")
    code = ("import sys; from aligner.pipelines.audit.source import audit_source; "
            f"assert len(audit_source({str(source)!r}).findings) == 1; "
            "print(sorted(m for m in ('torch', 'mindspore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_large_tree(tmp_path: Path) -> None:
    """Figure, not a limit: 400 files of 250 lines, a third of them MindSpore calls, every tenth one firing."""
    body = "".join(f"    h = nn.Conv2d(3, 64, 3, has_bias=True, pad_mode='valid')\n    y{i} = h(x) + {i}\n"
                   if i % 10 else "    g = nn.GELU()\n    y = g(x)\n" for i in range(80))
    text = HEADER + "\n\ndef block(x):\n" + body + "    return x\n" + "def other(a, b):\n    return a + b\n" * 40
    for i in range(400):
        _write(tmp_path / f"pkg{i % 20}" / f"m{i}.py", text)
    lines = 400 * len(text.splitlines())
    start = time.perf_counter()
    report = audit_source(tmp_path)
    seconds = time.perf_counter() - start
    assert report.files == 400 and len(report.findings) == 400 * 8
    start = time.perf_counter()
    for path in sorted(tmp_path.rglob("*.py")):
        ast.parse(path.read_bytes())
    parsing = time.perf_counter() - start
    print(f"\naudit --source: {report.files} files, {lines} lines, {len(report.findings)} findings in "
          f"{seconds:.2f} s ({lines / seconds:,.0f} lines/s); ast.parse alone on the same files: {parsing:.2f} s")


# --- the table against the installed frameworks --------------------------------------------------------------------

def _object(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _parameters(obj: Any) -> dict[str, inspect.Parameter]:
    """The parameters of a class or function; for a C builtin without a signature, those of the signature line that
    opens its docstring (torch's documented form, e.g. `std(input, dim=None, *, correction=1, ...)`)."""
    try:
        return dict(inspect.signature(obj).parameters)
    except ValueError:
        line = str(inspect.getdoc(obj)).splitlines()[0].split(" -> ")[0]
        args = ast.parse(f"def {line}: pass").body[0].args           # type: ignore[attr-defined]
        defaults = dict(zip([a.arg for a in args.args][::-1], args.defaults[::-1]))
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return {a.arg: inspect.Parameter(a.arg, kind, default=ast.literal_eval(defaults[a.arg])
                                         if a.arg in defaults else inspect.Parameter.empty)
                for a in [*args.args, *args.kwonlyargs]}


def _installed_default(api: str, argument: str) -> Any:
    params = _parameters(_object(api))
    assert argument in params, f"{api} has no argument {argument!r}"
    return params[argument].default


def _prove(side: Side) -> Any:
    """Assert the side's default on each of its APIs; return the value it stands for (`also`, else the default)."""
    for api in side.apis:
        found = _installed_default(api, side.argument)
        assert found == side.default and type(found) is type(side.default), \
            f"{api}({side.argument}=...) defaults to {found!r}, the table says {side.default!r}"
    if side.also is None:
        return side.default
    api, argument, default = side.also
    assert _installed_default(api, argument) == default, f"{api}({argument}=...) is no longer {default!r}"
    return default


@pytest.mark.parametrize("rule", load_defaults().rules, ids=lambda r: r.id)
def test_rule_defaults_are_those_of_the_installed_frameworks(rule: Any) -> None:
    pytest.importorskip("mindspore")
    pytest.importorskip("torch")
    assert len(rule.mindspore.apis) == len(rule.torch.apis), "each MindSpore api needs one torch counterpart"
    mindspore_value, torch_value = _prove(rule.mindspore), _prove(rule.torch)
    if rule.convention == "complement":
        assert mindspore_value == pytest.approx(1 - torch_value), "the two defaults no longer mean the same"
    else:
        assert mindspore_value != torch_value, "the defaults agree now: the rule is stale"
    for api in rule.mindspore.apis:
        params = _parameters(_object(api))
        for name in (*(fixed for fixed, _ in rule.fix), *rule.skip_when):
            assert name in params, f"{api} has no argument {name!r} (fix or skip_when)"


def test_the_proof_names_a_wrong_row() -> None:
    """The check above can fail: a default MindSpore does not have is refused, naming the API and the argument."""
    pytest.importorskip("mindspore")
    wrong = Side(("mindspore.nn.BatchNorm2d",), "momentum", 0.1)
    with pytest.raises(AssertionError, match=r"mindspore\.nn\.BatchNorm2d\(momentum=\.\.\.\) defaults to 0\.9"):
        _prove(wrong)


@pytest.mark.parametrize("api", sorted(load_defaults().signatures))
def test_signature_rows_are_those_of_mindspore(api: str) -> None:
    pytest.importorskip("mindspore")
    names: list[str] = []
    for p in _parameters(_object(api)).values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in names:
            names.append("*")
        names.append(p.name)
    assert tuple(names) == load_defaults().signatures[api], f"{api}{tuple(names)}"


@pytest.mark.parametrize("row", load_defaults().agree, ids=lambda r: f"{r[0].apis[0]}.{r[0].argument}")
def test_agreeing_defaults_still_agree(row: tuple[Side, Side]) -> None:
    pytest.importorskip("mindspore")
    pytest.importorskip("torch")
    mindspore, torch = row
    assert _prove(mindspore) == _prove(torch)


def _audit_text(text: str) -> SourceAuditReport:
    """Audit `text` as a file of its own (a fresh directory per call)."""
    with tempfile.TemporaryDirectory() as folder:
        return audit_source(_write(Path(folder) / "snippet.py", textwrap.dedent(text)))


def test_cli_source_json_report(tmp_path):
    """`align audit --source PATH --json OUT`: the same findings as data; exit 1 for an error finding."""
    from tests.support.cli import run_align

    src = tmp_path / "net.py"
    src.write_text("from mindspore import nn\nconv = nn.Conv2d(3, 8, 3)\n")
    proc = run_align("audit", "--source", src, "--json", tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == data["exit_code"] == 1
    assert {f["rule"] for f in data["findings"]} == {"source.conv.has_bias"}   # 'same' at stride 1: assumed equal
    assert all(f["where"] == [f"{src}:2"] for f in data["findings"])
    assert [w for w, _ in data["assumed"]] == [f"{src}:2"] and "padding=1 or padding='same'" in data["assumed"][0][1]
