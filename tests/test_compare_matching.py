"""Record matching: names first (with call occurrences), then order and shape in the gaps, unmatched reported."""
from __future__ import annotations

from aligner.pipelines.compare.matching import match
from aligner.pipelines.compare.sources import Item
from aligner.dumping.manifest import Record


def _items(names: list[str], shapes: list[list[int]] | None = None, kind: str = "forward") -> list[Item]:
    shapes = shapes or [[4]] * len(names)
    return [Item(Record(seq=i, module=n, type="", kind=kind, io="output", index=0, dtype="float32", shape=s))
            for i, (n, s) in enumerate(zip(names, shapes))]


def _pairs(pairs: list) -> list[tuple]:
    return [(p.a.record.module if p.a else None, p.b.record.module if p.b else None, p.matched_by) for p in pairs]


def test_repeated_calls_match_by_occurrence() -> None:
    a, b = _items(["enc", "act", "enc", "act"]), _items(["enc", "act", "enc", "act"])
    pairs = match(a, b)
    assert [(p.a.record.seq, p.b.record.seq) for p in pairs] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_renamed_records_fall_back_to_order_and_shape() -> None:
    a = _items(["conv", "bn_x", "relu", "fc_x"], [[8], [8], [8], [2]])
    b = _items(["conv", "bn", "relu", "extra", "fc"], [[8], [8], [8], [3], [2]])
    assert _pairs(match(a, b)) == [("conv", "conv", "name"), ("bn_x", "bn", "content"), ("relu", "relu", "name"),
                                   (None, "extra", None), ("fc_x", "fc", "content")]


def test_only_in_first_side_rows_sit_after_their_predecessor() -> None:
    a, b = _items(["x", "debug", "y"], [[4], [9], [4]]), _items(["x", "y"])
    assert _pairs(match(a, b)) == [("x", "x", "name"), ("debug", None, None), ("y", "y", "name")]


def test_forward_and_backward_records_do_not_cross_match() -> None:
    a = _items(["fc"]) + _items(["fc_grad"], kind="backward")
    b = _items(["fc"]) + _items(["fc_g"], kind="backward")
    assert [p.matched_by for p in match(a, b)] == ["name", "content"]
    assert [p.matched_by for p in match(_items(["fc_x"]), _items(["fc"], kind="backward"))] == [None, None]


def test_thousands_of_records_with_renames_scattered_through_them() -> None:
    n = 20000
    names = [f"layers.{i // 4}.op{i % 4}" for i in range(n)]
    a = _items([nm if i % 10 else nm + "_renamed" for i, nm in enumerate(names)])
    b = _items(names)
    pairs = match(a, b)  # anchors + per-gap alignment: an O(n*m) table would be 4e8 cells
    assert len(pairs) == n and all(p.a is not None and p.b is not None for p in pairs)
    assert sum(p.matched_by == "content" for p in pairs) == n // 10
