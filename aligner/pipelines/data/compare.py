"""`align data A B` / `aligner.compare_data`: two recorded input pipelines compared sample by sample.

Samples are paired by content where some fields agree (the digests of those fields, as a key: an order bug then
shows as a permutation of equal samples), by position otherwise. Each field is then diagnosed on the pairs: an
image field's per-channel statistics are fitted by one affine map per channel (a scale of 1/255, a normalisation
or a channel swap fit exactly; resampling and random augmentation do not), labels by an offset or a one-to-one
mapping, sequences by their pad runs. Thresholds are the limits in mappings/data_rules.yaml.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.words import words
from aligner.dumping.data_format import DataDump, Encoding, FieldData, FieldKind, Layout, rank_folders, read_data_dump
from aligner.pipelines.data.result import (
    DataCompareResult,
    DataFinding,
    FieldComparison,
    FirstDifference,
    Pairing,
    SamplePosition,
)
from aligner.pipelines.data.rules import DataRule, Section, limit
from aligner.pipelines.data.says import Say

STABLE = 0.5   # a field pairs samples when at least this fraction of its digests is found on both sides
UNIQUE = 0.5   # ... and its digests (together) tell at least this fraction of the samples apart
_S = Section.COMPARE


def compare_data(a: str | os.PathLike, b: str | os.PathLike) -> DataCompareResult:
    """Compare two data dumps (aligner.record_data folders, or multi-rank folders of them)."""
    ranks_a, ranks_b = rank_folders(a), rank_folders(b)
    if bool(ranks_a) != bool(ranks_b):
        multi, single = (a, b) if ranks_a else (b, a)
        raise AlignerError(f"{multi} holds rank folders and {single} does not; compare one rank's folder with the "
                           f"other side ({multi}/rank0) or record both runs on all ranks")
    if ranks_a:
        return _compare_ranks(str(a), str(b), ranks_a, ranks_b)
    return _compare(read_data_dump(a), read_data_dump(b))


def _keys(digest: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in np.ascontiguousarray(digest)]


def _combined(parts: list[np.ndarray]) -> list[bytes]:
    return _keys(np.concatenate(parts, axis=1)) if parts else []


def _overlap(x: list[bytes], y: list[bytes]) -> float:
    shared = collections.Counter(x) & collections.Counter(y)
    return sum(shared.values()) / max(len(x), len(y), 1)


def _sources(f: FieldData) -> list[np.ndarray]:
    """The digests a field can pair samples by: its values, and for sequences the tokens without padding."""
    return [f.digest] + ([f.content] if f.content is not None else [])


def _pair(dump_a: DataDump, dump_b: DataDump, ia: np.ndarray, ib: np.ndarray,
          names: list[str]) -> tuple[Pairing, list[tuple[int, int]], list[int], list[int]]:
    """Pairs of sample indices (A, B) in A's order, and the unpaired samples of each side."""
    parts_a, parts_b = [], []
    for name in names:
        for da, db in zip(_sources(dump_a.field(name)), _sources(dump_b.field(name))):
            if _overlap(_keys(da[ia]), _keys(db[ib])) >= STABLE:
                parts_a.append(da[ia])
                parts_b.append(db[ib])
    ka, kb = _combined(parts_a), _combined(parts_b)
    if not ka or len(set(ka)) < UNIQUE * len(ka):
        approx = _approximate(dump_a, dump_b, ia, ib, names)
        if approx is not None:
            return approx
        n = min(len(ia), len(ib))
        return Pairing.POSITION, [(int(ia[k]), int(ib[k])) for k in range(n)], list(map(int, ia[n:])), \
            list(map(int, ib[n:]))
    where: dict[bytes, collections.deque[int]] = collections.defaultdict(collections.deque)
    for k, key in enumerate(kb):
        where[key].append(k)
    pairs, lone_a = [], []
    for k, key in enumerate(ka):
        if where[key]:
            pairs.append((int(ia[k]), int(ib[where[key].popleft()])))
        else:
            lone_a.append(int(ia[k]))
    lone_b = sorted(int(ib[k]) for queue in where.values() for k in queue)
    if lone_a and lone_b and len(ia) == len(ib) and all(i == j for i, j in pairs) \
            and np.array_equal(dump_a.samples[ia], dump_b.samples[ib]):
        # as many samples on each side, every paired one in its place: the lone ones differ in a field the key
        # holds (tokens, labels), they are not missing
        return Pairing.POSITION, list(zip(map(int, ia), map(int, ib))), [], []
    return Pairing.CONTENT, pairs, lone_a, lone_b


def _value_range(f: FieldData) -> float:
    """The spread of a float field's values over all samples (1.0 when there is none)."""
    assert f.stats is not None
    return float(np.nanmax(f.stats[:, :, 3]) - np.nanmin(f.stats[:, :, 2])) or 1.0


def _approximate(dump_a: DataDump, dump_b: DataDump, ia: np.ndarray, ib: np.ndarray,
                 names: list[str]) -> tuple[Pairing, list[tuple[int, int]], list[int], list[int]] | None:
    """Pairs by the statistics of the first image or tensor field, equal within float rounding (two frameworks
    normalising one image differ in the last bits, so no digest agrees); None when too few samples pair."""
    usable = [(dump_a.field(n), dump_b.field(n)) for n in names]
    usable = [(fa, fb) for fa, fb in usable if fa.stats is not None and fb.stats is not None
              and fa.stats.shape[1:] == fb.stats.shape[1:]]
    if not usable:
        return None
    fa, fb = usable[0]
    assert fa.stats is not None and fb.stats is not None
    tol = limit(_S, DataRule.VALUES_DIFFER, "same_within") * _value_range(fa)
    va, vb = fa.stats[ia].reshape(len(ia), -1), fb.stats[ib].reshape(len(ib), -1)
    order = np.argsort(vb[:, 0], kind="stable")
    column = vb[order, 0]
    used = np.zeros(len(ib), dtype=bool)
    pairs, lone_a = [], []
    for k in range(len(ia)):
        lo = int(np.searchsorted(column, va[k, 0] - tol, side="left"))
        hi = int(np.searchsorted(column, va[k, 0] + tol, side="right"))
        match = next((int(order[c]) for c in range(lo, hi)
                      if not used[order[c]] and np.all(np.abs(vb[order[c]] - va[k]) <= tol)), None)
        if match is None:
            lone_a.append(int(ia[k]))
        else:
            used[match] = True
            pairs.append((int(ia[k]), int(ib[match])))
    if len(pairs) < STABLE * max(len(ia), len(ib)):
        return None
    return Pairing.CONTENT, pairs, lone_a, [int(ib[k]) for k in np.flatnonzero(~used)]


def _close(dump_a: DataDump, dump_b: DataDump, fa: FieldData, fb: FieldData, pa: np.ndarray,
           pb: np.ndarray) -> np.ndarray:
    """Which pairs of a float field agree within float rounding (`same_within` of the value range): on the tensors
    where both sides recorded them, else on the statistics."""
    close = np.zeros(len(pa), dtype=bool)
    if fa.stats is None or fb.stats is None or fa.stats.shape[1:] != fb.stats.shape[1:] \
            or fa.spec.shape != fb.spec.shape or "float" not in fa.spec.dtype + fb.spec.dtype:
        return close
    tol = limit(_S, DataRule.VALUES_DIFFER, "same_within") * _value_range(fa)
    close = np.abs(fa.stats[pa] - fb.stats[pb]).max(axis=(1, 2)) <= tol
    if fa.thumb is not None and fb.thumb is not None:  # a flip keeps the statistics, not the block means
        close &= np.abs(fa.thumb[pa] - fb.thumb[pb]).max(axis=(1, 2)) <= tol
    if dump_a.has_tensors and dump_b.has_tensors:
        for k in np.flatnonzero(close):
            ta, tb = dump_a.tensor(fa, int(pa[k])), dump_b.tensor(fb, int(pb[k]))
            assert ta is not None and tb is not None
            close[k] = float(np.abs(ta.astype(np.float64) - tb.astype(np.float64)).max()) <= tol
    return close


def _position(d: DataDump, i: int) -> SamplePosition:
    e, b, r = (int(v) for v in d.samples[i])
    return SamplePosition(i, e, b, r)


def _compare(dump_a: DataDump, dump_b: DataDump) -> DataCompareResult:
    names_a, names_b = [f.name for f in dump_a.fields], [f.name for f in dump_b.fields]
    if set(names_a) != set(names_b):
        only_a, only_b = sorted(set(names_a) - set(names_b)), sorted(set(names_b) - set(names_a))
        raise AlignerError(f"the data dumps record different fields: {dump_a.path} has {names_a}, {dump_b.path} has "
                           f"{names_b} (only in A: {only_a}, only in B: {only_b}); name them alike with "
                           "record_data(..., fields=[...])")
    ia, ib = dump_a.epoch(0), dump_b.epoch(0)
    pairing, pairs, lone_a, lone_b = _pair(dump_a, dump_b, ia, ib, names_a)
    sides = (dump_a.path, dump_b.path)
    findings: list[DataFinding] = []
    if pairing == Pairing.CONTENT:
        findings += _order(dump_a, dump_b, pairs, lone_a, lone_b, names_a, sides)
    pa = np.array([p[0] for p in pairs], dtype=np.int64)
    pb = np.array([p[1] for p in pairs], dtype=np.int64)
    fields, first, agree = [], None, []
    for name in names_a:
        fa, fb = dump_a.field(name), dump_b.field(name)
        equal = (fa.digest[pa] == fb.digest[pb]).all(axis=1)
        equal[~equal] = _close(dump_a, dump_b, fa, fb, pa[~equal], pb[~equal])
        agree.append(equal)
        comparison, found = _field(dump_a, dump_b, fa, fb, pa, pb, equal, sides)
        fields.append(comparison)
        findings += found
        bad = np.flatnonzero(~equal)
        if len(bad) and (first is None or bad[0] < first[0]):
            first = (int(bad[0]), name)
    identical = int(np.all(agree, axis=0).sum()) if len(pa) else 0
    difference = None if first is None else FirstDifference(first[1], _position(dump_a, int(pa[first[0]])),
                                                            _position(dump_b, int(pb[first[0]])))
    return DataCompareResult(dump_a.path, dump_b.path, dump_a.framework, dump_b.framework, len(dump_a.samples),
                             len(dump_b.samples), pairing,
                             identical, tuple(fields), difference, tuple(findings))


def _finding(rule: DataRule, field: str | None, **evidence: Any) -> DataFinding:
    return DataFinding(rule, _S, field, evidence)


def _sequence_of(d: DataDump, names: list[str], epoch: int) -> list[bytes]:
    idx = d.epoch(epoch)
    return _combined([d.field(n).digest[idx] for n in names])


def _reshuffles(d: DataDump, names: list[str]) -> bool | None:
    """Whether a side's second epoch came in another order than its first, judged on the fields that give the same
    values in both epochs (a random augmentation's do not); None: one epoch recorded, or no such field."""
    if d.epochs < 2:
        return None
    steady = [n for n in names if collections.Counter(_sequence_of(d, [n], 0)) ==
              collections.Counter(_sequence_of(d, [n], 1))]
    return _sequence_of(d, steady, 0) != _sequence_of(d, steady, 1) if steady else None


def _order(dump_a: DataDump, dump_b: DataDump, pairs: list[tuple[int, int]], lone_a: list[int], lone_b: list[int],
           names: list[str], sides: tuple[str, str]) -> list[DataFinding]:
    """Findings about which samples each side reads, in which order and batches."""
    sizes_a, sizes_b = dump_a.batch_sizes[0], dump_b.batch_sizes[0]
    if lone_a or lone_b:
        for lone, (sizes, other_sizes, side, oside) in (
                (lone_a, (sizes_a, sizes_b, sides[1], sides[0])),
                (lone_b, (sizes_b, sizes_a, sides[0], sides[1]))):
            if lone and not (lone_a and lone_b) and len(sizes) == len(other_sizes) + 1 \
                    and sizes[-1] == len(lone) and sizes[-1] < sizes[0] and set(other_sizes) == {sizes[0]}:
                return [_finding(DataRule.DROP_LAST, None, side=side, other=oside, dropped=len(lone),
                                 sizes=_sizes(other_sizes), other_sizes=_sizes(sizes))]
        lone, d, side, other = (lone_a, dump_a, sides[0], sides[1]) if lone_a else (lone_b, dump_b, sides[1], sides[0])
        return [_finding(DataRule.SAMPLES_MISSING, None, missing=len(lone), total=len(d.epoch(0)), side=side,
                         other=other, first=lone[0])]
    found = []
    start_a, start_b = np.cumsum([0] + sizes_a), np.cumsum([0] + sizes_b)   # epoch 0: sample i's place is
    place_a = start_a[dump_a.samples[:, 1]] + dump_a.samples[:, 2]           # its batch's start + its row
    place_b = start_b[dump_b.samples[:, 1]] + dump_b.samples[:, 2]
    moved = sum(1 for i, j in pairs if place_a[i] != place_b[j])
    shuffled_a, shuffled_b = _reshuffles(dump_a, names), _reshuffles(dump_b, names)
    if moved:
        if shuffled_a is not None and shuffled_b is not None and shuffled_a != shuffled_b:
            side, other = (sides[0], sides[1]) if shuffled_a else (sides[1], sides[0])
            found.append(_finding(DataRule.SHUFFLE_ONE_SIDE, None, side=side, other=other, moved=moved,
                                  total=len(pairs)))
        elif shuffled_a and shuffled_b:
            found.append(_finding(DataRule.SHUFFLE_SEED, None, moved=moved, total=len(pairs)))
        else:
            note = words(Say.REREADS_ORDER if shuffled_a is False else Say.ONE_EPOCH_ORDER)
            found.append(_finding(DataRule.ORDER_DIFFERS, None, moved=moved, total=len(pairs), note=note))
    elif shuffled_a is not None and shuffled_b is not None and shuffled_a != shuffled_b:
        side, other = (sides[0], sides[1]) if shuffled_a else (sides[1], sides[0])
        found.append(_finding(DataRule.RESHUFFLE_PER_EPOCH, None, side=side, other=other))
    elif sizes_a != sizes_b:
        found.append(_finding(DataRule.BATCH_COMPOSITION, None, sizes=_sizes(sizes_a), other_sizes=_sizes(sizes_b)))
    return found


def _sizes(sizes: list[int]) -> str:
    """Batch sizes in short: 8 x 32 + 4."""
    if not sizes:
        return "none"
    full = sizes[0]
    head = sum(1 for s in sizes if s == full)
    rest = [s for s in sizes[head:]]
    return f"{head} x {full}" + "".join(f" + {s}" for s in rest[:3]) + (" ..." if len(rest) > 3 else "")


def _field(dump_a: DataDump, dump_b: DataDump, fa: FieldData, fb: FieldData, pa: np.ndarray, pb: np.ndarray,
           equal: np.ndarray, sides: tuple[str, str]) -> tuple[FieldComparison, list[DataFinding]]:
    """One field's agreement on the pairs and what explains its differences."""
    comparison = FieldComparison(fa.name, fa.kind.value, fb.kind.value, int(equal.sum()), len(pa))
    if not len(pa):
        return comparison, []
    if fa.kind == FieldKind.IMAGE and fb.kind == FieldKind.IMAGE:
        return _image(dump_a, dump_b, fa, fb, pa, pb, equal, comparison, sides)
    if FieldKind.LABEL in (fa.kind, fb.kind) and _label_values(fa) is not None and _label_values(fb) is not None:
        return comparison, _labels(fa, fb, pa, pb)
    if fa.kind == FieldKind.SEQUENCE and fb.kind == FieldKind.SEQUENCE:
        return comparison, _sequences(fa, fb, pa, pb, sides)
    if equal.all():
        return comparison, []
    bad = np.flatnonzero(~equal)
    return comparison, [_finding(DataRule.VALUES_DIFFER, fa.name, changed=len(bad), total=len(pa),
                                 first=int(pa[bad[0]]), effect=f"; {fa.kind.value} against {fb.kind.value}"
                                 if fa.kind != fb.kind else "")]


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """y ~ s x + t by least squares: (s, t, residual as a fraction of y's spread)."""
    spread = float(np.ptp(y)) or 1.0
    if float(np.ptp(x)) == 0.0:
        return 1.0, float(np.mean(y - x)), float(np.ptp(y - x)) / spread
    s, t = np.polyfit(x, y, 1)
    return float(s), float(t), float(np.sqrt(np.mean((y - (s * x + t)) ** 2))) / spread


def _affine(sa: np.ndarray, sb: np.ndarray, order: list[int]) -> tuple[np.ndarray, np.ndarray, float]:
    """Per channel (side B's channel c against side A's channel order[c]): scale, shift, worst residual; fitted on
    each sample's mean, min and max, which an affine map carries over exactly."""
    fits = [_fit(sa[:, order[c], [0, 2, 3]].ravel(), sb[:, c, [0, 2, 3]].ravel()) for c in range(sb.shape[1])]
    return np.array([f[0] for f in fits]), np.array([f[1] for f in fits]), max(f[2] for f in fits)


def _scale_class(stats: np.ndarray) -> str:
    lo, hi = float(np.nanmin(stats[:, :, 2])), float(np.nanmax(stats[:, :, 3]))
    if lo < -1e-6:
        return "normalised"
    return "0-1" if hi <= 1.0 + 1e-6 else "0-255"


def _numbers(values: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _image(dump_a: DataDump, dump_b: DataDump, fa: FieldData, fb: FieldData, pa: np.ndarray, pb: np.ndarray,
           equal: np.ndarray, comparison: FieldComparison,
           sides: tuple[str, str]) -> tuple[FieldComparison, list[DataFinding]]:
    name, found = fa.name, []
    if fa.spec.layout != fb.spec.layout and Layout.HW not in (fa.spec.layout, fb.spec.layout):
        found.append(_finding(DataRule.LAYOUT, name, layout_a=fa.spec.layout.value, layout_b=fb.spec.layout.value,
                              same=comparison.same, total=comparison.paired))
    if fa.spec.shape != fb.spec.shape:
        found.append(_finding(DataRule.IMAGE_SIZE, name, size_a="x".join(map(str, fa.spec.shape)),
                              size_b="x".join(map(str, fb.spec.shape))))
        return comparison, found
    if equal.all():
        if fa.spec.dtype != fb.spec.dtype:
            found.append(_finding(DataRule.DTYPE, name, dtype_a=fa.spec.dtype, dtype_b=fb.spec.dtype))
        return comparison, found
    assert fa.stats is not None and fb.stats is not None
    sa, sb = fa.stats[pa], fb.stats[pb]
    channels = sa.shape[1]
    scale, shift, residual = _affine(sa, sb, list(range(channels)))
    tol = 1e-3
    identity = bool(np.all(np.abs(scale - 1) < 1e-3) and np.all(np.abs(shift) < 1e-3 * max(np.ptp(sb), 1e-12)))
    if channels == 3:
        rscale, rshift, rresidual = _affine(sa, sb, [2, 1, 0])
        if rresidual < tol and residual > 10 * max(rresidual, 1e-9):
            found.append(_finding(DataRule.CHANNEL_ORDER, name))
            return comparison, found
    if residual < tol and not identity:
        found.append(_affine_finding(name, sa, sb, scale, shift, sides))
        return comparison, found
    comparison, finding = _local(dump_a, dump_b, fa, fb, pa, pb, equal, comparison, sides)
    return comparison, found + [finding]


def _affine_finding(name: str, sa: np.ndarray, sb: np.ndarray, scale: np.ndarray, shift: np.ndarray,
                    sides: tuple[str, str]) -> DataFinding:
    """What an exact per-channel affine map between the sides is: a 1/255 scale, a normalisation missing or applied
    twice, or different constants."""
    ca, cb = _scale_class(sa), _scale_class(sb)
    if {ca, cb} == {"0-1", "0-255"} and np.all(np.abs(shift) < 1e-3 * max(np.ptp(sb), 1.0)):
        raw, scaled = (sides[0], sides[1]) if ca == "0-255" else (sides[1], sides[0])
        return _finding(DataRule.VALUE_RANGE, name, side=raw, other=scaled, scale=float(np.mean(scale)))
    if (ca == "normalised") != (cb == "normalised"):
        # dump_b = (dump_a - m) / sd when dump_b is the normalised side: sd = 1 / scale, m = -shift / scale
        if cb == "normalised":
            std, mean, side, other = 1 / scale, -shift / scale, sides[0], sides[1]
        else:
            std, mean, side, other = scale, shift, sides[1], sides[0]
        return _finding(DataRule.NORMALIZATION_MISSING, name, side=side, other=other, mean=_numbers(mean),
                        std=_numbers(std))
    spread_a, spread_b = float(np.mean(sa[:, :, 1])), float(np.mean(sb[:, :, 1]))
    wide_is_b = spread_b > spread_a
    s, t = (scale, shift) if wide_is_b else (1 / scale, -shift / scale)   # wide = (narrow - m) / sd
    std, mean = 1 / s, -t / s
    narrow = sa if wide_is_b else sb
    looks_normal = bool(np.all(np.abs(narrow[:, :, 0].mean(axis=0)) < 1.0) and
                        np.all((std > 0.05) & (std < 1.0)) and np.all((mean > -0.5) & (mean < 1.5)))
    if ca == cb == "normalised" and looks_normal and max(spread_a, spread_b) > 2 * min(spread_a, spread_b):
        return _finding(DataRule.NORMALIZATION_TWICE, name, side=sides[1] if wide_is_b else sides[0],
                        mean=_numbers(mean), std=_numbers(std))
    return _finding(DataRule.NORMALIZATION_CONSTANTS, name, scale=_numbers(scale), shift=_numbers(shift))


def _random_side(d: DataDump, f: FieldData) -> bool | None:
    """Whether a side's field gave other values for its samples in its second epoch (None: one epoch recorded)."""
    if d.epochs < 2:
        return None
    return _overlap(_keys(f.digest[d.epoch(0)]), _keys(f.digest[d.epoch(1)])) < 0.95


def _local(dump_a: DataDump, dump_b: DataDump, fa: FieldData, fb: FieldData, pa: np.ndarray, pb: np.ndarray,
           equal: np.ndarray, comparison: FieldComparison,
           sides: tuple[str, str]) -> tuple[FieldComparison, DataFinding]:
    """Samples that differ with no map between the sides: small everywhere (resampling), strong in some (random
    augmentation), or only in dtype; measured on the tensors where both sides recorded them, else on statistics."""
    name, bad = fa.name, np.flatnonzero(~equal)
    assert fa.stats is not None and fb.stats is not None
    value_range = _value_range(fa)
    psnr = max_error = None
    if dump_a.has_tensors and dump_b.has_tensors:
        errors = []
        for k in bad:
            ta, tb = dump_a.tensor(fa, int(pa[k])), dump_b.tensor(fb, int(pb[k]))
            assert ta is not None and tb is not None
            diff = np.abs(ta.astype(np.float64) - tb.astype(np.float64))
            errors.append((float(np.mean(diff ** 2)), float(diff.max())))
        mse = np.array([e[0] for e in errors])
        if not mse.any():
            return comparison, _finding(DataRule.DTYPE, name, dtype_a=fa.spec.dtype, dtype_b=fb.spec.dtype)
        scores = 10 * np.log10(value_range ** 2 / np.maximum(mse, 1e-30))
        psnr, max_error = float(np.median(scores)), max(e[1] for e in errors) / value_range
        strong = int((scores < limit(_S, DataRule.INTERPOLATION, "psnr")).sum())
    else:
        moved = np.abs(fa.stats[pa[bad]] - fb.stats[pb[bad]]).max(axis=(1, 2)) / value_range
        if fa.thumb is not None and fb.thumb is not None:
            moved = np.maximum(moved, np.abs(fa.thumb[pa[bad]] - fb.thumb[pb[bad]]).max(axis=(1, 2)) / value_range)
        strong = int((moved > limit(_S, DataRule.AUGMENTATION, "stat_change")).sum())
    comparison = FieldComparison(comparison.name, comparison.kind_a, comparison.kind_b, comparison.same,
                                 comparison.paired, psnr, max_error)
    shown = "-" if psnr is None else f"{psnr:.1f}"
    # resampling changes every sample a little; a random transform changes some strongly, or some only (a flip keeps
    # every statistic, so without tensors only the share of changed samples tells it). Two epochs on each side tell
    # it for sure: a random transform gives other values in the second epoch, resampling the same ones.
    random_a, random_b = _random_side(dump_a, fa), _random_side(dump_b, fb)
    some = len(bad) < limit(_S, DataRule.AUGMENTATION, "partial") * len(pa)
    if random_a is None or random_b is None:
        augmented = some or strong >= limit(_S, DataRule.AUGMENTATION, "fraction") * len(pa)
    else:
        augmented = random_a or random_b
    if augmented:
        active = words(Say.RANDOM_BOTH) if random_a and random_b else words(Say.RANDOM_ON, side=sides[0]) \
            if random_a else words(Say.RANDOM_ON, side=sides[1]) if random_b else words(Say.RANDOM_UNKNOWN)
        return comparison, _finding(DataRule.AUGMENTATION, name, changed=len(bad), total=len(pa), psnr=shown,
                                    active=active)
    alike = "" if random_a is None or random_b is None else ", alike in both epochs"
    return comparison, _finding(DataRule.INTERPOLATION, name, changed=len(bad), total=len(pa), psnr=shown,
                                max_abs="-" if max_error is None else f"{max_error:.3g}", alike=alike)


def _label_values(f: FieldData) -> np.ndarray | None:
    """A field's class per sample: a label field's, or a scalar float field holding whole numbers (labels read as
    floats on one side); None otherwise."""
    if f.label is not None:
        return f.label
    if f.kind == FieldKind.TENSOR and f.spec.shape == () and f.stats is not None:
        values = f.stats[:, 0, 0]
        if np.all(np.isfinite(values)) and np.array_equal(values, np.round(values)):
            return values.astype(np.int64)
    return None


def _labels(fa: FieldData, fb: FieldData, pa: np.ndarray, pb: np.ndarray) -> list[DataFinding]:
    """Labels compared: encoding, then a constant offset, a one-to-one mapping, or other differences."""
    values_a, values_b = _label_values(fa), _label_values(fb)
    assert values_a is not None and values_b is not None
    found = []
    if fa.spec.encoding != fb.spec.encoding and Encoding.NONE not in (fa.spec.encoding, fb.spec.encoding):
        found.append(_finding(DataRule.ONE_HOT, fa.name, enc_a=fa.spec.encoding.value, enc_b=fb.spec.encoding.value))
    la, lb = values_a[pa], values_b[pb]
    bad = np.flatnonzero(la != lb)
    if not len(bad):
        if fa.kind != fb.kind:  # the same classes, one side as floats
            found.append(_finding(DataRule.DTYPE, fa.name, dtype_a=fa.spec.dtype, dtype_b=fb.spec.dtype))
        return found
    offsets = np.unique(lb - la)
    if len(offsets) == 1:
        return found + [_finding(DataRule.LABEL_OFFSET, fa.name, offset=int(offsets[0]))]
    forward: dict[int, set[int]] = collections.defaultdict(set)
    backward: dict[int, set[int]] = collections.defaultdict(set)
    for x, y in zip(la.tolist(), lb.tolist()):
        forward[x].add(y)
        backward[y].add(x)
    if all(len(v) == 1 for v in forward.values()) and all(len(v) == 1 for v in backward.values()):
        moved = sorted((x, next(iter(ys))) for x, ys in forward.items() if next(iter(ys)) != x)
        pairs = ", ".join(f"{x} -> {y}" for x, y in moved[:6]) + (" ..." if len(moved) > 6 else "")
        return found + [_finding(DataRule.LABEL_PERMUTATION, fa.name, pairs=pairs)]
    return found + [_finding(DataRule.LABELS_DIFFER, fa.name, changed=len(bad), total=len(pa), first=int(pa[bad[0]]),
                             value_a=int(la[bad[0]]), value_b=int(lb[bad[0]]))]


def _side_of(seq: np.ndarray) -> str | None:
    left, right = int((seq[:, 1] > 0).sum()), int((seq[:, 2] > 0).sum())
    if not left and not right:
        return None
    return "left" if left > right else "right"


def _sequences(fa: FieldData, fb: FieldData, pa: np.ndarray, pb: np.ndarray,
               sides: tuple[str, str]) -> list[DataFinding]:
    assert fa.seq is not None and fb.seq is not None and fa.content is not None and fb.content is not None
    name, found = fa.name, []
    sa, sb = fa.seq[pa], fb.seq[pb]
    side_a, side_b = _side_of(sa), _side_of(sb)
    if side_a and side_b and side_a != side_b:
        found.append(_finding(DataRule.PAD_SIDE, name, side_a=side_a, side_b=side_b))
    if side_a and side_b and fa.spec.pad != fb.spec.pad:
        found.append(_finding(DataRule.PAD_VALUE, name, pad_a=fa.spec.pad, pad_b=fb.spec.pad))
    same = (fa.content[pa] == fb.content[pb]).all(axis=1)
    if same.all():
        if not found and fa.spec.shape != fb.spec.shape:
            found.append(_finding(DataRule.PAD_LENGTH, name, len_a=fa.spec.shape[0], len_b=fb.spec.shape[0]))
        return found
    bad = np.flatnonzero(~same)
    len_a, len_b = sa[:, 0], sb[:, 0]
    # cut on neither side: padding left in the row on both (a row's length is its tokens plus its padding)
    room = bad[(len_a[bad] < sa[bad].sum(axis=1)) & (len_b[bad] < sb[bad].sum(axis=1))]
    extra = np.unique(len_b[room] - len_a[room])
    if len(room) and len(extra) == 1 and 1 <= abs(int(extra[0])) <= 2:
        more, fewer = (sides[1], sides[0]) if extra[0] > 0 else (sides[0], sides[1])
        return found + [_finding(DataRule.SPECIAL_TOKENS, name, side=more, other=fewer, count=abs(int(extra[0])),
                                 changed=len(bad), total=len(pa))]
    max_a, max_b = int(len_a.max()), int(len_b.max())
    short = len_a if max_a < max_b else len_b
    if max_a != max_b and np.all(short[bad] == min(max_a, max_b)):
        return found + [_finding(DataRule.TRUNCATION, name, max_a=max_a, max_b=max_b, changed=len(bad))]
    return found + [_finding(DataRule.TOKENS_DIFFER, name, changed=len(bad), total=len(pa), first=int(pa[bad[0]]))]


def rank_keys(d: DataDump) -> list[bytes]:
    """Each first-epoch sample of a rank's dump as one key over all its fields."""
    return _combined([f.digest[d.epoch(0)] for f in d.fields])


def sharding(dumps: dict[int, DataDump], side: str, section: Section) -> list[DataFinding]:
    """The ranks of one side: all reading one shard, or two ranks sharing more samples than a sampler's padding."""
    keys = {r: rank_keys(d) for r, d in dumps.items()}
    world = len(keys)
    if world < 2:
        return []
    sets = list(keys.values())
    if all(collections.Counter(s) == collections.Counter(sets[0]) for s in sets[1:]):
        return [DataFinding(DataRule.SAME_SHARD, section, None, {"side": side, "ranks": world,
                                                                 "samples": len(sets[0])})]
    ranks = sorted(keys)
    for x in range(len(ranks)):
        for y in range(x + 1, len(ranks)):
            shared = len(set(keys[ranks[x]]) & set(keys[ranks[y]]))
            if shared > world:
                return [DataFinding(DataRule.SHARD_OVERLAP, section, None,
                                    {"side": side, "rank_a": ranks[x], "rank_b": ranks[y], "shared": shared,
                                     "allowed": world})]
    return []


def _all_digests(d: DataDump) -> np.ndarray:
    return np.concatenate([f.digest for f in d.fields], axis=1)


def _union(dumps: dict[int, DataDump]) -> DataDump:
    """The first epochs of all ranks as one dump (no tensors), for what the ranks read together."""
    parts = [d for _, d in sorted(dumps.items())]
    idx = [d.epoch(0) for d in parts]
    first = parts[0]
    fields = []
    for k, f in enumerate(first.fields):
        def joined(attr: str, k: int = k) -> np.ndarray | None:
            arrays = [getattr(d.fields[k], attr) for d in parts]
            return None if arrays[0] is None else np.concatenate([a[i] for a, i in zip(arrays, idx)])
        digest, nonfinite = joined("digest"), joined("nonfinite")
        assert digest is not None and nonfinite is not None
        fields.append(FieldData(f.spec, k, digest, nonfinite, joined("stats"), joined("seq"), joined("content"),
                                joined("label")))
    samples = np.concatenate([d.samples[i] for d, i in zip(parts, idx)])
    samples[:, 0] = 0
    return DataDump(first.path, first.header | {"tensors": False}, samples, fields)


def _compare_ranks(a: str, b: str, ranks_a: dict[int, Any], ranks_b: dict[int, Any]) -> DataCompareResult:
    if set(ranks_a) != set(ranks_b):
        raise AlignerError(f"the sides hold different ranks: {a} has {sorted(ranks_a)}, {b} has {sorted(ranks_b)}")
    dumps_a = {r: read_data_dump(p) for r, p in ranks_a.items()}
    dumps_b = {r: read_data_dump(p) for r, p in ranks_b.items()}
    results = tuple((r, _compare(dumps_a[r], dumps_b[r])) for r in sorted(ranks_a))
    findings = sharding(dumps_a, a, _S) + sharding(dumps_b, b, _S)
    union_a, union_b = _union(dumps_a), _union(dumps_b)
    names = [f.name for f in union_a.fields]
    if names == [f.name for f in union_b.fields]:
        pairing, pairs, lone_a, lone_b = _pair(union_a, union_b, union_a.epoch(0), union_b.epoch(0), names)
        if pairing == Pairing.CONTENT:
            # samples of one side's union no rank of the other reads (lone_a: side A's, so missing on side B); a
            # lone sample repeating a paired one is a sampler's padding, not a missing sample
            for side, other, reader, lone, paired in ((b, a, union_a, lone_a, [i for i, _ in pairs]),
                                                      (a, b, union_b, lone_b, [j for _, j in pairs])):
                keys = _keys(_all_digests(reader))
                missing = {keys[i] for i in lone} - {keys[i] for i in paired}
                if missing:
                    findings.append(_finding(DataRule.SHARD_MISSING, None, side=side, other=other,
                                             missing=len(missing)))
    if not findings:  # the ranks together read the same samples: a rank reading others is the shards' assignment
        moved = [r for r, res in results if any(f.rule == DataRule.SAMPLES_MISSING for f in res.findings)]
        if moved:
            results = tuple((r, dataclasses.replace(res, findings=tuple(
                f for f in res.findings if f.rule != DataRule.SAMPLES_MISSING))) for r, res in results)
            findings.append(_finding(DataRule.SHARD_ASSIGNMENT, None, ranks=", ".join(map(str, moved))))
    first = results[0][1]
    return DataCompareResult(a, b, first.framework_a, first.framework_b, sum(r.samples_a for _, r in results),
                             sum(r.samples_b for _, r in results), first.pairing,
                             sum(r.identical for _, r in results), (), None, tuple(findings), results)
