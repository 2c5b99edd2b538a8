"""No code runs from a dump through what aligner writes or tells the user to paste (issue 26): `align repro`'s
repro.py, and the zoom-in code and command `align compare` prints. Real torch and MindSpore dumps of a two-layer
net, their manifests' strings replaced by injection payloads (triple quotes, quotes, backslashes, newlines, `;`,
`$()`, backticks, `#`, decorators, control characters, lone surrogates); each payload, if it ever ran, would create a
marker file or print a marker it spells in two halves. A few fixed examples run the generated script (and the
suggested shell command, under `bash -c` with a stub `align`); the fuzz classes check the generated source's
structure with `ast` and `tokenize`: the same code and comments as with a benign value, the dump's text in string
constants only."""
from __future__ import annotations

import ast
import dataclasses
import io
import json
import keyword
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Callable

import mindspore as ms
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aligner
from aligner.core.errors import AlignerError
from aligner.pipelines.compare.run import compare
from aligner.pipelines.repro import repro
from aligner.render.compare import zoom
from tests.pipelines.repro.test_repro import BLOCKER
from tests.support.cli import align_in_process, assert_one_line_error

ms.set_context(mode=ms.PYNATIVE_MODE)

MS_NET = '''
import numpy as np
import mindspore as ms
from mindspore import nn


class MsNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 3)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(3, 2)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def make():
    net = MsNet()
    net.set_train(False)
    return net
'''


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@dataclasses.dataclass
class Dumps:
    pt: Path       # the torch net
    ms: Path       # its MindSpore twin, same weights
    ms_bad: Path   # the twin with fc2's bias shifted: compare blames fc2 and prints its zoom-in
    factory: Path  # FILE.py whose make() builds the MindSpore net (for a class repro cannot build itself)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Dumps:
    root = tmp_path_factory.mktemp("hostile_scripts")
    factory = root / "ms_net.py"
    factory.write_text(MS_NET)
    namespace: dict[str, Any] = {}
    exec(compile(MS_NET, str(factory), "exec"), namespace)  # the test's own source, to build the twin here
    torch.manual_seed(0)
    tnet = TorchNet().eval()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    with aligner.dump(tnet, root / "pt", params=True), torch.no_grad():
        tnet(torch.from_numpy(x))
    out = {}
    for name, shift in (("ms", 0.0), ("ms_bad", 0.5)):
        mnet = namespace["make"]()
        values = {n: p.detach().numpy() + (shift if n == "fc2.bias" else 0.0) for n, p in tnet.named_parameters()}
        params = {n: ms.Parameter(ms.Tensor(v), name=n) for n, v in values.items()}
        not_loaded, _ = ms.load_param_into_net(mnet, params, strict_load=True)
        assert not not_loaded
        with aligner.dump(mnet, root / name, params=True):
            mnet(ms.Tensor(x))
        out[name] = root / name
    return Dumps(root / "pt", out["ms"], out["ms_bad"], factory)


def mutated(src: Path, dst: Path, header: Callable[[dict], None] | None = None,
            record: Callable[[dict], None] | None = None) -> Path:
    """A copy of the dump at `src` with its manifest header and records changed in place by the callables."""
    shutil.copytree(src, dst)
    lines = (dst / "manifest.jsonl").read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    if header is not None:
        header(parsed[0])
    for rec in parsed[1:]:
        if record is not None:
            record(rec)
    (dst / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in parsed) + "\n")
    return dst


def renamed(old: str, new: str) -> Callable[[dict], None]:
    """Rename module `old` (its records, its parameters' names, its children's parent) to `new`."""
    def change(rec: dict) -> None:
        if rec["module"] == old:
            rec["module"] = new
        elif rec["module"].startswith(old + "."):
            rec["module"] = new + rec["module"][len(old):]
        if rec.get("parent") == old:
            rec["parent"] = new
    return change


def on_call(module: str, change: Callable[[dict], None]) -> Callable[[dict], None]:
    """Apply `change` to the call record (kind "call") of `module`."""
    return lambda rec: change(rec) if rec["kind"] == "call" and rec["module"] == module else None


def run_scripts(*scripts: Path, cwd: Path) -> tuple[dict[str, int], str]:
    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-I", "-c", BLOCKER, *map(str, scripts)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CODES=")), None)
    assert line is not None, proc.stdout + proc.stderr
    codes = ast.literal_eval(line[len("CODES="):])
    return {str(Path(k).parent.name): v for k, v in codes.items()}, proc.stdout + proc.stderr


def python_payload(marker: str) -> str:
    """Breaks out of a docstring, a string or a comment, and runs: creates `marker` and prints it (in Python and in
    a shell), the marker spelled in two halves so that only running the payload writes it whole."""
    half = len(marker) // 2
    run = f"open({marker[:half]!r} + {marker[half:]!r}, 'w'); print({marker[:half]!r} + {marker[half:]!r})"
    shell = f"touch {marker[:half]}''{marker[half:]}"
    return f"x\"\"\"'\\\n{run}\n@(lambda f: {run})\ndef _f(): pass\n\"\"\" #`{shell}`;$({shell});"


def breakout(marker: str) -> str:
    """Closes a docstring, runs (creates `marker`, spelled in two halves), and opens a string the rest closes."""
    half = len(marker) // 2
    return f'x"""\nopen({marker[:half]!r} + {marker[half:]!r}, "w")\n"""'


def assert_no_marker(cwd: Path, output: str, marker: str) -> None:
    assert not (cwd / marker).exists(), f"the payload ran: {marker} was created"
    assert marker not in output, f"the payload ran: {marker} was printed"


# ---- regressions: align repro ------------------------------------------------------------------------------------

def test_module_path_with_triple_quotes_stays_a_literal(dumps: Dumps, tmp_path: Path) -> None:
    """The MindSpore twin of fc2 renamed to a docstring break-out: compare pairs it by content; repro.py agrees and
    runs nothing else (it used to close repro.py's docstring and run the payload, then print "agrees")."""
    payload = breakout("PATHMARK")
    ms_dir = mutated(dumps.ms, tmp_path / "ms", record=renamed("fc2", payload))
    result = repro(ms_dir, dumps.pt, "fc2", tmp_path / "out")
    codes, output = run_scripts(tmp_path / "out" / "repro.py", cwd=tmp_path)
    assert_no_marker(tmp_path, output, "PATHMARK")
    assert codes == {"out": 0} and "agrees" in output, output
    assert result.modules["mindspore"] == payload
    assert payload not in (tmp_path / "out" / "repro.py").read_text()  # only its repr


def test_class_name_with_triple_quotes_stays_a_literal(dumps: Dumps, tmp_path: Path) -> None:
    """A recorded class naming no framework class (so the MindSpore side comes from its factory) that breaks out of
    the docstring: it reaches repro.py as a literal only."""
    payload = "mindspore.nn.Dense" + breakout("CLASSMARK")
    ms_dir = mutated(dumps.ms, tmp_path / "ms",
                     record=on_call("fc2", lambda r: r["attrs"].update({"class": payload})))
    result = repro(ms_dir, dumps.pt, "fc2", tmp_path / "out", factory_a=f"{dumps.factory}:make")
    assert result.classes["mindspore"] == payload
    codes, output = run_scripts(tmp_path / "out" / "repro.py", cwd=tmp_path)
    assert codes == {"out": 0}, output
    assert_no_marker(tmp_path, output, "CLASSMARK")


def test_tensor_placeholder_as_a_required_attribute_is_one_line(dumps: Dumps, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`{"tensor": 0}` as Dense's in_channels reached an eval (an internal error): now a user error naming it."""
    ms_dir = mutated(dumps.ms, tmp_path / "ms",
                     record=on_call("fc2", lambda r: r["attrs"].update({"in_channels": {"tensor": 0}})))
    proc = align_in_process(capsys, "repro", ms_dir, dumps.pt, "--module", "fc2", "-o", tmp_path / "out")
    assert_one_line_error(proc, "in_channels", "--factory-a")
    assert not (tmp_path / "out").exists()


def test_tensor_placeholder_as_an_optional_attribute_is_left_out(dumps: Dumps, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`{"tensor": 0}` as Dense's optional activation: left at its default, and repro.py says so."""
    ms_dir = mutated(dumps.ms, tmp_path / "ms",
                     record=on_call("fc2", lambda r: r["attrs"].update({"activation": {"tensor": 0}})))
    proc = align_in_process(capsys, "repro", ms_dir, dumps.pt, "--module", "fc2", "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "out" / "repro.py").read_text()
    assert "left at the constructor's default: activation" in script
    assert "x[0]" not in script.split("def run_mindspore")[1].split("layer.set_train")[0]


def test_repro_run_line_quotes_the_directory(dumps: Dumps, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The `run: python DIR/repro.py` line is one shell word per argument, whatever DIR holds."""
    out = tmp_path / "my repro;$(touch RUNMARK)"
    proc = align_in_process(capsys, "repro", dumps.ms, dumps.pt, "--module", "fc2", "-o", out)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run: python "))
    command = line[len("run: "):].split("   (exit")[0]
    assert shlex.split(command) == ["python", str(out / "repro.py")]


# ---- regressions: the zoom-in compare prints ---------------------------------------------------------------------

STUB = textwrap.dedent('''
    import contextlib
    class aligner:
        @staticmethod
        def dump(*args, **kwargs):
            return contextlib.nullcontext()
    class _Loss:
        def backward(self):
            pass
    model = lambda batch: batch
    loss_fn = lambda out, target: _Loss()
    batch = target = None
''')


def zoom_of(capsys: pytest.CaptureFixture[str], dump_a: Path, dump_b: Path) -> str:
    proc = align_in_process(capsys, "compare", dump_a, dump_b, "--json", "-")
    assert proc.returncode == 1, proc.stderr
    code = json.loads(proc.stdout)["zoom"]
    assert isinstance(code, str), proc.stdout[-500:]
    return code


def run_zoom(code: str, cwd: Path) -> tuple[str, list[int]]:
    """Run the zoom-in's Python block (with stubs for what the user's script holds) and its command (through bash,
    `align` a stub, cwd the scratch directory); (their output, their exit codes)."""
    block, _, rest = code.rpartition("\nalign compare ")
    command = "align compare " + rest
    py = subprocess.run([sys.executable, "-I", "-c", STUB + block], capture_output=True, text=True, cwd=cwd,
                        timeout=60)
    bin_dir = cwd / "stub_bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "align").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "align").chmod(0o755)
    sh = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=cwd, timeout=60,
                        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd)})
    return py.stdout + py.stderr + sh.stdout + sh.stderr, [py.returncode, sh.returncode]


@pytest.mark.parametrize("framework", ["mindspore;touch${IFS}ZOOMMARK;#", "mindspore`touch${IFS}ZOOMMARK`",
                                       "mindspore&&touch${IFS}ZOOMMARK&&true"])
def test_zoom_command_holds_no_shell_from_the_header(dumps: Dumps, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str], framework: str) -> None:
    """A header framework that was pasted into `align compare zoom_...` as it was: unknown, so never echoed."""
    ms_dir = mutated(dumps.ms_bad, tmp_path / "ms", header=lambda h: h.update(framework=framework))
    code = zoom_of(capsys, ms_dir, dumps.pt)
    output, codes = run_zoom(code, tmp_path)
    assert_no_marker(tmp_path, output, "ZOOMMARK")
    assert codes == [0, 0], output
    assert "unknown framework" in code and "touch" not in code


def test_zoom_code_holds_no_python_from_the_header(dumps: Dumps, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Newlines and a decorator in the header framework broke out of the zoom-in's comment line and ran."""
    framework = "mindspore\n@print\nclass DECOMARK: pass\n#"
    ms_dir = mutated(dumps.ms_bad, tmp_path / "ms", header=lambda h: h.update(framework=framework))
    code = zoom_of(capsys, ms_dir, dumps.pt)
    output, codes = run_zoom(code, tmp_path)
    assert "__main__.DECOMARK" not in output, "the payload ran"
    assert codes == [0, 0], output
    assert "# unknown framework, same weights and batch:" in code


def test_zoom_of_one_framework_names_two_directories(dumps: Dumps, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides torch (a torch-vs-torch comparison): the suggested command compares two directories, not one."""
    pt_bad = mutated(dumps.ms_bad, tmp_path / "pt_bad", header=lambda h: h.update(framework="pytorch"))
    command = zoom_of(capsys, pt_bad, dumps.pt).rpartition("\n")[2]
    words = shlex.split(command)
    assert len(words) == 4 and words[2] != words[3], command


# ---- fuzz: every string field repro and the zoom-in read -----------------------------------------------------------

BENIGN = "benign value"  # not an identifier, like every payload: the same code shape is expected
HEADER_FIELDS = ("framework_version", "aligner_version", "format")
RECORD_FIELDS = ("module", "type", "kind", "io", "dtype", "parent", "source", "file", "arg")
CALL_FIELDS = ("attrs.class", "attrs.note", "attrs.dict", "args.kwarg_key", "args.kwarg_value", "args.str_arg")


def field_change(field: str, value: str) -> tuple[Callable[[dict], None] | None, Callable[[dict], None] | None]:
    """(header change, record change) putting `value` into `field` of the MindSpore dump's fc2 records."""
    if field in HEADER_FIELDS:
        return (lambda h: h.update({field: value})), None
    if field == "module":
        return None, renamed("fc2", value)
    if field in RECORD_FIELDS:
        return None, lambda r: r.update({field: value}) if r["module"] == "fc2" else None
    part, _, key = field.partition(".")

    def change(rec: dict) -> None:
        if key == "class":
            rec["attrs"]["class"] = value
        elif key == "note":
            rec["attrs"]["note"] = value
        elif key == "dict":
            rec["attrs"]["note"] = {"dict": {value: {"tuple": [value, 1.5]}}}
        elif key == "kwarg_key":
            rec["args"]["kwargs"][value] = {"tensor": 0}
            rec["args"]["args"] = []
        elif key == "kwarg_value":
            rec["args"]["kwargs"]["note"] = value
        else:
            rec["args"]["args"].append(value)
    return None, on_call("fc2", change)


def write_repro(dumps: Dumps, work: Path, field: str, value: str) -> str | None:
    """repro.py's source for fc2 with `value` in `field` (None when repro refuses the dump as a user error)."""
    header, record = field_change(field, value)
    ms_dir = mutated(dumps.ms, work / "ms", header=header, record=record)
    factory = f"{dumps.factory}:make" if field == "attrs.class" else None
    try:
        repro(ms_dir, dumps.pt, "fc2", work / "out", factory_a=factory)
    except AlignerError:
        return None
    return (work / "out" / "repro.py").read_text(encoding="utf-8")


class _Strings(ast.NodeTransformer):
    """Every string constant replaced by one placeholder: what is left is the code's shape."""

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.Constant("S") if isinstance(node.value, str) else node


def shape(source: str) -> str:
    return ast.dump(_Strings().visit(ast.parse(source)))


def comments(source: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]


def assert_only_data(source: str, baseline: str) -> None:
    """`source` is `baseline`'s code with other string constants: the same AST once strings are blanked (so the
    dump's text is in string constants only) and the same comments (none carries the dump's text)."""
    assert shape(source) == shape(baseline)
    assert comments(source) == comments(baseline)


FRAGMENTS = ['"""', "'''", '"', "'", "\\", "\n", "\r", ";", "$(touch FUZZMARK)", "`touch FUZZMARK`", "#", "${IFS}",
             "@print\ndef f(): pass\n", "open('FUZZ' + 'MARK', 'w')", "\x1b[31m", "\x7f", "\u202e", "\ud800", " ",
             "[/x]", "mindspore", "fc2", "{", "}", "%s", "\t"]
# NUL is left out: a path with one is another issue's (the readers'), not a script's
_TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=4)
payloads = st.lists(st.one_of(st.sampled_from(FRAGMENTS), _TEXT), min_size=1, max_size=6).map("".join).filter(bool)


class TestGeneratedScriptInjection:
    """Payloads in every string field a repro or the zoom-in reads; a few run, the rest are checked as source."""

    FIXED = [("module", python_payload("FIXMARK")), ("attrs.note", breakout("FIXMARK")),
             ("attrs.class", "mindspore.nn.Dense" + python_payload("FIXMARK")),
             ("framework_version", breakout("FIXMARK")), ("attrs.dict", python_payload("FIXMARK"))]

    def test_fixed_payloads_run_only_the_comparison(self, dumps: Dumps, tmp_path: Path) -> None:
        scripts = []
        for i, (field, payload) in enumerate(self.FIXED):
            work = tmp_path / f"case{i}"
            work.mkdir()
            source = write_repro(dumps, work, field, payload)
            assert source is not None, field
            scripts.append(work / "out" / "repro.py")
        codes, output = run_scripts(*scripts, cwd=tmp_path)
        assert set(codes.values()) == {0}, output
        assert output.count("agrees") == len(self.FIXED), output
        assert_no_marker(tmp_path, output, "FIXMARK")

    baselines: dict[str, str | None] = {}

    @settings()
    @given(field=st.sampled_from(HEADER_FIELDS + RECORD_FIELDS + CALL_FIELDS), payload=payloads)
    def test_repro_py_holds_dump_strings_as_constants_only(self, dumps: Dumps, field: str, payload: str) -> None:
        if field == "args.kwarg_key" and payload.isidentifier() and not keyword.iskeyword(payload):
            return  # a plain keyword name is written as one (`layer(name=...)`): not the benign value's shape
        with tempfile.TemporaryDirectory() as tmp:
            if field not in self.baselines:
                (Path(tmp) / "benign").mkdir()
                self.baselines[field] = write_repro(dumps, Path(tmp) / "benign", field, BENIGN)
            source = write_repro(dumps, Path(tmp), field, payload)
        if source is None:  # refused as a user error: nothing written
            return
        baseline = self.baselines[field]
        assert baseline is not None, field
        assert_only_data(source, baseline)

    @settings()
    @given(framework=payloads, module=payloads)
    def test_zoom_in_holds_known_names_and_quoted_paths_only(self, dumps: Dumps, framework: str,
                                                             module: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            ms_dir = mutated(dumps.ms_bad, Path(tmp) / "ms", header=lambda h: h.update(framework=framework),
                             record=renamed("fc2", module))
            try:
                result = compare(ms_dir, dumps.pt)
            except AlignerError:
                return
        code = zoom(result)
        if code is None:
            return
        block, _, command = code.rpartition("\n")
        tree = ast.parse(block)
        assert [type(node) for node in tree.body] == [ast.With, ast.With]
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                assert node.id in {"aligner", "model", "batch", "loss_fn", "target", "loss"}, node.id
            if isinstance(node, ast.Attribute):
                assert node.attr in {"dump", "backward"}, node.attr
        for comment in comments(block):
            assert re.fullmatch(r"# (pytorch|mindspore|numpy|unknown framework), same weights and batch:", comment)
        words = shlex.split(command)
        assert words[:2] == ["align", "compare"] and len(words) == 4
        assert all(re.fullmatch(r"zoom_\w+/", w) for w in words[2:]), words
