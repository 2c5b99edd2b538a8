"""PyTorch .pth/.pt/.bin reader (weights_only, mmap where the file allows) and writer."""
from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from typing import IO, Any, Iterable

import numpy as np

from aligner.core.dtypes import canonical, numpy_to_torch, torch_to_numpy
from aligner.core.errors import AlignerError
from aligner.core.files import check_legacy_torch, check_zip, open_input
from aligner.io.base import TensorInfo, TensorSource

NEST_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt")
SCHEDULER_KEYS = ("scheduler", "lr_scheduler", "scheduler_state_dict", "lr_scheduler_state_dict")
STEP_KEYS = ("step", "global_step", "iteration", "iter", "epoch")


def _find_state_dict(obj: Any, torch: Any, seen: set[int] | None = None) -> tuple[dict, str | None]:
    """The tensor dict inside a loaded object, and the key path it was nested under (None at top level); a dict
    nested inside itself is visited once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return {}, None
    seen.add(id(obj))
    if isinstance(obj, dict) and any(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    if isinstance(obj, dict):
        for key in NEST_KEYS:
            if key in obj:
                found, inner = _find_state_dict(obj[key], torch, seen)
                if found:
                    return found, key if inner is None else f"{key}.{inner}"
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), "<module>.state_dict()"
    return {}, None


def _check_tensor(path: str, name: object, value: Any, torch: Any) -> str:
    """The canonical dtype of a state_dict entry that aligner can read as a dense array, else one clear error."""
    if not isinstance(name, str):
        raise AlignerError(f"{path}: tensor key {name!r} has type {type(name).__name__}, not a name (not a state_dict)")
    if value.layout != torch.strided:
        raise AlignerError(f"{path}: tensor {name!r} has layout {value.layout} (sparse tensors are not supported; "
                           "save it with .to_dense())")
    if value.device.type != "cpu":
        raise AlignerError(f"{path}: tensor {name!r} has no data (device {value.device.type!r}: saved from a "
                           "meta or fake tensor)")
    try:
        return canonical(str(value.dtype))
    except AlignerError as exc:
        raise AlignerError(f"{path}: tensor {name!r}: {exc}") from None


class TorchSource(TensorSource):
    """A torch checkpoint. Pickled code is refused unless `allow_pickle` is set (then the file is fully trusted)."""

    format = "pytorch"

    def __init__(self, path: str, allow_pickle: bool = False, model_key: str | None = None) -> None:
        super().__init__(path, "pytorch")
        import torch

        try:
            handle = open_input(path)  # a regular file (a FIFO would block torch.load), not a decompression bomb
        except OSError as exc:         # missing, unreadable, a symlink loop
            raise AlignerError(f"{path}: cannot open PyTorch file: {exc.strerror or exc}") from None
        with handle as fh:
            try:
                self.file_backed = zipfile.is_zipfile(fh)
            except zipfile.BadZipFile:  # raised on some broken end records: torch.load then says what is wrong
                self.file_backed = False
            if self.file_backed:
                check_zip(path, fh, "unzip it and check what it holds if you trust it")
            else:
                check_legacy_torch(path, fh)
            self._size = os.fstat(fh.fileno()).st_size
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obj = torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=self.file_backed)
        except pickle.UnpicklingError as exc:
            if allow_pickle:
                raise AlignerError(f"{path}: cannot unpickle ({_first_line(exc)})") from None
            raise AlignerError(f"{path}: refusing to load: {_unsafe_reason(exc)}; pass --trust-pickle only if you "
                               "trust this file") from None
        except Exception as exc:  # torch's parsers meet a corrupted file with any exception type
            raise AlignerError(f"{path}: cannot read PyTorch file (truncated or corrupted?): "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
        self.top: dict[Any, Any] = obj if isinstance(obj, dict) else {}   # the training checkpoint around the model
        if model_key is not None:
            if model_key not in self.top:
                raise AlignerError(f"{path}: no key {model_key!r} (--model-key); top-level keys: "
                                   f"{', '.join(map(str, list(self.top)[:10])) or 'none'}")
            state, nested = _find_state_dict(self.top[model_key], torch)
            nested = model_key if nested is None else f"{model_key}.{nested}"
        else:
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
                skipped.append(str(name))
                continue
            dtype = _check_tensor(path, name, value, torch)
            key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                   tuple(value.stride()), value.dtype)
            if value.numel() and key in seen:
                self.tied[name] = seen[key]
            else:
                seen[key] = name
            self._tensors[name] = value
            self.infos[name] = TensorInfo(tuple(value.shape), dtype)
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entr{'y' if len(skipped) == 1 else 'ies'}: "
                              f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}")
        if self.tied:
            self.notes.append("tied weights: " + ", ".join(f"{a} = {b}" for a, b in self.tied.items()))

    def _load(self, name: str) -> np.ndarray:
        """The tensor (a view on the file's mapping for zip files: first checked that the file has not shrunk, since
        reading a mapping past the end of a truncated file raises SIGBUS; a truncation during the copy still can)."""
        if self.file_backed and os.stat(self.path).st_size < self._size:
            raise AlignerError(f"{self.path}: file shrank while being read (truncated by another process?)")
        return torch_to_numpy(self._tensors[name].detach())

    def close(self) -> None:
        self._tensors = {}
        self.top = {}

    def optimizer_state(self, key: str | None = None) -> tuple[str, dict[str, Any]] | None:
        """(key, {"state": {index: {slot: array or number}}, "param_groups": [dict]}) of the optimizer state_dict
        saved beside the model (under `key`, else a usual name), tensors as numpy arrays; None when there is none.
        Every field is type-checked: the file is untrusted."""
        import torch

        keys = [key] if key is not None else [k for k in OPTIMIZER_KEYS if k in self.top]
        if key is not None and key not in self.top:
            raise AlignerError(f"{self.path}: no key {key!r} (--optimizer-key); top-level keys: "
                               f"{', '.join(map(str, list(self.top)[:10])) or 'none'}")
        if not keys:
            return None
        name, value = keys[0], self.top[keys[0]]
        where = f"{self.path}: {name!r}"
        if not isinstance(value, dict) or not isinstance(value.get("state"), dict) \
                or not isinstance(value.get("param_groups"), list):
            raise AlignerError(f"{where} is not an optimizer state_dict (a dict of 'state' and 'param_groups')")
        groups = []
        for i, group in enumerate(value["param_groups"]):
            if not isinstance(group, dict) or not isinstance(group.get("params"), list) or not all(
                    isinstance(p, int) and not isinstance(p, bool) for p in group["params"]):
                raise AlignerError(f"{where}: param group {i} is not a dict with a list of integer 'params'")
            groups.append({str(k): v for k, v in group.items()})
        state: dict[int, dict[str, Any]] = {}
        for index, record in value["state"].items():
            if not isinstance(index, int) or isinstance(index, bool) or not isinstance(record, dict):
                raise AlignerError(f"{where}: state entry {str(index)[:40]} is not an integer position with a dict")
            slots: dict[str, Any] = {}
            for slot, item in record.items():
                if isinstance(item, torch.Tensor):
                    _check_tensor(self.path, f"{name}.state.{index}.{slot}", item, torch)
                    item = torch_to_numpy(item.detach())
                elif item is not None and (isinstance(item, bool) or not isinstance(item, (int, float))):
                    raise AlignerError(f"{where}: state {index}.{slot} is a {type(item).__name__}, not a tensor "
                                       "or number")
                slots[str(slot)] = item
            state[index] = slots
        return name, {"state": state, "param_groups": groups}

    def numbers(self) -> dict[str, int]:
        """The step/epoch counters saved beside the model (whole numbers at the top level)."""
        import torch

        out = {}
        for key in STEP_KEYS:
            value = self.top.get(key)
            if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
                value = int(value.item())
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = value
        return out

    def scheduler_keys(self) -> list[str]:
        """Top-level keys holding an LR scheduler's state (not converted: it is Python-side in MindSpore)."""
        return [k for k in SCHEDULER_KEYS if k in self.top]


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, at most 200 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def _unsafe_reason(exc: Exception) -> str:
    """Why torch's safe unpickler refused a file, from its long message: the global it would import ('the pickle
    needs code execution (it imports posix.system)'), else its own words ('Unsupported operand 149')."""
    text = str(exc)
    found = re.search(r"GLOBAL\s+([\w.]+)", text)
    if found:
        return f"the pickle needs code execution (it imports {found.group(1)})"
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    reason = found.group(1).strip()[:200] if found else _first_line(exc)
    return f"the safe unpickler cannot read it ({reason}: corrupted, or a pickle of more than tensors)"


def write_pth(path: str | IO[bytes], items: Iterable[tuple[str, np.ndarray]]) -> None:
    """Save (name, array) pairs as a torch state_dict to a file name or an open binary file; arrays that are the same
    object stay tied (one storage)."""
    import torch

    state: dict[str, Any] = {}
    by_id: dict[int, Any] = {}
    keep = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only mmap views: torch warns, we never write through them
        for name, array in items:
            if id(array) not in by_id:
                keep.append(array)
                by_id[id(array)] = numpy_to_torch(array)
            state[name] = by_id[id(array)]
        torch.save(state, path)


def write_training_pth(path: str | IO[bytes], model: Iterable[tuple[str, np.ndarray]], optimizer: dict[str, Any],
                       extras: dict[str, Any]) -> None:
    """Save a training checkpoint {"model": state_dict, "optimizer": optimizer.state_dict(), **extras}: the
    optimizer's arrays become tensors, everything else stays as given (plain numbers, tuples, None)."""
    import torch

    def tensor(array: np.ndarray) -> Any:
        return numpy_to_torch(array, copy=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {name: tensor(array) for name, array in model}
        optim = {"state": {i: {k: tensor(v) if isinstance(v, np.ndarray) else v for k, v in record.items()}
                           for i, record in optimizer["state"].items()},
                 "param_groups": optimizer["param_groups"]}
        torch.save({"model": state, "optimizer": optim, **extras}, path)
