"""`align repro`: pack one module's recorded call into a standalone directory that rebuilds it in both frameworks.

The module's twin on the other side is what `compare` pairs its forward outputs with; each side gets its own recorded
parameters, call structure and training mode, and both run on the reference side's recorded inputs.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.files import TEXT, read_text
from aligner.core.frameworks import Framework
from aligner.core.nesting import json_loads
from aligner.core.result import PassedByExitCode, check_schema, number, typed
from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.pair.matching import Pair
from aligner.dumping.pair.paired import check_same_model, read_pair
from aligner.dumping.read.source import Item, Source, TensorError, load_tensor
from aligner.pipelines.compare.evaluate import RowStatus, evaluate
from aligner.pipelines.repro.layers import Build, Planned, Recorded, buildable, plan
from aligner.pipelines.repro.script import FOLDER, Layout, SideCode, StandIn, readme, repro_py

MARKER = "repro.json"  # what a repro directory holds; --force replaces only a directory that has it
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


@dataclasses.dataclass(frozen=True)
class ReproResult(PassedByExitCode):
    """The repro directory written for one module: where, which layers, how they are built, how big it is. Its exit
    code is 0 once written (whether the two layers agree is what running its repro.py says)."""

    directory: Path
    reference: Framework
    modules: dict[Framework, str]     # each side's module path
    classes: dict[Framework, str]     # each side's recorded class
    built: dict[Framework, Build]
    stand_ins: dict[Framework, StandIn]  # the sides built as a standard layer standing in for their recorded class
    needs: dict[Framework, tuple[str, ...]]  # each side built by its factory: the packages its layer is made of
    tolerance: Tolerance
    step: int                         # the reference call's step
    diverged: bool                    # whether compare saw this call's outputs diverge
    files: tuple[str, ...]            # relative paths written
    size_bytes: int                   # all files written

    @property
    def exit_code(self) -> ExitCode:
        """0: the directory was written (a repro that could not be written raised AlignerError instead)."""
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "reference": self.reference.value,
                "modules": {k.value: v for k, v in self.modules.items()},
                "classes": {k.value: v for k, v in self.classes.items()},
                "built": {k.value: v.value for k, v in self.built.items()},
                "stand_ins": {k.value: {"class": v.spelling, "layout": v.layout.value, "max_abs_err": v.max_abs_err,
                                        "tolerance": v.tolerance.to_dict(), "left_out": list(v.left_out)}
                              for k, v in self.stand_ins.items()},
                "needs": {k.value: list(v) for k, v in self.needs.items()}, "tolerance": self.tolerance.to_dict(),
                "step": self.step, "diverged": self.diverged, "files": list(self.files), "size_bytes": self.size_bytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReproResult:
        """The result `to_dict` gave; NotAResultError, ValueError, KeyError or TypeError for data that is not one."""
        data = check_schema(data, "repro", ("directory", "modules", "built", "files"))

        def sides(key: str) -> dict[Framework, Any]:
            return {Framework(k): v for k, v in typed(data[key], dict, key).items()}

        return cls(Path(typed(data["directory"], str, "directory")), Framework(data["reference"]),
                   {fw: typed(v, str, "module") for fw, v in sides("modules").items()},
                   {fw: typed(v, str, "class") for fw, v in sides("classes").items()},
                   {fw: Build(v) for fw, v in sides("built").items()},
                   {fw: StandIn(typed(v["class"], str, "class"), Layout(v["layout"]), _float(v["max_abs_err"]),
                                Tolerance(**v["tolerance"]), tuple(typed(n, str, "left out") for n in v["left_out"]))
                    for fw, v in sides("stand_ins").items()},
                   {fw: tuple(typed(n, str, "package") for n in v) for fw, v in sides("needs").items()},
                   Tolerance(**typed(data["tolerance"], dict, "tolerance")), typed(data["step"], int, "step"),
                   typed(data["diverged"], bool, "diverged"), tuple(typed(f, str, "file") for f in data["files"]),
                   typed(data["size_bytes"], int, "size_bytes"))


def _float(value: Any) -> float:
    found = number(value)
    if found is None:
        raise ValueError("a stand-in's measured error is missing")
    return found


@dataclasses.dataclass
class _Side:
    """One dump's records of the chosen call."""

    source: Source
    framework: Framework
    option: str
    output: Item             # the paired forward output record of the call


def _check_target(out: Path, force: bool) -> None:
    """Refuse an output that is not an empty or absent directory, unless --force and it holds a previous repro's
    files and nothing else (the only thing ever deleted)."""
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        raise AlignerError(f"-o {out} exists and is not a directory")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise AlignerError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise AlignerError(f"output directory {parent} is not writable")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise AlignerError(f"-o {out} exists and is not empty (use --force to replace a previous repro)")
    stray = _not_ours(out)
    if stray:
        raise AlignerError(f"-o {out} holds {stray!r}, which `align repro` did not write: left it as it is "
                           "(choose another -o)")


def _not_ours(out: Path) -> str | None:
    """The first entry of `out` a previous repro did not write (None: all of it is a repro's)."""
    try:
        listed = set(json_loads(read_text(out / MARKER, TEXT))["files"]) | {MARKER}
    except (OSError, ValueError, KeyError, TypeError, AlignerError):  # AlignerError: a FIFO, a device, over the cap
        return MARKER + " (missing or unreadable)"
    folders = {str(parent) for f in listed if isinstance(f, str) for parent in Path(f).parents}
    for root, dirs, names in os.walk(out):
        for name in dirs + names:
            path = Path(root) / name
            rel = str(path.relative_to(out))
            if path.is_symlink() or (name in dirs and rel not in folders) or (name in names and rel not in listed):
                return rel
    return None


def _pick(pairs: list[Pair], module: str, tolerance: ToleranceSpec) -> tuple[Item, Item, bool] | None:
    """(non-reference item, reference item, diverged) of the module's first paired forward-output call (its first
    divergent call where there is one), the module named on the reference side or else on the other; only these
    pairs are compared."""
    for side in ("b", "a"):
        calls: dict[tuple[int, int | None], tuple[Item, Item, bool]] = {}
        for pair in pairs:
            a, b = pair.a, pair.b
            if a is None or b is None or not all(it.record.kind == Kind.FORWARD and it.record.io == Io.OUTPUT
                                                 for it in (a, b)):
                continue
            if getattr(pair, side).record.module != module:
                continue
            key = (b.record.step, b.record.call)
            bad = evaluate(pair, tolerance).status is RowStatus.DIVERGED
            first = calls.get(key)
            calls[key] = (a, b, bad or (first is not None and first[2])) if first is None or not first[2] else first
        if calls:
            return next((c for c in calls.values() if c[2]), next(iter(calls.values())))
    return None


def _unknown(module: str, sources: tuple[Source, Source]) -> AlignerError:
    names = sorted({it.record.module for s in sources for it in s.items if it.record.kind == Kind.FORWARD})
    if module in names:
        return AlignerError(f"{module!r} was recorded, but compare paired none of its forward outputs with the other "
                            "dump: there is no twin to repro it against")
    near = difflib.get_close_matches(module, names, n=3, cutoff=0.5)
    return AlignerError(f"no module {module!r} in either dump" + (f"; nearest: {', '.join(near)}" if near else ""))


def _array(item: Item) -> np.ndarray:
    """The item's tensor, read through the hardened reader (bfloat16 widened to float32, losslessly)."""
    try:
        data = load_tensor(item)
    except TensorError as exc:
        raise AlignerError(f"{item.record.module}: {exc}") from None
    return data.astype(np.float32) if item.record.dtype == "bfloat16" else data


def _count(structure: Any) -> int:
    """How many tensor placeholders a recorded call structure holds."""
    if isinstance(structure, dict):
        return int("tensor" in structure) + sum(_count(v) for k, v in structure.items() if k != "tensor")
    if isinstance(structure, list):
        return sum(_count(v) for v in structure)
    return 0


def _call(side: _Side) -> Record:
    rec = side.output.record
    root = side.source.root
    if rec.call is None:
        raise AlignerError(f"{root} has no call structure (a version 1 dump): record it again with "
                           "aligner.dump(model, DIR, params=True)")
    call = side.source.calls.get((rec.step, rec.call))
    if call is None or call.args is None:
        raise AlignerError(f"{root} has no inputs for {rec.module!r} (recorded with inputs=False?): record them with "
                           "aligner.dump(model, DIR, params=True) (inputs are recorded by default)")
    return call


def _attrs(side: _Side, call: Record) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The module's recorded attributes (from its first call of the step) and its submodules', by relative path."""
    path, step = call.module, call.step
    prefix = f"{path}." if path else ""
    own: dict[str, Any] | None = call.attrs
    children: dict[str, dict[str, Any]] = {}
    for _key, rec in sorted(side.source.calls.items(), key=lambda kv: (kv[0][0] != step, kv[1].seq)):
        if rec.attrs is None:
            continue
        if rec.module == path and own is None:
            own = rec.attrs
        elif rec.module.startswith(prefix) and rec.module != path:
            children.setdefault(rec.module[len(prefix):], rec.attrs)
    if own is None:
        raise AlignerError(f"{side.source.root} records no attributes for {path!r}: record it again with "
                           "aligner.dump(model, DIR, params=True)")
    return own, children


def _tensors(side: _Side, call: Record, io: str) -> list[Item]:
    items = [it for it in side.source.items if it.record.kind == Kind.FORWARD and it.record.io == io
             and it.record.module == call.module and it.record.step == call.step and it.record.call == call.call]
    return sorted(items, key=lambda it: it.record.index)


def _state(side: _Side, call: Record) -> dict[str, np.ndarray] | None:
    """The module's recorded parameters and buffers at the start of the call's step, by module-relative name (None
    when the dump holds no parameter values for the step: a layer without parameters needs none)."""
    params = side.source.params
    if not any(step == call.step for step, _ in params):
        return None
    prefix = f"{call.module}." if call.module else ""
    state = {}
    for (step, name), item in params.items():
        if step == call.step and name.startswith(prefix):
            rel = name[len(prefix):]
            if not _SAFE_NAME.fullmatch(rel) or ".." in rel:
                raise AlignerError(f"{side.source.root}: parameter name {name!r} cannot be a file name")
            state[rel] = _array(item)
    return state


def _inputs(side: _Side, call: Record) -> list[Item] | None:
    """The call's recorded input records in order, None unless the dump holds every tensor its structure names."""
    items = _tensors(side, call, Io.INPUT)
    if len(items) != _count(call.args or {}) or any(it.record.index != i for i, it in enumerate(items)):
        return None
    return items


def _recorded(side: _Side, factory: str | None) -> tuple[Recorded, Record]:
    call = _call(side)
    attrs, children = _attrs(side, call)
    inputs = _inputs(side, call)
    own = None if inputs is None else [(_array(it), it.record.dtype) for it in inputs]
    outputs = [_array(it) for it in _tensors(side, call, Io.OUTPUT)]
    return Recorded(side.framework, call.module, side.option, str(side.source.root), attrs, children,
                    call.args or {}, _state(side, call), own, outputs, factory), call


def _write(directory: Path, files: dict[str, np.ndarray | str]) -> int:
    """Write every file under `directory` (created); the bytes written."""
    total = 0
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            np.save(path, content, allow_pickle=False)
        total += path.stat().st_size
    return total


def _commit(tmp: Path, out: Path) -> None:
    """Put the finished temp directory in place; a previous repro (checked to hold only its own files) goes whole."""
    old = None
    if out.exists():
        if any(out.iterdir()):
            old = out.with_name(f".{out.name}.old.{os.getpid()}.{secrets.token_hex(4)}.tmp")
            os.rename(out, old)
        else:
            out.rmdir()
    try:
        os.rename(tmp, out)
    except OSError as exc:
        if old is not None:
            os.rename(old, out)
        raise AlignerError(f"cannot write {out}: {exc.strerror or exc}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def repro(dump_a: str | os.PathLike, dump_b: str | os.PathLike, module: str, out: str | os.PathLike, *,
          ref: str | None = None, factory_a: str | None = None, factory_b: str | None = None,
          tolerance: ToleranceSpec | None = None, force: bool = False) -> ReproResult:
    """Write a standalone directory reproducing `module` of two dumps (`python DIR/repro.py` exits 1 when the two
    frameworks' layers differ on the reference side's recorded inputs, 0 when they agree)."""
    out = Path(out)
    _check_target(out, force)
    paired = read_pair(Path(dump_a), Path(dump_b), ref=ref, tolerance=tolerance)
    ref_index = paired.reference_index
    sources = (paired.reference, paired.migrated) if ref_index == 0 else (paired.migrated, paired.reference)
    frameworks = tuple(Framework.parse(s.framework) for s in sources)
    if set(frameworks) != {Framework.PYTORCH, Framework.MINDSPORE}:
        raise AlignerError(f"align repro needs one PyTorch and one MindSpore dump (manifests say "
                           f"{sources[0].framework} and {sources[1].framework})")
    for s in sources:
        if s.mode != "full":
            raise AlignerError(f"{s.root} is a statistics-only dump: record tensors with "
                               "aligner.dump(model, DIR, params=True) (without stats_only=True)")
    check_same_model(paired.pairs, paired.migrated, paired.reference)
    picked = _pick(paired.pairs, module, paired.tolerance)
    if picked is None:
        raise _unknown(module, sources)
    item_other, item_ref, diverged = picked
    options = ("--factory-a", "--factory-b")
    factories = (factory_a, factory_b)
    sides = {"ref": _Side(sources[ref_index], frameworks[ref_index], options[ref_index], item_ref),  # type: ignore[arg-type]
             "other": _Side(sources[1 - ref_index], frameworks[1 - ref_index], options[1 - ref_index],  # type: ignore[arg-type]
                            item_other)}
    recorded_ref, call_ref = _recorded(sides["ref"], factories[ref_index])
    recorded_other, call_other = _recorded(sides["other"], factories[1 - ref_index])
    unbuildable = [rec for rec in (recorded_ref, recorded_other) if not buildable(rec)]
    if unbuildable:
        what = "; ".join(f"{rec.framework}: {rec.attrs.get('class', '?')}" for rec in unbuildable)
        give = " and ".join(sorted(f"{rec.option} MODULE:CALLABLE" for rec in unbuildable))
        raise AlignerError(f"{module} ({what}) is not a torch.nn / mindspore.nn layer repro can build from its "
                           f"recorded attributes: give {give} (or FILE.py:CALLABLE) returning the whole model")
    inputs_ref = _inputs(sides["ref"], call_ref)
    n_ref, n_other = _count(recorded_ref.structure), _count(recorded_other.structure)
    if inputs_ref is None or recorded_ref.inputs is None:
        held = len(_tensors(sides["ref"], call_ref, Io.INPUT))
        raise AlignerError(f"{sides['ref'].source.root} holds {held} of the {n_ref} input(s) of "
                           f"{call_ref.module!r}: record them with aligner.dump(model, DIR, params=True)")
    if n_other != n_ref:
        raise AlignerError(f"{call_ref.module!r} takes {n_ref} tensor(s) in {sources[ref_index].root} but "
                           f"{call_other.module!r} takes {n_other} in {sources[1 - ref_index].root}: the reference's "
                           "inputs cannot be fed to both")
    inputs = [array for array, _ in recorded_ref.inputs]
    casts = {i: "bfloat16" for i, it in enumerate(inputs_ref) if it.record.dtype == "bfloat16"}
    dtypes = [it.record.dtype for s, c in ((sides["ref"], call_ref), (sides["other"], call_other))
              for it in _tensors(s, c, Io.OUTPUT)]
    spec = tolerance or ToleranceSpec()
    tol = spec.resolve(call_ref.module, *dtypes)
    planned: dict[Framework, Planned] = {rec.framework: plan(rec, casts, tol)
                                         for rec in (recorded_ref, recorded_other)}
    outputs = {rec.framework: rec.outputs for rec in (recorded_ref, recorded_other)}
    reference = sides["ref"].framework
    files: dict[str, np.ndarray | str] = {f"inputs/{i}.npy": a for i, a in enumerate(inputs)}
    for fw, p in planned.items():
        files.update({f"{FOLDER[fw]}/params/{name}.npy": a for name, a in p.state.items()})
        files.update({f"{FOLDER[fw]}/outputs/{i}.npy": a for i, a in enumerate(outputs[fw])})
    codes: dict[Framework, SideCode] = {fw: p.code for fw, p in planned.items()}
    tensor_bytes = sum(a.nbytes for a in files.values() if isinstance(a, np.ndarray))
    labels = {sides[k].framework: str(sides[k].source.root) for k in sides}
    files["repro.py"] = repro_py(codes, reference, len(inputs), tol)
    files["README.md"] = readme(codes, reference, tol, labels, tensor_bytes)
    names = sorted(files) + [MARKER]
    marker = {"format": "aligner-repro", "modules": {fw.value: c.path for fw, c in codes.items()},
              "reference": reference.value, "files": names}
    files[MARKER] = json.dumps(marker, indent=1) + "\n"
    tmp = out.with_name(f".{out.name}.repro.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        size = _write(tmp, files)
        _commit(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AlignerError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ReproResult(out, reference, {fw: c.path for fw, c in codes.items()},
                       {fw: c.klass for fw, c in codes.items()}, {fw: p.how for fw, p in planned.items()},
                       {fw: c.stand_in for fw, c in codes.items() if c.stand_in is not None},
                       {fw: c.needs for fw, c in codes.items() if c.factory is not None}, tol,
                       call_ref.step, diverged, tuple(names), size)
