"""Reproducible runs: `fix_random` pins every seed and determinism switch, `disable_dropout` switches dropout off.

(`check_determinism`, which uses `fix_random`, lives in `aligner.dumping.determinism`: imports point one way.)
"""
from __future__ import annotations

import functools
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


def _returns_input(original: Callable[..., Any]) -> Callable[..., Any]:
    """A dropout function switched off: it returns its input, as it does with training=False."""
    @functools.wraps(original)
    def dropout_off(input: Any, *args: Any, **kwargs: Any) -> Any:
        return input
    return dropout_off


def _zero_dropout_p(original: Callable[..., Any]) -> Callable[..., Any]:
    """An attention function whose `dropout_p` (5th argument) is always 0."""
    @functools.wraps(original)
    def attention_without_dropout(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                  *args: Any, **kwargs: Any) -> Any:
        return original(query, key, value, attn_mask, 0.0, *args, **kwargs)
    return attention_without_dropout


# Functional entry points switched off inside `with disable_dropout(model):`: (module, names, how), per framework.
# torch's MultiheadAttention calls the patched torch.nn.functional names; mindspore.mint.functional is
# mindspore.mint.nn.functional. Code that bound a function before the context (`from torch.nn.functional import
# dropout`) keeps the original.
_FUNCTIONS: dict[Framework, list[tuple[str, tuple[str, ...], Callable[[Callable[..., Any]], Callable[..., Any]]]]] = {
    Framework.PYTORCH: [
        ("torch", ("dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout", "feature_dropout_",
                   "feature_alpha_dropout", "feature_alpha_dropout_"), _returns_input),
        ("torch.nn.functional", ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                 "feature_alpha_dropout"), _returns_input),
        ("torch.nn.functional", ("scaled_dot_product_attention",), _zero_dropout_p),
    ],
    Framework.MINDSPORE: [
        ("mindspore.ops", ("dropout", "dropout1d", "dropout2d", "dropout3d"), _returns_input),
        ("mindspore.mint.nn.functional", ("dropout", "dropout2d"), _returns_input),
    ],
}


def _is_dropout_class(module: Any) -> bool:
    """Dropout, DropPath, DropBlock, PatchDropout, StochasticDepth, ...: classes whose `p`/`prob` is a drop rate."""
    name = type(module).__name__.lower()
    return "drop" in name or "stochasticdepth" in name


def _switches(module: Any) -> dict[str, float]:
    """{attribute: value that switches it off} for every dropout probability the module holds that is on: float
    attributes named like `*drop*` (dropout, dropout_p, attention_dropout, drop_prob, layerdrop, ...) and, on
    dropout-like classes, `p`/`prob`; `keep_prob` (MindSpore) where no `p` is set (legacy nn.Dropout, Dropout2d/3d,
    mindcv DropPath)."""
    attrs = vars(module)
    found = {}
    for attr, value in attrs.items():
        if not isinstance(value, float):
            continue
        if attr == "keep_prob":
            if 0.0 < value < 1.0 and not isinstance(attrs.get("p"), (int, float)):
                found[attr] = 1.0
        elif 0.0 < value <= 1.0 and ("drop" in attr.lower() or (attr in ("p", "prob") and _is_dropout_class(module))):
            found[attr] = 0.0
    return found


class DisabledDropout(list[str]):
    """What `disable_dropout` switched off: a list of module paths ("<model>" for the root), with `attributes`
    ({"path.attribute": original value}) and `functions` (functional entry points patched inside `with`).

    Used as a context manager, functional dropout is off too while inside, and everything is restored on exit."""

    def __init__(self, framework: Framework, saved: list[tuple[str, Any, str, float]]) -> None:
        super().__init__(dict.fromkeys(path for path, _, _, _ in saved))
        self.attributes = {f"{path}.{attr}": value for path, _, attr, value in saved}
        self.functions: list[str] = []
        self._framework = framework
        self._saved = [(module, attr, value) for _, module, attr, value in saved]

    def __enter__(self) -> DisabledDropout:
        for module_name, names, switch_off in _FUNCTIONS[self._framework]:
            owner = _import(module_name)  # None: an older MindSpore without mint
            for name in names:
                if owner is not None and hasattr(owner, name):
                    self._saved.append((owner, name, getattr(owner, name)))
                    setattr(owner, name, switch_off(getattr(owner, name)))
                    self.functions.append(f"{module_name}.{name}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back every original probability (and function, when inside `with`)."""
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)


def disable_dropout(model: Any) -> DisabledDropout:
    """Switch off every dropout probability held by the modules of a torch Module or MindSpore Cell (in place,
    training mode kept: BatchNorm still uses batch statistics); returns what was switched off (a list of module
    paths). As `with disable_dropout(model):`, functional dropout calls (`F.dropout`, `torch.dropout`,
    `F.scaled_dot_product_attention(dropout_p=...)`, `ops.dropout`, `mint.nn.functional.dropout`) are no-ops inside,
    and every setting is restored on exit."""
    torch = sys.modules.get("torch")
    ms = sys.modules.get("mindspore")
    if torch is not None and isinstance(model, torch.nn.Module):
        framework, modules = Framework.PYTORCH, model.named_modules()
    elif ms is not None and isinstance(model, ms.nn.Cell):
        framework, modules = Framework.MINDSPORE, model.cells_and_names()
    else:
        raise AlignerError(f"disable_dropout needs a torch.nn.Module or a mindspore.nn.Cell, "
                           f"got {type(model).__name__}")
    saved = []
    for path, module in list(modules):
        for attr, off in _switches(module).items():
            saved.append((path or "<model>", module, attr, getattr(module, attr)))
            setattr(module, attr, off)
    return DisabledDropout(framework, saved)
