"""The `align compare` pipeline: read both sides -> match records -> metrics -> verdicts -> a CompareResult."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from aligner import mapping  # --map: the user map's parser is loaded only when one is given
from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework, reference_index
from aligner.core.progress import SILENT, Progress
from aligner.core.tolerance import CALIBRATION_K, Tolerance, ToleranceSpec
from aligner.dumping.manifest import Kind
from aligner.dumping.read.foreign.layout import Tool, detect, msprobe_maps
from aligner.dumping.read.source import Source, read_source
from aligner.pipelines import compare as package  # the parts loaded on first use: see compare/__init__.py
from aligner.pipelines.compare.engine import Engine, LocalEngine
from aligner.pipelines.compare.evaluate import Row, evaluate
from aligner.pipelines.compare.matching import MatchedBy, Pair, match, namers, same_layer
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import bisect as bisect_rows
from aligner.pipelines.compare.verdict import judge

if TYPE_CHECKING:
    from aligner.mapping import MsprobeMap
    from aligner.pipelines.compare.calibrate import Calibration

# A training-mode forward through BatchNorm normalises by batch statistics, reductions whose summation order differs
# between the frameworks; dividing by them amplifies rounding. Measured on the clean timm/mindcv ResNet-50 pair
# (batch 2, 64x64, tests/zoo/cnn.py): relative L2 error up to 7.3e-6 and max abs error 5.9e-5 (values up to 2.1) by
# layer4, where eval mode stays under 1e-6. rtol = atol = 1e-4 bounds that with 5x margin (1e-4 + 1e-4 * 2.1 = 3.1e-4
# against 5.9e-5), and stays 5x under the smallest real bug measured here (tanh-GELU: 4.7e-4 in one layer).
TRAINING_FLOOR = Tolerance(1e-4, 1e-4)
_TRAINING_REASON = "the reference dump ran BatchNorm in training mode: batch statistics amplify rounding"


def label(root: Path, framework: str) -> str:
    """"dumps_ms/ (mindspore)": the framework a known name, or "unknown framework" (never the manifest's own text,
    which the zoom-in code and commands would otherwise echo)."""
    return f"{root} ({Framework.parse(framework) or 'unknown framework'})"


# Below either size one worker is fastest: per-pair Python work dominates, threads queue on the GIL and worker
# processes on handing results back (1024 pairs of 16K-element tensors: 0.19 s in one worker, 0.21 s in two
# processes, ~2x slower in two threads; 64 pairs of 256K-element tensors: 0.089 s in one, 0.064 s in two processes).
_PARALLEL_MIN_ELEMENTS = 1 << 24  # tensor elements of the whole run, both sides
_PARALLEL_MIN_PAIR_ELEMENTS = 1 << 18  # mean tensor elements per pair, both sides


def _parallel(pairs: list[Pair], workers: int) -> bool:
    """Whether this run is worth spreading over `workers`: enough pairs, and big tensors (`package.evaluate_parallel`
    picks processes or threads)."""
    if workers < 2 or len(pairs) < 2 * workers:
        return False
    total = sum(p.elements for p in pairs)
    return not (total < _PARALLEL_MIN_ELEMENTS or total < _PARALLEL_MIN_PAIR_ELEMENTS * len(pairs))


def evaluate_pairs(pairs: list, tolerance: ToleranceSpec, workers: int | None,
              progress: Callable[[], None] | None = None, engine: Engine | None = None) -> list[Row]:
    """Evaluate each distinct pair of tensor files once (an input linked to the output that returned it is the same
    pair of files), then give every row its pair's result."""
    first: dict[tuple, int] = {}
    owner = list(range(len(pairs)))  # the row whose result each row takes (itself, or the first with its files)
    for i, p in enumerate(pairs):
        if p.a is not None and p.b is not None and p.a.path and p.b.path:
            ref = p.b.record
            owner[i] = first.setdefault((p.a.path, p.b.path, tolerance.chosen(ref.module, (ref.step, ref.seq))), i)
    unique = [i for i, o in enumerate(owner) if o == i]
    rows = _evaluate_unique([pairs[i] for i in unique] if len(unique) < len(pairs) else pairs, tolerance, workers,
                            progress, engine)
    if len(unique) == len(pairs):
        return rows
    if progress:
        for _ in range(len(pairs) - len(unique)):
            progress()
    done = dict(zip(unique, rows))
    return [done[i] if owner[i] == i else Row(pairs[i], done[owner[i]].metrics, done[owner[i]].error, read=True)
            for i in range(len(pairs))]


def _evaluate_unique(pairs: list, tolerance: ToleranceSpec, workers: int | None,
                     progress: Callable[[], None] | None = None, engine: Engine | None = None) -> list[Row]:
    """Tasks of `engine` when one is given (a cluster, not the LocalEngine); else one worker for short runs and
    small tensors, or several (`package.evaluate_parallel`: forked worker processes or threads)."""
    if engine is not None and engine.name != LocalEngine.name:
        return package.evaluate_on(engine, pairs, tolerance, progress)
    n = workers or os.cpu_count() or 1
    if _parallel(pairs, n):
        return package.evaluate_parallel(pairs, tolerance, n, progress)
    rows = []
    for pair in pairs:
        rows.append(evaluate(pair, tolerance))
        if progress:
            progress()
    return rows


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
        tolerance = dataclasses.replace(tolerance, floor=TRAINING_FLOOR, floor_reason=_TRAINING_REASON)
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


@gc_paused()
def compare(dumps_a: str, dumps_b: str, *, ref: str | None = None, map_file: str | None = None,
            tolerance: ToleranceSpec | None = None, bisect: bool = False, workers: int | None = None,
            strict: bool = False, calibrate: str | None = None, calibrate_k: float = CALIBRATION_K,
            progress: Progress = SILENT, engine: Engine | None = None, trust_pickle: bool = False) -> CompareResult:
    """Compare dump directory A against the reference B (PyTorch by default) and find where they part.

    calibrate: a float64 dump of the reference model on the same input (`aligner.noise_floor`); each reference
    record's tolerance becomes `calibrate_k` times its own error against float64 where that exceeds the default.
    engine: where the metrics of the pairs are computed (`open_engine`; None or the local engine: here, as `workers`
    says); the calibration pass stays here. trust_pickle: msprobe's PyTorch `.pt` tensors may be read.
    Raises AlignerError for unusable input (missing directory, bad --map, both arguments the same directory, a
    float64 dump that cannot calibrate this comparison, --bisect with an engine).
    """
    if bisect and engine is not None and engine.name != LocalEngine.name:
        raise AlignerError(f"--bisect reads a few pairs one after another: nothing for --engine {engine.name} to "
                           f"distribute")
    paired = read_pair(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance, trust_pickle=trust_pickle)
    migrated, reference, pairs, tolerance = paired.migrated, paired.reference, paired.pairs, paired.tolerance
    check_same_model(pairs, migrated, reference)
    calibration: Calibration | None = None
    if calibrate is not None:
        cluster = engine if engine is not None and engine.name != LocalEngine.name else None
        calibration = package.calibrate_pairs(calibrate, pairs, reference, migrated, tolerance, calibrate_k, workers,
                                              cluster)
        tolerance = dataclasses.replace(tolerance, calibrated=calibration.tolerances,
                                        calibrated_from=calibration.source, calibration_k=calibration.k)
    noise = calibration.noise if calibration is not None else {}

    def noted(i: int, row: Row) -> Row:
        return dataclasses.replace(row, noise=noise[i]) if i in noise else row

    if bisect:
        rows = [noted(i, Row(p)) for i, p in enumerate(pairs)]
        verdict = bisect_rows(rows, lambda i: noted(i, evaluate(pairs[i], tolerance)))
    else:
        with progress.task("comparing", total=len(pairs)) as task:
            rows = evaluate_pairs(pairs, tolerance, workers, task.advance, engine)
        rows = [noted(i, row) for i, row in enumerate(rows)] if noise else rows  # (the others' noise stays None)
        verdict = judge(rows)
    if verdict.findings and migrated.calls and reference.calls:  # the blamed module's settings, from its calls
        verdict = package.with_settings(verdict, rows, migrated, reference)
    return CompareResult(label(migrated.root, migrated.framework), label(reference.root, reference.framework),
                         tuple(rows), verdict,
                         tuple(migrated.problems + reference.problems), tolerance, strict, calibration,
                         tuple(paired.maps))
