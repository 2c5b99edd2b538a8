"""Every string that came from a file is data in every output (issue 26): names holding rich markup, lone surrogates,
mathtext, spreadsheet formulas or plotly's pseudo-HTML are shown as written (escaped where they would act) on the
terminal and in JSON, CSV, HTML and plots, in compare, check, inspect, diff, convert, replay and losses."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aligner
from aligner.core.text import printable
from aligner.dumping import manifest
from aligner.pipelines.compare.run import compare
from aligner.render.compare import print_table, summary
from aligner.render.console import make_console
from tests.support.cli import align_in_process
from tests.support.paths import ROOT
from tests.support.twin_models import example_input, make_twins

MARKUP = "a[/x]b"                                          # a closing tag that opens nothing: MarkupError in rich
SURROGATE = "blk\ud800.weight"                                  # a lone surrogate: no UTF-8 writer can encode it
OSC8 = "\x1b]8;"                                           # the start of a terminal hyperlink
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")  # never raw on a terminal
FORMULAS = ['=HYPERLINK("http://evil.example/","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)", "\tx", "\rx"]


def _dump(root: Path, names: list[str], shift: float = 0.0) -> Path:
    """An aligner dump written by hand: one forward record per name (its manifest line JSON-escaped, so a lone
    surrogate arrives as a `\\ud800` escape), each with its own tensor."""
    (root / "tensors").mkdir(parents=True)
    manifest.write_header(root, "numpy", "test", "full")
    with open(root / manifest.MANIFEST, "a", encoding="utf-8") as fh:
        for seq, name in enumerate(names):
            np.save(root / "tensors" / f"{seq}.npy", np.arange(4.0) + shift)
            fh.write(json.dumps({"seq": seq, "module": name, "kind": "forward", "dtype": "float64", "shape": [4],
                                 "file": f"tensors/{seq}.npy"}) + "\n")
    return root


def _pair(tmp: Path, names: list[str]) -> tuple[Path, Path]:
    """Two dumps of the same records, the first off by 1 everywhere (each record diverges)."""
    return _dump(tmp / "a", names, 1.0), _dump(tmp / "b", names)


def _safetensors(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A safetensors file written by hand: its JSON header escapes a lone surrogate as `\\ud800`."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def _checkpoints(tmp: Path, name: str) -> tuple[Path, Path]:
    """Two safetensors checkpoints holding `name`, its values differing."""
    return (_safetensors(tmp / "a.safetensors", {name: np.arange(4.0), "norm.running_mean": np.ones(2)}),
            _safetensors(tmp / "b.safetensors", {name: np.arange(4.0) + 1, "norm.running_mean": np.ones(2)}))


def _no_internal_error(proc: Any, codes: tuple[int, ...] = (0, 1)) -> None:
    assert proc.returncode in codes and "internal error" not in proc.stderr, (proc.returncode, proc.stderr)


class _Terminal(io.StringIO):
    """A StringIO the console takes for a terminal (colours, hyperlinks and all)."""

    def isatty(self) -> bool:
        return True


# -- 1. rich markup ------------------------------------------------------------------------------------------------

def test_compare_shows_a_markup_name_as_written(tmp_path, capsys):
    a, b = _pair(tmp_path, [MARKUP])
    proc = align_in_process(capsys, "compare", a, b)
    _no_internal_error(proc, (1,))
    assert f"{MARKUP} " in proc.stdout  # the table cell, as written


def test_inspect_and_diff_show_a_markup_name_as_written(tmp_path, capsys):
    a, b = _checkpoints(tmp_path, f"{MARKUP}.weight")
    proc = align_in_process(capsys, "inspect", a)
    _no_internal_error(proc, (0,))
    assert f"{MARKUP}.weight" in proc.stdout
    proc = align_in_process(capsys, "diff", a, b)
    _no_internal_error(proc, (1,))
    assert f"{MARKUP}.weight" in proc.stdout


def test_convert_shows_a_markup_name_as_written(tmp_path, capsys):
    torch.save({f"bn{MARKUP}.{key}": torch.ones(4) for key in ("weight", "bias", "running_mean", "running_var")},
               tmp_path / "bn.pth")
    proc = align_in_process(capsys, "convert", tmp_path / "bn.pth", "-o", tmp_path / "bn.ckpt")
    _no_internal_error(proc, (0,))
    assert f"bn{MARKUP}.moving_variance" in proc.stdout and "renamed" in proc.stdout


def _train(root: Path, name: str, steps: int = 2) -> Path:
    """A tiny torch MLP whose first layer is called `name` and left out of the optimizer (frozen-weights names it),
    dumped with its parameters and a loss probe at each step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential()
    net.add_module(name, torch.nn.Linear(4, 4))
    net.add_module("act", torch.nn.Tanh())
    net.add_module("out", torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(net.out.parameters(), lr=0.1)
    for step in range(steps):
        with aligner.dump(net, root, step=step, params=True):
            opt.zero_grad()
            loss = (net(torch.randn(8, 4)) ** 2).mean()
            loss.backward()
            aligner.save("loss", loss.detach())
            opt.step()
    return root


def test_check_shows_a_markup_name_as_written(tmp_path, capsys):
    dump = _train(tmp_path / "pt", MARKUP)
    proc = align_in_process(capsys, "check", dump)
    _no_internal_error(proc)
    assert "frozen-weights" in proc.stdout and MARKUP in proc.stdout


def test_replay_shows_a_markup_path_as_written(tmp_path, capsys):
    import mindspore as ms  # here: only this test needs MindSpore

    ms.set_context(mode=ms.PYNATIVE_MODE)
    tnet, mnet = make_twins("cnn", train=False)
    weight = dict(mnet.parameters_and_names())["conv2.weight"]
    weight.set_data(ms.Tensor(weight.asnumpy() * np.float32(1.001)))  # conv2 off by 1e-3: its own error
    x = example_input("cnn")
    pt, ms_dir = tmp_path / f"pt{MARKUP}", tmp_path / f"ms{MARKUP}"
    with aligner.dump(tnet, pt, backward=False), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, ms_dir, backward=False):
        mnet(ms.Tensor(x))
    ms.save_checkpoint(mnet, str(tmp_path / "ms.ckpt"))
    (tmp_path / "factory.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.support.twin_models import mindspore_model\n\n"
        "def make():\n    m = mindspore_model('cnn')\n    m.set_train(False)\n    return m\n")
    proc = align_in_process(capsys, "replay", pt, ms_dir, "--factory", f"{tmp_path / 'factory.py'}:make",
                            "--weights", tmp_path / "ms.ckpt")
    _no_internal_error(proc, (1,))
    assert f"pt{MARKUP}" in proc.stdout and "FOUND: conv2" in proc.stdout


def test_a_terminal_gets_no_hyperlink_and_no_hidden_text(tmp_path, monkeypatch):
    """On a real terminal console, `[link=...]` would emit an OSC 8 hyperlink and `[conceal]` hide the text."""
    monkeypatch.setenv("COLUMNS", "400")  # a wide terminal: no name folded across lines
    link, hidden = "[link=http://evil.example/]a[/link]", "[conceal]secret[/conceal]"
    a, b = _pair(tmp_path, [link, hidden])
    result = compare(str(a), str(b))
    out = _Terminal()
    console = make_console(out)
    print_table(result, console, full=True)
    console.print(summary(result))
    console.print(link, hidden)
    text = out.getvalue()
    assert OSC8 not in text and "\x1b[8m" not in text  # no hyperlink, no concealed (SGR 8) text
    assert text.count(link) >= 3 and text.count(hidden) >= 2  # in the table, the summary (which names the first
    # divergence) and the plain print


# -- 2. lone surrogates ----------------------------------------------------------------------------------------------

def test_compare_writes_a_lone_surrogate_in_every_output(tmp_path, capsys):
    a, b = _pair(tmp_path, [SURROGATE])
    out = tmp_path / "out"
    out.mkdir()
    proc = align_in_process(capsys, "compare", a, b, "--json", out / "r.json", "--csv", out / "r.csv",
                            "--html", out / "r.html")
    _no_internal_error(proc, (1,))
    assert "blk\\ud800.weight" in proc.stdout and not RAW.search(proc.stdout)
    assert json.loads((out / "r.json").read_text())["rows"][0]["module"] == SURROGATE  # JSON: exact, escaped
    assert '"blk\\ud800.weight"' in (out / "r.json").read_text()
    assert next(csv.DictReader(io.StringIO((out / "r.csv").read_text())))["module"] == "blk\\ud800.weight"
    assert '<td class="mod">blk\\ud800.weight</td>' in (out / "r.html").read_text()
    proc = align_in_process(capsys, "compare", a, b, "--json", "-")  # on stdout too
    assert json.loads(proc.stdout)["rows"][0]["module"] == SURROGATE


def test_an_npy_file_name_that_is_not_utf8_is_shown_escaped(tmp_path, capsys):
    """A plain .npy directory whose file name holds the byte 0xff: Python reads it as the lone surrogate \\udcff."""
    for side, shift in (("a", 1.0), ("b", 0.0)):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "0_fc.npy", np.arange(4.0))
        with open(os.path.join(os.fsencode(tmp_path / side), b"1_bad\xff.npy"), "wb") as fh:
            np.save(fh, np.arange(4.0) + shift)
    proc = align_in_process(capsys, "compare", tmp_path / "a", tmp_path / "b")
    _no_internal_error(proc, (1,))
    assert "bad\\udcff" in proc.stdout
    rows = json.loads(align_in_process(capsys, "compare", tmp_path / "a", tmp_path / "b", "--json", "-").stdout)
    assert "bad\udcff" in {r["module"] for r in rows["rows"]}


def test_inspect_and_diff_write_a_lone_surrogate(tmp_path, capsys):
    a, b = _checkpoints(tmp_path, SURROGATE)
    proc = align_in_process(capsys, "inspect", a)
    _no_internal_error(proc, (0,))
    assert "blk\\ud800.weight" in proc.stdout
    assert SURROGATE in {t["name"] for t in json.loads(align_in_process(capsys, "inspect", a, "--json", "-")
                                                       .stdout)["tensors"]}
    proc = align_in_process(capsys, "diff", a, b)
    _no_internal_error(proc, (1,))
    assert "blk\\ud800.weight" in proc.stdout and not RAW.search(proc.stdout)
    assert SURROGATE in json.dumps(json.loads(align_in_process(capsys, "diff", a, b, "--json", "-").stdout),
                                   ensure_ascii=False)


# -- 3. mathtext in plots --------------------------------------------------------------------------------------------

def test_losses_plot_draws_a_log_name_with_dollars_as_text(tmp_path, capsys):
    log = "".join(f"step {s} loss {2.5 - s / 10}\n" for s in range(1, 6))
    a, b = tmp_path / "run$\\frac{$.log", tmp_path / "b.log"
    a.write_text(log)
    b.write_text(log)
    proc = align_in_process(capsys, "losses", a, b, "--plot", tmp_path / "p.png")
    _no_internal_error(proc)
    assert (tmp_path / "p.png").stat().st_size > 0 and "run$\\frac{$.log" in proc.stdout


# -- 4. CSV formulas -------------------------------------------------------------------------------------------------

def test_csv_neutralises_formula_names_and_keeps_numbers(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    a, b = _dump(tmp_path / "a" / "d", FORMULAS), _dump(tmp_path / "b", FORMULAS)
    for i in range(len(FORMULAS)):  # the first side negated: a negative cosine and SQNR
        np.save(a / "tensors" / f"{i}.npy", -np.arange(4.0))
    proc = align_in_process(capsys, "compare", a, b, "--csv", "-")
    _no_internal_error(proc, (1,))
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [r["module"] for r in rows] == ["'" + printable(name) for name in FORMULAS]
    assert all(r["module"] == r["module_a"] and r["status"] == "diverged" for r in rows)
    for r in rows:  # numbers stay numbers: no quote before a minus sign
        assert r["cosine"] == "-1.0" and float(r["sqnr_db"]) < 0 and r["max_rel_err"] == "2.0"


# -- 5. plotly's pseudo-HTML ----------------------------------------------------------------------------------------

LIVE = ('<a href="http://evil/">x</a>', '<span style="font-size:80px">big</span>')


def _decoded(page: str) -> str:
    """The page with JSON string escapes (\\u003c, \\") decoded: what plotly reads from its figure."""
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), page).replace('\\"', '"')


def test_check_html_escapes_parameter_names_for_plotly(tmp_path, capsys):
    dump = _train(tmp_path / "pt", LIVE[0] + LIVE[1])
    proc = align_in_process(capsys, "check", dump, "--html", tmp_path / "r.html")
    _no_internal_error(proc)
    page = _decoded((tmp_path / "r.html").read_text())
    assert "http://evil/" in page and "font-size:80px" in page  # the names are there ...
    assert not any(tag in page for tag in LIVE)  # ... and none of them is a live tag, in the table or the charts
    assert '&lt;a href="http://evil/"&gt;' in page  # the legend shows the name as written


# -- 6. fuzz ---------------------------------------------------------------------------------------------------------

FRAGMENTS = ["[", "]", "[/", "[/x]", "[link=http://e.example/]", "[conceal]", "[bold", "\x1b", "\x1b[31m", "\x07",
             "\u202e", "\u2066", "\ud800", "\udfff", "=", "+", "-", "@", "\t", "\r", "$", "<", ">", "&", '"', "'",
             "%{x}", "a", "b.", "\n"]
LEADERS = ("=", "+", "-", "@", "\t", "\r")
HEAD, TAIL = "nAmEbEgInS", "nAmEeNdS"  # around the name in one record, so its copies can be found in an output


class TestHostileNamesFuzz:
    """Names built from markup, control, bidi, surrogate, formula and HTML fragments: compare (text, JSON, CSV, HTML),
    inspect and diff exit 0/1 with no internal error, and each output shows the name as data."""

    @staticmethod
    def _check_terminal(out: str) -> None:
        assert not RAW.search(out) and OSC8 not in out

    @given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=6).map("".join))
    @settings()
    def test_every_output_keeps_the_name_data(self, tmp_path_factory, capsys, fragments):
        tmp = tmp_path_factory.mktemp("fuzz")
        # a high surrogate then a low one is a pair: JSON (the manifest, a safetensors header) reads one character
        name = fragments.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        marked = HEAD + name + TAIL  # a second record, whose copies in the HTML page can be found
        a, b = _pair(tmp, [fragments, HEAD + fragments + TAIL])
        proc = align_in_process(capsys, "compare", a, b, "--json", tmp / "r.json", "--csv", tmp / "r.csv",
                                "--html", tmp / "r.html")
        _no_internal_error(proc)
        self._check_terminal(proc.stdout)
        assert [r["module"] for r in json.loads((tmp / "r.json").read_text())["rows"]] == [name, marked]
        with open(tmp / "r.csv", newline="", encoding="utf-8") as fh:
            cell = next(csv.DictReader(fh))["module"]
        assert cell == ("'" if name.startswith(LEADERS) else "") + printable(name)
        copies = re.findall(f"{HEAD}(.*?){TAIL}", (tmp / "r.html").read_text(), re.S)
        assert copies and not any(re.search(r"[<>]|\\u003[ce]", c, re.I) for c in copies), copies  # no tag
        a, b = _checkpoints(tmp, fragments)
        proc = align_in_process(capsys, "inspect", a)
        _no_internal_error(proc, (0,))
        self._check_terminal(proc.stdout)
        proc = align_in_process(capsys, "diff", a, b, "--json", tmp / "d.json")
        _no_internal_error(proc)
        self._check_terminal(proc.stdout)
        assert name in {p["name"] for p in json.loads((tmp / "d.json").read_text())["params"]}
