"""The package's shape: imports point one way (cli -> render -> pipelines -> dumping -> mapping -> {metrics, io}
-> core), aligner's own modules are imported at module level (only torch/mindspore and heavy optional libraries
lazily), and nothing below render/ formats output with rich."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import aligner

PACKAGE = Path(aligner.__file__).resolve().parent
# Layer of each top-level room; a module may import only rooms of a lower layer, or its own room.
# dumping sits above mapping: pairing two dumps (dumping/pair/) renames parameter gradients with mapping's planner
LAYERS = {"core": 0, "io": 1, "metrics": 1, "mapping": 2, "dumping": 3, "pipelines": 4, "render": 5, "cli": 6,
          "mappings": 0}
FACADE = {"aligner", "aligner.api", "aligner.cli.__main__"}  # the public API entry points, above every room
FORMATTING = ("rich", "matplotlib", "plotly")
FRAMEWORKS = ("torch", "mindspore")


def _modules() -> list[tuple[str, Path]]:
    out = [("aligner", PACKAGE / "__init__.py")]
    for info in pkgutil.walk_packages([str(PACKAGE)], "aligner."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            out.append((info.name, Path(spec.origin)))
    return out


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "aligner" else None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level?) for every import of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    for block in tree.body:  # `if TYPE_CHECKING:` and `try: ... except ImportError:` at module level count as top
        if isinstance(block, (ast.If, ast.Try)):
            top |= {id(n) for n in block.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(pkg + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names] \
                if base.startswith("aligner") else [base]
            found += [(n, node.lineno, id(node) in top) for n in names]
    return found


def test_every_module_imports() -> None:
    for name, _ in _modules():
        if name != "aligner.cli.__main__":
            importlib.import_module(name)


def test_imports_point_down() -> None:
    upward = []
    for name, path in _modules():
        if name in FACADE:
            continue
        mine = LAYERS[_room(name) or ""]
        for target, line, _ in _imports(path, name):
            room = _room(target)
            if room is None or room == _room(name):
                continue
            if LAYERS.get(room, 99) >= mine:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} (layer {room})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def _imports_framework(module: str) -> bool:
    """Whether a module imports torch or MindSpore when loaded (then importing it lazily is the design)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return any(top and target.split(".")[0] in FRAMEWORKS for target, _, top in _imports(Path(spec.origin), module))


def test_own_modules_imported_at_module_level() -> None:
    lazy = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
            for name, path in _modules() if name not in FACADE
            for target, line, top in _imports(path, name)
            if not top and target.startswith("aligner") and not _imports_framework(target)]
    assert not lazy, "function-level imports of aligner's own modules hide the structure:\n" + "\n".join(lazy)


def test_only_render_formats() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
             for name, path in _modules() if _room(name) not in ("render", "cli") and name not in FACADE
             for target, line, _ in _imports(path, name) if target.split(".")[0] in FORMATTING]
    assert not found, "formatting libraries below render/:\n" + "\n".join(found)


# What `align compare` of two small .npy folders must not load: each module serves an option or a kind of input it
# does not have (--html, --calibrate, --map, --engine ray, rank folders, foreign dumps, bfloat16 tensors, a terminal's
# progress bar, a run big enough for worker processes). Its start cost is measured by scripts/bench_compare.py.
COMPARE_UNUSED = ("multiprocessing", "concurrent.futures", "yaml", "ml_dtypes", "rich.progress", "aligner.render.html",
                  "aligner.render.ranks", "aligner.pipelines.compare.ranks", "aligner.pipelines.compare.calibrate",
                  "aligner.pipelines.compare.distributed", "aligner.pipelines.compare.parallel",
                  "aligner.dumping.ranks", "aligner.dumping.read.foreign.msprobe",
                  "aligner.dumping.read.foreign.native",
                  "aligner.mapping.plan", "aligner.mapping.usermap", "aligner.mapping.ops", "aligner.core.findings")
FACADES = ("aligner.pipelines.compare", "aligner.render", "aligner.dumping.read.foreign", "aligner.mapping",
           "aligner.dumping", "aligner.io")


def test_compare_of_npy_folders_loads_only_what_it_runs(tmp_path: Path) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "x.npy", np.ones(4, np.float32))
    code = ("import sys\nfrom aligner.cli import main\ntry:\n    main(['compare', 'a', 'b'])\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code\nsys.stderr.write(' '.join(sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "No divergence" in done.stdout
    loaded = set(done.stderr.split())
    assert "aligner.pipelines.compare.run" in loaded  # the listing is real
    assert not loaded & set(COMPARE_UNUSED)


def test_lazy_facades_name_what_exists() -> None:
    for name in FACADES:
        facade = importlib.import_module(name)
        for attribute in facade.__all__:
            assert getattr(facade, attribute) is not None, f"{name}.{attribute}"


# The dump format's owner: aligner.dumping writes it (manifest.py, writer.py), reads it (read/: aligner dumps,
# plain .npy folders, msprobe and native dumps, rank folders) and pairs two dumps (pair/: read_pair, the record
# matching, the same-model check). What a pipeline needs of it comes from there.
DUMP_FORMAT = ("aligner.dumping.manifest", "aligner.dumping.read.source", "aligner.dumping.read.ranks",
               "aligner.dumping.read.foreign", "aligner.dumping.read.foreign.layout", "aligner.io.npy_header",
               "aligner.dumping.pair.paired", "aligner.dumping.pair.matching", "aligner.dumping.pair.ops")
# What reading a dump or a .npy header by hand looks like: the manifest's file name, numpy's header reader.
FORMAT_INTERNALS = ("MANIFEST", "read_manifest", "read_array_header", "read_magic", "RANK_DIR")


def _format_names() -> set[str]:
    names: set[str] = set()
    for module in DUMP_FORMAT:
        loaded = importlib.import_module(module)
        names |= {n for n, v in vars(loaded).items() if not n.startswith("_") and not inspect.ismodule(v)
                  and getattr(v, "__module__", module) == module}
    return names


def test_pipelines_read_dumps_only_through_dumping() -> None:
    """No pipeline takes a dump reader's or the pairing's name (Item, read_source, read_ranks, read_pair, Pair,
    match, ...) from another pipeline, and none reads the format by hand (the manifest's name, numpy's header
    parser): one owner, below the pipelines."""
    names, found = _format_names(), []
    assert {"Item", "Source", "read_source", "load_tensor", "read_ranks", "holds_ranks", "NpyHeader"} <= names
    assert {"read_pair", "Paired", "check_same_model", "match", "Pair", "MatchedBy", "namers", "is_op"} <= names
    for name, path in _modules():
        if _room(name) != "pipelines":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aligner.pipelines"):
                found += [f"{name}:{node.lineno} takes {a.name} from {node.module}" for a in node.names
                          if a.name in names]
            elif isinstance(node, (ast.Name, ast.Attribute)):
                word = node.id if isinstance(node, ast.Name) else node.attr
                if word in FORMAT_INTERNALS:
                    found.append(f"{name}:{node.lineno} reads the dump format itself ({word})")
    assert not found, "dump format read outside aligner.dumping:\n" + "\n".join(found)


# Prose below render/ (issue 29 item 6): a pipeline says what it found as `Words` (a code and its evidence) and
# render/words/ writes the sentence; no module of aligner/pipelines/ writes one.
PROSE_WORDS = 4
# The standalone script `align repro` writes is a program: its comments and strings are code it generates, not
# sentences to a user.
PROSE_GENERATED_CODE = {"repro/script.py", "repro/layers.py"}


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string literal or f-string in `path` holding more than PROSE_WORDS plain words (runs of
    lowercase letters, a trailing , . : ; allowed), outside docstrings and the arguments of an `...Error(...)` call."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        callee = node.func if isinstance(node, ast.Call) else None
        if isinstance(node, ast.JoinedStr) or (callee is not None and (
                getattr(callee, "id", None) or getattr(callee, "attr", "")).endswith("Error")):
            skip |= {id(inner) for inner in ast.walk(node) if inner is not node}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
        else:
            continue
        if sum(1 for word in text.split() if re.fullmatch(r"[a-z]+[,.:;]?", word)) > PROSE_WORDS:
            found.append((node.lineno, text))
    return found


def test_pipelines_write_no_sentences() -> None:
    """No string literal or f-string in aligner/pipelines/ holds more than PROSE_WORDS plain words (a sentence), but
    docstrings, error messages (the arguments of AlignerError and other `...Error(...)` calls: one line raised at the
    edge) and the repro script's generated code. Names, labels and code snippets (a fix such as
    "nn.LayerNorm(..., epsilon=1e-05)") pass: they hold few plain words."""
    over = []
    root = PACKAGE / "pipelines"
    for path in sorted(root.rglob("*.py")):
        key = path.relative_to(root).as_posix()
        if key not in PROSE_GENERATED_CODE:
            over += [f"pipelines/{key}:{line}: {text[:90]!r}" for line, text in _prose(path)]
    assert not over, "sentences written in a pipeline (say them as Words, word them in render/words/):\n" + \
        "\n".join(over)


def test_render_words_every_code() -> None:
    """Every code a pipeline can say (each `Say` enum in aligner/pipelines/*/says.py) has its template in
    render/words/, and no template is for a code nothing says."""
    from aligner.render.words import templates

    codes = {member for path in sorted((PACKAGE / "pipelines").glob("*/says.py"))
             for member in importlib.import_module(f"aligner.pipelines.{path.parent.name}.says").Say}
    assert len({type(code) for code in codes}) >= 3
    assert codes == set(templates())
