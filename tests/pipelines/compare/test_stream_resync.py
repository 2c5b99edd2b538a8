"""`align compare` streamed over dumps that do not pair record by record (aligner/dumping/pair/window.py through
compare/stream.py): with windows of a few records, the reports (JSON, CSV, table, summary) and the verdict equal the
whole-list ones for each difference the window resynchronises on, and each reason it still reads whole for is kept in
`streamed.fallback` with the whole-list result."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from aligner.dumping.pair import window
from aligner.pipelines.compare import stream
from aligner.pipelines.compare.stream import Fallback
from tests.pipelines.compare.test_stream import _both, _dumps, _records, _rewrite
from tests.support import paths
from tests.support.compare_fixtures import write_dump

Lines = list[dict[str, Any]]


def _pass_through(lines: Lines) -> None:
    """An Identity after layer 6 on this side only: its input and output are layer 6's output (folded away)."""
    out = next(i for i, line in enumerate(lines) if line.get("module") == "layer6" and line["io"] == "output")
    extra = [dict(lines[out], module="layer6_id", type="Identity", io=io) for io in ("input", "output")]
    lines[out + 1:out + 1] = extra


def _extra_call(lines: Lines) -> None:
    """A call on this side only computing other numbers (listed "only in"), after layer 10."""
    out = next(i for i, line in enumerate(lines) if line.get("module") == "layer10" and line["io"] == "output")
    lines.insert(out + 1, dict(lines[out], module="debug_probe", type="Probe", shape=[2, 2], file=None,
                               stats=dict(lines[out]["stats"], l2=123.0)))


def _swapped(lines: Lines) -> None:
    """Layer 3's input and output records in the other order (a hook that wrote them late)."""
    i = next(i for i, line in enumerate(lines) if line.get("module") == "layer3")
    lines[i], lines[i + 1] = lines[i + 1], lines[i]


def _renamed(lines: Lines) -> None:
    """Layers 8 and 9 under other names (paired by content)."""
    for line in lines[1:]:
        if line["module"] in ("layer8", "layer9"):
            line["module"] = line["module"].replace("layer", "block")


def _missing(lines: Lines) -> None:
    """Layer 15's input record absent on this side."""
    lines.remove(next(line for line in lines[1:] if line["module"] == "layer15" and line["io"] == "input"))


EDITS: dict[str, Callable[[Lines], None]] = {"pass-through": _pass_through, "extra call": _extra_call,
                                             "swapped": _swapped, "renamed": _renamed, "missing": _missing}


def _resequenced(lines: Lines) -> Lines:
    """The manifest's lines (a header first) with their records numbered in order again."""
    for seq, line in enumerate(lines[1:]):
        line["seq"] = seq
    return lines


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("block", [4, 16])
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_differences_stream_with_the_whole_list_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str,
                                                        block: int, order: str) -> None:
    """Each difference on the MindSpore side, paired `block` records at a time (the 24-layer chain: 48 records, so
    the windows cut several times): the streamed reports are the whole-list ones, byte for byte."""
    monkeypatch.setattr(stream, "BLOCK", block)
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    lines = _records(ms)
    EDITS[edit](lines)
    _rewrite(ms, _resequenced(lines))
    a, b = (ms, pt) if order == "ab" else (pt, ms)
    whole, whole_text, streamed, streamed_text = _both(a, b, tmp_path)
    assert streamed.streamed.fallback is None and streamed.tally is not None
    assert streamed_text == whole_text
    assert streamed.verdict == whole.verdict and streamed.exit_code == whole.exit_code
    assert streamed.matched == whole.matched and list(streamed.unmatched) == list(whole.unmatched)
    pairs = [(r.pair.a.record.seq, r.pair.b.record.seq, r.pair.matched_by) if r.pair.a and r.pair.b else None
             for r in whole.rows]
    assert pairs != [(k, k, "name") for k in range(len(pairs))]  # (not record k with record k by name: read whole)


def _moved_far(ms: Path, pt: Path) -> None:
    """Layer 2's records named as layer 20's on the MindSpore side: they pair with records 36 rows later, past a
    4-record window (ORDER)."""
    lines = _records(ms)
    for line in lines[1:]:
        if line["module"] == "layer2":
            line["module"] = "layer20"
    _rewrite(ms, lines)


def _renamed_run(ms: Path, pt: Path) -> None:
    """Twelve layers renamed in a row: no name pair to cut at within a 16-record look-ahead (WINDOW)."""
    lines = _records(ms)
    for line in lines[1:]:
        if line["module"] in {f"layer{i}" for i in range(4, 16)}:
            line["module"] = "x" + line["module"]
    _rewrite(ms, lines)


def _with_grads(root: Path, grads: list[tuple[str, int]], step_one: bool) -> None:
    """Parameter gradients (name, step) after the chain's records; with `step_one`, the first ten records again as
    a second step before the step-1 gradients."""
    lines = _records(root)
    extra = _records(write_dump(root.parent / f"g_{root.name}", "x", [
        {"module": name, "kind": "param_grad", "array": np.full(8, 1.0 + k, np.float32), "step": step}
        for k, (name, step) in enumerate(grads)], mode="stats"))[1:]
    again = [dict(line, step=1) for line in lines[1:11]] if step_one else []
    _rewrite(root, _resequenced(lines + [dict(g, file=None) for g in extra if g["step"] == 0] + again +
                                [dict(g, file=None) for g in extra if g["step"] == 1]))


def _param_grads(ms: Path, pt: Path) -> None:
    """Gradients of layer1's parameters in step 0, and of layer2's only in step 1, past the look-ahead: the plan of
    step 0's names may not be the whole dump's (PARAM_NAMES)."""
    _with_grads(ms, [("layer1.gamma", 0), ("layer2.gamma", 1)], True)
    _with_grads(pt, [("layer1.weight", 0), ("layer2.weight", 1)], True)


def test_parameter_gradients_across_frameworks_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MindSpore's `gamma`/`beta` gradients against PyTorch's `weight`/`bias` (planned once the step's gradients are
    read, as `namers` plans them over the whole dump): the whole-list reports, the gradients paired by name."""
    monkeypatch.setattr(stream, "BLOCK", 4)
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    _with_grads(ms, [("layer1.gamma", 0), ("layer1.beta", 0), ("layer2.gamma", 0)], False)
    _with_grads(pt, [("layer1.weight", 0), ("layer1.bias", 0), ("layer2.weight", 0)], False)
    whole, whole_text, streamed, streamed_text = _both(ms, pt, tmp_path)
    assert streamed.streamed.fallback is None
    assert streamed_text == whole_text
    renamed = {(r.pair.a.record.module, r.pair.b.record.module) for r in whole.rows
               if r.pair.matched_by == "name" and r.pair.b.record.kind == "param_grad"}
    assert ("layer1.gamma", "layer1.weight") in renamed  # (a rename only the plan makes)


def _buffer(pt: Path, at: int) -> None:
    """A BatchNorm buffer record in the reference after its line `at` (the whole-list tolerance floor)."""
    lines = _records(pt)
    extra = _records(write_dump(pt.parent / "b_pt", "x", [
        {"module": lines[at]["module"], "kind": "buffer", "io": "running_mean", "array": np.zeros(8, np.float32)}],
        mode="stats"))
    _rewrite(pt, _resequenced(lines[:at + 1] + [dict(extra[1], file=None)] + lines[at + 1:]))


def _buffers(ms: Path, pt: Path) -> None:
    """The reference's buffer record at its end: rows were evaluated before its tolerance floor was known (BUFFERS)."""
    _buffer(pt, 48)


def test_a_training_reference_streams_with_its_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A buffer record among the reference's first records (BatchNorm in training mode: timm writes it after the
    layer's output): read before any row is evaluated, so the stream takes the whole-list tolerance floor."""
    monkeypatch.setattr(stream, "BLOCK", 4)
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    _buffer(pt, 2)
    whole, whole_text, streamed, streamed_text = _both(ms, pt, tmp_path)
    assert streamed.streamed.fallback is None and whole.tolerance.floor is not None
    assert streamed.tolerance == whole.tolerance
    assert streamed_text == whole_text


def _unordered(ms: Path, pt: Path) -> None:
    """Two steps written out of order (UNORDERED)."""
    lines = _records(ms)
    for line in lines[1:11]:
        line["step"] = 1
    _rewrite(ms, lines)


def _foreign(ms: Path, pt: Path) -> None:
    """msprobe dumps of one model in place of both (FOREIGN: msprobe's own mapping files may rename)."""
    for root, name in ((ms, "ms_L0_tensor"), (pt, "pt_L0_statistics")):
        shutil.rmtree(root)
        shutil.copytree(paths.DATA / "msprobe" / name, root)


FALLBACKS: dict[Fallback, Callable[[Path, Path], None]] = {
    Fallback.ORDER: _moved_far, Fallback.WINDOW: _renamed_run, Fallback.PARAM_NAMES: _param_grads,
    Fallback.BUFFERS: _buffers, Fallback.UNORDERED: _unordered, Fallback.FOREIGN: _foreign}


@pytest.mark.parametrize("why", FALLBACKS, ids=lambda w: w.value)
def test_what_cannot_stream_exactly_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  why: Fallback) -> None:
    """Each remaining reason, met with 4-record windows and a 16-record look-ahead: the whole-list result, every
    row, the reason kept (the reports equal)."""
    monkeypatch.setattr(stream, "BLOCK", 4)
    monkeypatch.setattr(window, "LOOKAHEAD", 16)
    ms, pt = _dumps(tmp_path, bug={13: lambda h: h * 1.01})
    FALLBACKS[why](ms, pt)
    whole, whole_text, streamed, streamed_text = _both(ms, pt, tmp_path)
    assert streamed.streamed.fallback == why.value and streamed.tally is None
    assert streamed_text == whole_text
    assert streamed.rows == whole.rows
