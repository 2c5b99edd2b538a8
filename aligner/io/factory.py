"""Resolve a model factory named on the command line: `pkg.module:make_model` or `path/to/file.py:make_model`.

The callable is called with no arguments (the current directory on `sys.path`, as `python -m` would have it) and must
return a PyTorch module or a MindSpore cell, or a `(model, optimizer)` pair. Every command that takes a factory uses
this one resolver; each failure is one line (AlignerError, exit 2).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.files import open_input
from aligner.core.frameworks import Framework
from aligner.io import open_checkpoint

_ROOTS = {Framework.PYTORCH: ("torch.nn.modules.module", "Module"),
          Framework.MINDSPORE: ("mindspore.nn.cell", "Cell")}


@dataclasses.dataclass(frozen=True)
class Built:
    """What a factory returned: the model, its framework, and the optimizer when it returned a pair."""

    spec: str
    model: Any
    framework: Framework
    optimizer: Any = None
    scheduler: Any = None


def model_framework(obj: Any) -> Framework | None:
    """PyTorch for an `nn.Module`, MindSpore for a `Cell`, else None; reads the class hierarchy, imports nothing."""
    for cls in type(obj).__mro__:
        for framework, (module, name) in _ROOTS.items():
            if cls.__module__ == module and cls.__name__ == name:
                return framework
    return None


def _load_callable(spec: str) -> Any:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise AlignerError(f"factory {spec!r}: expected MODULE:CALLABLE or FILE.py:CALLABLE")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.exists():
                raise AlignerError(f"factory {spec!r}: no such file {target}")
            open_input(path).close()  # a regular file: a FIFO would block the import, a device never end
            name = f"_aligner_factory_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except AlignerError:
        raise
    except Exception as exc:  # the user's module may fail any way at import time: one line, whatever it was
        raise AlignerError(f"factory {spec!r}: cannot import {target}: {type(exc).__name__}: {exc}") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise AlignerError(f"factory {spec!r}: {target} has no callable {attr!r}")
    return func


def load_factory(spec: str) -> Any:
    """The callable `spec` names, imported but not called (for a caller that unpacks what it returns itself)."""
    return _load_callable(spec)


def build(spec: str) -> Built:
    """Import the factory, call it with no arguments, and check it returned one model (or a tuple of a model, an
    optimizer and optionally a learning-rate scheduler)."""
    func = _load_callable(spec)
    try:
        made = func()
    except Exception as exc:  # the user's code: report it on one line
        raise AlignerError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from None
    optimizer = scheduler = None
    if isinstance(made, tuple) and len(made) in (2, 3):
        made, optimizer, scheduler = (*made, None)[:3]
    framework = model_framework(made)
    if framework is None:
        raise AlignerError(f"factory {spec!r} returned {type(made).__name__}, not a torch.nn.Module or "
                           "mindspore.nn.Cell (or a (model, optimizer[, scheduler]) tuple)")
    return Built(spec, made, framework, optimizer, scheduler)


def load_example_inputs(path: str) -> np.ndarray | dict[str, np.ndarray]:
    """Example inputs from a file: a .npy array (passed positionally), or an .npz of named arrays (passed as keyword
    arguments, in file order); stored dtypes are kept and nothing is unpickled."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise AlignerError(f"--input {path}: expected a .npy or .npz file")
    try:  # the checkpoint readers: sizes checked before allocating, no pickles, no memory maps
        with open_checkpoint(path) as source:
            arrays = {name: np.asarray(source.get(name)) for name in source.names}
    except AlignerError as exc:
        raise AlignerError(f"--input {path}: {exc}") from None
    if suffix == ".npy":
        return next(iter(arrays.values()))
    return arrays
