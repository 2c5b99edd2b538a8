"""Dumps raced and hostile manifests (issue 26): two processes starting a dump in one directory, a dump overwritten
while or after another process writes it, manifests nested deep enough to exhaust a recursive decoder, and a fuzz
of manifest headers and records that `align compare` and `align check` must answer with 0, 1 or one error line."""
from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aligner
from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT
from aligner.dumping import directory, manifest
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.compare_fixtures import write_dump

ROUNDS = 40  # directories two processes race for


def _contend(root: str, barrier: Any, results: Any) -> None:
    """One racer: for each round, wait for the other process, then claim the round's empty directory."""
    for i in range(ROUNDS):
        barrier.wait()
        try:
            directory.claim(Path(root) / f"d{i}", "pytorch", "test", True, False, None)
            results.put((i, "won"))
        except AlignerError as exc:
            results.put((i, str(exc)))


def test_two_processes_starting_a_dump_in_one_directory_exactly_one_claims_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    racers = [ctx.Process(target=_contend, args=(str(tmp_path), barrier, results)) for _ in range(2)]
    for racer in racers:
        racer.start()
    outcomes: dict[int, list[str]] = {}
    for _ in range(2 * ROUNDS):
        i, outcome = results.get(timeout=120)
        outcomes.setdefault(i, []).append(outcome)
    for racer in racers:
        racer.join(timeout=60)
        assert racer.exitcode == 0
    for i, both in sorted(outcomes.items()):
        assert sorted(both)[-1] == "won" and sorted(both)[0] != "won", (i, both)  # one wins, the other is refused
        lost = sorted(both)[0]
        assert f"d{i}" in lost and ("claimed by another dump" in lost or "is not empty" in lost), lost
        assert len((tmp_path / f"d{i}" / manifest.MANIFEST).read_text().splitlines()) == 1  # one header, intact


def test_a_manifest_that_appears_after_the_emptiness_check_is_another_dumps_claim(tmp_path):
    """The window itself, made deterministic: the directory is checked empty, another dump's manifest appears, and
    only then does this one create its own."""
    target = tmp_path / "d"
    target.mkdir()
    assert directory._prepare(target, target, False) is None  # empty: this dump may start
    theirs = '{"format": "aligner-dump", "version": 2}\n{"seq": 0}\n'
    (target / manifest.MANIFEST).write_text(theirs)  # ... but another process got there first
    with pytest.raises(FileExistsError):
        manifest.write_header(target, "pytorch", "test", "stats")
    with pytest.raises(AlignerError, match="claimed by another dump") as info:
        directory._create(target, target, "pytorch", "test", "stats", None, None)
    assert str(target) in str(info.value) and "\n" not in str(info.value)
    assert (target / manifest.MANIFEST).read_text() == theirs  # their records are untouched


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _dump(target: Path, **options: Any) -> None:
    net = _net()
    with aligner.dump(net, target, progress=SILENT, stats_only=True, **options):
        net(torch.ones(3, 4)).sum().backward()


_HOLDING = """
import sys, torch, aligner
net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
with aligner.dump(net, sys.argv[1], stats_only=True):
    net(torch.ones(3, 4)).sum().backward()
    print("inside", flush=True)
    sys.stdin.readline()
"""


def test_overwrite_refuses_a_directory_another_process_is_dumping_into(tmp_path):
    target = tmp_path / "d"
    writer = subprocess.Popen([sys.executable, "-c", _HOLDING, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "inside\n", writer.stderr
        with pytest.raises(AlignerError, match="claimed by another dump") as info:
            _dump(target, overwrite=True)
        assert str(target) in str(info.value)
    finally:
        out, err = writer.communicate("\n", timeout=120)
    assert writer.returncode == 0, err
    lines = [json.loads(line) for line in (target / manifest.MANIFEST).read_text().splitlines()]
    assert lines[0]["format"] == manifest.FORMAT and [r["seq"] for r in lines[1:]] == list(range(len(lines) - 1))
    assert len(lines) > 4  # the writer's records, all of them, and no one else's header among them


def test_a_later_step_refuses_a_directory_another_process_overwrote(tmp_path):
    target = tmp_path / "d"
    _dump(target, step=0)
    code = ("import sys, torch, aligner; net = torch.nn.Linear(4, 2)\n"
            "with aligner.dump(net, sys.argv[1], stats_only=True, overwrite=True):\n    net(torch.ones(3, 4))")
    subprocess.run([sys.executable, "-c", code, str(target)], check=True, capture_output=True, timeout=120)
    theirs = (target / manifest.MANIFEST).read_text()
    with pytest.raises(AlignerError, match="overwritten by another dump"):
        _dump(target, step=1)
    assert (target / manifest.MANIFEST).read_text() == theirs  # nothing of this process appended to theirs


def test_steps_of_one_process_still_append_and_overwrite_still_replaces(tmp_path):
    target = tmp_path / "d"
    for step in range(3):
        _dump(target, step=step)
    lines = (target / manifest.MANIFEST).read_text().splitlines()
    assert sorted({json.loads(line)["step"] for line in lines[1:]}) == [0, 1, 2]
    other = tmp_path / "other"
    _dump(other, step=0)
    subprocess.run([sys.executable, "-c", "import sys, torch, aligner; net = torch.nn.Linear(4, 2)\n"
                    "with aligner.dump(net, sys.argv[1], stats_only=True, overwrite=True):\n"
                    "    net(torch.ones(3, 4))", str(tmp_path / "fresh")], check=True, capture_output=True,
                   timeout=120)
    _dump(tmp_path / "fresh", overwrite=True)  # a finished dump of another process: overwrite replaces it
    assert "Linear" in (tmp_path / "fresh" / manifest.MANIFEST).read_text()


# -- deep nesting ---------------------------------------------------------------------------------------------------

def _stats_dump(root: Path, framework: str = "pytorch") -> Path:
    records = [{"module": f"fc{i}", "array": [float(i), 2.0, 3.0]} for i in range(3)]
    return write_dump(root, framework, records, mode="stats")


def _insert(root: Path, line: str, at: int) -> None:
    """Put a raw line into the manifest as line `at` (1: replacing the header)."""
    path = root / manifest.MANIFEST
    lines = path.read_text().splitlines()
    if at == 1:
        lines[0] = line
    else:
        lines.insert(at - 1, line)
    path.write_text("\n".join(lines) + "\n")


def _deep(depth: int, dicts: bool = False) -> str:
    return ('{"k":' * depth + "0" + "}" * depth) if dicts else "[" * depth + "]" * depth


@pytest.fixture
def default_recursion_limit():
    """Python's default recursion limit, the one `align compare` runs under: importing mindspore (other test files
    do) raises it to 10000, and msgspec then skips an unknown field nested 1000 deep instead of refusing the line."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.parametrize("depth", [1000, 100])
@pytest.mark.parametrize("field", ["args", "attrs", "unknown"])
def test_a_record_nested_too_deep_is_skipped_and_reported(tmp_path, capsys, depth, field, default_recursion_limit):
    a, b = _stats_dump(tmp_path / "a"), _stats_dump(tmp_path / "b")
    record = {"seq": 9, "module": "deep", "kind": "call", "io": "signature", "dtype": "", "shape": []}
    line = json.dumps(record)[:-1] + f', "{field}": {{"x": {_deep(depth)}}}}}'
    assert len(line) < 2200
    _insert(a, line, 3)
    proc = align_in_process(capsys, "compare", a, b, "--json", "-")
    assert proc.returncode in (0, 1, 2) and "internal error" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("align: error: compare incomplete: ") if proc.returncode == 2 else not proc.stderr
    assert len(proc.stderr.splitlines()) <= 1, proc.stderr
    problems = json.loads(proc.stdout)["manifest_problems"]
    if field != "unknown" or depth == 1000:  # a field aligner does not read is skipped unread, at any sane depth
        assert len(problems) == 1 and "line 3" in problems[0] and "nested" in problems[0], problems
    proc = align_in_process(capsys, "check", a)
    assert proc.returncode in (0, 1) and "error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("seq", [1 << 63, -(1 << 63) - 1])
def test_a_sequence_number_beyond_64_bits_is_a_skipped_line(tmp_path, capsys, seq):
    """The readers keep sequence numbers in int64 arrays: a seq outside that range (found by the fuzz test below:
    2**63 was an internal OverflowError in compare and check) is a manifest line skipped and named, as any line that
    does not parse; compare is then incomplete, never passed."""
    a, b = _stats_dump(tmp_path / "a"), _stats_dump(tmp_path / "b")
    record = {"seq": seq, "module": "fc9", "kind": "forward", "io": "output", "dtype": "float32", "shape": [3]}
    _insert(a, json.dumps(record), 3)
    proc = align_in_process(capsys, "compare", a, b, "--json", "-")
    assert proc.returncode == 2 and proc.stderr.startswith("align: error: compare incomplete: "), proc.stderr
    problems = json.loads(proc.stdout)["manifest_problems"]
    assert len(problems) == 1 and "line 3" in problems[0] and "$.seq" in problems[0], problems
    proc = align_in_process(capsys, "check", a)
    assert proc.returncode in (0, 1) and "internal error" not in proc.stderr and "$.seq" in proc.stdout, proc.stdout


@pytest.mark.parametrize("depth", [100_000, 1000, 100])
@pytest.mark.parametrize("command", ["compare", "check"])
def test_a_header_nested_too_deep_is_one_error_line(tmp_path, capsys, depth, command):
    a, b = _stats_dump(tmp_path / "a"), _stats_dump(tmp_path / "b")
    _insert(a, '{"format": "aligner-dump", "version": 2, "seed": ' + _deep(depth, dicts=depth < 1000) + "}", 1)
    proc = align_in_process(capsys, command, a, *([b] if command == "compare" else []))
    assert_one_line_error(proc, str(a), "nested more than")


def test_overwrite_refuses_a_manifest_nested_too_deep(tmp_path):
    target = _stats_dump(tmp_path / "d")
    _insert(target, json.dumps({"seq": 9, "module": "m", "kind": "call", "dtype": "", "shape": []})[:-1]
            + f', "args": {{"x": {_deep(5000)}}}}}', 2)
    with pytest.raises(AlignerError, match="not an aligner dump's own file"):
        _dump(target, overwrite=True)


def test_a_rank_header_nested_too_deep_is_reported_not_raised(tmp_path, capsys):
    sides = []
    for side in ("a", "b"):
        for rank in (0, 1):
            _stats_dump(tmp_path / side / f"rank{rank}")
        sides.append(tmp_path / side)
    _insert(tmp_path / "a" / "rank1", '{"format": "aligner-dump", "rank": ' + _deep(100_000) + "}", 1)
    for argv in (("compare", *sides), ("check", sides[0])):
        proc = align_in_process(capsys, *argv)
        assert proc.returncode in (1, 2), proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


# -- fuzz -----------------------------------------------------------------------------------------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                     st.text(max_size=8))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                     max_leaves=10)


@st.composite
def _value(draw: st.DrawFn, max_depth: int) -> str:
    """A field's JSON text: a random value, or lists and objects nested to a random depth around one."""
    inner = json.dumps(draw(_JSON))
    depth = draw(st.one_of(st.just(0), st.integers(1, 80), st.integers(0, max_depth)))
    shape = draw(st.sampled_from(["list", "dict", "mixed"]))
    opens, closes = [], []
    for level in range(depth):
        if shape == "list" or shape == "mixed" and level % 2:
            opens.append("[")
            closes.append("]")
        else:
            opens.append('{"k":')
            closes.append("}")
    return "".join(opens) + inner + "".join(reversed(closes))


_HEADER_FIELDS = ["format", "version", "framework", "mode", "seed", "rank", "world_size", "groups", "comm"]
_RECORD_FIELDS = ["seq", "module", "type", "kind", "io", "index", "dtype", "shape", "step", "stats", "file", "call",
                  "parent", "same_as", "source", "arg", "args", "attrs"]
_VALID_HEADER = {"format": "aligner-dump", "version": 2, "framework": "pytorch", "mode": "stats"}
_VALID_RECORD = {"seq": 0, "module": "fc0", "type": "Linear", "kind": "forward", "io": "output", "index": 0,
                 "dtype": "float32", "shape": [3], "stats": {"min": 0.0, "max": 1.0, "mean": 0.5}}


@st.composite
def _line(draw: st.DrawFn, valid: dict[str, Any], fields: list[str], max_depth: int) -> str:
    """A JSON object line: `valid` with some fields (known or not) replaced by fuzzed values."""
    chosen = draw(st.lists(st.sampled_from(fields + ["zz"]), max_size=3, unique=True))
    parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in valid.items() if k not in chosen]
    parts += [f"{json.dumps(k)}: {draw(_value(max_depth))}" for k in chosen]
    return "{" + ", ".join(parts) + "}"


class TestFuzzManifests:
    """Random JSON in every field of headers (nested up to 100,000 deep) and records (up to 3,000 deep)."""

    @settings()
    @given(header=_line(_VALID_HEADER, _HEADER_FIELDS, 100_000),
           records=st.lists(_line(_VALID_RECORD, _RECORD_FIELDS, 3000), min_size=1, max_size=4))
    def test_compare_and_check_answer_without_an_internal_error(self, tmp_path_factory, capsys, header, records):
        root = tmp_path_factory.mktemp("fuzz")
        a, b = _stats_dump(root / "a"), _stats_dump(root / "b")
        (a / manifest.MANIFEST).write_text("\n".join([header, *records]) + "\n")
        for argv in (("compare", a, b), ("compare", b, a, "--json", "-"), ("check", a)):
            proc = align_in_process(capsys, *argv)
            assert proc.returncode in (0, 1, 2), (argv, proc.returncode, proc.stderr)
            assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, (argv, proc.stderr)
            if proc.returncode == 2 and proc.stderr.strip():
                assert len(proc.stderr.strip().splitlines()) == 1, (argv, proc.stderr)


# -- record limit ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["compare"])  # align check streams a manifest: it has no record limit
def test_a_manifest_over_the_record_limit_is_one_error_line_naming_the_knob(tmp_path, capsys, monkeypatch, command):
    """The limit bounds what is read whole: compare with --all (every row shown) reads both dumps whole; streamed
    (the two dumps pair in step, compare/stream.py) it holds no record list and reads on."""
    a, b = _stats_dump(tmp_path / "a"), _stats_dump(tmp_path / "b")
    monkeypatch.setenv(manifest.MAX_RECORDS_VARIABLE, "2")
    assert align_in_process(capsys, command, a, b).returncode in (0, 1)
    argv = (command, a, *([b, "--all"] if command == "compare" else []))
    monkeypatch.setenv(manifest.MAX_RECORDS_VARIABLE, "3")  # each side holds 3 records: at the limit, read
    assert align_in_process(capsys, *argv).returncode in (0, 1)
    monkeypatch.setenv(manifest.MAX_RECORDS_VARIABLE, "2")
    assert_one_line_error(align_in_process(capsys, *argv), str(a), "more than 2 records", "ALIGNER_MAX_RECORDS")
    monkeypatch.setenv(manifest.MAX_RECORDS_VARIABLE, "lots")
    assert_one_line_error(align_in_process(capsys, *argv), "ALIGNER_MAX_RECORDS='lots'")
