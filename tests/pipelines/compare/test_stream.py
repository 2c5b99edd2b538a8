"""`align compare` streamed (aligner/pipelines/compare/stream.py): the same reports and verdict as reading both dumps
whole, the whole-list path where the dumps do not pair in step, memory that does not grow with the record count, and
bad input met mid-stream as one line and exit 2."""
from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from aligner.dumping.read import stream as read_stream
from aligner.pipelines.compare import stream
from aligner.pipelines.compare.run import compare
from aligner.pipelines.compare.stream import Fallback, compare_streamed
from aligner.render.compare import ReportSpool, print_table, summary, write_compare_json, write_csv
from aligner.render.jsonout import jsonable
from tests.support.cli import assert_one_line_error, run_align
from tests.support.compare_fixtures import chain, write_dump

LAYERS = [lambda h: h * 1.5, np.tanh, lambda h: h[:, ::-1] * 0.5, np.exp, lambda h: h - 1.0, np.sin,
          lambda h: h * h, np.cos] * 3  # 24 layers, 48 records with their inputs


def _dumps(tmp_path: Path, bug: dict[int, Any] | None, mode: str = "full", steps: int = 1,
           inputs: bool = True) -> tuple[Path, Path]:
    """A MindSpore side with `bug` and a PyTorch side without, `steps` steps of the 24-layer chain."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    good = [dict(r, step=s) for s in range(steps) for r in chain(x, LAYERS, inputs=inputs)]
    bad = [dict(r, step=s) for s in range(steps) for r in chain(x, LAYERS, bug, inputs=inputs)]
    return write_dump(tmp_path / "ms", "mindspore", bad, mode), write_dump(tmp_path / "pt", "pytorch", good, mode)


def _reports(result: Any, out: Path, spool: ReportSpool | None = None) -> dict[str, str]:
    """The JSON and CSV reports, the table and the paragraph of a result, as the CLI writes them."""
    texts = {}
    for name, writer in (("json", write_compare_json), ("csv", write_csv)):
        path = out.with_suffix(f".{name}")
        with open(path, "w", encoding="utf-8") as fh:
            writer(result, fh, spool if result.tally is not None else None)
        texts[name] = path.read_text(encoding="utf-8")
    console = Console(width=200, record=True, color_system=None, file=open(os.devnull, "w"))
    print_table(result, console)
    texts["table"] = console.export_text()
    texts["summary"] = summary(result)
    return texts


def _both(a: Path, b: Path, out: Path, **options: Any) -> tuple[Any, dict[str, str], Any, dict[str, str]]:
    """The whole-list result and reports, and the streamed ones (a spool taking the rows)."""
    whole = compare(str(a), str(b), **options)
    spool = ReportSpool(json_rows=True, csv_rows=True)
    streamed = compare_streamed(str(a), str(b), sink=spool, **options)
    return whole, _reports(whole, out / "whole"), streamed, _reports(streamed, out / "streamed", spool)


CASES = {
    "clean": dict(bug=None),
    "layer 13": dict(bug={13: lambda h: h * 1.01}),
    "nan": dict(bug={5: lambda h: np.where(h > 0.5, np.nan, h)}),
    "two steps": dict(bug={20: lambda h: h + 0.1}, steps=2),
    "stats": dict(bug={9: np.cosh}, mode="stats"),
    "no inputs": dict(bug={2: np.arctan}, inputs=False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_streamed_reports_equal_whole(tmp_path: Path, case: str, order: str) -> None:
    ms, pt = _dumps(tmp_path, **CASES[case])
    a, b = (ms, pt) if order == "ab" else (pt, ms)
    whole, whole_text, streamed, streamed_text = _both(a, b, tmp_path)
    assert streamed.streamed.fallback is None and streamed.streamed.evicted == 0
    assert streamed.tally is not None  # the rows went through the spools, not the result
    assert streamed.verdict == whole.verdict
    assert streamed_text == whole_text
    assert streamed.exit_code == whole.exit_code


def test_small_window_keeps_the_findings(tmp_path: Path) -> None:
    """Rows leave a 4-row window (48 records): the findings, NaN origin and every row's numbers are the whole-list
    ones; labels are kept for the rows around the first divergence only."""
    ms, pt = _dumps(tmp_path, bug={17: lambda h: h * 1.01})
    whole = compare(str(ms), str(pt))
    spool = ReportSpool(json_rows=True, csv_rows=False)
    streamed = compare_streamed(str(ms), str(pt), sink=spool, window=4)
    assert streamed.streamed.evicted > 0
    assert streamed.verdict.findings == whole.verdict.findings
    assert streamed.verdict.nan_origin == whole.verdict.nan_origin
    path = tmp_path / "s.json"
    with open(path, "w", encoding="utf-8") as fh:
        write_compare_json(streamed, fh, spool)
    rows, expected = json.loads(path.read_text())["rows"], whole.to_dict()["rows"]
    assert len(rows) == len(expected) == 48
    labelled = {r["row"] for r in rows if r["label"] is not None}
    assert {whole.verdict.findings[0].origin} <= labelled < {i for i, r in enumerate(expected) if r["label"]}
    for got, want in zip(rows, expected):
        want = jsonable(want)
        assert {k: v for k, v in got.items() if k != "label"} == {k: v for k, v in want.items() if k != "label"}
        assert got["label"] in (None, want["label"])


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "manifest.jsonl").read_text().splitlines()]


def _rewrite(path: Path, lines: list[dict[str, Any]]) -> None:
    (path / "manifest.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


EDITS = {  # a record on one side only, a module renamed on one side, a record turned into an op record
    "lengths": lambda lines: lines.__delitem__(30),
    "order": lambda lines: lines[20].update(module="renamed"),
    "ops": lambda lines: lines[40].update(kind="op", type="Tensor.__mul__"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_dumps_out_of_step_resynchronise(tmp_path: Path, edit: str) -> None:
    """Where the two dumps part record by record (what read them whole before the window resynchronised them), the
    streamed reports are the whole-list ones."""
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    lines = _records(ms)
    EDITS[edit](lines)
    _rewrite(ms, lines)
    whole, whole_text, streamed, streamed_text = _both(ms, pt, tmp_path)
    assert streamed.streamed.fallback is None and streamed.tally is not None
    assert streamed_text == whole_text
    assert streamed.verdict == whole.verdict


def test_options_read_whole(tmp_path: Path) -> None:
    """--bisect reads a few pairs one after another: the result is the whole-list one, every row, the reason kept."""
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    whole, whole_text, streamed, streamed_text = _both(ms, pt, tmp_path, bisect=True)
    assert streamed.streamed.fallback == Fallback.OPTIONS.value and streamed.tally is None
    assert streamed_text == whole_text
    assert streamed.rows == whole.rows


def _stats_dump(root: Path, framework: str, records: int, diverge_from: int, extra: int = 0,
                model: int = 1000) -> Path:
    """A stats-only dump of `records` forward outputs, shifted from record `diverge_from` on: a model of `model`
    module calls a step (the same module paths each step). With `extra`, a call on this side only after every
    `extra` records, handing back the record before it (a Dropout or Identity the other framework does not record:
    folded away)."""
    root.mkdir()
    header = {"format": "aligner-dump", "version": 2, "framework": framework, "framework_version": "x",
              "aligner_version": "x", "mode": "stats", "seed": None, "rank": None, "world_size": None}
    seq = 0
    with open(root / "manifest.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        for i in range(records):
            v = 1.0 + (i % 97) / 100 + (0.5 if i >= diverge_from else 0.0)
            stats = {"min": -v, "max": v, "mean": v / 10, "l2": v * 30, "nan": 0, "inf": 0}
            layer, step = (i % model) // 10, i // model
            calls = [(f"layers.{layer}.fc{i % 10}", "Dense")]
            if extra and i % extra == extra - 1:
                calls.append((f"layers.{layer}.drop{i % 10}", "Dropout"))
            for module, kind in calls:
                seq += 1
                fh.write(json.dumps({"seq": seq, "step": step, "module": module, "type": kind, "kind": "forward",
                                     "io": "output", "index": 0, "dtype": "float32", "shape": [4, 1024],
                                     "stats": stats, "file": None, "call": seq, "parent": f"layers.{layer}"}) + "\n")
    return root


def _peak(tmp_path: Path, records: int, extra: int) -> int:
    """Python's peak allocation while comparing `records` stats records a side, streamed with a JSON and a CSV
    spool (the manifests read in 64 KiB blocks, paired 256 records at a time, 256 rows kept before the first
    divergence: all three far below the record count, as they are at a million records at their defaults)."""
    a = _stats_dump(tmp_path / f"a{records}", "mindspore", records, records // 2, extra)
    b = _stats_dump(tmp_path / f"b{records}", "pytorch", records, records)
    spool = ReportSpool(json_rows=True, csv_rows=True)
    tracemalloc.start()
    try:
        result = compare_streamed(str(a), str(b), sink=spool, window=256)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.streamed.fallback is None and result.streamed.evicted > 0
    # the first diverged row: record records // 2, after the calls on one side only before it
    assert result.verdict.findings[0].first == records // 2 + (records // 2 // extra if extra else 0)
    assert result.matched["folded_a"] == (records // extra if extra else 0)
    return peak


@pytest.mark.parametrize("extra", [0, 50])
def test_memory_does_not_grow_with_the_record_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    extra: int) -> None:
    """Python's peak allocation comparing 4N records a side is within 25% of N's (N = 3,000; 3 and 12 steps of a
    1,000-call model): the same blocks in flight and the same window, whether the two sides pair in step or one side
    records a call the other lacks every 50 records (paired a window at a time). Holding the records or the rows
    would take ~4x (each record and row is a few KB); the 25% covers what grows with the model or the step: the
    distinct module paths, the occurrence counts of the step's name keys, and the readers' link table of 16 bytes a
    record of the step."""
    monkeypatch.setattr(read_stream, "BLOCK", 1 << 16)
    monkeypatch.setattr(stream, "BLOCK", 256)
    small, large = _peak(tmp_path, 3_000, extra), _peak(tmp_path, 12_000, extra)
    assert large < 1.25 * small, (small, large)


def test_long_reports_from_the_writer_process(tmp_path: Path) -> None:
    """Past render's _WRITER_FROM rows (16,384) a writer process encodes the JSON and CSV rows: a 40,000-record
    comparison, diverged from record 30,000 to its last (rows the verdict labels, written again, the last row among
    them), writes the reports the whole-list path writes, byte for byte, its rows past the start written by the
    writer; so does one that writes the CSV alone."""
    a = _stats_dump(tmp_path / "a", "mindspore", 40_000, 30_000)
    b = _stats_dump(tmp_path / "b", "pytorch", 40_000, 40_000)
    spool = ReportSpool(json_rows=True, csv_rows=True)
    try:
        streamed = compare_streamed(str(a), str(b), sink=spool)
        streamed_reports = _reports(streamed, tmp_path / "streamed", spool)
    finally:
        spool.close()
    assert streamed.tally is not None
    for report in (spool.json, spool.csv):
        assert report is not None and report.spans is not None
        assert report.spans.count >= 40_000 - 2 * 16_384  # handed over by twice _WRITER_FROM at the latest
    whole = compare(str(a), str(b))
    assert len(whole.verdict.labels) > 1_000 and len(whole.rows) - 1 in whole.verdict.labels
    whole_reports = _reports(whole, tmp_path / "whole")
    assert streamed_reports["json"] == whole_reports["json"]
    assert streamed_reports["csv"] == whole_reports["csv"]
    csv_only = ReportSpool(json_rows=False, csv_rows=True)  # (no JSON report written first: the CSV flushes alone)
    try:
        with open(tmp_path / "only.csv", "w", encoding="utf-8") as fh:
            write_csv(compare_streamed(str(a), str(b), sink=csv_only), fh, csv_only)
    finally:
        csv_only.close()
    assert csv_only.csv is not None and csv_only.csv.spans is not None
    assert (tmp_path / "only.csv").read_text(encoding="utf-8") == whole_reports["csv"]


def test_bad_input_mid_stream_is_one_line(tmp_path: Path) -> None:
    """A manifest line cut short, and one naming a link to a record it does not hold, in the middle of a streamed
    comparison: the reports are written whole and the exit is 2 with one line; a FIFO for a manifest is refused
    before anything is written."""
    ms, pt = _dumps(tmp_path, bug=None)
    lines = (ms / "manifest.jsonl").read_text().splitlines()
    lines[25] = lines[25][: len(lines[25]) // 2]
    (ms / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    proc = run_align("compare", ms, pt, "--json", out)
    assert_one_line_error(proc, "compare incomplete", "manifest line")
    assert json.loads(out.read_text())["exit_code"] == 2
    fifo_side = tmp_path / "fifo"
    fifo_side.mkdir()
    os.mkfifo(fifo_side / "manifest.jsonl")
    out2 = tmp_path / "r2.json"
    proc = run_align("compare", fifo_side, pt, "--json", out2)
    assert_one_line_error(proc, "manifest.jsonl")
    assert not out2.exists()
