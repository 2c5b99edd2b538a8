"""Noise-calibrated tolerances: measure the reference side's own error against a float64 run of the same model.

`aligner.noise_floor(model, inputs, dir)` records the reference model once in float64 on the same input. Each
reference record is paired with its float64 twin by (step, module, kind, io, index, occurrence): the same model in
the same framework calls the same modules in the same order, whatever the dtype. The reference's error against that
twin (max abs error, relative L2 error) is what its dtype's rounding costs at that layer; a record's tolerance
becomes k times it (k = 3, as the torch minifier's accuracy check uses), never below the per-dtype default. So a
float16 model is judged against float16 noise as it grows through the layers, while an error well above the noise
of its layer is still named, with how many times the noise it is.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Hashable, Sequence

from aligner.core.dtypes import FLOATING
from aligner.core.errors import AlignerError
from aligner.core.tolerance import CALIBRATION_K, Tolerance, ToleranceSpec
from aligner.core.words import Words, words
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.pair.matching import Pair
from aligner.dumping.read.source import Item, Source, TensorError, open_tensor, read_source
from aligner.metrics.measure import Metrics, compare_streams
from aligner.pipelines import compare as package  # the cluster's part loaded on first use: see compare/__init__.py
from aligner.pipelines.compare.says import Say

if TYPE_CHECKING:
    from aligner.pipelines.compare.engine import Engine

# Refuse a float64 dump when fewer than this share of its floating records are float64 (a model that upcasts a few
# tensors itself still passes; a float32 or float16 run does not).
_MIN_FLOAT64 = 0.5
# Refuse when fewer than this share of the reference's floating records (of the kinds and steps the float64 dump
# holds) find a twin of the same shape: another model, or other dump options. A twin run pairs 100%.
_MIN_PAIRED = 0.5
# The model's own input, cast to float64 for the twin run, differs from the reference's only by the reference
# dtype's rounding: relative L2 error <= 2^-9 = 2.0e-3 for bfloat16 (8 significand bits), less for float16/float32.
# 1e-2 leaves a 5x margin; another batch of data gives errors of order 1.
_MAX_INPUT_ERROR = 1e-2


@dataclasses.dataclass(frozen=True)
class Noise:
    """A reference record's own error against its float64 twin: what its dtype's rounding costs at this layer."""

    dtype: str          # the reference record's dtype (the precision this noise belongs to)
    max_abs: float      # largest |ref - float64| (from statistics: the largest difference of min/max/mean)
    rel_l2: float       # ||ref - float64|| / ||float64|| (from statistics: the difference of the norms over the norm)
    method: str         # "elements" or "stats" (both dumps kept only statistics for this record: lower bounds)

    def above(self, metrics: Metrics | None) -> float | None:
        """How many times this noise the compared error is (max abs errors); None when nothing was measured."""
        err = metrics.max_abs_err if metrics is not None else None
        if err is None or not math.isfinite(err):
            return None if err is None else math.inf
        if self.max_abs == 0:
            return None if err == 0 else math.inf
        return err / self.max_abs

    def tolerance(self, default: Tolerance, k: float) -> Tolerance:
        """k times this noise, never below `default` (the per-dtype tolerance of the pair)."""
        return default.raised(k * self.rel_l2, k * self.max_abs)


@dataclasses.dataclass
class Calibration:
    """What calibrating against a float64 dump gave: the noise of each calibrated row, and the rows left out."""

    source: str                                   # the float64 dump directory
    k: float
    noise: dict[int, Noise]                       # row (pair) index -> the reference record's noise
    tolerances: dict[Hashable, Tolerance]         # reference record (step, seq) -> its calibrated tolerance
    missing: dict[int, str] = dataclasses.field(default_factory=dict)  # row -> why it kept the default tolerance
    #                                  (the Words' text: it goes into rows, flat records that msgspec encodes)

    @property
    def from_stats(self) -> int:
        """Rows calibrated from recorded statistics only (lower bounds of the elementwise noise)."""
        return sum(n.method == "stats" for n in self.noise.values())

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "k": self.k, "calibrated": len(self.noise), "not_calibrated": len(self.missing),
                "from_stats": self.from_stats}


def _key(item: Item) -> Hashable:
    return item.record.step, item.record.seq


def _twins(items: Sequence[Item]) -> dict[tuple, Item]:
    """Items by (step, module, kind, io, index, occurrence): the nth record of the same place gets occurrence n."""
    seen: dict[tuple, int] = defaultdict(int)
    out: dict[tuple, Item] = {}
    for item in items:
        r = item.record
        base = (r.step, r.module, r.kind, r.io, r.index)
        out[base + (seen[base],)] = item
        seen[base] += 1
    return out


def _floating(item: Item) -> bool:
    return item.record.dtype in FLOATING


def measure(ref: Item, twin: Item) -> Noise | Words:
    """The noise of `ref` against its float64 twin, or why it cannot be measured."""
    if list(ref.record.shape) != list(twin.record.shape):
        return words(Say.TWIN_SHAPE, twin=twin.record.shape, shape=ref.record.shape)
    if twin.record.dtype != "float64":
        return words(Say.TWIN_DTYPE, dtype=twin.record.dtype)
    if ref.path is not None and twin.path is not None and not ref.error and not twin.error:
        try:
            m = compare_streams(open_tensor(ref), open_tensor(twin))
        except (TensorError, OSError) as exc:
            return words(Say.TWIN_UNREADABLE, error=str(exc))
        if m.max_abs_err is None or m.rel_l2_err is None:
            return words(Say.NOTHING_FINITE)
        if not (math.isfinite(m.max_abs_err) and math.isfinite(m.rel_l2_err)):
            return words(Say.NOISE_NOT_FINITE)
        return Noise(ref.record.dtype, m.max_abs_err, m.rel_l2_err, "elements")
    sr, st = ref.record.stats, twin.record.stats
    if not (sr and st):
        return words(Say.NOTHING_TO_MEASURE)
    diffs = [abs(float(a) - float(b)) for a, b in ((sr.max, st.max), (sr.min, st.min), (sr.mean, st.mean))
             if isinstance(a, (int, float)) and isinstance(b, (int, float))]
    l2r, l2t = sr.l2, st.l2
    if not diffs or not isinstance(l2r, (int, float)) or not isinstance(l2t, (int, float)):
        return words(Say.STATS_LACKING)
    rel = abs(l2r - l2t) / l2t if l2t else (0.0 if l2r == l2t else math.inf)
    if not all(math.isfinite(d) for d in diffs) or not math.isfinite(rel):
        return words(Say.NOISE_NOT_FINITE)
    return Noise(ref.record.dtype, max(diffs), rel, "stats")


def _read_twin_dump(path: str, reference: Source, compared: Source) -> Source:
    """The float64 dump, refused when it cannot calibrate the reference (not a dump, or of another framework)."""
    root = Path(path)
    if root.exists() and any(root.resolve() == s.root.resolve() for s in (reference, compared)):
        raise AlignerError(f"--calibrate {path}: that is one of the compared dumps; record the reference model in "
                           f"float64 into its own directory with aligner.noise_floor(model, inputs, directory)")
    source = read_source(path)
    if source.mode == "npy":
        raise AlignerError(f"--calibrate {path}: not an aligner dump (no manifest); record it with "
                           f"aligner.noise_floor(model, inputs, directory)")
    if source.framework != reference.framework:
        raise AlignerError(f"--calibrate {path}: dumped by {source.framework}, but the reference side "
                           f"{reference.root} is {reference.framework}; record the reference model itself in float64 "
                           f"(or choose the PyTorch side with --ref pytorch)")
    floats = [it for it in source.items if _floating(it)]
    wide = sum(it.record.dtype == "float64" for it in floats)
    if not floats or wide < _MIN_FLOAT64 * len(floats):
        found = sorted({it.record.dtype for it in floats if it.record.dtype != "float64"})
        raise AlignerError(f"--calibrate {path}: not a float64 dump ({wide} of {len(floats)} floating records are "
                           f"float64, the others {', '.join(found) or 'none'}); record it with "
                           f"aligner.noise_floor(model, inputs, directory), which runs a float64 copy of the model")
    return source


def calibrate(path: str, pairs: Sequence[Pair], reference: Source, compared: Source, tolerance: ToleranceSpec,
              k: float = CALIBRATION_K, workers: int | None = None, engine: Engine | None = None) -> Calibration:
    """Measure each reference record's noise against its twin in the float64 dump at `path`; the calibrated
    tolerance of each measured record (k times its noise, at least the pair's per-dtype tolerance).

    Raises AlignerError for a float64 dump that cannot calibrate this comparison: not a dump, another framework, not
    float64, another model or dump options (few records pair), or another input.
    """
    if not (isinstance(k, (int, float)) and math.isfinite(k) and k > 0):
        raise AlignerError(f"--calibrate-k must be a finite number > 0, got {k!r}")
    source = _read_twin_dump(path, reference, compared)
    if source.mode == "stats" and any(p.a is not None and p.b is not None and p.a.path is not None
                                      and p.b.path is not None for p in pairs):
        raise AlignerError(f"--calibrate {path}: a statistics-only dump (stats_only=True) bounds the elementwise noise "
                           f"only from below, too little to calibrate an elementwise comparison; record it with "
                           f"tensors (aligner.noise_floor without stats_only), or compare statistics-only dumps")
    twins = _twins(source.items)
    present = {(it.record.step, it.record.kind) for it in source.items}
    ref_keys = _twins([p.b for p in pairs if p.b is not None])
    row_of = {id(p.b): i for i, p in enumerate(pairs) if p.b is not None}
    todo: list[tuple[int, Item, Item]] = []
    missing: dict[int, str] = {}
    expected = paired = 0
    for key, item in ref_keys.items():
        if not _floating(item):
            continue
        i = row_of[id(item)]
        twin = twins.get(key)
        comparable = (item.record.step, item.record.kind) in present
        expected += comparable
        if twin is None:
            missing[i] = str(words(Say.NO_TWIN) if comparable else
                             words(Say.NO_TWIN_RECORDS, kind=item.record.kind, step=item.record.step))
            continue
        paired += list(twin.record.shape) == list(item.record.shape)
        todo.append((i, item, twin))
    if paired == 0 or paired < _MIN_PAIRED * expected:
        raise AlignerError(f"--calibrate {path}: only {paired} of {expected} floating records of the reference "
                           f"{reference.root} have a float64 twin of the same shape (at least {_MIN_PAIRED:.0%} "
                           f"needed): a dump of another model, or made with other dump options; record the reference "
                           f"model with aligner.noise_floor on the same input and with the same options")
    measured = _measure_all(todo, workers, engine)
    noise: dict[int, Noise] = {}
    tolerances: dict[Hashable, Tolerance] = {}
    for (i, item, _), got in zip(todo, measured):
        if isinstance(got, str):   # why it was not measured (Words, or their text from a remote engine)
            missing[i] = str(got)
            continue
        rec = item.record
        if rec.kind == Kind.FORWARD and rec.io == Io.INPUT and rec.call is not None and rec.parent is None \
                and got.rel_l2 > _MAX_INPUT_ERROR:
            raise AlignerError(f"--calibrate {path}: recorded on another input (the model's input {rec.index} differs "
                               f"from the reference's by a relative error of {got.rel_l2:.1e}, more than "
                               f"{item.record.dtype} rounding); run aligner.noise_floor on the same input")
        other = pairs[i].a
        default = tolerance.for_dtype(*([rec.dtype] + ([other.record.dtype] if other is not None else [])))
        noise[i] = got
        tolerances[_key(item)] = got.tolerance(default, k)
    return Calibration(str(source.root), float(k), noise, tolerances, dict(sorted(missing.items())))


def _measure_all(todo: list[tuple[int, Item, Item]], workers: int | None,
                 engine: Engine | None = None) -> list[Noise | str]:
    """measure() of every (row, reference, twin), each distinct pair of files once: `workers` at a time here, or as
    tasks of `engine` (a cluster's Engine; None: this machine)."""
    first: dict[tuple, int] = {}
    owner = []
    for n, (_, ref, twin) in enumerate(todo):
        key = (ref.path, twin.path) if ref.path is not None and twin.path is not None else (n,)
        owner.append(first.setdefault(key, n))
    unique = sorted(set(owner))
    n_workers = min(workers or os.cpu_count() or 1, max(1, len(unique)))
    if engine is not None:
        done = package.measure_on(engine, [(todo[n][1], todo[n][2]) for n in unique])
    elif n_workers == 1:
        done = [measure(todo[n][1], todo[n][2]) for n in unique]
    else:
        with concurrent.futures.ThreadPoolExecutor(n_workers) as pool:
            done = list(pool.map(lambda n: measure(todo[n][1], todo[n][2]), unique))
    results = dict(zip(unique, done))
    return [results[o] for o in owner]
