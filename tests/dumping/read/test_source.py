"""Reading tensor files while comparing: small files in one read, large float32/float64 ones folded from their
mapped pages, others read block by block."""
from __future__ import annotations

import numpy as np
import pytest

from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.pair.matching import match
from aligner.dumping.read.source import open_tensor, read_source
from aligner.metrics.measure import MAP_MIN, compare_arrays
from aligner.pipelines.compare.evaluate import evaluate


@pytest.mark.parametrize("numel", [1000, 1 << 19])  # read in one call / folded from the file's mapped pages
@pytest.mark.parametrize("keep", [-8, 4096])  # cut inside the last page / after the first page (SIGBUS past it)
@pytest.mark.parametrize("side", ["a", "b"])
def test_file_cut_short_after_listing_marks_its_row(tmp_path, numel: int, keep: int, side: str) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "0_x.npy", np.ones(numel, np.float32))
    pairs = match(read_source(tmp_path / "a").items, read_source(tmp_path / "b").items, None, None)
    path = tmp_path / side / "0_x.npy"
    path.write_bytes(path.read_bytes()[:keep])  # truncated between listing and reading
    row = evaluate(pairs[0], ToleranceSpec())
    assert row.status == "error" and row.error == "0_x.npy: truncated while being compared"
    assert evaluate(pairs[0], ToleranceSpec()).error == row.error  # and again: nothing was left half done


@pytest.mark.parametrize(("dtype", "mapped"), [("<f4", True), ("<f8", True), ("<f2", False), (">f4", False)])
def test_large_files_compare_alike_mapped_or_read(tmp_path, dtype: str, mapped: bool) -> None:
    """Float32/float64 files of MAP_MIN bytes or more are folded from their mapped pages, other types read in
    chunks and converted: either way the metrics are those of the same arrays compared in memory."""
    rng = np.random.default_rng(7)
    n = MAP_MIN // 4 + 12_345  # not a whole number of blocks
    b = rng.standard_normal(n).astype(dtype)
    a = (b + 1e-3 * rng.standard_normal(n)).astype(dtype)
    a[[5, 70_000, n - 1]], b[[6, 70_000]] = [np.nan, np.inf, -np.inf], [np.nan, np.inf]
    for name, array in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "0_x.npy", array)
    pair = match(read_source(tmp_path / "a").items, read_source(tmp_path / "b").items, None, None)[0]
    assert (open_tensor(pair.a).region() is not None) == mapped  # type: ignore[arg-type]
    row = evaluate(pair, ToleranceSpec())
    assert row.metrics == compare_arrays(a, b)
    assert (row.metrics.nan_a, row.metrics.inf_a, row.metrics.nan_b, row.metrics.inf_b) == (1, 2, 1, 1)
