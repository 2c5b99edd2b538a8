"""Order-keeping selections over pairs of positions, shared by every pairing (audit layers, compare records)."""
from __future__ import annotations

import bisect


def longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest chain of (i, j) pairs, given sorted by i, whose j also increases (patience sorting, O(n log n)):
    the matches that agree on the order of both sides."""
    if all(p[1] < q[1] for p, q in zip(pairs, pairs[1:])):  # the usual case, the same order on both sides
        return list(pairs)
    tails: list[int] = []        # tails[k]: the smallest j ending a chain of length k + 1
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_idx.append(n)
        else:
            tails[k], tail_idx[k] = j, n
        prev[n] = tail_idx[k - 1] if k else -1
    chain, n = [], tail_idx[-1] if tail_idx else -1
    while n >= 0:
        chain.append(pairs[n])
        n = prev[n]
    return chain[::-1]
