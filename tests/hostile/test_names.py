"""A dump whose index names a file by a string no file system name encodes to (a lone surrogate, which JSON's
"\\ud800" escape carries): the path is refused like one leading outside the dump, never a UnicodeEncodeError out of
pathlib (found by a random draw of tests/hostile/test_scripts.py: repro raised it)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

import aligner
from aligner.dumping.read.foreign.layout import inside


def test_a_name_no_file_system_encodes_is_refused(tmp_path: Path) -> None:
    path, why = inside(tmp_path, "\ud800.npy")
    assert path is None and why is not None and "not encodable as a file name" in why
    assert inside(tmp_path, "a\udcffb.npy")[1] is None  # an undecodable byte (surrogateescape) is a possible name


def test_compare_marks_the_row_of_an_unencodable_file_name(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).eval()
    for side in ("a", "b"):
        with aligner.dump(model, tmp_path / side), torch.no_grad():
            model(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))
    manifest = tmp_path / "a" / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    hit = next(i for i, line in enumerate(lines) if json.loads(line).get("file"))
    record = json.loads(lines[hit])
    record["file"] = "tensors/\ud800.npy"
    lines[hit] = json.dumps(record)  # ensure_ascii: the surrogate travels as the escape "\ud800"
    manifest.write_text("\n".join(lines) + "\n")
    result = aligner.compare(tmp_path / "a", tmp_path / "b")  # no exception
    assert result.exit_code != 0 and result.compared > 0
