"""The dump vocabulary as enums (issue 29 item 4) and one pair of side names (item 5): a real torch dump's records
decode to `Kind`/`Io` members and write back the same manifest strings; an unknown kind or io is a problem line;
`--ref` resolves in one place; compare's JSON names its sides `migrated`/`reference` (schema 2) whichever argument
the reference is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework, Reference, reference_index
from aligner.dumping.manifest import MANIFEST, Io, Kind, read_manifest
from aligner.dumping.pair.matching import MatchedBy
from tests.support.cli import run_align


def _dump(directory: Path, scale: float = 1.0) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU())
    with torch.no_grad():
        model[0].weight.mul_(scale)
    model.train()
    with aligner.dump(model, directory, backward=True, inputs=True):
        model(torch.randn(5, 4)).sum().backward()
    return directory


def test_a_real_dump_reads_as_members_and_writes_the_same_strings(tmp_path) -> None:
    directory = _dump(tmp_path / "d")
    lines = (directory / MANIFEST).read_text(encoding="utf-8").splitlines()[1:]
    _, records, problems = read_manifest(directory)
    assert problems == [] and len(records) == len(lines)
    assert all(type(r.kind) is Kind and type(r.io) is Io for r in records)
    seen = {(r.kind, r.io) for r in records}
    # what this model's forward, backward and training-mode BatchNorm write: each a member, none a plain string
    assert {(Kind.FORWARD, Io.INPUT), (Kind.FORWARD, Io.OUTPUT), (Kind.BACKWARD, Io.GRAD_OUTPUT),
            (Kind.PARAM_GRAD, Io.GRAD), (Kind.BUFFER, Io.RUNNING_MEAN), (Kind.BUFFER, Io.RUNNING_VAR)} <= seen
    for line, rec in zip(lines, records):
        written = json.loads(line)
        assert (written["kind"], written["io"]) == (rec.kind.value, rec.io.value)
        assert json.loads(rec.to_json())["kind"] == written["kind"]  # the enum writes its plain string


@pytest.mark.parametrize(("field", "value"), [("kind", "forwards"), ("io", "outputs")])
def test_an_unknown_kind_or_io_is_a_problem_line_not_a_record(tmp_path, field, value) -> None:
    directory = _dump(tmp_path / "d")
    path = directory / MANIFEST
    lines = path.read_text(encoding="utf-8").splitlines()
    bad = json.loads(lines[1]) | {field: value}
    path.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n", encoding="utf-8")
    _, records, problems = read_manifest(directory)
    assert len(records) == len(lines) - 2 and len(problems) == 1
    assert problems[0].startswith(f"{MANIFEST} line 2:") and repr(value) in problems[0] and field in problems[0]


CASES = [(None, ("pytorch", "mindspore"), 0), (None, ("mindspore", "pytorch"), 1), (None, ("numpy", "numpy"), 1),
         ("first", ("mindspore", "pytorch"), 0), ("second", ("pytorch", "mindspore"), 1),
         ("pytorch", ("mindspore", "pytorch"), 1), ("mindspore", ("mindspore", "pytorch"), 0),
         (Reference.SECOND, ("pytorch", "pytorch"), 1), (Framework.MINDSPORE, ("pytorch", "mindspore"), 1),
         ("torch", ("mindspore", "pytorch"), 1), ("MS", ("mindspore", "pytorch"), 0)]


@pytest.mark.parametrize(("ref", "frameworks", "index"), CASES)
def test_one_resolver_for_the_reference_side(ref, frameworks, index) -> None:
    assert reference_index(ref, frameworks) == index


@pytest.mark.parametrize(("ref", "frameworks", "needle"),
                         [("third", ("pytorch", "mindspore"), "--ref must be one of first, second, pytorch, mindspore"),
                          ("numpy", ("numpy", "pytorch"), "--ref must be one of"),
                          ("pytorch", ("mindspore", "mindspore"), "neither side(s) were dumped by pytorch"),
                          ("mindspore", ("mindspore", "mindspore"), "both side(s) were dumped by mindspore")])
def test_a_reference_that_names_no_single_side_is_refused(ref, frameworks, needle) -> None:
    with pytest.raises(AlignerError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        reference_index(ref, frameworks)


def test_compare_names_its_sides_migrated_and_reference_in_either_order(tmp_path) -> None:
    """With --ref first the migrated side is the second argument: the JSON says so by name, not by position."""
    a, b = _dump(tmp_path / "a"), _dump(tmp_path / "b", scale=1.5)
    for args, migrated, reference in (([a, b], a, b), ([a, b, "--ref", "first"], b, a)):
        proc = run_align("compare", *args, "--json", "-")
        assert proc.returncode == 1, proc.stderr
        report = json.loads(proc.stdout)
        assert report["schema"] == 2 and "side_a" not in report
        assert report["migrated"] == f"{migrated} (pytorch)" and report["reference"] == f"{reference} (pytorch)"
        assert {row["matched_by"] for row in report["rows"]} <= {m.value for m in MatchedBy} | {None}
    assert run_align("compare", a, b, "--ref", "third").stderr.strip() == \
        "align: error: --ref must be one of first, second, pytorch, mindspore, got 'third'"
