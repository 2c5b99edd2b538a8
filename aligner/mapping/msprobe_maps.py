"""msprobe's own name mappings read as compare's `--map`: `layer_mapping.yaml` (`msprobe compare -lm`) and
`data_mapping.yaml` (`msprobe compare -dm`), in msprobe's format (its compare docs and
`msprobe/core/compare/layer_mapping`): the left side names the MindSpore (NPU) dump, the right the PyTorch (bench)
one; compare applies the renames to whichever side they fit, as with any `--map`.

* layer_mapping.yaml: `{LayerClass: {child: child}}`: inside every module of class `LayerClass` (on the left), the
  child named on the left is the one named on the right; `TopLayer` (older files: `Cell`) holds the model's own
  children; a child may span levels (`a.b: c`), the longest one that fits wins; children named alike need no entry.
* data_mapping.yaml: `{data name: data name}`, e.g.
  `Cell.act.ReLU.forward.0.input.0: Module.relu.ReLU.forward.0.input.0` (renames the module) or
  `Cell.fc.Dense.parameters_grad.weight: Module.head.Linear.parameters_grad.weight` (the parameter); entries
  naming API calls (`Functional.matmul.0.forward.input.0`) and a module renamed two ways are counted as not used:
  aligner pairs API calls by their order within their module.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.mapping.usermap import UserMap, read_yaml

LAYER_MAPPING = "layer_mapping.yaml"
TOP_LAYER = ("TopLayer", "Cell")   # msprobe's name of the model itself in layer_mapping.yaml (older files: Cell)
_MODULE_DATA = re.compile(r"(?:Cell|Module)\.(?P<path>.+)\.[^.]+\.(?:forward|backward)\.\d+\.(?:input|output)(?:\..*)?")
_GRAD_DATA = re.compile(r"(?:Cell|Module)\.(?P<path>.+)\.[^.]+\.parameters_grad\.(?P<param>[^.]+)")


@dataclasses.dataclass(frozen=True)
class MsprobeMap:
    """One msprobe mapping file read: how many module and parameter renames it gave, and how many entries it holds
    that aligner could not use."""

    path: str
    modules: int
    params: int
    unused: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _str_map(path: str, data: Any, what: str) -> dict[str, str]:
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise AlignerError(f"{path}: not an msprobe {what} (expected name: name entries)")
    return data


def _layer_renames(path: str, data: Any, classes: dict[str, str]) -> dict[str, str]:
    """{left module path: right module path} for every left module the layer mapping renames."""
    if not isinstance(data, dict):
        raise AlignerError(f"{path}: not an msprobe {LAYER_MAPPING} (expected LayerClass: {{child: child}} entries)")
    rules: dict[str, list[tuple[list[str], str]]] = {}
    for cls, children in data.items():
        key = TOP_LAYER[0] if cls in TOP_LAYER else str(cls)
        pairs = _str_map(path, children, f"{LAYER_MAPPING} (under {cls!r})")
        rules.setdefault(key, []).extend((left.split("."), right) for left, right in pairs.items())
    for found in rules.values():
        found.sort(key=lambda rule: -len(rule[0]))   # the longest child path first, as msprobe tries them
    renames = {}
    for module in classes:
        parts = module.split(".")
        out: list[str] = []
        i = 0
        while i < len(parts):
            owner = classes.get(".".join(parts[:i])) if i else TOP_LAYER[0]
            rule = next(((left, right) for left, right in rules.get(owner or "", [])
                         if parts[i:i + len(left)] == left), None)
            out.append(rule[1] if rule else parts[i])
            i += len(rule[0]) if rule else 1
        if out != parts:
            renames[module] = ".".join(out)
    return renames


def load_msprobe_maps(paths: list[Path], classes: dict[str, str]) -> tuple[UserMap, list[MsprobeMap]]:
    """One UserMap from msprobe's mapping files (`classes`: the left side's module paths -> class names, which the
    layer mapping is keyed by), and what each file gave; AlignerError naming a file that is not msprobe's format."""
    umap = UserMap(path=", ".join(map(str, paths)))
    read: list[MsprobeMap] = []
    for file in paths:
        path = str(file)
        data = read_yaml(path)
        if file.name == LAYER_MAPPING:
            renames = _layer_renames(path, data, classes)
            umap.modules.update(renames)
            read.append(MsprobeMap(path, len(renames), 0, 0))
            continue
        modules: dict[str, set[str]] = {}
        params = unused = 0
        for left, right in _str_map(path, data, "data_mapping.yaml").items():
            grads = _GRAD_DATA.fullmatch(left), _GRAD_DATA.fullmatch(right)
            calls = _MODULE_DATA.fullmatch(left), _MODULE_DATA.fullmatch(right)
            if grads[0] and grads[1]:
                umap.rename[f"{grads[0]['path']}.{grads[0]['param']}"] = [f"{grads[1]['path']}.{grads[1]['param']}"]
                params += 1
            elif calls[0] and calls[1]:
                modules.setdefault(calls[0]["path"], set()).add(calls[1]["path"])
            else:
                unused += 1
        renamed = {m: next(iter(t)) for m, t in modules.items() if len(t) == 1 and next(iter(t)) != m}
        unused += sum(len(t) > 1 for t in modules.values())
        umap.modules.update(renamed)
        read.append(MsprobeMap(path, len(renamed), params, unused))
    return umap, read
