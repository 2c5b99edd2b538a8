"""aligner.core.sequences.longest_increasing, the one order-keeping pairing routine (audit layers, compare records),
against a quadratic dynamic programme on random pair lists."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.core.sequences import longest_increasing


def _longest_length(pairs: list[tuple[int, int]]) -> int:
    best = [1] * len(pairs)
    for n in range(len(pairs)):
        for m in range(n):
            if pairs[m][1] < pairs[n][1]:
                best[n] = max(best[n], best[m] + 1)
    return max(best, default=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40))
def test_chain_is_longest_increasing_and_taken_from_the_pairs(js: list[int]) -> None:
    pairs = list(enumerate(js))
    chain = longest_increasing(pairs)
    assert len(chain) == _longest_length(pairs)
    assert all(p in pairs for p in chain)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(chain, chain[1:]))


def test_same_order_is_kept_whole_and_a_swap_drops_one() -> None:
    assert longest_increasing([(0, 0), (1, 2), (2, 5)]) == [(0, 0), (1, 2), (2, 5)]
    assert len(longest_increasing([(0, 0), (1, 3), (2, 2), (3, 4)])) == 3
    assert longest_increasing([]) == []
