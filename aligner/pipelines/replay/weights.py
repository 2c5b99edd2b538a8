"""Load a checkpoint into the model a factory built for `align replay --weights`: the model's own parameter names,
every one of them, nothing guessed."""
from __future__ import annotations

import difflib
from contextlib import closing
from typing import Any

import numpy as np

from aligner.core.dtypes import to_numpy
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.dumping.tensors import model_framework
from aligner.io import open_checkpoint


def load_weights(model: Any, path: str, *, allow_pickle: bool = False) -> None:
    """Copy every parameter (and torch buffer) of `model` from the checkpoint at `path`, which must use the model's
    own names and shapes (a checkpoint of this framework, e.g. written by `align convert`)."""
    framework = model_framework(model)
    with closing(open_checkpoint(path, allow_pickle=allow_pickle)) as source:
        names = set(source.names)
        if framework == Framework.PYTORCH:
            targets = dict(model.state_dict())
        else:
            targets = dict(model.parameters_and_names())
        for name, target in targets.items():
            if name not in names:
                close = difflib.get_close_matches(name, sorted(names), n=2, cutoff=0.5)
                hint = f" (nearest: {', '.join(repr(c) for c in close)})" if close else ""
                raise AlignerError(f"{path} has no {name!r}, which the model to re-run has{hint}: give a checkpoint "
                                   f"in the model's own names (align convert writes one)")
            shape = tuple(source.info(name).shape)
            if shape != tuple(target.shape):
                raise AlignerError(f"{path}: {name!r} has shape {list(shape)}, the model's is {list(target.shape)}")
        for name, target in targets.items():
            _assign(framework, target, source.get(name))


def _assign(framework: Framework, target: Any, array: np.ndarray) -> None:
    array = array.astype(np.float32) if array.dtype == to_numpy("bfloat16") else array.copy()
    if framework == Framework.PYTORCH:
        import torch

        with torch.no_grad():
            target.copy_(torch.from_numpy(array).to(target.dtype))
        return
    import mindspore as ms

    target.set_data(ms.Tensor(array).astype(target.dtype))
