"""The text of a repro directory's `repro.py` and README.md: Python source written from recorded JSON values.

Every piece of source comes from `literal` (recorded values through `repr` of checked types), identifiers checked
with `str.isidentifier`, and class spellings taken from the framework class they resolved to; `decode` builds the
same values as data (never `eval`). Module paths and class names reach the script only as `repr` literals in its
`LAYERS` table: nothing from a manifest reaches the script as code, its docstring or its comments.
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import keyword
import textwrap
from typing import Any

import numpy as np

from aligner.core.dtypes import NUMPY
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.tolerance import Tolerance

ROOT = {Framework.PYTORCH: "torch", Framework.MINDSPORE: "mindspore"}  # the import name of each framework
FOLDER = ROOT  # each side's params/ and outputs/ live under its framework's name


class Layout(str, enum.Enum):
    """The layout a side's layer is called in: as recorded, or with the channel axis (1) of every input of 3+
    dimensions moved last and the last axis of every such output moved back to 1 (the transpose that timm's
    LayerNorm2d and mindcv's ConvNextLayerNorm apply around their base nn.LayerNorm)."""

    AS_RECORDED = "as recorded"
    CHANNELS_LAST = "channels moved last"

    def __str__(self) -> str:
        return self.value


def moved(array: np.ndarray, layout: Layout, back: bool = False) -> np.ndarray:
    """An input (or with `back`, an output) array in `layout`: what repro.py does around a stand-in's call."""
    if layout is Layout.AS_RECORDED or array.ndim < 3:
        return array
    return np.ascontiguousarray(np.moveaxis(array, -1, 1) if back else np.moveaxis(array, 1, -1))


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A standard layer built for a recorded class that is none (timm's LayerNorm2d: torch.nn.LayerNorm), and what
    was measured: on the side's own recorded inputs, in `layout`, it reproduced the side's own recorded outputs
    within `tolerance` (the greatest absolute error `max_abs_err`). `left_out`: recorded attributes it has no place
    for (what its class's own forward did with them is reproduced only as far as the measurement shows)."""

    spelling: str
    layout: Layout
    max_abs_err: float
    tolerance: Tolerance
    left_out: tuple[str, ...]

    def describe(self) -> str:
        """One sentence: what stands in, in which layout, what it left out and what it reproduced."""
        layout = ("with the channel transpose its class's forward applies (inputs' channel axis moved last before "
                  "the call, the outputs' back)" if self.layout is Layout.CHANNELS_LAST else "called as recorded")
        left = f"; recorded attributes it has no place for: {', '.join(self.left_out)}" if self.left_out else ""
        return (f"built as {self.spelling} {layout}{left}; on its own recorded inputs it reproduces its recorded "
                f"output (max abs error {self.max_abs_err:.3g}, {self.tolerance})")


def _layout_lines(layout: Layout) -> tuple[list[str], str]:
    """(repro.py's lines putting `inputs` into the layout, the wrapper putting the outputs back)."""
    if layout is Layout.AS_RECORDED:
        return [], "{}"
    return (["    # the recorded class moves the channel axis last around its base layer: so does this repro",
             "    inputs = [np.ascontiguousarray(np.moveaxis(a, 1, -1)) if a.ndim >= 3 else a for a in inputs]"],
            "[np.moveaxis(t, -1, 1) if t.ndim >= 3 else t for t in {}]")


class OpaqueError(AlignerError):
    """A recorded value the dump kept only as a repr: it cannot be written back as code."""


def identifier(name: str) -> bool:
    """Whether `name` can be written as a Python keyword argument or attribute name."""
    return name.isidentifier() and not keyword.iskeyword(name)


def literal(value: Any, framework: Framework, tensors: str = "x") -> str:
    """Python source for one recorded JSON value (`aligner.dumping.signature` tags), tensors as `x[i]`."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, framework, tensors) for v in value) + "]"
    if not isinstance(value, dict):
        raise OpaqueError(f"a recorded {type(value).__name__} cannot be written as code")
    if "tensor" in value:
        if isinstance(value["tensor"], bool) or not isinstance(value["tensor"], int):
            raise OpaqueError(f"a malformed tensor placeholder {value!r:.80}")
        return f"{tensors}[{value['tensor']}]"
    if "tuple" in value and isinstance(value["tuple"], list):
        items = [literal(v, framework, tensors) for v in value["tuple"]]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if "dict" in value and isinstance(value["dict"], dict):
        return "{" + ", ".join(f"{k!r}: {literal(v, framework, tensors)}" for k, v in value["dict"].items()) + "}"
    if "float" in value and value["float"] in ("inf", "-inf", "nan"):
        return f"float({value['float']!r})"
    if "dtype" in value and value["dtype"] in NUMPY:  # a canonical dtype name, never another attribute
        return f"{ROOT[framework]}.{value['dtype']}"
    raise OpaqueError(f"a {value.get('type', '?')} ({str(value.get('repr', '?'))[:60]})")


def decode(value: Any, framework: Framework) -> Any:
    """The value `literal` writes as source, built from the recorded JSON value as data (no `eval`): what the layer
    is built with before repro.py is written. A tensor placeholder is no layer attribute: OpaqueError."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v, framework) for v in value]
    if not isinstance(value, dict):
        raise OpaqueError(f"a recorded {type(value).__name__} cannot be decoded")
    if "tensor" in value:
        raise OpaqueError(f"a tensor placeholder {value!r:.80}, which is no attribute value")
    if "tuple" in value and isinstance(value["tuple"], list):
        return tuple(decode(v, framework) for v in value["tuple"])
    if "dict" in value and isinstance(value["dict"], dict):
        return {k: decode(v, framework) for k, v in value["dict"].items()}
    if "float" in value and value["float"] in ("inf", "-inf", "nan"):
        return float(value["float"])
    if "dtype" in value and value["dtype"] in NUMPY:
        found = getattr(importlib.import_module(ROOT[framework]), value["dtype"], None)
        if found is not None:
            return found
    raise OpaqueError(f"a {value.get('type', '?')} ({str(value.get('repr', '?'))[:60]})")


def call_source(structure: dict[str, Any], framework: Framework) -> str:
    """`layer(x[0], attn_mask=x[1])` from a recorded call structure."""
    args = structure.get("args", [])
    kwargs = structure.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise OpaqueError("a malformed call signature (args must be a list, kwargs an object)")
    parts = [literal(v, framework) for v in args]
    plain = {k: v for k, v in kwargs.items() if identifier(k)}
    parts += [f"{k}={literal(v, framework)}" for k, v in plain.items()]
    odd = {k: v for k, v in kwargs.items() if k not in plain}
    if odd:
        parts.append("**{" + ", ".join(f"{k!r}: {literal(v, framework)}" for k, v in odd.items()) + "}")
    return f"layer({', '.join(parts)})"


@dataclasses.dataclass
class SideCode:
    """What repro.py does for one side: build the layer, load its parameters, call it."""

    framework: Framework
    path: str                        # the module's path in that side's model
    klass: str                       # the recorded class
    build: list[str]                 # lines creating `layer` (a constructor call, or a factory and a submodule)
    preamble: list[str]              # module-level lines (importing a factory)
    training: bool
    has_params: bool
    call: str                        # `layer(x[0], ...)`
    casts: dict[int, str]            # input index -> dtype to cast to after loading (bfloat16 kept as float32)
    stand_in: StandIn | None = None  # the standard layer built for a recorded class that is none
    factory: str | None = None       # the factory repro.py imports (FILE.py:CALLABLE or MODULE:CALLABLE)
    needs: tuple[str, ...] = ()      # the packages the factory's layer is made of, beyond numpy, torch, mindspore

    @property
    def layout(self) -> Layout:
        return self.stand_in.layout if self.stand_in is not None else Layout.AS_RECORDED


_HELPERS = '''
def arrays(folder):
    """{name: array} of the .npy files in a folder of this directory (none when it is absent)."""
    found = sorted((HERE / folder).glob("*.npy"))
    return {p.name[:-4]: np.load(p, allow_pickle=False) for p in found}


def tensors(out):
    """The tensors of a layer's output (nested tuples, lists and dicts flattened), as float64 numpy arrays."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in tensors(o)]
    if isinstance(out, torch.Tensor):
        return [out.detach().cpu().double().numpy()]
    if isinstance(out, mindspore.Tensor):
        return [out.astype(mindspore.float64).asnumpy()]
    return []


def report(name, actual, expected):
    """Print how `actual` differs from `expected` the way torch.testing.assert_close does; True when it agrees."""
    if actual.shape != expected.shape:
        print(f"{name}: shape {list(actual.shape)} but the reference has {list(expected.shape)}")
        return False
    diff = np.abs(actual - expected)
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    bad = ~(same | (diff <= ATOL + RTOL * np.abs(expected)))
    if not bad.any():
        print(f"{name}: agrees ({actual.size} elements, max abs error {np.nanmax(diff, initial=0.0):.3g}, "
              f"rtol={RTOL:g}, atol={ATOL:g})")
        return True
    diff = np.where(same, 0.0, diff)
    rel = diff / np.where(expected == 0, np.inf, np.abs(expected))
    worst, worst_rel = np.unravel_index(np.nanargmax(diff), diff.shape), np.unravel_index(np.nanargmax(rel), rel.shape)
    print(f"{name}: tensor-likes are not close!")
    print(f"  Mismatched elements: {int(bad.sum())} / {bad.size} ({bad.mean():.1%})")
    print(f"  Greatest absolute difference: {diff[worst]:.6g} at index {tuple(map(int, worst))} "
          f"(up to {ATOL:g} allowed)")
    print(f"  Greatest relative difference: {rel[worst_rel]:.6g} at index {tuple(map(int, worst_rel))} "
          f"(up to {RTOL:g} allowed)")
    return False
'''


def wrap(line: str, width: int = 116) -> list[str]:
    """A long `name = f(a=1, b=2, ...)` line as one argument per line (nothing else is wrapped)."""
    head, sep, rest = line.partition("(")
    if len(line) <= width or not sep or not rest.endswith(")") or "=" not in head:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()))
    wrapped = [f"{head}("] + [f"{indent}    {a}," for a in _split(rest[:-1])] + [f"{indent})"]
    try:  # the same code, or the line as it was
        same = ast.dump(ast.parse(textwrap.dedent("\n".join(wrapped)))) == ast.dump(ast.parse(line.strip()))
    except SyntaxError:
        same = False
    return wrapped if same else [line]


def _split(text: str) -> list[str]:
    """Top-level comma-separated parts of an argument list (brackets and quotes respected)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [p for p in parts + [text[start:].strip()] if p]


def _torch_side(code: SideCode) -> list[str]:
    lines = ["def run_torch(inputs):", '    """The PyTorch layer, its recorded parameters, called as recorded."""']
    lines += [part for line in code.build for part in wrap("    " + line)]
    into, back = _layout_lines(code.layout)
    lines += into
    if code.has_params:
        lines += ['    state = {k: torch.from_numpy(v) for k, v in arrays("torch/params").items()}',
                  "    layer.load_state_dict(state, strict=True)"]
    lines += [f"    layer.train({code.training})", "    x = [torch.from_numpy(a) for a in inputs]"]
    lines += [f"    x[{i}] = x[{i}].to(torch.{dtype})" for i, dtype in sorted(code.casts.items())]
    lines += ["    with torch.no_grad():", f"        return {back.format(f'tensors({code.call})')}"]
    return lines


def _mindspore_side(code: SideCode) -> list[str]:
    lines = ["def run_mindspore(inputs):", '    """The MindSpore cell, its recorded parameters, called as recorded."""']
    lines += [part for line in code.build for part in wrap("    " + line)]
    into, back = _layout_lines(code.layout)
    lines += into
    if code.has_params:
        lines += ["    names = {rel: p.name for rel, p in layer.parameters_and_names()}",
                  "    params = {names[k]: mindspore.Parameter(mindspore.Tensor(v), name=names[k])",
                  '              for k, v in arrays("mindspore/params").items()}',
                  "    not_loaded, unused = mindspore.load_param_into_net(layer, params, strict_load=True)",
                  "    if not_loaded or unused:",
                  '        raise RuntimeError(f"parameters not loaded: {not_loaded}, recorded but unused: {unused}")']
    lines += [f"    layer.set_train({code.training})", "    x = [mindspore.Tensor(a) for a in inputs]"]
    lines += [f"    x[{i}] = x[{i}].astype(mindspore.{dtype})" for i, dtype in sorted(code.casts.items())]
    lines += [f"    return {back.format(f'tensors({code.call})')}"]
    return lines


def needs(sides: dict[Framework, SideCode]) -> str:
    """What running repro.py needs, in words: numpy, torch and mindspore only, or those and each factory with the
    packages its layer is made of."""
    factories = [code for code in sides.values() if code.factory is not None]
    if not factories:
        return "numpy, torch and mindspore only"
    parts = [f"{code.framework}'s factory {code.factory!r}"
             + (f" with {', '.join(code.needs)}" if code.needs else "") for code in factories]
    return f"numpy, torch, mindspore and {' and '.join(parts)} (repro.py builds that whole model)"


def repro_py(sides: dict[Framework, SideCode], reference: Framework, n_inputs: int, tolerance: Tolerance) -> str:
    """The whole repro.py: numpy, torch and mindspore (never aligner), and a factory where a side needs one."""
    other = reference.other
    ref, oth = sides[reference], sides[other]
    factories = [code for code in (sides[Framework.PYTORCH], sides[Framework.MINDSPORE]) if code.factory is not None]
    imports = ("Needs only numpy, torch and mindspore:  python repro.py" if not factories else
               "Needs numpy, torch, mindspore and the factories NEEDS names:  python repro.py")
    head = [
        '"""Minimal repro of one module recorded in two dumps (its path and class on each side: LAYERS below), written',
        "by `align repro`.",
        "",
        f"Builds the layer in both frameworks, loads each side's recorded parameters, runs both on the {reference} "
        "side's",
        "recorded inputs and compares the outputs as torch.testing does. Exit 0: they agree; 1: they differ beyond the",
        f"tolerance; 2: the repro itself failed. {imports}",
        '"""',
        "import sys",
        "import traceback",
        "from pathlib import Path",
        "",
        "import mindspore",
        "import numpy as np",
        "import torch",
        "",
        "HERE = Path(__file__).resolve().parent",
        f"RTOL, ATOL = {tolerance.rtol!r}, {tolerance.atol!r}",
        "# each side's module: (its path in the model, its class), as the dumps recorded them",
        f"LAYERS = {{{reference.value!r}: ({ref.path!r}, {ref.klass!r}), {other.value!r}: ({oth.path!r}, "
        f"{oth.klass!r})}}",
        "mindspore.set_context(mode=mindspore.PYNATIVE_MODE)",
    ]
    if factories:
        head += ["# each factory (imported below; it builds the whole model) and the packages its layer is made of",
                 "NEEDS = {" + ", ".join(f"{c.framework.value!r}: ({c.factory!r}, {list(c.needs)!r})"
                                         for c in factories) + "}"]
    for code in (sides[Framework.PYTORCH], sides[Framework.MINDSPORE]):
        head += [line for line in code.preamble if line not in head or not line.startswith(("sys.path", "import "))]
    body = [*_HELPERS.strip("\n").splitlines(), "", ""]
    body += _torch_side(sides[Framework.PYTORCH]) + ["", ""] + _mindspore_side(sides[Framework.MINDSPORE])
    run = {Framework.PYTORCH: "run_torch", Framework.MINDSPORE: "run_mindspore"}
    main = [
        "", "",
        "def main():",
        "    for side, (path, klass) in LAYERS.items():",
        '        print(f"{side}: {path!r} ({klass!r})")',
        f"    inputs = [np.load(HERE / 'inputs' / f'{{i}}.npy', allow_pickle=False) for i in range({n_inputs})]",
        f"    expected, actual = {run[reference]}(inputs), {run[other]}(inputs)",
        "    if len(actual) != len(expected):",
        f'        print(f"{other} returned {{len(actual)}} tensor(s), {reference} {{len(expected)}}")',
        "        return 1",
        "    agree = True",
        "    for i, (a, e) in enumerate(zip(actual, expected)):",
        f'        agree &= report(f"output {{i}} ({other} vs {reference})", a, e)',
        f'        for side, out in (("{FOLDER[reference]}", e), ("{FOLDER[other]}", a)):',
        '            recorded = HERE / side / "outputs" / f"{i}.npy"',
        "            if recorded.is_file():",
        "                was = np.load(recorded, allow_pickle=False).astype(np.float64)",
        "                if was.shape == out.shape:",
        "                    err = float(np.nanmax(np.abs(was - out), initial=0.0))",
        '                    print(f"  {side} now vs its recorded output: max abs error {err:.3g}")',
        "    return 0 if agree else 1",
        "",
        "",
        'if __name__ == "__main__":',
        "    try:",
        "        sys.exit(main())",
        "    except Exception:  # the repro could not run: 2, never the 1 that means the layers differ",
        "        traceback.print_exc()",
        "        sys.exit(2)",
    ]
    return "\n".join(head + ["", ""] + body + main) + "\n"


def readme(sides: dict[Framework, SideCode], reference: Framework, tolerance: Tolerance,
           sources: dict[Framework, str],
           size: int) -> str:
    """A few lines on what the directory holds and how to run it."""
    other = reference.other
    ref, oth = sides[reference], sides[other]
    built = {fw: _built(code) for fw, code in sides.items()}
    return "\n".join([
        f"# Minimal repro: {ref.path!r} ({reference}) vs {oth.path!r} ({other})",
        "",
        "    python repro.py    # exit 0: the two layers agree; 1: they differ; 2: the repro failed to run",
        "",
        f"- reference: {reference} ({sources[reference]!r}); other side: {other} ({sources[other]!r})",
        f"- {reference} layer {ref.klass!r}: {built[reference]}",
        f"- {other} layer {oth.klass!r}: {built[other]}",
        f"- inputs/: the {reference} layer's recorded inputs, fed to both layers",
        "- torch/params/, mindspore/params/: each layer's own recorded parameters and buffers (module-relative names)",
        "- torch/outputs/, mindspore/outputs/: each layer's recorded outputs (the other side's ran on its own inputs)",
        f"- tolerance: rtol={tolerance.rtol:g}, atol={tolerance.atol:g} (|a - ref| <= atol + rtol * |ref|)",
        f"- size: {size} bytes of tensors; needs {needs(sides)}",
        "",
    ])


def _built(code: SideCode) -> str:
    """How repro.py makes a side's layer, for the README: its own class, a measured stand-in, or its factory."""
    if code.factory is not None:
        where = ("from its absolute path on the machine that wrote this" if code.factory.rpartition(":")[0]
                 .endswith(".py") else "as a module")
        return (f"built by the factory {code.factory!r}, which builds the whole model (repro.py takes the layer at "
                f"its path); repro.py imports it {where}, with the directory `align repro` ran in on sys.path: send "
                "it along, with what it imports (the layer is made of classes of "
                f"{', '.join(code.needs) or 'numpy, torch and mindspore only'})")
    if code.stand_in is not None:
        return (f"not a {ROOT[code.framework]}.nn class; {code.stand_in.describe()}")
    return "built from its recorded attributes"
