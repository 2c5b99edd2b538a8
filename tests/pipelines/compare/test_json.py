"""The streamed JSON report (render/compare.py write_compare_json) writes exactly what the generic path writes:
`jsonable` over the whole result, then json.dumps per key and msgspec's compact encoding per row (one row a line).
Compared byte for byte on results with every kind of row: diverged, clean, NaN/Inf metrics (the fallback), one side
only, skipped, non-ASCII names, and more rows than one write holds."""
from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

import aligner
from aligner.pipelines.compare.result import CompareResult, row_record
from aligner.render import compare as render
from aligner.render import report_rows
from aligner.render.jsonout import jsonable
from tests.support.compare_fixtures import chain, write_dump


def reference_json(result: CompareResult) -> str:
    """The report as the generic path writes it (the head as write_compare_json wrote it before it streamed; each
    row msgspec's compact JSON of its jsonable form)."""
    data = jsonable({"summary": render.summary(result), "zoom": render.zoom(result)} | result.to_dict())
    rows = data.pop("rows")
    head = "{\n" + "".join(f"{json.dumps(key)}: {json.dumps(value)},\n" for key, value in data.items())
    return head + '"rows": [\n' + ",\n".join(msgspec.json.encode(r).decode() for r in rows) + "\n]}\n"


def streamed(result: CompareResult) -> str:
    fh = io.StringIO()
    render.write_compare_json(result, fh)
    return fh.getvalue()


def test_every_kind_of_row_is_written_as_the_generic_path_writes_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    layers = [np.tanh, lambda h: h * 2, np.exp, lambda h: h - 1]
    nan_b = lambda h: np.where(h > 0, np.nan, h)  # noqa: E731  (NaN in places the other side lacks: NaN metrics)
    inf_a = lambda h: np.where(h > 1, np.inf, h)  # noqa: E731
    ref = chain(x, layers) + [{"module": "ünïcode.层", "array": x}, {"module": "only_b", "array": x}]
    a = chain(x, layers, bug={1: lambda h: h * 2.5, 2: inf_a}) + [{"module": "ünïcode.层", "array": nan_b(x)},
                                                                 {"module": "only_a", "array": x}]
    result = aligner.compare(write_dump(tmp_path / "a", "mindspore", a), write_dump(tmp_path / "b", "pytorch", ref))
    statuses = {r["status"] for r in result.to_dict()["rows"]}
    assert {"diverged", "ok", "unmatched"} <= statuses
    text = streamed(result)
    assert '"nan"' in text or '"inf"' in text  # a row took the jsonable fallback
    assert text == reference_json(result)
    assert json.loads(text)["rows"] == jsonable(result.to_dict()["rows"])


@pytest.mark.parametrize("records", [1, render._JSON_ROWS, render._JSON_ROWS * 2 + 3])
def test_rows_across_writes(tmp_path: Path, records: int) -> None:
    """Stats-only dumps of `records` rows, the writes' boundaries included."""
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    a = [{"module": f"m.{i}", "array": x * (1.5 if i % 1000 == 7 else 1)} for i in range(records)]
    b = [{"module": f"m.{i}", "array": x} for i in range(records)]
    result = aligner.compare(write_dump(tmp_path / "a", "mindspore", a, mode="stats"),
                             write_dump(tmp_path / "b", "pytorch", b, mode="stats"))
    assert streamed(result) == reference_json(result)


def test_rows_spooled_a_block_at_a_time(tmp_path: Path) -> None:
    """A streamed comparison's rows go into the spool a block at a time (one msgspec call a block): the report is
    what the row-by-row writer writes, with rows holding an infinite error (found by their nulls) in several blocks, a
    module named "null", one whose name holds a lone surrogate (a block msgspec cannot encode), and rows settled
    before their block was written (a window smaller than a block)."""
    n = render._JSON_ROWS * 2 + 3
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    names = [f"m.{i}" for i in range(n)]
    names[5], names[render._JSON_ROWS + 9] = "null", "bad\ud800name"
    zero = {7, render._JSON_ROWS + 1, n - 1}  # the reference all zeros there: the norm's relative error is inf
    a = [{"module": name, "array": x * (1.5 if i % 1000 == 7 else 1)} for i, name in enumerate(names)]
    b = [{"module": name, "array": x * 0 if i in zero else x} for i, name in enumerate(names)]
    result = aligner.compare(write_dump(tmp_path / "a", "mindspore", a, mode="stats"),
                             write_dump(tmp_path / "b", "pytorch", b, mode="stats"))
    assert sum(r.metrics is not None and r.metrics.rel_l2_err == float("inf") for r in result.rows) == len(zero)
    assert any(r.pair.ref.record.module == "bad\ud800name" for r in result.rows)
    spool = render.ReportSpool(json_rows=True, csv_rows=False)
    for i, row in enumerate(result.rows):
        spool.add(i, row)
        if i >= 100 and i - 100 not in result.verdict.labels:
            spool.settled(i - 100)  # 100 rows back: in the block not yet written, or in the one before
    fh = io.StringIO()
    render.write_compare_json(result, fh, spool)
    assert fh.getvalue() == streamed(result)
    # unlabelled, as the spool first writes them (the verdict labels the diverged rows above, which are written again)
    records = [row_record(i, row, None, None) for i, row in enumerate(result.rows)]
    for start in range(0, n, render._JSON_ROWS):
        block = records[start:start + render._JSON_ROWS]
        assert report_rows.rows_lines(block) == b"".join(report_rows.row_bytes(r) + b"\n" for r in block)
