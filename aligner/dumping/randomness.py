"""Reproducible runs: `fix_random` pins every seed and determinism switch, `disable_dropout` removes dropout.

(`check_determinism`, which uses `fix_random`, lives in `aligner.dumping.determinism`: imports point one way.)
"""
from __future__ import annotations

import importlib
import os
import random
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework

FRAMEWORKS = (Framework.PYTORCH, Framework.MINDSPORE)
CUBLAS_WORKSPACE = ":4096:8"

_pinned: dict[str, Any] | None = None


def pinned() -> dict[str, Any] | None:
    """The record of the last `fix_random` call in this process (written into dump headers), or None."""
    return _pinned


def _import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _pin_torch(torch: Any, seed: int) -> dict[str, Any]:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # read when CUDA first creates a cuBLAS handle
    torch.manual_seed(seed)  # seeds the CPU and every CUDA device
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return {"version": torch.__version__, "manual_seed": seed, "cuda_seeded": cuda,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": True, "cudnn_benchmark": False,
            "CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"]}


def _pin_mindspore(ms: Any, seed: int) -> dict[str, Any]:
    import mindspore.dataset as ds

    ms.set_seed(seed)
    if ms.get_context("deterministic") != "ON":
        ms.set_deterministic(True)  # MindSpore allows this once per process; later calls see it already ON
    ds.config.set_seed(seed)
    return {"version": ms.__version__, "set_seed": seed, "deterministic": ms.get_context("deterministic") == "ON",
            "dataset_seed": ds.config.get_seed()}


def fix_random(seed: int, frameworks: Iterable[str] = FRAMEWORKS) -> dict[str, Any]:
    """Seed python, numpy and every installed framework in `frameworks` (any spelling `Framework.parse` knows, e.g.
    "torch"), switch on deterministic kernels, and return a JSON-able record of what was pinned, keyed by framework
    name ("pytorch", "mindspore"; also stored in the header of later dumps)."""
    global _pinned
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise AlignerError(f"fix_random needs an integer seed in [0, 2**32), got {seed!r}")
    parsed = [(name, Framework.parse(name)) for name in frameworks]
    unknown = [str(name) for name, framework in parsed if framework not in FRAMEWORKS]
    if unknown:
        raise AlignerError(f"fix_random: unknown framework(s) {', '.join(sorted(unknown))} "
                           f"(choose from {', '.join(FRAMEWORKS)})")
    wanted = {framework for _, framework in parsed}
    random.seed(seed)
    np.random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    record: dict[str, Any] = {
        "seed": seed, "python_random": seed, "numpy": seed,
        "PYTHONHASHSEED": f"{seed} (child processes only: this interpreter's str hashing was fixed at start-up)",
    }
    pinners = {Framework.PYTORCH: ("torch", _pin_torch), Framework.MINDSPORE: ("mindspore", _pin_mindspore)}
    for framework in FRAMEWORKS:
        module_name, pin = pinners[framework]
        module = _import(module_name) if framework in wanted else None
        if framework not in wanted:
            record[framework.value] = "not requested"
        elif module is None:
            record[framework.value] = "not installed"
        else:
            record[framework.value] = pin(module, seed)
    _pinned = record
    return record


_TORCH_DROPOUT = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")
_MS_DROPOUT = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "DropoutExt", "Dropout2dExt")


def _replace_children(parent: Any, children: Iterable[tuple[str, Any]], is_dropout: Callable[[Any], bool],
                      identity: Callable[[], Any], prefix: str, replaced: list[str]) -> None:
    for name, child in list(children):
        path = f"{prefix}{name}"
        if is_dropout(child):
            if name.isdigit() and hasattr(parent, "__setitem__"):  # Sequential / SequentialCell / ModuleList
                parent[int(name)] = identity()
            else:
                setattr(parent, name, identity())
            replaced.append(path)


def disable_dropout(model: Any) -> list[str]:
    """Replace every dropout layer of a torch Module or MindSpore Cell by Identity (in place, training mode kept);
    returns the paths replaced. Functional dropout calls inside forward/construct are not affected."""
    torch = sys.modules.get("torch")
    ms = sys.modules.get("mindspore")
    replaced: list[str] = []
    if torch is not None and isinstance(model, torch.nn.Module):
        drop = tuple(getattr(torch.nn, n) for n in _TORCH_DROPOUT)
        for path, module in list(model.named_modules()):
            _replace_children(module, module.named_children(), lambda m: isinstance(m, drop), torch.nn.Identity,
                              f"{path}." if path else "", replaced)
            if isinstance(module, torch.nn.MultiheadAttention) and module.dropout:
                module.dropout = 0.0
                replaced.append(path)
    elif ms is not None and isinstance(model, ms.nn.Cell):
        drop = tuple(getattr(ms.nn, n) for n in _MS_DROPOUT if hasattr(ms.nn, n))
        for path, cell in list(model.cells_and_names()):
            _replace_children(cell, cell.name_cells().items(), lambda c: isinstance(c, drop), ms.nn.Identity,
                              f"{path}." if path else "", replaced)
    else:
        raise AlignerError(f"disable_dropout needs a torch.nn.Module or a mindspore.nn.Cell, "
                           f"got {type(model).__name__}")
    return replaced
