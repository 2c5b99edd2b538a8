"""PyTorch .pth/.pt/.bin reader (weights_only, mmap where the file allows) and writer."""
from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from typing import Any, Iterable

import numpy as np

from aligner.core.dtypes import canonical, contiguous, to_numpy, torch_to_numpy
from aligner.core.errors import AlignerError
from aligner.io.base import TensorInfo, TensorSource

NEST_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")


def _find_state_dict(obj: Any, torch) -> tuple[dict, str | None]:
    """The tensor dict inside a loaded object, and the key path it was nested under (None at top level)."""
    if isinstance(obj, dict) and any(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    if isinstance(obj, dict):
        for key in NEST_KEYS:
            if key in obj:
                found, inner = _find_state_dict(obj[key], torch)
                if found:
                    return found, key if inner is None else f"{key}.{inner}"
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), "<module>.state_dict()"
    return {}, None


class TorchSource(TensorSource):
    """A torch checkpoint. Pickled code is refused unless `allow_pickle` is set (then the file is fully trusted)."""

    format = "pytorch"

    def __init__(self, path: str, allow_pickle: bool = False) -> None:
        super().__init__(path, "pytorch")
        import torch

        self.file_backed = zipfile.is_zipfile(path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obj = torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=self.file_backed)
        except pickle.UnpicklingError as exc:
            reason = str(exc).split("\n")[0] if allow_pickle else _unsafe_reason(exc)
            if allow_pickle:
                raise AlignerError(f"{path}: cannot unpickle ({reason})") from None
            raise AlignerError(f"{path}: refusing to load: the pickle needs code execution ({reason}); "
                               "pass --trust-pickle only if you trust this file") from None
        except (EOFError, RuntimeError, zipfile.BadZipFile, ValueError, OSError, KeyError) as exc:
            msg = str(exc).split("\n")[0][:200]
            raise AlignerError(f"{path}: cannot read PyTorch file (truncated or corrupted?): {msg}") from None
        state, nested = _find_state_dict(obj, torch)
        if not state:
            raise AlignerError(f"{path}: no tensors found (looked at the top level and under keys "
                               f"{', '.join(NEST_KEYS)})")
        if nested:
            self.notes.append(f"state_dict nested under {nested!r}")
        self._tensors: dict[str, Any] = {}
        seen: dict[tuple, str] = {}
        skipped = []
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):
                skipped.append(name)
                continue
            key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                   tuple(value.stride()), value.dtype)
            if value.numel() and key in seen:
                self.tied[name] = seen[key]
            else:
                seen[key] = name
            self._tensors[name] = value
            self.infos[name] = TensorInfo(tuple(value.shape), canonical(str(value.dtype)))
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entr{'y' if len(skipped) == 1 else 'ies'}: "
                              f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}")
        if self.tied:
            self.notes.append("tied weights: " + ", ".join(f"{a} = {b}" for a, b in self.tied.items()))

    def _load(self, name: str) -> np.ndarray:
        return torch_to_numpy(self._tensors[name].detach())

    def close(self) -> None:
        self._tensors = {}


def _unsafe_reason(exc: Exception) -> str:
    """Which global the safe unpickler refused (e.g. 'it imports __main__.Foo'), from torch's long message."""
    text = str(exc)
    found = re.search(r"GLOBAL\s+([\w.]+)", text)
    if found:
        return f"it imports {found.group(1)}"
    for line in text.splitlines():
        if "unsupported" in line.lower():
            return line.strip().removeprefix("WeightsUnpickler error:").strip()[:200]
    return text.splitlines()[0][:200] if text else type(exc).__name__


def write_pth(path: str, items: Iterable[tuple[str, np.ndarray]]) -> None:
    """Save (name, array) pairs as a torch state_dict; arrays that are the same object stay tied (one storage)."""
    import torch

    state: dict[str, Any] = {}
    by_id: dict[int, Any] = {}
    keep = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only mmap views: torch warns, we never write through them
        for name, array in items:
            if id(array) not in by_id:
                keep.append(array)
                if array.dtype == to_numpy("bfloat16"):
                    tensor = torch.from_numpy(contiguous(array).view(np.int16)).view(torch.bfloat16)
                else:
                    tensor = torch.from_numpy(contiguous(array))
                by_id[id(array)] = tensor
            state[name] = by_id[id(array)]
        torch.save(state, path)
