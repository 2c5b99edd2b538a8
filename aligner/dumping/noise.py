"""`aligner.noise_floor`: record the reference model once in float64, what `align compare --calibrate` measures
each layer's own rounding noise against.

    aligner.noise_floor(model, x, "dumps_pt_f64/")                    # forward only
    aligner.noise_floor(model, x, "dumps_pt_f64/", loss_fn=lambda out: out.square().mean())  # and backward

The model is deep-copied and the copy cast to float64 (parameters, buffers and the floating inputs), so the user's
model and tensors are never touched; the copy runs one forward (and a backward through `loss_fn(output)`, a scalar)
inside `aligner.dump`. PyTorch only: MindSpore's CPU kernels refuse float64 in Conv2D and BatchNorm (and bfloat16 in
MatMul, Conv, LayerNorm and Softmax), so a MindSpore model is refused with what to do instead (record its PyTorch
twin, the reference side of the comparison).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.dumping.context import dump
from aligner.dumping.tensors import model_framework

_INPUTS_HELP = ("inputs must be a tensor (the model's one argument), a tuple or list of positional arguments, or a "
                "dict of keyword arguments")


def _float64(value: Any) -> Any:
    """A floating torch tensor (or numpy array) as a float64 copy keeping requires_grad; anything else unchanged."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


def _arguments(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) for the float64 call: a tensor is the one argument, a tuple/list the positional arguments, a
    dict the keyword arguments."""
    import numpy as np
    import torch

    if isinstance(inputs, (torch.Tensor, np.ndarray)):
        return (_float64(inputs),), {}
    if isinstance(inputs, (tuple, list)):
        return tuple(_float64(v) for v in inputs), {}
    if isinstance(inputs, dict):
        if not all(isinstance(k, str) for k in inputs):
            raise AlignerError(f"aligner.noise_floor: {_INPUTS_HELP}; a dict's keys must be argument names")
        return (), {k: _float64(v) for k, v in inputs.items()}
    raise AlignerError(f"aligner.noise_floor: {_INPUTS_HELP}, got {type(inputs).__name__}")


def _active_dropout(model: Any) -> str | None:
    """The path of a dropout module that would draw a random mask (training mode, p > 0), else None."""
    from torch import nn

    for path, module in model.named_modules():
        if isinstance(module, (nn.modules.dropout._DropoutNd,)) and module.training and module.p > 0:
            return path or "(root)"
    return None


def noise_floor(model: Any, inputs: Any, directory: str | os.PathLike, /, *,
                loss_fn: Callable[[Any], Any] | None = None, overwrite: bool = False, **options: Any) -> Path:
    """Dump one float64 forward (and backward through `loss_fn`) of a copy of the torch `model` on `inputs` into
    `directory`, for `align compare --calibrate`; returns the directory.

    inputs: a tensor, a tuple/list of positional arguments or a dict of keyword arguments (floating tensors and
    numpy arrays are cast to float64, others passed as they are). Give the model and input that the reference dump
    used (a float16 or bfloat16 model is fine: its weights cast to float64 exactly) and the same dump options
    (`step`, `include`, `exclude`, `leaves_only`, `inputs`, ... go to `aligner.dump`), so that every record finds its
    twin. Dropout must be off (`aligner.disable_dropout`): a random mask differs between runs.
    """
    if model_framework(model) == Framework.MINDSPORE:
        raise AlignerError("aligner.noise_floor runs the reference model in float64, which MindSpore's CPU kernels "
                           "refuse (no float64 Conv2D or BatchNorm, no bfloat16 MatMul/Conv/LayerNorm/Softmax): "
                           "record the PyTorch twin of this model instead and compare with it as the reference")
    import torch

    dropout = _active_dropout(model)
    if dropout is not None:
        raise AlignerError(f"aligner.noise_floor: dropout at {dropout} is on, so the float64 run would draw another "
                           f"random mask; switch it off in both runs first (aligner.disable_dropout(model))")
    if loss_fn is not None and not callable(loss_fn):
        raise AlignerError(f"aligner.noise_floor loss_fn must be a function of the model's output, got "
                           f"{type(loss_fn).__name__}")
    args, kwargs = _arguments(inputs)
    twin = copy.deepcopy(model).to(torch.float64)
    with dump(twin, directory, overwrite=overwrite, **options), torch.set_grad_enabled(loss_fn is not None):
        output = twin(*args, **kwargs)
        if loss_fn is not None:
            loss = loss_fn(output)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise AlignerError("aligner.noise_floor loss_fn must return a scalar tensor (what .backward() runs "
                                   f"from), got {type(loss).__name__}")
            loss.backward()
    return Path(directory)
