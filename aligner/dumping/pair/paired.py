"""Two dumps read and paired: both sides read, the reference chosen, their records matched (`read_pair`), and the
check that they are dumps of one model (`check_same_model`); what compare, replay and repro start from."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from aligner import mapping  # --map: the user map's parser is loaded only when one is given
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework, reference_index
from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.dumping.manifest import Kind
from aligner.dumping.pair.matching import MatchedBy, Pair, match, namers, same_layer
from aligner.dumping.read.foreign.layout import Tool, detect, msprobe_maps
from aligner.dumping.read.source import Source, read_source

if TYPE_CHECKING:
    from aligner.mapping import MsprobeMap

# A training-mode forward through BatchNorm normalises by batch statistics, reductions whose summation order differs
# between the frameworks; dividing by them amplifies rounding. Measured on the clean timm/mindcv ResNet-50 pair
# (batch 2, 64x64, tests/zoo/cnn.py): relative L2 error up to 7.3e-6 and max abs error 5.9e-5 (values up to 2.1) by
# layer4, where eval mode stays under 1e-6. rtol = atol = 1e-4 bounds that with 5x margin (1e-4 + 1e-4 * 2.1 = 3.1e-4
# against 5.9e-5), and stays 5x under the smallest real bug measured here (tanh-GELU: 4.7e-4 in one layer).
TRAINING_FLOOR = Tolerance(1e-4, 1e-4)
_TRAINING_REASON = "the reference dump ran BatchNorm in training mode: batch statistics amplify rounding"


SAME_MODEL_MIN_RECORDS = 8  # below this many records per side, too little to tell two models apart
# Pairs that look like the same layer (same module type, or the same shape): on the six zoo pairs with each injected
# bug, at least 69% of the smaller side (ceil_mode changes every later shape, types still agree), 100% on clean pairs;
# two unrelated models pair almost nothing (or pair by container index only, with other types and shapes).
SAME_MODEL_MIN_PAIRED = 0.2


def check_same_model(pairs: list, migrated: Source, reference: Source) -> None:
    """Refuse to compare dumps of two different models: almost nothing pairs up, so any verdict would be noise."""
    records = [0, 0]  # of each side, pass-through calls left out
    for p in pairs:
        if p.matched_by != MatchedBy.FOLDED:
            records[0] += p.a is not None
            records[1] += p.b is not None
    smaller = min(records)
    if smaller < SAME_MODEL_MIN_RECORDS:
        return
    needed = SAME_MODEL_MIN_PAIRED * smaller
    alike = 0
    for p in pairs:  # counted until there are enough: the whole list only for dumps of different models
        if p.a is not None and p.b is not None and same_layer(p.a, p.b):
            alike += 1
            if alike >= needed:
                return
    raise different_models(migrated.root, reference.root, alike, smaller)


def different_models(migrated: Path, reference: Path, alike: int, smaller: int) -> AlignerError:
    """The error `check_same_model` raises: `alike` of the smaller side's `smaller` records pair alike."""
    return AlignerError(
        f"{migrated} and {reference} look like dumps of different models: only {alike} of {smaller} "
        f"records pair with a record of the same layer type or shape (at least {SAME_MODEL_MIN_PAIRED:.0%} "
        f"needed); dump the same model in both frameworks, or pass --map with the renames between them")


def training_floor(tolerance: ToleranceSpec) -> ToleranceSpec:
    """The tolerance with the training-mode floor, for a reference that ran BatchNorm in training mode (it holds
    buffer records)."""
    return dataclasses.replace(tolerance, floor=TRAINING_FLOOR, floor_reason=_TRAINING_REASON)


@dataclasses.dataclass
class Paired:
    """Two dump directories read, the reference side chosen and their records matched (what compare and replay
    start from)."""

    migrated: Source          # the side checked against the reference
    reference: Source
    reference_index: int      # 0: the reference is the first argument, 1: the second
    pairs: list[Pair]         # records of `migrated` (Pair.a) matched with the reference's (Pair.b)
    tolerance: ToleranceSpec  # the caller's, with the training-mode floor when the reference ran BatchNorm training
    maps: list[MsprobeMap] = dataclasses.field(default_factory=list)  # msprobe's mapping files read as the --map


def read_pair(dumps_a: str | Path, dumps_b: str | Path, *, ref: str | None = None, map_file: str | None = None,
              tolerance: ToleranceSpec | None = None, trust_pickle: bool = False) -> Paired:
    """Read both dumps, choose the reference (PyTorch by default) and match their records; AlignerError for a
    missing directory, a bad --map or both arguments naming the same directory. `trust_pickle`: msprobe's PyTorch
    `.pt` tensors may be read (torch.load with weights_only)."""
    tolerance = tolerance or ToleranceSpec()
    rename: Callable[[str], str | None] | None = \
        mapping.load_user_map(map_file).rename_path if map_file is not None else None
    first_source = read_source(dumps_a, trust_pickle=trust_pickle)  # a missing directory is named first
    if Path(dumps_a).resolve() == Path(dumps_b).resolve():  # before the second read, which would be the same
        raise AlignerError(f"both arguments name the same directory {dumps_a}")
    sources = (first_source, read_source(dumps_b, trust_pickle=trust_pickle))
    maps: list[MsprobeMap] = []
    if map_file is None:
        rename, maps = _msprobe_rename(sources)
    r = reference_index(ref, (sources[0].framework, sources[1].framework))
    migrated, reference = sources[1 - r], sources[r]
    if any(it.record.kind == Kind.BUFFER for it in reference.items) and tolerance.floor is None:
        tolerance = training_floor(tolerance)
    first, second = sources
    name_first, name_second = namers(first.items, first.framework, second.framework, second.items, rename)
    names = (name_first, name_second) if r == 1 else (name_second, name_first)
    pairs = match(migrated.items, reference.items, *names)
    return Paired(migrated, reference, r, pairs, tolerance, maps)


def _msprobe_rename(sources: tuple[Source, Source]) -> tuple[Callable[[str], str | None] | None, list[MsprobeMap]]:
    """Without --map: msprobe's own mapping files (layer_mapping.yaml, data_mapping.yaml) in or beside an msprobe
    dump's folder, as the renames compare applies, and what each file gave; (None, []) when there are none. The
    layer mapping is keyed by the classes of the MindSpore side's modules (msprobe's left side; else the first)."""
    found = [(s.root, p) for s in sources for p in msprobe_maps(s.root)]
    paths = list({p.resolve(): p for root, p in found if detect(root) is Tool.MSPROBE}.values())  # files first: cheap
    if not paths:
        return None, []
    left = next((s for s in sources if s.framework == Framework.MINDSPORE), sources[0])
    classes = {it.record.module: it.record.type for it in left.items
               if it.record.kind in (Kind.FORWARD, Kind.BACKWARD) and it.record.type}
    umap, maps = mapping.load_msprobe_maps(paths, classes)
    return umap.rename_path, maps
