"""`align audit --source`: MindSpore calls that rely on a default differing from the torch counterpart.

The scan reads the Python AST only (nothing is imported or run, MindSpore need not be installed): names are resolved
through the file's imports (`from mindspore import nn`, `import mindspore.ops as ops`, `from mindspore.nn import
Conv2d`, `ms.nn.Conv2d`, ...), each call is matched against the defaults table (mappings/defaults_mindspore_torch.yaml),
and every call that relies on a differing default (or passes a value that looks copied from torch, such as a
BatchNorm momentum of 0.1) becomes a `Finding` at file:line, with the call rewritten to match torch as its fix.

Severity, per row of the table: error when relying on the default changes the forward numbers against torch (same
weights, same input), so `exit_code` is 1 until the argument is written out (either value: an explicit argument is a
decision, not an oversight); warning when it changes training only, or depends on the input; info when the numbers
are the same but the spelling is easy to misread.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import io
import os
import tokenize
from pathlib import Path
from typing import Any, Iterator, Mapping

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.files import SOURCE, read_bytes
from aligner.core.findings import Finding, Severity
from aligner.core.result import PassedByExitCode
from aligner.core.rules import ANY, ListOf, MapOf, OneOf, Opt, load_rules
from aligner.core.words import Text, Words, words
from aligner.pipelines.audit.says import Say

DEFAULTS_FILE = "defaults_mindspore_torch.yaml"   # in the top-level mappings/, shipped as aligner.mappings
RULE_PREFIX = "source."                          # a finding's rule is "source.<row id>"
SKIPPED_DIRS = frozenset({"__pycache__", "site-packages", "node_modules"})   # plus every hidden directory
_ABSENT = object()                               # an argument the call does not pass
_NOT_LITERAL = object()                          # an argument whose value the source alone does not tell


@dataclasses.dataclass(frozen=True)
class Side:
    """One framework's half of a row: the APIs, the argument, its default (and what a string default resolves to)."""

    apis: tuple[str, ...]
    argument: str
    default: Any
    also: tuple[str, str, Any] | None = None    # (api, argument, default): the value behind a default like 'normal'

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Side:
        also = data.get("also")
        return cls(tuple(data["apis"]), data["argument"], data["default"],
                   (also["api"], also["argument"], also["default"]) if also else None)


@dataclasses.dataclass(frozen=True)
class DefaultRule:
    """A row of the table: when a MindSpore call fires it, how bad that is, and the argument that fixes it."""

    id: str
    severity: Severity
    mindspore: Side
    torch: Side
    fires: str                                   # "absent", "literal_below", "not_literal_below" or "equals"
    threshold: Any                               # X of the conditions that take one
    skip_when: dict[str, tuple[Any, ...]]        # other argument -> values (_ABSENT: not passed) that void it
    fix: tuple[tuple[str, str], ...]             # (argument name, expression template) for each argument to write
    why: str
    convention: str | None = None                # "complement": the argument means 1 - the torch one
    window: str | None = None                    # "same": judged by what pad_mode='same' pads for the call's
                                                 # kernel, stride and dilation (equal to a torch padding: no finding)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> DefaultRule:
        fires = data["fires"]
        kind, threshold = (fires, None) if isinstance(fires, str) else next(iter(fires.items()))
        if kind not in ("absent", "literal_below", "not_literal_below", "equals"):
            raise ValueError(f"{DEFAULTS_FILE}: rule {data['id']}: unknown condition {kind!r}")
        fixes = [data["fix"]] if isinstance(data["fix"], str) else data["fix"]
        return cls(data["id"], Severity(data["severity"]), Side.parse(data["mindspore"]), Side.parse(data["pytorch"]),
                   kind, threshold, {arg: tuple(_ABSENT if v is None else _hashable(v) for v in values)
                                     for arg, values in (data.get("skip_when") or {}).items()},
                   tuple((name.strip(), template.strip()) for name, _, template in (f.partition("=") for f in fixes)),
                   " ".join(data["why"].split()), data.get("convention"), data.get("window"))


@dataclasses.dataclass(frozen=True)
class DefaultsTable:
    """The whole defaults file: rules, MindSpore signatures (parameter order) and the rows checked to agree."""

    rules: tuple[DefaultRule, ...]
    signatures: dict[str, tuple[str, ...]]
    agree: tuple[tuple[Side, Side], ...]

    @functools.cached_property
    def by_api(self) -> dict[str, tuple[DefaultRule, ...]]:
        """MindSpore API -> the rules that look at its calls."""
        found: dict[str, list[DefaultRule]] = {}
        for rule in self.rules:
            for api in rule.mindspore.apis:
                found.setdefault(api, []).append(rule)
        return {api: tuple(rules) for api, rules in found.items()}


_SIDE = {"apis": ListOf(str), "argument": str, "default": ANY,
         "also": Opt({"api": str, "argument": str, "default": ANY})}
SCHEMA = {
    "rules": ListOf({"id": str, "severity": Severity, "mindspore": _SIDE, "pytorch": _SIDE,
                     "fires": OneOf(str, MapOf(ANY)), "skip_when": Opt(MapOf(ListOf(ANY))),
                     "fix": OneOf(str, ListOf(str)), "why": str,
                     "convention": Opt(str), "window": Opt(str)}),
    "signatures": MapOf(ListOf(str)),
    "agree": Opt(ListOf({"mindspore": _SIDE, "pytorch": _SIDE})),
}


@functools.cache
def load_defaults(name: str = DEFAULTS_FILE) -> DefaultsTable:
    """Parse the defaults table of the installed `aligner.mappings` package once."""
    data = load_rules(name, SCHEMA)
    table = DefaultsTable(tuple(DefaultRule.parse(r) for r in data["rules"]),
                          {api: tuple(params) for api, params in data["signatures"].items()},
                          tuple((Side.parse(r["mindspore"]), Side.parse(r["pytorch"])) for r in data.get("agree", ())))
    unsigned = sorted(api for api in table.by_api if api not in table.signatures)
    if unsigned:
        raise ValueError(f"{name}: no signature for {', '.join(unsigned)}")
    return table


@dataclasses.dataclass(frozen=True)
class SourceAuditReport(PassedByExitCode):
    """What `align audit --source` found: findings (file:line, call, default, fix) and the files it could not parse."""

    path: str
    files: int                                   # Python files read
    findings: list[Finding]
    skipped: list[Text]                          # "file:line: why" of each file that did not parse
    assumed: list[tuple[str, Text]] = dataclasses.field(default_factory=list)   # (file:line, what the scan took
                                                 # the torch reference to be, for a call it therefore did not flag)

    @property
    def exit_code(self) -> ExitCode:
        """1 when any finding is an error (the call's forward numbers differ from torch), else 0."""
        return ExitCode.FOUND if any(f.severity is Severity.ERROR for f in self.findings) else ExitCode.OK

    def counts(self) -> dict[str, int]:
        """Findings per severity, every severity present."""
        return {s.value: sum(1 for f in self.findings if f.severity is s) for s in Severity}

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "files": self.files, "passed": bool(self), "exit_code": int(self.exit_code),
                "counts": self.counts(), "findings": [f.to_dict() for f in self.findings],
                "skipped": list(self.skipped), "assumed": [list(a) for a in self.assumed]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceAuditReport:
        return cls(data["path"], data["files"], [Finding.from_dict(f) for f in data["findings"]],
                   list(data["skipped"]), [(str(w), str(t)) for w, t in data.get("assumed", ())])


def audit_source(path: str | os.PathLike[str]) -> SourceAuditReport:
    """Scan a Python file, or every *.py under a directory (hidden directories, __pycache__ and site-packages left
    out), for MindSpore calls that rely on a default differing from torch. A file that does not parse (or cannot be
    read, or is no regular file, or is above the `SOURCE` size cap) is listed in `skipped` with its line; the others
    are scanned. A file that never mentions `mindspore` is not parsed: no name in it can resolve to a MindSpore API.
    A file named directly that cannot be read is an AlignerError instead."""
    root = Path(path)
    if not root.exists():
        raise AlignerError(f"audit --source: {path}: no such file or directory")
    if not root.is_dir() and root.suffix != ".py":
        raise AlignerError(f"audit --source: {path}: not a Python file (give a .py file or a directory)")
    _ = SOURCE.limit  # a malformed ALIGNER_MAX_SOURCE_BYTES is one error, not a skipped line per file
    table = load_defaults()
    findings: list[Finding] = []
    skipped: list[Text] = []
    assumed: list[tuple[str, Text]] = []
    files = 0
    for file in _python_files(root):
        files += 1
        try:
            data = read_bytes(file, SOURCE)
        except OSError as exc:                   # unreadable, or a dangling link named *.py
            if file == root:
                raise AlignerError(f"audit --source: {path}: cannot be read ({exc.strerror or exc})") from None
            skipped.append(words(Say.SKIP_UNREADABLE, file=str(file), error=str(exc.strerror or exc)))
            continue
        except AlignerError as exc:              # a FIFO, device or directory named *.py; a file above the cap
            if file == root:
                raise AlignerError(f"audit --source: {exc}") from None
            skipped.append(f"{file}:0: {str(exc).removeprefix(f'{file}: ')}")
            continue
        if b"mindspore" not in data:
            continue
        try:
            tree = ast.parse(data, filename=str(file))
            text = data.decode(tokenize.detect_encoding(io.BytesIO(data).readline)[0], errors="replace")
            findings += scan_tree(tree, text.encode("utf-8").splitlines(), str(file), table, assumed)
        except (RecursionError, MemoryError):   # the parser's or the scan's stack: nesting no real code has
            skipped.append(words(Say.SKIP_NESTED, file=str(file)))
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes
            line = getattr(exc, "lineno", None)
            skipped.append(f"{file}:{line or 0}: {getattr(exc, 'msg', None) or exc}")
    return SourceAuditReport(str(path), files, findings, skipped, assumed)


def scan_tree(tree: ast.Module, lines: list[bytes], filename: str, table: DefaultsTable,
              assumed: list[tuple[str, Text]] | None = None) -> list[Finding]:
    """The findings of one parsed file (its lines as UTF-8 bytes, for the calls as written), in line order; what the
    scan assumed of the torch reference for a call it did not flag is appended to `assumed`."""
    nodes = list(ast.walk(tree))
    names = _ImportedNames.of(nodes)
    if not names.aliases and not names.star_modules:
        return []
    calls = sorted((node for node in nodes if isinstance(node, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    findings = []
    for call in calls:
        api = names.resolve(call.func, table)
        if api is not None:
            findings += _check_call(call, api, lines, filename, table, assumed if assumed is not None else [])
    return findings


def _python_files(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        yield root
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


@dataclasses.dataclass
class _ImportedNames:
    """A file's names bound to MindSpore modules or objects, from every import statement in it."""

    aliases: dict[str, str]                      # local name -> dotted MindSpore name
    star_modules: list[str]                      # `from mindspore.nn import *`

    @classmethod
    def of(cls, nodes: list[ast.AST]) -> _ImportedNames:
        aliases: dict[str, str] = {}
        stars: list[str] = []
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_mindspore(alias.name):   # `import mindspore.nn` binds `mindspore`
                        aliases[alias.asname or "mindspore"] = alias.name if alias.asname else "mindspore"
            elif isinstance(node, ast.ImportFrom) and not node.level and _is_mindspore(node.module or ""):
                for alias in node.names:
                    if alias.name == "*":
                        stars.append(str(node.module))
                    else:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return cls(aliases, stars)

    def resolve(self, func: ast.expr, table: DefaultsTable) -> str | None:
        """The table's name for what `func` calls, or None (not a MindSpore API the table knows)."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        rest = parts[::-1]
        if func.id in self.aliases:
            api = _canonical(".".join([self.aliases[func.id], *rest]))
            return api if api in table.by_api else None
        for module in self.star_modules:
            api = _canonical(".".join([module, func.id, *rest]))
            if api in table.by_api:
                return api
        return None


def _is_mindspore(module: str) -> bool:
    return module == "mindspore" or module.startswith("mindspore.")


def _canonical(name: str) -> str:
    """`mindspore.ops.operations.ResizeBilinearV2` -> `mindspore.ops.ResizeBilinearV2`, `mindspore.nn.layer.conv.
    Conv2d` -> `mindspore.nn.Conv2d`: the public name under which the table lists an API (mint is kept apart)."""
    for package in ("mindspore.nn.", "mindspore.ops."):
        if name.startswith(package):
            return package + name.rpartition(".")[2]
    return name


def _check_call(call: ast.Call, api: str, lines: list[bytes], filename: str, table: DefaultsTable,
                assumed: list[tuple[str, Text]]) -> list[Finding]:
    """Every rule this call fires, each as a finding whose fix is the call with all of them applied; a 'same' window
    equal to a torch padding is no finding but an assumption about the reference (appended to `assumed`)."""
    params = table.signatures[api]
    given, opaque = _bound_arguments(call, params)
    fired = [(rule, value) for rule in table.by_api[api]
             for value in [given.get(rule.mindspore.argument, _ABSENT)] if _fires(rule, value, given, opaque)]
    for rule, value in list(fired):
        equal = _same_equals_torch(given, opaque, value is _ABSENT) if rule.window == "same" else None
        if equal is not None:
            fired.remove((rule, value))
            assumed.append((f"{filename}:{call.lineno}", equal))
    if not fired:
        return []
    written = _source(call, lines)
    edits = {name: _fill(template, given, lines) for rule, _ in fired for name, template in rule.fix}
    drops = {rule.mindspore.argument for rule, _ in fired
             if rule.mindspore.argument not in {name for name, _ in rule.fix}}
    fix = _rewrite(call, lines, params, edits, drops)
    findings = []
    for rule, value in fired:
        torch_api = rule.torch.apis[rule.mindspore.apis.index(api)]
        findings.append(Finding(f"{RULE_PREFIX}{rule.id}", rule.severity,
                                words(Say.SOURCE_FINDING, call=written,
                                      difference=_difference(rule, torch_api, value, lines), why=rule.why),
                                where=(f"{filename}:{call.lineno}",), fix=fix))
    return findings


def _difference(rule: DefaultRule, torch_api: str, value: ast.expr | object, lines: list[bytes]) -> Words:
    """What differs, in one clause: the default relied on, or the value passed and what it means in torch."""
    ms, pt = rule.mindspore, rule.torch
    torch_side = {"torch_api": torch_api, "torch_argument": pt.argument, "torch_default": pt.default}
    if not isinstance(value, ast.expr):
        also = (ms.also[0].rpartition(".")[2], ms.also[1], ms.also[2]) if ms.also else None
        return words(Say.SOURCE_DEFAULT, argument=ms.argument, default=ms.default, also=also, **torch_side)
    written = _source(value, lines)
    if rule.convention == "complement":
        return words(Say.SOURCE_COMPLEMENT, argument=ms.argument, written=written, one_minus=_one_minus(value, lines),
                     **torch_side)
    return words(Say.SOURCE_PASSED, argument=ms.argument, written=written, **torch_side)


def _ints(node: ast.expr | None, default: int) -> tuple[int, ...] | None:
    """An int or tuple-of-ints argument as a tuple (`default` when not passed), None when the source does not tell."""
    if node is None:
        return (default,)
    value = _literal(node)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def _same_equals_torch(given: dict[str, ast.expr], opaque: bool, by_default: bool) -> Words | None:
    """The torch padding that pad_mode='same' equals for this call's literal kernel, stride and dilation, as the
    assumption the scan makes about the reference; None where it depends on the input size (a stride above 1 with a
    larger kernel: TF-style padding puts the odd pixel after) or the source does not tell.

    At stride 1 'same' pads d*(k-1) in all, the smaller half before, exactly as torch's padding='same' (and, for an
    odd kernel, torch's padding=d*(k-1)/2); with every kernel <= its stride it pads nothing where the input size
    divides by the stride, as torch's padding=0 (tests/pipelines/audit/test_source.py runs both frameworks' convs to
    show it)."""
    if opaque:
        return None
    kernel, stride, dilation = (_ints(given.get("kernel_size"), 1), _ints(given.get("stride"), 1),
                                _ints(given.get("dilation"), 1))
    if kernel is None or stride is None or dilation is None or "kernel_size" not in given:
        return None
    rank = max(len(kernel), len(stride), len(dilation))
    kernel, stride, dilation = (t * rank if len(t) == 1 else t for t in (kernel, stride, dilation))
    if len({len(kernel), len(stride), len(dilation)}) != 1:
        return None
    if all(s == 1 for s in stride):
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        pads = tuple(t // 2 for t in totals)
        odd = all(t % 2 == 0 for t in totals)   # an odd kernel: a plain padding equals 'same' too
        return words(Say.SAME_STRIDE_ONE, by_default=by_default,
                     padding=(pads[0] if len(set(pads)) == 1 else pads) if odd else None)
    if all(k <= s for k, s in zip(kernel, stride)):
        return words(Say.SAME_KERNEL_LE_STRIDE, by_default=by_default)
    return None


def _bound_arguments(call: ast.Call, params: tuple[str, ...]) -> tuple[dict[str, ast.expr], bool]:
    """The arguments the call passes, by parameter name, and whether `*args`/`**kwargs` may pass others."""
    positional = _positional(params)
    given: dict[str, ast.expr] = {}
    opaque = False
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            opaque = True
            break
        if i < len(positional):
            given[positional[i]] = arg
    for keyword in call.keywords:
        if keyword.arg is None:
            opaque = True
        else:
            given[keyword.arg] = keyword.value
    return given, opaque


def _positional(params: tuple[str, ...]) -> tuple[str, ...]:
    """The parameters an argument can reach by position (those before a '*')."""
    return params[:params.index("*")] if "*" in params else params


def _fires(rule: DefaultRule, value: Any, given: dict[str, ast.expr], opaque: bool) -> bool:
    for other, voiding in rule.skip_when.items():
        node = given.get(other)
        if (node is None and not opaque and _ABSENT in voiding) or (node is not None and _literal(node) in voiding):
            return False
    if rule.fires == "absent":
        return value is _ABSENT and not opaque
    if value is _ABSENT:
        return False
    if rule.fires == "equals":
        return bool(_literal(value) == rule.threshold)
    number = _number(value)
    below = number is not None and number < rule.threshold
    return below if rule.fires == "literal_below" else not below


def _literal(node: ast.expr) -> Any:
    """The node's value as a hashable literal (lists become tuples), or _NOT_LITERAL."""
    try:
        return _hashable(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def _number(node: ast.expr) -> float | None:
    value = _literal(node)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fill(template: str, given: dict[str, ast.expr], lines: list[bytes]) -> str:
    """A fix template with `{ARG}` (the argument as written), `{1-ARG}` (one minus it) and `{ARG//2}` (half of it,
    rounded down, per element) filled in."""
    start = template.find("{")
    if start < 0:
        return template
    end = template.index("}", start)
    key = template[start + 1:end]
    if key.startswith("1-"):
        value = _one_minus(given[key[2:]], lines)
    elif key.endswith("//2"):
        value = _half(given[key[:-3]], lines)
    else:
        value = _source(given[key], lines)
    return template[:start] + value + _fill(template[end + 1:], given, lines)


def _half(node: ast.expr, lines: list[bytes]) -> str:
    """`node // 2` as source: computed for an int or a tuple of ints ((3, 5) -> '(1, 2)'), written out otherwise."""
    value = _literal(node)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value // 2)
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return repr(tuple(v // 2 for v in value))
    written = _source(node, lines)
    return f"{written} // 2" if isinstance(node, (ast.Name, ast.Attribute)) else f"({written}) // 2"


def _one_minus(node: ast.expr, lines: list[bytes]) -> str:
    """`1 - node` as source: computed for a number (0.9 -> '0.1'), written out otherwise."""
    number = _number(node)
    if number is not None:
        return repr(float(f"{1 - number:.12g}"))
    written = _source(node, lines)
    return f"1 - {written}" if isinstance(node, (ast.Name, ast.Attribute)) else f"1 - ({written})"


def _rewrite(call: ast.Call, lines: list[bytes], params: tuple[str, ...], edits: dict[str, str],
             drops: set[str]) -> str:
    """The call with the `drops` arguments removed and `edits` (name -> expression) passed by keyword; positional
    arguments after a removed one are passed by keyword too, so that none shifts onto another parameter."""
    positional = _positional(params)
    parts: list[str] = []
    done: set[str] = set()
    by_keyword = False
    for i, arg in enumerate(call.args):
        name = positional[i] if i < len(positional) and not isinstance(arg, ast.Starred) else None
        if name in drops:
            by_keyword = True
            continue
        if name in edits:
            parts.append(f"{name}={edits[name]}" if by_keyword else edits[name])
            done.add(name)
        else:
            parts.append(f"{name}={_source(arg, lines)}" if by_keyword and name else _source(arg, lines))
    for keyword in call.keywords:
        if keyword.arg in drops:
            continue
        if keyword.arg is not None and keyword.arg in edits:
            parts.append(f"{keyword.arg}={edits[keyword.arg]}")
            done.add(keyword.arg)
        else:
            parts.append(_source(keyword, lines))
    parts += [f"{name}={expr}" for name, expr in edits.items() if name not in done]
    return f"{_source(call.func, lines)}({', '.join(parts)})"


def _source(node: ast.expr | ast.keyword, lines: list[bytes]) -> str:
    """The node as written when it fits on one line, else as `ast.unparse` writes it (not `ast.get_source_segment`,
    which splits the whole file again for every node: it more than doubled the time of a large scan)."""
    if node.end_lineno != node.lineno or node.end_col_offset is None:
        return ast.unparse(node)
    return lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode("utf-8", errors="replace")

