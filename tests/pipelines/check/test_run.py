"""`align check` reads a dump as a stream: the same findings as the whole-list reading, memory that does not grow
with the number of records, and the same answers to bad input."""
from __future__ import annotations

import io
import json
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from aligner.dumping import manifest
from aligner.dumping.read import stream as streaming
from aligner.dumping.read.source import Item, load_tensor, read_source
from aligner.pipelines.check import CheckReport, RuleConfig, check, evaluate
from aligner.render.check import write_check_json
from aligner.render.jsonout import dumps
from tests.pipelines.check.test_check import SYMPTOMS, Case, train_ms, train_torch
from tests.support.cli import align_in_process, assert_one_line_error

# every rule of check_rules.yaml found at least once: the symptom runs of test_check, and a saturated tanh, a
# stats-only dump (update ratios from statistics) and a float16 run
CASES: dict[str, Case] = {name: bad for name, (bad, _, _) in SYMPTOMS.items()} | {
    "tanh": Case(act="Tanh", gain=20.0, lr=1e-4), "stats-only": Case(frozen=(1,), stats_only=True),
    "float16": Case(half=True, loss_mult=1e-3)}


@pytest.fixture(scope="module")
def dumps_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("check_stream")
    out = {f"{name}-pt": train_torch(case, root / f"{name}-pt") for name, case in CASES.items()}
    for name in ("exploding", "dead-relu", "zero-init"):  # MindSpore's dumps link inputs by identity
        out[f"{name}-ms"] = train_ms(CASES[name], root / f"{name}-ms")
    return out


def _whole_list(path: Path) -> dict[str, Any]:
    """The check as it read a dump before streaming: read_source's lists, sorted, links resolved by seq over all."""
    source = read_source(path)
    items: list[Item] = list(source.items) + list(source.params.values())
    by_record = {id(item.record): item for item in items}
    records = sorted((item.record for item in items), key=lambda r: (r.step, r.seq))

    def arrays(rec: Any) -> Any:
        item = by_record.get(id(rec))
        return None if item is None or item.path is None or item.error else load_tensor(item)

    config = RuleConfig.load()
    evaluation = evaluate(records, config, framework=source.framework,
                          arrays=arrays if source.mode == "full" else None)
    return CheckReport(str(path), source.framework, source.mode, len(records), evaluation,
                       {k: dict(v) for k, v in config.rules.items()}, source.problems).to_dict()


def test_streamed_findings_equal_the_whole_list_reading(dumps_dir: dict[str, Path]) -> None:
    fired: set[str] = set()
    for name, path in dumps_dir.items():
        streamed = check(path).to_dict()
        assert dumps(streamed) == dumps(_whole_list(path)), name
        fired |= {f["rule"] for f in streamed["findings"]}
    assert fired == set(RuleConfig.load().names) - {"rank-weights", "rank-grads", "rank-nonfinite"}


def test_the_json_report_is_written_in_pieces_as_one_dumps_wrote_it(dumps_dir: dict[str, Path]) -> None:
    for name in ("exploding-pt", "loss-spike-pt", "dead-relu-ms"):
        report, out = check(dumps_dir[name]), io.StringIO()
        write_check_json(report, out)
        assert out.getvalue() == dumps(report.to_dict()) + "\n" and report.findings, name


def test_a_manifest_out_of_order_is_read_whole_and_checked_alike(dumps_dir: dict[str, Path], tmp_path: Path) -> None:
    """Records shuffled by hand (the header kept first): the stream stops at the first one out of place and the check
    reads the dump whole, sorted; its findings are those of the dump in order."""
    path = dumps_dir["exploding-pt"]
    lines = (path / manifest.MANIFEST).read_text().splitlines()
    shuffled = shutil.copytree(path, tmp_path / "shuffled")
    (shuffled / manifest.MANIFEST).write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    with pytest.raises(streaming.UnorderedError):
        with streaming.open_stream(shuffled) as stream:
            list(stream)
    mine, theirs = check(shuffled).to_dict(), check(path).to_dict()
    assert mine["findings"] and dumps({**mine, "directory": ""}) == dumps({**theirs, "directory": ""})


def _long_dump(root: Path, records: int) -> Path:
    """A stats-only dump of one step: `records` op records of 40 modules (an op-level dump: names repeat), every
    fourth linked to the record before it, and a ReLU output and a parameter gradient every 100."""
    root.mkdir()
    stats = {"min": -1.0, "max": 2.0, "mean": 0.5, "l2": 3.0, "nan": 0, "inf": 0, "zeros": 0.5, "near_zero": 0.1,
             "near_one": 0.1, "tiny": 0.0, "numel": 64}
    with open(root / manifest.MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"format": manifest.FORMAT, "version": 2, "framework": "pytorch", "mode": "stats"}) + "\n")
        for seq in range(records):
            kind, io, module = "op", "output", f"layers.{seq % 40}"
            if seq % 100 == 50:
                kind, module = "forward", f"layers.{seq % 40}.act"
            elif seq % 100 == 99:
                kind, io, module = "param_grad", "grad", f"layers.{seq % 40}.weight"
            line = {"seq": seq, "step": 0, "module": module, "type": "ReLU" if kind == "forward" else "aten.mm",
                    "kind": kind, "io": io, "index": 0, "dtype": "float32", "shape": [8, 8], "stats": stats}
            if seq % 4 == 3 and kind == "op":
                line |= {"io": "input", "stats": None, "same_as": seq - 1}
            fh.write(json.dumps(line) + "\n")
    return root


def _peak(path: Path) -> int:
    tracemalloc.start()
    try:
        report = check(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert report.records > 0 and "dead-relu" in report.evaluation.checked
    return peak


def test_memory_does_not_grow_with_the_number_of_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tracemalloc's peak over a check of N and of 4N records. Blocks of 64 KiB (~150 records) so that both runs go
    through many windows. What may grow: the link table, 16 bytes per record of the step (3N x 16 B = 1.4 MiB);
    the margin is 2 MiB. Measured: 1.8 -> 2.5 MiB; the whole-list reading, which held every record, 28.7 -> 82.9 MiB."""
    monkeypatch.setattr(streaming, "BLOCK", 1 << 16)
    n = 30_000
    small, large = _peak(_long_dump(tmp_path / "n", n)), _peak(_long_dump(tmp_path / "4n", 4 * n))
    assert large - small < 2 << 20, (small, large)


def test_bad_input_is_answered_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line cut short mid-stream is a problem line (listed, the rest checked); a link to a later or missing record
    is an error on that record (no statistics); a FIFO for a manifest is one error line, exit 2."""
    path = _long_dump(tmp_path / "d", 500)
    lines = (path / manifest.MANIFEST).read_text().splitlines()
    lines[200] = lines[200][:37]  # cut short
    lines[304] = lines[304].replace('"same_as": 302', '"same_as": 450')  # record 303 links to a later record
    (path / manifest.MANIFEST).write_text("\n".join(lines) + "\n")
    report = check(path)
    assert report.problems == read_source(path).problems and "line 201" in report.problems[0]
    assert report.records == 499
    with streaming.open_stream(path) as stream:
        linked = next(item for item in stream if item.record.seq == 303)
    assert linked.error and "links to record 450" in linked.error and linked.record.stats is None
    proc = align_in_process(capsys, "check", path)
    assert proc.returncode in (0, 1) and "unparsable manifest line" in proc.stdout, proc.stdout
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / manifest.MANIFEST)
    assert_one_line_error(align_in_process(capsys, "check", fifo), "not a regular file (a FIFO)")


def test_no_record_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ALIGNER_MAX_RECORDS bounds what is read whole (compare, replay); a check holds no records, so it reads on."""
    monkeypatch.setenv(manifest.MAX_RECORDS_VARIABLE, "10")
    assert check(_long_dump(tmp_path / "d", 500)).records == 500
