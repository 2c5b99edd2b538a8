"""`aligner.dump(..., wait=False)` on real zoo pairs (timm / transformers-style torch models against their mindcv /
mindone-style MindSpore twins, a bug of the localization catalogue injected in the MindSpore twin's own forward):
dumps whose files were written after their context exited hold the same lines as the default dumps, and compare
names the same module, read in the same process right after the last context.

Skipped when the zoo is not installed (scripts/install_zoo.sh).
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from aligner.dumping.manifest import MANIFEST  # noqa: E402
from tests.zoo import localization as loc  # noqa: E402

BUGS = {"vit": "vit-attn-scale", "moe_lm": "moe-missing-residual"}


def _lines(directory: Path) -> list[str]:
    """A dump's record lines (the header names the run, not the records)."""
    return (directory / MANIFEST).read_text().splitlines()[1:]


@pytest.mark.parametrize("family", BUGS)
def test_dumps_written_after_their_context_compare_as_waited_ones(pair_runs, family: str) -> None:
    run = pair_runs(family)
    bug = next(b for b in loc.CATALOGUE if b.id == BUGS[family])
    restore = bug.inject(run.pair)
    try:
        waited = run.dump_ms(run.fresh("ms_waited"))
        overlapped = run.dump_ms(run.fresh("ms_overlapped"), wait=False)
    finally:
        restore()
    reference = run.reference("base")
    reference_overlapped = run.dump_torch(run.fresh("pt_overlapped"), wait=False)
    verdicts = [loc.compare(ms, pt).verdict for ms, pt in ((waited, reference), (overlapped, reference_overlapped))]
    assert verdicts[0].findings and verdicts[0] == verdicts[1]
    assert _lines(waited) == _lines(overlapped) and _lines(reference) == _lines(reference_overlapped)
    assert len(_lines(waited)) > 50
