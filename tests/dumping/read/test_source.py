"""Reading tensor files while comparing: small files in one read, large ones mapped block by block."""
from __future__ import annotations

import numpy as np
import pytest

from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.read.source import read_source
from aligner.pipelines.compare.evaluate import evaluate
from aligner.pipelines.compare.matching import match


@pytest.mark.parametrize("numel", [1000, 1 << 19])  # read in one call / mapped block by block
def test_file_cut_short_after_listing_marks_its_row(tmp_path, numel: int) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "0_x.npy", np.ones(numel, np.float32))
    pairs = match(read_source(tmp_path / "a").items, read_source(tmp_path / "b").items, None, None)
    path = tmp_path / "a" / "0_x.npy"
    path.write_bytes(path.read_bytes()[:-8])  # truncated between listing and reading
    row = evaluate(pairs[0], ToleranceSpec())
    assert row.status == "error" and "truncated while being compared" in row.error
