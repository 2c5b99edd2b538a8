"""`align compare --html` in a real headless browser (Debian's chromium through playwright), offline: the page loads
without console errors, page errors or network requests; the headline names the origin; the plotly chart has its
traces; a near-zero-norm record is not drawn as a spike under "No divergence"; hostile module names stay text."""
from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from compare_fixtures import chain, write_dump
from conftest import run_align

from aligner.dumping.manifest import Record
from aligner.metrics.measure import Metrics
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.matching import Pair
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.sources import Item
from aligner.pipelines.compare.verdict import judge
from aligner.render.html import write_html

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 32)).astype(np.float32)
WEIGHTS = [np.linalg.qr(RNG.standard_normal((32, 32)))[0].astype(np.float32) for _ in range(8)]
LAYERS = [lambda h, w=w: h @ w for w in WEIGHTS]
HOSTILE = '</script><img src=x onerror="window.__pwned=1">&amp;'


def _browser_or_skip() -> Any:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium); .ci/run does")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    return sync_playwright


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def align_html(a: Path, b: Path, out: Path) -> subprocess.CompletedProcess:
    """`align compare A B --html OUT` through the real entry point."""
    return run_align("compare", a, b, "--html", out)


def load(browser: Any, page_file: Path) -> tuple[Any, dict[str, list[str]]]:
    """Open the page with every non-file request aborted; return it and what went wrong while loading."""
    problems: dict[str, list[str]] = {"console": [], "pageerror": [], "requestfailed": [], "blocked": []}
    page = browser.new_page()

    def route(r: Any) -> None:
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            problems["blocked"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems["console"].append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems["pageerror"].append(str(e)))
    page.on("requestfailed", lambda r: problems["requestfailed"].append(r.url))
    page.goto(page_file.as_uri(), wait_until="load")
    assert page.locator("#chart.plotly-graph-div").count() == 1, \
        "no plotly chart in the page: does `align compare --html` write it with aligner.render.html.write_html?"
    page.wait_for_function("document.querySelector('.js-plotly-plot') && "
                           "document.querySelector('.js-plotly-plot').data", timeout=20000)
    return page, problems


def traces(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("""() => document.querySelector('.js-plotly-plot').data.map(t => ({
        uid: t.uid, name: t.name, visible: t.visible === undefined ? true : t.visible,
        x: Array.from(t.x || []), y: Array.from(t.y || [])}))""")


def test_divergent_page_names_origin_and_charts_offline(tmp_path: Path, browser: Any) -> None:
    layers = LAYERS[:6]
    ref = chain(X, layers)
    other = chain(X, layers, {3: lambda h: h @ WEIGHTS[3] + np.float32(0.05)})
    for recs in (ref, other):  # a hostile module name on every side, and a type, to show they stay text
        for r in recs:
            r["type"] = "Linear"
            if r["module"] == "layer3":
                r["module"] = "layer3" + HOSTILE
    a = write_dump(tmp_path / "ms", "mindspore", other)
    b = write_dump(tmp_path / "pt", "pytorch", ref)
    out = tmp_path / "report.html"
    res = align_html(a, b, out)
    assert res.returncode == 1, res.stderr
    page, problems = load(browser, out)
    assert problems == {"console": [], "pageerror": [], "requestfailed": [], "blocked": []}
    headline = page.inner_text("#headline")
    assert "divergence" in headline.lower()
    assert page.inner_text("#headline .origin") == "layer3" + HOSTILE  # shown as text, big
    assert "aligner.dump(" in headline and "rtol" in headline  # the next step and the tolerance in words
    assert page.evaluate("window.__pwned") is None and page.locator("img").count() == 0
    assert page.evaluate("document.querySelector('.js-plotly-plot').data.length") >= 3
    by_uid = {t["uid"]: t for t in traces(page)}
    assert {"forward", "diverged", "origin", "tol-lo", "tol-hi"} <= set(by_uid)
    origin_row = by_uid["origin"]["x"][0]
    assert page.inner_text(f"#row-{origin_row} td.mod") == "layer3" + HOSTILE
    assert "origin" in page.get_attribute(f"#row-{origin_row}", "class")
    assert page.locator("tbody tr").count() == len(ref)
    page.close()


def test_clean_page_hides_near_zero_record(tmp_path: Path, browser: Any) -> None:
    ref = chain(X, LAYERS[:4])
    other = [dict(r) for r in ref]
    # a zero-initialised bias' gradient: the reference is all zeros and the other side float noise far below atol,
    # and a tiny-norm tensor whose relative error is huge while every element is within atol
    zero = np.zeros(32, np.float32)
    tiny = np.full(32, 1e-9, np.float32)
    ref += [{"module": "head.bias", "kind": "param_grad", "io": "grad", "array": zero},
            {"module": "head.scale", "kind": "param_grad", "io": "grad", "array": tiny}]
    other += [{"module": "head.bias", "kind": "param_grad", "io": "grad", "array": zero + np.float32(1e-8)},
              {"module": "head.scale", "kind": "param_grad", "io": "grad", "array": tiny * 50}]
    a = write_dump(tmp_path / "ms", "mindspore", other)
    b = write_dump(tmp_path / "pt", "pytorch", ref)
    out = tmp_path / "clean.html"
    res = align_html(a, b, out)
    assert res.returncode == 0, res.stdout + res.stderr
    page, problems = load(browser, out)
    assert problems == {"console": [], "pageerror": [], "requestfailed": [], "blocked": []}
    assert "no divergence" in page.inner_text("#headline").lower()
    assert "align diff" in page.inner_text("#headline .next")
    near = [i for i, r in enumerate(ref) if r["module"].startswith("head.")]
    data = traces(page)
    shown = [t for t in data if t["visible"] is True]
    for t in shown:  # neither near-zero record is among the drawn points
        assert not set(near) & set(t["x"]), t
    hidden = [t for t in data if t["uid"] == "nearzero"]
    assert len(hidden) == 1 and hidden[0]["visible"] == "legendonly" and sorted(hidden[0]["x"]) == near
    assert max(hidden[0]["y"]) > 1  # head.scale: a 4900% relative error, all within atol: it would be a spike
    drawn = [y for t in shown if t["uid"] in ("forward", "backward") for y in t["y"]]
    assert drawn and max(drawn) < 1e-3  # no spike among what is drawn
    assert "2 record(s) whose reference is near zero" in page.inner_text("#plot")
    for i in near:
        assert "nearzero" in page.get_attribute(f"#row-{i}", "class")
    page.close()


def test_big_report_has_every_row() -> None:
    """10,000 rows, the last thousand divergent, all in the table (speed belongs in scripts/bench_*, not here)."""
    rows = []
    for i in range(10_000):
        rec = Record(seq=i, module=f"blocks.{i // 4}.fc{i % 4}", type="Linear", kind="forward", io="output", index=0,
                     dtype="float32", shape=[8, 64], step=0)
        err = 1e-7 * (1 + i % 7) if i < 9000 else 1e-2
        m = Metrics((8, 64), (8, 64), "float32", "float32", 1.3e-6, 1e-5, numel=512, mismatched=int(i >= 9000),
                    max_abs_err=err, max_rel_err=err, cosine=1.0, rel_l2_err=err, norm_a=10.0, norm_b=10.0)
        item = Item(rec)
        rows.append(Row(Pair(item, item, "name"), m, read=True))
    result = CompareResult("a (mindspore)", "b (pytorch)", rows, judge(rows), [])
    out = io.StringIO()
    write_html(result, out)
    assert out.getvalue().count('<tr id="row-') == 10_000
