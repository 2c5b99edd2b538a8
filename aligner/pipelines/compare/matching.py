"""Pair the records of two sides: by (mapped) module path first, then by execution order and shape in the gaps.

Records with the same key (kind, module, io, index, step, occurrence) on both sides are matched by name. The name
matches that keep execution order (longest increasing subsequence, O(n log n)) anchor the order; between consecutive
anchors, the leftovers of each side are aligned by (kind, io, shape) with a small LCS, or greedily when a gap is big.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from typing import Callable, Hashable, Sequence

from aligner.dumping.manifest import Record
from aligner.io.base import TensorInfo
from aligner.mapping import build_plan
from aligner.pipelines.compare.sources import Item

Namer = Callable[[Record], "str | None"]  # the name a record is matched under (None: match by order only)
_MAX_DP_CELLS = 250_000
_GREEDY_LOOKAHEAD = 64


@dataclasses.dataclass
class Pair:
    """A record of the compared side `a` and its counterpart on the reference side `b` (either may be missing)."""

    a: Item | None
    b: Item | None
    matched_by: str | None = None  # "name" | "order" | None (unmatched)

    @property
    def ref(self) -> Item:
        """The item that names the row (the reference side's when there is one)."""
        return self.b if self.b is not None else self.a  # type: ignore[return-value]


def param_namer(items: Sequence[Item], src: str, dst: str, rename: Callable[[str], "str | None"] | None = None
                ) -> Namer:
    """Names under which one side's records match the other's: the user's renames (`--map`), then, for parameter
    gradients between PyTorch and MindSpore, the conversion's layer rules (`gamma` <-> `weight`, ...)."""
    params: dict[str, str] = {}
    if {src, dst} == {"pytorch", "mindspore"}:
        infos = {it.record.module: TensorInfo(tuple(it.record.shape), it.record.dtype or "float32")
                 for it in items if it.record.kind == "param_grad"}
        for entry in build_plan(infos, src, dst).entries if infos else []:
            if entry.target and len(entry.sources) == 1:
                params[entry.sources[0]] = entry.target

    def name(record: Record) -> str | None:
        module = record.module if rename is None else rename(record.module)
        return params.get(record.module, module) if record.kind == "param_grad" and module is not None else module

    return name


def _keys(items: Sequence[Item], namer: Namer | None) -> list[Hashable | None]:
    """Name keys in order; the nth call of the same module/io/index gets occurrence n. None when renamed away."""
    seen: dict[tuple, int] = defaultdict(int)
    keys: list[Hashable | None] = []
    for item in items:
        r = item.record
        module = r.module if namer is None else namer(r)
        if module is None:
            keys.append(None)
            continue
        base = (r.kind, module, r.io, r.index, r.step)
        keys.append(base + (seen[base],))
        seen[base] += 1
    return keys


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest subsequence of (ia, ib) pairs, sorted by ia, whose ib also increases (patience sorting)."""
    tails: list[int] = []
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for k, (_, ib) in enumerate(pairs):
        pos = bisect.bisect_left(tails, ib)
        if pos == len(tails):
            tails.append(ib)
            tail_idx.append(k)
        else:
            tails[pos] = ib
            tail_idx[pos] = k
        prev[k] = tail_idx[pos - 1] if pos else -1
    out: list[tuple[int, int]] = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = prev[k]
    return out[::-1]


def _signature(item: Item) -> tuple:
    r = item.record
    return r.kind, r.io, tuple(s for s in r.shape if s != 1)


def _align_gap(ga: list[int], gb: list[int], sa: list[tuple], sb: list[tuple]) -> list[tuple[int, int]]:
    """Match two short runs of unnamed leftovers by signature, keeping order (LCS; greedy when the run is long)."""
    if not ga or not gb:
        return []
    if len(ga) * len(gb) > _MAX_DP_CELLS:
        out, j = [], 0
        for i in ga:
            for k in range(j, min(j + _GREEDY_LOOKAHEAD, len(gb))):
                if sa[i] == sb[gb[k]]:
                    out.append((i, gb[k]))
                    j = k + 1
                    break
        return out
    n, m = len(ga), len(gb)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for x in range(n - 1, -1, -1):
        row, below = table[x], table[x + 1]
        for y in range(m - 1, -1, -1):
            row[y] = below[y + 1] + 1 if sa[ga[x]] == sb[gb[y]] else max(below[y], row[y + 1])
    out, x, y = [], 0, 0
    while x < n and y < m:
        if sa[ga[x]] == sb[gb[y]]:
            out.append((ga[x], gb[y]))
            x, y = x + 1, y + 1
        elif table[x + 1][y] >= table[x][y + 1]:
            x += 1
        else:
            y += 1
    return out


def match(items_a: Sequence[Item], items_b: Sequence[Item], name_a: Namer | None = None,
          name_b: Namer | None = None) -> list[Pair]:
    """All records of both sides as pairs, in the reference side's (`b`) execution order, unmatched ones included."""
    keys_a, keys_b = _keys(items_a, name_a), _keys(items_b, name_b)
    where_b = {k: i for i, k in enumerate(keys_b) if k is not None}
    named = sorted((i, where_b[k]) for i, k in enumerate(keys_a) if k is not None and k in where_b)
    partner: dict[int, tuple[int, str]] = {ia: (ib, "name") for ia, ib in named}
    used_b = {ib for _, ib in named}
    anchors = [(-1, -1)] + _increasing(named) + [(len(items_a), len(items_b))]
    sig_a, sig_b = [_signature(it) for it in items_a], [_signature(it) for it in items_b]
    for (a0, b0), (a1, b1) in zip(anchors, anchors[1:]):
        gap_a = [i for i in range(a0 + 1, a1) if i not in partner]
        gap_b = [j for j in range(b0 + 1, b1) if j not in used_b]
        for ia, ib in _align_gap(gap_a, gap_b, sig_a, sig_b):
            partner[ia] = (ib, "order")
            used_b.add(ib)
    # order rows by the reference position; an unmatched `a` record sits right after its predecessor's row
    rows: list[tuple[float, int, Pair]] = []
    by_b = {ib: (ia, how) for ia, (ib, how) in partner.items()}
    for ib, item in enumerate(items_b):
        ia, how = by_b.get(ib, (None, None))
        rows.append((ib, 0, Pair(items_a[ia] if ia is not None else None, item, how)))
    last = -1.0
    for ia, item in enumerate(items_a):
        if ia in partner:
            last = partner[ia][0]
        else:
            rows.append((last + 0.5, ia + 1, Pair(item, None, None)))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [pair for _, _, pair in rows]
