"""`align compare --html` of a long comparison (issue 32), streamed: the page charts every row through a downsampled
profile (aligner/render/html_profile.py) in which a single divergent row among thousands is a point at its own index
and height, shows the rows around the findings with a line for each gap, links the CSV report or gives the command
that writes it, holds no live markup from the data, takes memory that does not grow with the row count; a comparison
whose rows all stayed in memory gets the very page the whole-list comparison gets."""
from __future__ import annotations

import html
import io
import json
import re
import shlex
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.manifest import Record
from aligner.dumping.pair.matching import Pair
from aligner.dumping.read import stream as read_stream
from aligner.dumping.read.source import Item
from aligner.metrics.measure import Metrics
from aligner.pipelines.compare import stream
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.run import compare
from aligner.pipelines.compare.stream import compare_streamed
from aligner.pipelines.compare.verdict import error_level
from aligner.render.compare import ReportSpool
from aligner.render.html import FullTable, write_html
from aligner.render.html_profile import ErrorProfile, Tee
from tests.render import test_html
from tests.render.test_html import HOSTILE, NO_PROBLEMS, assert_reads_well, load, traces
from tests.support.cli import run_align
from tests.support.compare_fixtures import chain, write_dump

browser = test_html.browser  # the headless chromium fixture of the compare page's tests
HEADER = {"format": "aligner-dump", "version": 2, "framework_version": "x", "aligner_version": "x", "mode": "stats",
          "seed": None, "rank": None, "world_size": None}


def stats_dump(root: Path, framework: str, records: int, bad: int | None, name: str = "", at: int = -1) -> Path:
    """A stats-only dump of `records` forward outputs; with `bad`, that one record's statistics are off by half; the
    module of record `at` is `name`."""
    root.mkdir(parents=True)
    with open(root / "manifest.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(HEADER, framework=framework)) + "\n")
        for i in range(records):
            v = 1.0 + (i % 97) / 100 + (0.5 if i == bad else 0.0)
            stats = {"min": -v, "max": v, "mean": v / 10, "l2": v * 30, "nan": 0, "inf": 0}
            module = name if i == at else f"layers.{i // 10}.fc{i % 10}"
            fh.write(json.dumps({"seq": i, "step": 0, "module": module, "type": "Dense", "kind": "forward",
                                 "io": "output", "index": 0, "dtype": "float32", "shape": [4, 1024], "stats": stats,
                                 "file": None, "call": i + 1, "parent": f"layers.{i // 10}"}) + "\n")
    return root


def long_page(tmp_path: Path, records: int, bad: int, window: int, name: str = "",
              full: FullTable | None = None) -> tuple[Path, Any, ErrorProfile]:
    """The page of a streamed comparison of `records` stats records a side, one of them (`bad`) divergent, `window`
    rows kept around it."""
    a = stats_dump(tmp_path / "a", "mindspore", records, bad, name, bad)
    b = stats_dump(tmp_path / "b", "pytorch", records, None, name, bad)
    profile = ErrorProfile(ToleranceSpec())
    result = compare_streamed(str(a), str(b), sink=profile, window=window)
    out = tmp_path / "long.html"
    with open(out, "w", encoding="utf-8") as fh:
        write_html(result, fh, profile, full)
    return out, result, profile


def test_a_single_divergent_row_among_thousands_is_charted_and_tabled(tmp_path: Path, browser: Any) -> None:
    """6,000 records, the 64-row window: the chart's points are buckets of 4 rows (1,500 of them, below the 2,000 a
    trace may hold), the one divergent record is a red point at its own index and height (not a bucket's average),
    the table shows it as the origin among its neighbours with lines for the rows left out, the tolerance counts
    every record, and its hostile module name stays text."""
    bad = 4321
    out, result, profile = long_page(tmp_path, 6000, bad, window=64, name="layer" + HOSTILE)
    assert result.streamed.evicted > 0 and result.verdict.findings[0].origin == bad
    assert profile.width == 4 and len(profile.buckets) == 1500
    page, problems = load(browser, out)
    assert problems == NO_PROBLEMS
    by_uid = {t["uid"]: t for t in traces(page)}
    level = error_level(result.rows[bad])  # the matching records' is 0 (their statistics are equal)
    assert by_uid["diverged"]["x"] == [bad] and by_uid["diverged"]["y"] == [pytest.approx(level)]
    assert bad in by_uid["forward"]["x"] and len(by_uid["forward"]["x"]) == 1500
    assert by_uid["forward"]["y"][by_uid["forward"]["x"].index(bad)] == pytest.approx(level)
    assert by_uid["origin"]["x"] == [bad]
    assert page.inner_text("#headline .origin") == "layer" + HOSTILE
    assert page.evaluate("window.__pwned") is None and page.locator("img").count() == 0
    assert page.inner_text(f"#row-{bad} td.mod") == "layer" + HOSTILE
    assert "origin" in page.get_attribute(f"#row-{bad}", "class")
    assert result.verdict.findings[0].previous == bad - 1  # 40 rows around it, the origin and the first are shown
    assert [page.locator(f"#row-{i}").count() for i in (bad - 42, bad - 41, bad + 40, bad + 41)] == [0, 1, 1, 0]
    shown = page.locator("tbody tr[id]").count()
    gaps = page.eval_on_selector_all("tr.gap", "rs => rs.map(r => r.innerText)")
    not_shown = [int(re.search(r"([\d,]+) records? not shown", g)[1].replace(",", "")) for g in gaps]
    assert shown + sum(not_shown) == 6000 and len(gaps) >= 2
    assert f"({shown:,} of 6,000)" in page.inner_text("#rows h2")
    assert "6000 records)" in page.inner_text("#headline .tol")  # counted over every row, not the kept ones
    assert "bucket of up to 4 consecutive records (1,500 buckets over 6,000 records)" in page.inner_text("#plot")
    page.close()


def test_long_page_reads_well(tmp_path: Path, browser: Any) -> None:
    """At 1400 px wide the long page overflows nothing and wraps no word inside itself (its gap lines, the note above
    the table, the command in it), as the short page does."""
    words = ("align", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--csv", str(tmp_path / "long.csv"))
    out, _, _ = long_page(tmp_path, 3000, 2500, window=32, full=FullTable(None, words))
    page, problems = load(browser, out)
    assert problems == NO_PROBLEMS
    assert page.locator("tr.gap").count() >= 2 and page.locator(".full pre").count() == 1
    assert_reads_well(page, tmp_path / "long.png")
    page.close()


def test_profile_buckets_keep_every_peak() -> None:
    """The buckets merged in pairs as rows arrive: they cover every row once, in order, at most `buckets` of them
    and at least half as many, and each holds its rows' largest error (where it occurs), its count of rows outside
    tolerance and its smallest cosine, as computed from all its rows at once; after a restart, what a fresh profile
    holds."""
    levels = [1e-7 * (1 + (i * 7919) % 13) for i in range(1000)]
    for i in (3, 517, 518, 999):
        levels[i] = 0.1 * (1 + i % 3)
    rows = [_row(i, level) for i, level in enumerate(levels)]
    profile = ErrorProfile.of(ToleranceSpec(), list(enumerate(rows)), buckets=16)
    again = ErrorProfile.of(ToleranceSpec(), list(enumerate(rows[:700])), buckets=16)
    again.restart()  # a streamed comparison that falls back to reading whole hands every row again
    for i, row in enumerate(rows):
        again.add(i, row)
    assert again.buckets == profile.buckets and again.tolerances.groups() == profile.tolerances.groups()
    b = profile.buckets
    assert 8 <= len(b) <= 16 and profile.width == 64
    assert b[0].first == 0 and b[-1].last == 999 and all(x.last + 1 == y.first for x, y in zip(b, b[1:]))
    for bucket in b:
        span = range(bucket.first, bucket.last + 1)
        top = max(span, key=lambda i: (levels[i], -i))
        assert (bucket.peaks[0].row, bucket.peaks[0].level) == (top, levels[top])
        assert bucket.diverged == sum(rows[i].diverged for i in span)
        assert bucket.cosine == min((rows[i].metrics.cosine, i) for i in span)
    assert [x.worst.row for x in b if x.worst is not None] == [3, 518, 999]  # 517 and 518 share a bucket


def _row(i: int, level: float) -> Row:
    """Row i of a comparison of Linear outputs with relative L2 error `level` (outside tolerance above 1e-3)."""
    rec = Record(seq=i, module=f"blocks.{i // 4}.fc{i % 4}", type="Linear", kind="forward", io="output", index=0,
                 dtype="float32", shape=[8, 64], step=0)
    m = Metrics((8, 64), (8, 64), "float32", "float32", 1.3e-6, 1e-5, numel=512, mismatched=int(level > 1e-3),
                max_abs_err=level, max_rel_err=level, cosine=1.0 - level, rel_l2_err=level, norm_a=10.0, norm_b=10.0)
    item = Item(rec)
    return Row(Pair(item, item, "name"), m, read=True)


def test_the_page_links_the_csv_or_says_how_to_write_it(tmp_path: Path) -> None:
    """With --csv, the page links it (URL-quoted, HTML-escaped); without, it names the command that writes it, each
    word shell-quoted; without either (a library call), a command for the two dumps."""
    csv = "rows & more/r<1>.csv"
    out, _, _ = long_page(tmp_path / "linked", 300, 250, window=16, full=FullTable(csv, ()))
    page = out.read_text(encoding="utf-8")
    assert '<a href="rows%20%26%20more/r%3C1%3E.csv">rows &amp; more/r&lt;1&gt;.csv</a>' in page
    words = ("align", "compare", "my dumps/ms", "it's/pt", "--csv", "a b.csv")
    out, _, _ = long_page(tmp_path / "command", 300, 250, window=16, full=FullTable(None, words))
    code = re.findall(r'<div class="note full">.*?<code>(.*?)</code>', out.read_text(encoding="utf-8"), re.S)
    assert len(code) == 1 and shlex.split(html.unescape(code[0])) == list(words)
    out, result, _ = long_page(tmp_path / "bare", 300, 250, window=16)
    code = re.findall(r'<div class="note full">.*?<code>(.*?)</code>', out.read_text(encoding="utf-8"), re.S)
    a, b = (str(tmp_path / "bare" / side) for side in ("a", "b"))
    assert shlex.split(html.unescape(code[0])) == ["align", "compare", a, b, "--ref", "second", "--csv", "rows.csv"]
    assert "not in this report" in out.read_text(encoding="utf-8")


def test_without_a_profile_the_chart_shows_the_kept_rows_and_says_so(tmp_path: Path) -> None:
    """A library caller that streamed without a profile still gets a page: the chart of the rows kept, saying so."""
    a = stats_dump(tmp_path / "a", "mindspore", 300, 250)
    b = stats_dump(tmp_path / "b", "pytorch", 300, None)
    result = compare_streamed(str(a), str(b), window=16)
    out = io.StringIO()
    write_html(result, out)
    kept = sum(1 for i in range(300) if result.holds(i))
    assert result.streamed.evicted > 0 and kept < 300
    assert f"This chart shows only the {kept:,} records this comparison kept" in out.getvalue()


LAYERS = [lambda h: h * 1.5, np.tanh, lambda h: h[:, ::-1] * 0.5, np.exp, lambda h: h - 1.0, np.sin] * 4
CASES = {"clean": ({}, 1, "full"), "layer 13": ({13: lambda h: h * 1.01}, 1, "full"),
         "nan": ({5: lambda h: np.where(h > 0.5, np.nan, h)}, 1, "full"),
         "two steps": ({20: lambda h: h + 0.1}, 2, "full"), "stats": ({9: np.cosh}, 1, "stats")}


@pytest.mark.parametrize("case", CASES)
def test_a_comparison_held_whole_gets_todays_page(tmp_path: Path, case: str) -> None:
    """Rows that all stayed in memory (a 24-layer chain with its inputs, the default window): the streamed page, a
    profile and spools taking the rows, is byte for byte the whole-list comparison's page."""
    bug, steps, mode = CASES[case]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    sides = [[dict(r, step=s) for s in range(steps) for r in chain(x, LAYERS, fault)] for fault in (bug, None)]
    ms = write_dump(tmp_path / "ms", "mindspore", sides[0], mode)
    pt = write_dump(tmp_path / "pt", "pytorch", sides[1], mode)
    whole, pages = compare(str(ms), str(pt)), []
    profile = ErrorProfile(ToleranceSpec())
    streamed = compare_streamed(str(ms), str(pt), sink=Tee(ReportSpool(json_rows=True, csv_rows=True), profile))
    assert streamed.tally is not None and streamed.streamed.evicted == 0
    for result, given in ((whole, None), (streamed, profile)):
        out = io.StringIO()
        write_html(result, out, given, FullTable(None, ("align", "compare")))
        pages.append(out.getvalue())
    assert pages[0] == pages[1]


def test_cli_streams_html_past_the_window_and_writes_no_file_unasked(tmp_path: Path) -> None:
    """`align compare A B --html` on 60,000 records a side, one divergent near the end: the page is the long one (the
    default window of 50,000 rows let rows go), it suggests the CSV command beside the page and no such file is
    written; with --csv too, it links that file relative to the page, which holds every row."""
    a = stats_dump(tmp_path / "a", "mindspore", 60_000, 57_000)
    b = stats_dump(tmp_path / "b", "pytorch", 60_000, None)
    (tmp_path / "out").mkdir()
    page = tmp_path / "out" / "rep.html"
    res = run_align("compare", a, b, "--html", page, "--rtol", "1e-5", "--atol", "1e-6")
    assert res.returncode == 1, res.stderr
    text = page.read_text(encoding="utf-8")
    assert "Records around the findings" in text and "of 60,000)" in text
    code = re.findall(r'<div class="note full">.*?<code>(.*?)</code>', text, re.S)
    assert shlex.split(html.unescape(code[0])) == ["align", "compare", str(a), str(b), "--rtol", "1e-5", "--atol",
                                                    "1e-6", "--csv", str(tmp_path / "out" / "rep.csv")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rep.html"]
    csv = tmp_path / "rows.csv"
    res = run_align("compare", a, b, "--html", page, "--csv", csv, "--force")
    assert res.returncode == 1, res.stderr
    assert '<a href="../rows.csv">../rows.csv</a>' in page.read_text(encoding="utf-8")
    assert len(csv.read_text(encoding="utf-8").splitlines()) == 60_001


def _peak(tmp_path: Path, records: int) -> int:
    """Python's peak allocation while comparing `records` stats records a side, streamed, and writing the HTML page
    (with a JSON and a CSV spool; blocks of 256 records, 256 rows kept around the divergence)."""
    a = stats_dump(tmp_path / f"a{records}", "mindspore", records, records // 2)
    b = stats_dump(tmp_path / f"b{records}", "pytorch", records, None)
    profile = ErrorProfile(ToleranceSpec())
    sink = Tee(ReportSpool(json_rows=True, csv_rows=True), profile)
    tracemalloc.start()
    try:
        result = compare_streamed(str(a), str(b), sink=sink, window=256)
        with open(tmp_path / f"{records}.html", "w", encoding="utf-8") as fh:
            write_html(result, fh, profile)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.streamed.evicted > 0 and result.verdict.findings[0].first == records // 2
    return peak


def test_memory_does_not_grow_with_the_record_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's peak allocation comparing 4N records a side and writing the page is within 25% of N's (N = 3,000):
    the same blocks in flight, the same window, the same ~1,500 buckets (2 rows each for N, 8 for 4N) and a table of
    the same rows. The whole-list page held every row and its text: ~4x. The 25% covers what grows with the model,
    the distinct module paths (N/10 names), and the readers' link table (16 bytes a record of the step)."""
    monkeypatch.setattr(read_stream, "BLOCK", 1 << 16)
    monkeypatch.setattr(stream, "BLOCK", 256)
    write_html(compare_streamed(*(str(stats_dump(tmp_path / s, "pytorch", 40, None)) for s in "xy")), io.StringIO())
    small, large = _peak(tmp_path, 3_000), _peak(tmp_path, 12_000)
    assert large < 1.25 * small, (small, large)
