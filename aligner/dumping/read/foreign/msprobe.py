"""msprobe dump folders (MindStudio Probe, `mindstudio-probe`) as aligner records.

Layout (msprobe 26.2, read from real dumps of torch 2.13 and MindSpore 2.10): `DUMP_PATH/step{N}/rank{R}/` (or
`proc{PID}` when the run is not distributed) holds `dump.json`, `construct.json` (mix level: each API call's parent
module), `stack.json` (not read) and, for task "tensor", `dump_tensor_data/` with one file per tensor: `.npy` from
MindSpore, `.pt` (a torch pickle) from PyTorch. `dump.json` is `{"task", "level", "framework", "dump_data_dir",
"data": {name: call}}`, calls in execution order, named

* L0 (modules): `Module.{path}.{Class}.forward.{n}` (PyTorch) / `Cell.{path}.{Class}.forward.{n}` (MindSpore), also
  `.backward.{n}` and `.parameters_grad.{n}`;
* L1 (APIs): `{Prefix}.{api}.{n}.forward` (`Functional.conv2d.0.forward`, `Tensor.add_.0.forward`,
  `Primitive.conv2d.Conv2D.0.forward`); level "mix" has both.

A forward call holds `input_args` (list), `input_kwargs` (dict), `output` and `parameters` (the module's parameters
at the call: not read); a backward call `input` (the gradients w.r.t. the module's outputs: aligner's grad_output)
and `output` (w.r.t. its inputs: grad_input); `parameters_grad` maps parameter names to `[tensor]`. A tensor is a
dict with `type`, `dtype`, `shape`, the statistics `Max`, `Min`, `Mean`, `Norm` and, when its file was saved,
`data_name`. Mapping: module calls -> kind forward/backward at their module path, parameter gradients -> param_grad
`path.param`, API forward calls -> kind op (type `F.conv2d`, `ops.Conv2D`, ...) under their parent module (mix) or the
model (L1). API backward calls are not read (aligner's op records are forward only).
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator

import msgspec
import numpy as np

from aligner.core.dtypes import canonical, torch_to_numpy
from aligner.core.errors import AlignerError
from aligner.core.files import INDEX, check_legacy_torch, check_zip, open_input, read_text
from aligner.core.nesting import NestingError, json_loads
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.read.foreign.base import Entry, ForeignDump
from aligner.dumping.read.foreign.layout import DUMP_JSON, STEP, inside, run_dirs
from aligner.metrics.stats import Stats

CONSTRUCT_JSON = "construct.json"
TENSOR_DIR = "dump_tensor_data"
STATS = {"Max": "max", "Min": "min", "Mean": "mean", "Norm": "l2"}  # msprobe's summary_mode "statistics" keys
_RANK = re.compile(r"(?:rank|proc)\d+")
_MODULE = re.compile(r"(?:Module|Cell)\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.\d+")
_PARAM_GRAD = re.compile(r"(?:Module|Cell)\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad(?:\.\d+)?")
_API = re.compile(r"(?P<prefix>[A-Za-z_]+)\.(?P<api>.+)\.\d+\.(?P<dir>forward|backward)")
# msprobe's API prefixes -> the op names aligner's own op-level dumps record (mappings/ops_torch_mindspore.yaml)
_OP_PREFIX = {"pytorch": {"Functional": "F.", "Torch": "torch.", "Tensor": "Tensor.", "Aten": "aten."},
              "mindspore": {"Functional": "ops.", "Mint": "mint.", "MintFunctional": "mint.nn.functional.",
                            "Tensor": "Tensor."}}


def _step(run: Path) -> int:
    found = STEP.fullmatch(run.parent.name)
    return int(found[1]) if found else 0


def _runs(root: Path) -> list[Path]:
    """One rank's folders in step order; a dump of several ranks must be narrowed to one by naming its folder."""
    runs = run_dirs(root)
    if len(runs) == 1:
        return runs
    ranks = sorted({run.name for run in runs})
    if len(ranks) > 1 or not all(_RANK.fullmatch(r) for r in ranks):
        example = next(run for run in runs if run.name == ranks[0])
        raise AlignerError(f"{root}: an msprobe dump of {len(ranks)} ranks ({', '.join(ranks[:4])}"
                           f"{', ...' if len(ranks) > 4 else ''}); name one rank's folder, e.g. {example}")
    return sorted(runs, key=_step)


def _load_json(path: Path, what: str) -> dict[str, Any]:
    """One of msprobe's JSON indices (a regular file under the INDEX cap, nested at most MAX_NESTING deep) as a dict;
    AlignerError naming the file for anything else."""
    try:
        data = json_loads(read_text(path, INDEX))
    except (OSError, UnicodeDecodeError) as exc:
        raise AlignerError(f"{path}: cannot read {what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise AlignerError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    except NestingError as exc:
        raise AlignerError(f"{path}: {exc}, too deep to be an msprobe {what}") from exc
    if not isinstance(data, dict):
        raise AlignerError(f"{path}: not an msprobe {what} (a JSON object expected, found {type(data).__name__})")
    return data


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("shape"), list) and isinstance(value.get("dtype"), str)


def _tensors(value: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(place in the call, tensor dict) of every tensor in a nested argument or output, in order: "0", "1/0" (the
    first element of a tuple passed second), "mask" (a keyword); scalars and other objects are skipped."""
    if _is_tensor(value):
        yield where or "0", value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{where}/{i}" if where else str(i))
    elif isinstance(value, dict) and "type" not in value:  # a dict output; {"type": "int", "value": 2} is a scalar
        for key, item in value.items():
            yield from _tensors(item, f"{where}/{key}" if where else str(key))


def load_pt(path: Path, shape: list[int], dtype: str) -> np.ndarray:
    """An msprobe PyTorch tensor file (`torch.save` of one tensor) through `torch.load(weights_only=True)`: torch's
    restricted unpickler, which rebuilds tensors and plain containers and imports no other code; ValueError if the
    file is not one tensor of the recorded shape and dtype, nor a regular file whose zip members expand at most
    `MAX_RATIO` times (aligner.core.files)."""
    import pickle

    import torch

    try:
        with open_input(path) as fh:
            check_zip(path, fh, "a tensor file of the dump should not be compressed")
            check_legacy_torch(path, fh)
            value = torch.load(fh, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path.name}: file missing") from None
    except AlignerError as exc:
        raise ValueError(str(exc)) from None
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path.name}: not a torch tensor file ({first[:160]})") from None
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{path.name}: holds a {type(value).__name__}, not a tensor")
    array = torch_to_numpy(value.detach().contiguous())
    if list(array.shape) != shape or canonical(array.dtype) != dtype:
        raise ValueError(f"{path.name}: {canonical(array.dtype)} {list(array.shape)} but dump.json says {dtype} "
                         f"{shape}")
    return array


class _Reader:
    """Turns the calls of one msprobe dump into entries, counting the .pt files it may not open."""

    def __init__(self, root: Path, trust_pickle: bool) -> None:
        self.root, self.trust_pickle = root, trust_pickle
        self.entries: list[Entry] = []
        self.problems: list[str] = []
        self.pickled = 0
        try:
            self._real: Path | None = root.resolve()  # once for every file the dump's indices name
        except (OSError, RuntimeError):  # a symlink loop: `inside` then refuses every file
            self._real = None

    def tensor(self, run: Path, call: str, spec: dict[str, Any], fields: dict[str, Any]) -> None:
        """One tensor dict -> one entry (a malformed one is a problem, skipped)."""
        shape = spec["shape"]
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
            self.problems.append(f"{DUMP_JSON} {call!r}: shape {shape!r} is not a list of sizes"[:200])
            return
        try:
            dtype = canonical(spec["dtype"])
        except AlignerError as exc:
            self.problems.append(f"{DUMP_JSON} {call!r}: {exc}")
            return
        stats = {key: float(spec[name]) for name, key in STATS.items()
                 if isinstance(spec.get(name), (int, float)) and not isinstance(spec.get(name), bool)
                 and math.isfinite(spec[name])}
        name = spec.get("data_name")
        record = Record(seq=len(self.entries), dtype=dtype, shape=list(shape),
                        stats=msgspec.convert(stats, Stats) if stats else None,
                        file=f"{TENSOR_DIR}/{name}" if isinstance(name, str) else None, **fields)
        entry = Entry(record)
        self.entries.append(entry)
        if not isinstance(name, str):
            return
        path, why = self.inside(run / TENSOR_DIR / name) if "/" not in name and "\\" not in name else \
            (None, f"names a file in another folder ({name!r}): refused")
        if path is None:
            entry.error = f"{DUMP_JSON} {call!r}: {why}"
        elif name.endswith(".npy"):
            entry.path = path
        elif name.endswith(".pt"):
            self.pickled += 1
            entry.load = functools.partial(load_pt, path, record.shape, dtype)
        else:
            entry.error = f"{DUMP_JSON} {call!r}: tensor file {name!r} is neither .npy nor .pt"

    def inside(self, path: Path) -> tuple[Path | None, str | None]:
        """`inside` for a file under the dump folder the user named: a link (the file's, or a rank or tensor
        folder's on the way) leading out of it is refused, so an index cannot make aligner read a file elsewhere."""
        return inside(self.root, str(path.relative_to(self.root)), self._real)

    def index(self, run: Path, name: str) -> dict[str, Any]:
        """One of the run's JSON indices (dump.json, construct.json), confined to the dump folder (AlignerError)."""
        path, why = self.inside(run / name)
        if path is None:
            raise AlignerError(f"{self.root}: {why}")
        return _load_json(path, name)

    def call(self, run: Path, step: int, framework: str, name: str, call: Any, parents: dict[str, Any]) -> None:
        """One entry of dump.json's "data": its tensors as records (an API backward call is not read)."""
        if not isinstance(call, dict):
            self.problems.append(f"{DUMP_JSON} {name!r}: not a JSON object")
            return
        try:
            self._call(run, step, framework, name, call, parents)
        except RecursionError:
            self.problems.append(f"{DUMP_JSON} {name!r}: nested too deeply")

    def _call(self, run: Path, step: int, framework: str, name: str, call: dict[str, Any],
              parents: dict[str, Any]) -> None:
        base = {"step": step}
        grad = _PARAM_GRAD.fullmatch(name)
        module = _MODULE.fullmatch(name)
        api = _API.fullmatch(name) if module is None and grad is None else None
        if grad is not None:
            for param, value in call.items():
                for _, spec in _tensors(value):
                    self.tensor(run, name, spec, base | {"module": f"{grad['path']}.{param}", "type": grad["cls"],
                                                         "kind": Kind.PARAM_GRAD, "io": Io.GRAD, "index": 0})
        elif module is not None and module["dir"] == "forward":
            self._io(run, name, call, base | {"module": module["path"], "type": module["cls"], "kind": Kind.FORWARD})
        elif module is not None:
            for key, io in (("input", Io.GRAD_OUTPUT), ("output", Io.GRAD_INPUT)):
                for index, (_, spec) in enumerate(_tensors(call.get(key))):
                    self.tensor(run, name, spec, base | {"module": module["path"], "type": module["cls"],
                                                         "kind": Kind.BACKWARD, "io": io, "index": index})
        elif api is not None and api["dir"] == "forward":
            parent = parents.get(name)
            owner = _MODULE.fullmatch(parent) if isinstance(parent, str) else None
            path = owner["path"] if owner is not None else ""
            self._io(run, name, call, base | {"module": path, "type": _op_type(framework, api["prefix"], api["api"]),
                                              "kind": Kind.OP, "parent": path})
        elif api is None:
            self.problems.append(f"{DUMP_JSON} {name!r}: not an msprobe module or API call name")

    def _io(self, run: Path, name: str, call: dict[str, Any], fields: dict[str, Any]) -> None:
        """A forward call's inputs (positional, then keyword) and outputs."""
        kwargs = call.get("input_kwargs")
        inputs = list(_tensors(call.get("input_args")))
        if isinstance(kwargs, dict):
            inputs += [item for key, value in kwargs.items() for item in _tensors(value, str(key))]
        for index, (arg, spec) in enumerate(inputs):
            self.tensor(run, name, spec, fields | {"io": Io.INPUT, "index": index, "arg": arg})
        for index, (_, spec) in enumerate(_tensors(call.get("output"))):
            self.tensor(run, name, spec, fields | {"io": Io.OUTPUT, "index": index})


def _op_type(framework: str, prefix: str, api: str) -> str:
    """The op name aligner's op-level dumps use for an msprobe API name: `Functional.conv2d` (PyTorch) ->
    `F.conv2d`, `Primitive.conv2d.Conv2D` -> `ops.Conv2D`, `Mint.add` -> `mint.add`; others as msprobe spells them."""
    if prefix == "Primitive":
        return f"ops.{api.rpartition('.')[2]}"
    found = _OP_PREFIX.get(framework, {}).get(prefix)
    return f"{found}{api}" if found else f"{prefix}.{api}"


def read(root: Path, *, trust_pickle: bool = False) -> ForeignDump:
    """Read an msprobe dump folder: one rank (name its folder when the dump holds several), every step found.

    Raises AlignerError for a dump.json that is not JSON or not msprobe's, and for PyTorch `.pt` tensor files without
    `trust_pickle`; a malformed call or tensor is a problem (skipped), a bad or missing tensor file marks its row.
    """
    reader = _Reader(root, trust_pickle)
    frameworks = set()
    try:
        runs = _runs(root)
    except OSError as exc:
        raise AlignerError(f"{root}: cannot list the msprobe dump ({exc})") from exc
    for run in runs:
        header = reader.index(run, DUMP_JSON)
        data = header.get("data")
        if not isinstance(data, dict):
            raise AlignerError(f"{run / DUMP_JSON}: not an msprobe dump.json (no \"data\" object of calls)")
        framework = str(header.get("framework", "unknown"))
        frameworks.add(framework)
        parents = reader.index(run, CONSTRUCT_JSON) if os.path.lexists(run / CONSTRUCT_JSON) else {}
        # msprobe writes a module call after the API calls inside it; they are read after it instead, so that the
        # module's output does not follow its last API call's identical output (compare folds such a record away)
        inner: dict[str, list[str]] = {}
        for name in data:
            parent = parents.get(name)
            if isinstance(parent, str) and parent in data and _API.fullmatch(name):
                inner.setdefault(parent, []).append(name)
        held = {name for names in inner.values() for name in names}
        for name in (n for n in data if n not in held):
            for each in (name, *inner.get(name, ())):
                reader.call(run, _step(run), framework, each, data[each], parents)
    if reader.pickled and not trust_pickle:
        raise AlignerError(f"{root}: {reader.pickled} tensor(s) of this msprobe dump are torch pickles (.pt); aligner "
                           "loads them only with the explicit opt-in (align compare --trust-pickle, or "
                           "trust_pickle=True; then through torch.load(weights_only=True)), or dump with msprobe task "
                           "\"statistics\" to compare by statistics")
    if len(frameworks) > 1:
        raise AlignerError(f"{root}: steps dumped by different frameworks ({', '.join(sorted(frameworks))})")
    mode = "full" if any(e.path is not None or e.load is not None for e in reader.entries) else "stats"
    return ForeignDump(root, frameworks.pop() if frameworks else "unknown", mode, reader.entries, reader.problems)
