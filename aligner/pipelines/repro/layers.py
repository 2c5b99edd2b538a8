"""Build one side's layer for a repro, the way repro.py will: from its recorded class and attributes, or from a factory.

Known layers (any torch.nn / mindspore.nn class whose constructor the recorded attributes fill) are built from a
constructor call written out in full. A class of another package (timm's `LayerNorm2d`, mindcv's `ConvNextLayerNorm`,
timm's `GELU`) is stood in for by a standard layer (its framework base where a factory's live module shows its class
hierarchy, else a standard layer whose name its class name contains), built the same way and kept only when it
reproduces the side's own recorded output on the side's own recorded inputs, as recorded or with the channel axis
moved last (the transpose such a class's forward applies). Anything else needs the user's factory, which builds the
whole model and hands over the submodule. Either way the layer is built here first, its recorded parameters loaded
strictly, so a repro that could not run is refused before it is written. The layer is built from values `decode` made
out of the recorded JSON (never by evaluating source), and its class is reached by attribute lookups from the
framework's root (no module the dump names is imported). torch and MindSpore are imported inside the functions.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.tolerance import Tolerance
from aligner.dumping.signature import attributes, restore
from aligner.io.factory import build as build_factory
from aligner.metrics.measure import compare_arrays
from aligner.pipelines.replay.runner import runner
from aligner.pipelines.repro.script import (
    ROOT,
    Layout,
    OpaqueError,
    SideCode,
    StandIn,
    call_source,
    decode,
    identifier,
    literal,
    moved,
)

# constructor parameter -> the attribute the layer keeps it under, where the names differ
_ALIASES = {"data_format": "format"}
_NOT_CONFIG = ("class", "training")


class Build(str, enum.Enum):
    """How repro.py makes a side's layer."""

    ATTRIBUTES = "attributes"  # a torch.nn / mindspore.nn constructor filled from the recorded attributes
    FACTORY = "factory"        # the user's factory builds the model; the layer is its submodule at the path

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Recorded:
    """What one side's dump says about the module: where, what class, how it was called, its parameters."""

    framework: Framework
    path: str
    option: str                           # the CLI option that gives this side a factory (--factory-a / -b)
    dump: str                             # the dump directory, as the user named it
    attrs: dict[str, Any]                 # the module's recorded class and attributes
    children: dict[str, dict[str, Any]]   # recorded attributes of its submodules, by module-relative path
    structure: dict[str, Any]             # the recorded call's arguments
    state: dict[str, np.ndarray] | None   # recorded parameters and buffers, by module-relative name (None: the dump
                                          # holds no parameter values for the call's step)
    inputs: list[tuple[np.ndarray, str]] | None  # the side's own recorded inputs and their dtypes (None: not held)
    outputs: list[np.ndarray]             # the side's own recorded outputs of the call
    factory: str | None = None


@dataclasses.dataclass
class Planned:
    """One side, ready to write: the code for repro.py, the parameters it loads, and how the layer is built."""

    code: SideCode
    state: dict[str, np.ndarray]
    how: Build


@dataclasses.dataclass(frozen=True)
class _Arg:
    """One constructor argument filled from a recorded attribute: the value built here and its source in repro.py."""

    name: str          # the constructor's parameter (from its signature, never from the dump)
    value: Any         # `decode` of the recorded value
    text: str          # `literal` of the same recorded value
    optional: bool     # the parameter has a default


def _base(framework: Framework) -> type:
    if framework is Framework.PYTORCH:
        import torch

        return torch.nn.Module
    import mindspore

    return mindspore.nn.Cell


def _resolve(dotted: str, root: str) -> Any:
    """The object at a dotted path under the framework `root`, reached by attributes and already-imported modules
    only: a path from the dump never imports (runs) a module, nor reaches a dunder. None if there is none."""
    parts = dotted.split(".")
    if parts[0] != root or not all(identifier(p) and not p.startswith("__") for p in parts):
        return None
    obj: Any = importlib.import_module(root)
    for i, part in enumerate(parts[1:], 2):
        found = getattr(obj, part, None)
        obj = found if found is not None else sys.modules.get(".".join(parts[:i]))
        if obj is None:
            return None
    return obj


def _spelling(cls: type, root: str) -> str | None:
    """The class's shortest public spelling under the framework root (what repro.py writes), None if it has none."""
    for spelling in (f"{root}.nn.{cls.__name__}", f"{cls.__module__}.{cls.__qualname__}"):
        if _resolve(spelling, root) is cls:
            return spelling
    return None


def _candidates(recorded: Recorded, live: type | None) -> list[tuple[type, str, bool]]:
    """(class, spelling, whether it is the module's own class) of the framework layers that may build the module,
    best first: its own class when that is one (the factory's live class, else the recorded one); else its framework
    bases (only a live class shows them), then the public framework layers whose name its class name contains,
    longest name first. Spellings are the classes' own names, never the recorded text."""
    root = ROOT[recorded.framework]
    base = _base(recorded.framework)
    own = live if live is not None else _resolve(str(recorded.attrs.get("class", "")), root)
    if isinstance(own, type) and issubclass(own, base):
        spelled = _spelling(own, root)
        if spelled is not None:
            return [(own, spelled, True)]
    namespace = importlib.import_module(f"{root}.nn")
    name = live.__name__ if live is not None else str(recorded.attrs.get("class", "")).rsplit(".", 1)[-1]
    named = sorted((cls for attr, cls in vars(namespace).items() if isinstance(cls, type) and issubclass(cls, base)
                    and cls is not base and cls.__name__ == attr and attr in name), key=lambda c: -len(c.__name__))
    bases = [cls for cls in (live.__mro__[1:] if live is not None else ()) if issubclass(cls, base) and cls is not base]
    found: list[tuple[type, str, bool]] = []
    for cls in bases + named:
        spelled = _spelling(cls, root)
        if spelled is not None and all(cls is not seen for seen, _, _ in found):
            found.append((cls, spelled, False))
    return found


def buildable(recorded: Recorded) -> bool:
    """Whether repro.py may make the side's layer: a factory was given, or a framework layer may build it."""
    return recorded.factory is not None or bool(_candidates(recorded, None))


def _has_bias(state: dict[str, np.ndarray]) -> bool:
    return any(name.rsplit(".", 1)[-1].endswith("bias") for name in state)


def _constructor(recorded: Recorded, cls: type) -> tuple[list[_Arg], list[str], list[str]]:
    """(the arguments the recorded attributes fill (defaults left out), the required parameters no recorded
    attribute fills, the optional ones whose recorded value cannot be decoded and is left at its default)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return [], ["(its signature cannot be read)"], []
    filled: list[_Arg] = []
    missing: list[str] = []
    undecoded: list[str] = []
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or name.startswith("_"):
            continue
        key = name if name in recorded.attrs else _ALIASES.get(name, name)
        optional = p.default is not p.empty
        if key in recorded.attrs and key not in _NOT_CONFIG:
            try:
                value = decode(recorded.attrs[key], recorded.framework)
                text = literal(recorded.attrs[key], recorded.framework)
            except OpaqueError:
                (undecoded if optional else missing).append(name)
                continue
        elif name in ("bias", "has_bias"):
            value = _has_bias(recorded.state or {})
            text = repr(value)
        elif not optional:
            missing.append(name)
            continue
        else:
            continue
        if optional and _same(value, p.default):
            continue
        filled.append(_Arg(name, value, text, optional))
    return filled, missing, undecoded


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an exotic default whose == is not a bool
        return False


def _construct(recorded: Recorded, cls: type, spelling: str, filled: list[_Arg]) -> tuple[Any, str]:
    """Build the layer by calling its class with the decoded arguments. Optional arguments the constructor refuses
    (MindSpore's GELU keeps `approximate` as 'tanh' but takes a bool) or keeps transformed are left out: the attribute
    fix-ups then set what was left out. Returns (layer, the source of the same call for repro.py)."""

    def make(args: list[_Arg]) -> Any:
        return cls(**{arg.name: arg.value for arg in args})

    def source(args: list[_Arg]) -> str:
        return f"{spelling}({', '.join(f'{arg.name}={arg.text}' for arg in args)})"

    try:
        layer = make(filled)
        kept = filled
    except Exception:
        kept = [arg for arg in filled if not arg.optional]
        for arg in filled:
            if arg.optional:
                try:
                    make(kept + [arg])
                    kept.append(arg)
                except Exception:
                    continue
    else:  # an argument the constructor keeps transformed (MindSpore BatchNorm stores 1 - momentum): left out
        have = attributes(layer)
        transformed = [arg for arg in kept if arg.optional and arg.name in recorded.attrs and arg.name in have
                       and have[arg.name] != recorded.attrs[arg.name]]
        if not transformed:
            return layer, source(kept)
        kept = [arg for arg in kept if arg not in transformed]
    try:
        return make(kept), source(kept)
    except Exception as exc:
        raise AlignerError(f"{recorded.path or 'the model'} ({recorded.attrs.get('class')}): its constructor "
                           f"refuses the recorded attributes ({type(exc).__name__}: {exc}); give "
                           f"{recorded.option} MODULE:CALLABLE returning the whole model") from None


def _modules(layer: Any, framework: Framework) -> dict[str, Any]:
    if framework is Framework.PYTORCH:
        return dict(layer.named_modules())
    return dict(layer.cells_and_names())


def _fixups(recorded: Recorded, layer: Any) -> list[str]:
    """Set every recorded attribute the built layer (or a submodule of its recorded class) holds differently; the
    lines doing it. An attribute the layer does not have is left out (a stand-in has no place for its class's own)."""
    lines = []
    for rel, module in _modules(layer, recorded.framework).items():
        wanted = recorded.attrs if rel == "" else recorded.children.get(rel)
        if not wanted or (rel and str(wanted.get("class", "")).rsplit(".", 1)[-1] != type(module).__qualname__):
            continue
        have = attributes(module)
        for name, value in wanted.items():
            if (name in _NOT_CONFIG or not identifier(name) or name.startswith("_") or not hasattr(module, name)
                    or have.get(name, object()) == value):
                continue
            try:
                text = literal(value, recorded.framework)
                setattr(module, name, decode(value, recorded.framework))
            except Exception:  # opaque, or a read-only property: the constructor's value stays
                continue
            where = "layer" if rel == "" else (f"layer.get_submodule({rel!r})" if recorded.framework is
                                               Framework.PYTORCH else f"dict(layer.cells_and_names())[{rel!r}]")
            lines.append(f"{where}.{name} = {text}  # as recorded")
    return lines


def _factory(recorded: Recorded) -> tuple[Any, list[str], list[str]]:
    """(the factory model's layer at the path, repro.py's lines building it, module-level lines importing the
    factory)."""
    spec = str(recorded.factory)
    built = build_factory(spec)
    if built.framework is not recorded.framework:
        raise AlignerError(f"{recorded.option} {spec} returned a {built.framework} model, but that dump was recorded "
                           f"by {recorded.framework}")
    modules = _modules(built.model, recorded.framework)
    if recorded.path not in modules:
        raise AlignerError(f"{recorded.option} {spec}: the model it returns has no module {recorded.path!r}")
    layer = modules[recorded.path]
    target, _, attr = spec.rpartition(":")
    name = f"make_{ROOT[recorded.framework]}_model"
    preamble = ["", f"sys.path.insert(0, {os.getcwd()!r})  # where `align repro` ran: the factory's imports"]
    if target.endswith(".py"):
        preamble += ["import importlib.util",
                     f"_spec = importlib.util.spec_from_file_location({name + '_file'!r}, "
                     f"{str(Path(target).resolve())!r})",
                     "_module = importlib.util.module_from_spec(_spec)",
                     "_spec.loader.exec_module(_module)",
                     f"{name} = getattr(_module, {attr!r})"]
    else:
        preamble += ["import importlib", f"{name} = getattr(importlib.import_module({target!r}), {attr!r})"]
    pick = (f"layer = model.get_submodule({recorded.path!r})" if recorded.framework is Framework.PYTORCH
            else f"layer = dict(model.cells_and_names())[{recorded.path!r}]")
    lines = [f"model = {name}()", "model = model[0] if isinstance(model, tuple) else model", pick]
    return layer, lines, preamble


def _state(recorded: Recorded, layer: Any, how: Build) -> dict[str, np.ndarray]:
    """The recorded values of exactly the layer's parameters (and torch's persistent buffers), loaded strictly into
    `layer` here so that repro.py's own strict load cannot fail."""
    where = recorded.path or "the model"
    if recorded.framework is Framework.PYTORCH:
        wanted = list(layer.state_dict().keys())
    else:
        wanted = [rel for rel, _ in layer.parameters_and_names()]
    if recorded.state is None:  # a parameter-free layer needs none: only a layer with parameters is refused
        if wanted:
            raise AlignerError(f"{recorded.dump} holds no parameter values, and {where} has {', '.join(wanted[:4])}: "
                               "record them with aligner.dump(model, DIR, params=True)")
        return {}
    missing = [k for k in wanted if k not in recorded.state]
    if missing and how is Build.ATTRIBUTES and len(missing) < len(wanted):
        raise AlignerError(f"{where}: built from its recorded attributes it has parameter(s) the dump does not hold "
                           f"({', '.join(missing[:4])}); give {recorded.option} MODULE:CALLABLE returning the model")
    if missing:
        raise AlignerError(f"{where}: the dump holds no value for its parameter(s) {', '.join(missing[:4])}; record "
                           "them with aligner.dump(model, DIR, params=True) (no include/exclude leaving them out)")
    extra = [k for k in recorded.state if k not in wanted and not _buffer(layer, k, recorded.framework)]
    if extra and how is Build.ATTRIBUTES:
        raise AlignerError(f"{where}: built from its recorded attributes it lacks the recorded parameter(s) "
                           f"{', '.join(extra[:4])}; give {recorded.option} MODULE:CALLABLE returning the model")
    if extra:
        raise AlignerError(f"{recorded.option}: the factory's {where} lacks the recorded parameter(s) "
                           f"{', '.join(extra[:4])}: it builds a different layer than the dump recorded")
    state = {k: recorded.state[k] for k in wanted}
    try:
        _load(layer, state, recorded.framework)
    except Exception as exc:
        why = (str(exc).strip().splitlines() or [""])[0][:160]
        raise AlignerError(f"{where}: its recorded parameters do not load into the layer built from "
                           f"{'its recorded attributes' if how is Build.ATTRIBUTES else recorded.option} "
                           f"({type(exc).__name__}: {why})") from None
    return state


def _buffer(layer: Any, name: str, framework: Framework) -> bool:
    """A torch buffer kept out of the state dict (persistent=False): recorded, but not part of a strict load."""
    return framework is Framework.PYTORCH and name in dict(layer.named_buffers())


def _load(layer: Any, state: dict[str, np.ndarray], framework: Framework) -> None:
    if framework is Framework.PYTORCH:
        import torch

        layer.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
        return
    import mindspore

    if not state:
        return
    names = {rel: p.name for rel, p in layer.parameters_and_names()}
    params = {names[k]: mindspore.Parameter(mindspore.Tensor(v), name=names[k]) for k, v in state.items()}
    not_loaded, unused = mindspore.load_param_into_net(layer, params, strict_load=True)
    if not_loaded or unused:
        raise AlignerError(f"not loaded {not_loaded}, unused {unused}")


def _outputs(recorded: Recorded, layer: Any, layout: Layout) -> list[np.ndarray]:
    """The layer's outputs on the side's own recorded inputs, called as recorded in the given layout."""
    assert recorded.inputs is not None
    run = runner(recorded.framework)
    tensors = [run.tensor(moved(array, layout), dtype) for array, dtype in recorded.inputs]
    args, kwargs = restore(recorded.structure, tensors, run.dtype)
    run.set_training(layer, bool(recorded.attrs.get("training", False)))
    return [moved(out, layout, back=True) for out in run.forward(layer, args, kwargs)]


def _stand_in(recorded: Recorded, layer: Any, spelling: str, tolerance: Tolerance) -> StandIn:
    """How `layer` (a standard layer built for a class that is not one) reproduces the side's own recorded outputs
    on its own recorded inputs: as recorded, else with the channel axis moved last (what a channels-first LayerNorm
    such as timm's LayerNorm2d or mindcv's ConvNextLayerNorm does around its base). AlignerError, with what was
    measured, when neither layout does."""
    where = f"{recorded.path or 'the model'} ({recorded.attrs.get('class', '?')})"
    if recorded.inputs is None:
        raise AlignerError(f"{where}: {spelling} built from its recorded attributes cannot be checked against its "
                           f"recorded output: {recorded.dump} holds none of its inputs")
    layouts = [Layout.AS_RECORDED] + ([Layout.CHANNELS_LAST] if any(a.ndim >= 3 for a, _ in recorded.inputs) else [])
    tried = []
    for layout in layouts:
        try:
            got = _outputs(recorded, layer, layout)
        except Exception as exc:  # the layer refuses the recorded call in this layout (a shape it cannot take)
            tried.append(f"{layout}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:80]}")
            continue
        if len(got) != len(recorded.outputs):
            tried.append(f"{layout}: {len(got)} output(s), {len(recorded.outputs)} recorded")
            continue
        metrics = [compare_arrays(g, want, tolerance) for g, want in zip(got, recorded.outputs)]
        if all(m.allclose for m in metrics):
            left_out = tuple(sorted(name for name in recorded.attrs if name not in _NOT_CONFIG
                                    and identifier(name) and not hasattr(layer, name)))
            worst = max((m.max_abs_err or 0.0 for m in metrics), default=0.0)
            return StandIn(spelling, layout, worst, tolerance, left_out)
        shapes = [m for m in metrics if not m.shape_match]
        tried.append(f"{layout}: output shape {list(shapes[0].shape_a)}, recorded {list(shapes[0].shape_b)}"
                     if shapes else f"{layout}: max abs error "
                     f"{max((m.max_abs_err for m in metrics if m.max_abs_err is not None), default=math.nan):.3g}")
    raise AlignerError(f"{where}: {spelling} built from its recorded attributes does not reproduce its recorded "
                       f"output on its own recorded inputs ({'; '.join(tried)}; tolerance {tolerance})")


def _attributes(recorded: Recorded, cls: type, spelling: str, own: bool, tolerance: Tolerance) -> Planned:
    """The side built as `cls` from its recorded attributes, its parameters loaded; a class that is not the module's
    own is kept only where it reproduces the side's own recorded output (AlignerError otherwise)."""
    where = recorded.path or "the model"
    klass = str(recorded.attrs.get("class", "?"))
    filled, missing, undecoded = _constructor(recorded, cls)
    if missing:
        raise AlignerError(f"{where} ({klass}): no recorded attribute gives {spelling}'s "
                           f"{', '.join(missing)}; give {recorded.option} MODULE:CALLABLE returning the model")
    layer, source = _construct(recorded, cls, spelling, filled)
    lines = [f"layer = {source}"]
    if undecoded:  # parameter names from the constructor's signature, never from the dump
        lines.insert(0, f"# recorded as no value repro can decode, left at the constructor's default: "
                        f"{', '.join(undecoded)}")
    lines += _fixups(recorded, layer)
    state = _state(recorded, layer, Build.ATTRIBUTES)
    if not own:
        lines.insert(0, "# a standard layer stands in for the recorded class: README.md says what was measured")
    code = _code(recorded, lines, [], bool(state))
    code.stand_in = None if own else _stand_in(recorded, layer, spelling, tolerance)
    return Planned(code, state, Build.ATTRIBUTES)


def _code(recorded: Recorded, lines: list[str], preamble: list[str], has_params: bool) -> SideCode:
    """The side's code for repro.py around its building lines (its recorded call written back)."""
    try:
        call = call_source(recorded.structure, recorded.framework)
    except OpaqueError as exc:
        raise AlignerError(f"{recorded.path or 'the model'}: the recorded call passed {exc}, which a repro cannot "
                           "write back") from None
    return SideCode(recorded.framework, recorded.path, str(recorded.attrs.get("class", "?")), lines, preamble,
                    bool(recorded.attrs.get("training", False)), has_params, call, {})


def _packages(layer: Any, framework: Framework) -> tuple[str, ...]:
    """The packages the factory's layer is made of, beyond numpy, torch and mindspore (the factory file itself,
    loaded under a private name, is named on its own)."""
    names = {type(m).__module__.partition(".")[0] for m in _modules(layer, framework).values()}
    return tuple(sorted(n for n in names if n not in ("numpy", "torch", "mindspore") and not n.startswith("_")))


def plan(recorded: Recorded, casts: dict[int, str], tolerance: Tolerance) -> Planned:
    """Build the side's layer from its recorded attributes (as its own framework class, else as a standard layer
    that reproduces its recorded output), else from its factory; check its parameters load, and write its code."""
    where = recorded.path or "the model"
    klass = str(recorded.attrs.get("class", "?"))
    live = _factory(recorded) if recorded.factory is not None else None
    tried: list[str] = []
    for cls, spelling, own in _candidates(recorded, type(live[0]) if live is not None else None):
        try:
            planned = _attributes(recorded, cls, spelling, own, tolerance)
        except AlignerError as exc:
            if own and live is None:
                raise
            tried.append(str(exc))
            continue
        planned.code.casts.update(casts)
        return planned
    if live is None:
        raise AlignerError(f"{where} is a {klass}, not a {ROOT[recorded.framework]}.nn layer"
                           + (f" ({'; '.join(tried)})" if tried else "") + f"; give {recorded.option} "
                           "MODULE:CALLABLE (or FILE.py:CALLABLE) returning the whole model")
    layer, lines, preamble = live
    lines = lines + _fixups(recorded, layer)
    state = _state(recorded, layer, Build.FACTORY)
    code = _code(recorded, lines, preamble, bool(state))
    code.casts.update(casts)
    code.factory, code.needs = recorded.factory, _packages(layer, recorded.framework)
    return Planned(code, state, Build.FACTORY)
