"""Localization regression set: one migration bug at a time in the MindSpore twin of a real zoo pair; `align compare`
must name the module where it was put (tests/zoo/localization.py holds the catalogue; results in LOCALIZATION.md).

The catalogue's current hits are asserted (with `compare pt ms` and `--bisect` in both orders blaming the same
module, and for code in a parent's forward the op-level zoom-in naming an op), and README.md must show the
catalogue's table; its current misses are strict xfails (reason: what aligner lacks), so a fix that turns a miss
into a hit fails here until the catalogue (`Bug.now`) and LOCALIZATION.md are updated. An
injection or dump that raises is a real failure, not an xfail. Also: each clean pair compared in both argument
orders must not diverge.

Skipped when the zoo is not installed (scripts/install_zoo.sh). Each pair is built, converted and its torch reference
dumped once per module run: about 65 s for the whole file on the shared 2-core machine (not marked slow).
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from tests.zoo import localization as loc  # noqa: E402

# Clean configurations compared in both orders; value: None (must pass) or the xfail reason (a known false divergence).
CLEAN = {
    ("cnn", False): None, ("vit", False): None, ("encoder_lm", False): None, ("decoder_lm", False): None,
    ("mha", False): None, ("upsample", False): None, ("cnn", True): None,
}


def _bug_param(bug: loc.Bug):
    marks = ()
    if bug.now == "miss":
        marks = pytest.mark.xfail(strict=True, raises=AssertionError, reason=bug.why)
    return pytest.param(bug, id=bug.id, marks=marks)


def _clean_param(family: str, train: bool, reason: str | None):
    marks = pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason) if reason else ()
    return pytest.param(family, train, id=f"{family}{'-train' if train else ''}", marks=marks)


@pytest.mark.parametrize("family,train", [_clean_param(f, t, r) for (f, t), r in CLEAN.items()])
def test_clean_pair_has_no_false_divergence(pair_runs, family, train):
    rows = loc.clean_orders(pair_runs(family), train=train)
    assert all(rc == 0 for _, rc, _ in rows), f"{family}: false divergence on the clean pair: {rows}"


@pytest.mark.parametrize("bug", [_bug_param(b) for b in loc.CATALOGUE])
def test_compare_names_the_bug(pair_runs, bug):
    outcome = loc.run_bug(pair_runs(bug.family), bug)
    if outcome.status == "error":
        raise RuntimeError(f"{bug.id}: {outcome.detail}")  # not an xfail: the benchmark itself broke
    assert outcome.exit_code == 1, f"{bug.id}: compare found no divergence (exit {outcome.exit_code})"
    assert outcome.named == bug.expected, (f"{bug.id}: named {outcome.named!r} (MindSpore {outcome.named_ms!r}), "
                                           f"expected {bug.expected!r}")
    assert not outcome.disagreements, f"{bug.id}: the other argument order or --bisect blames another module"
    if outcome.culprit == "parent_code":  # code in the parent's forward: the zoom-in must name the op
        assert outcome.zoom and outcome.zoom.startswith("op: "), f"{bug.id}: zoom-in gave {outcome.zoom!r}"


def test_readme_shows_the_catalogues_table():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert loc.catalogue_matrix() in readme, "README.md's localization table differs from tests/zoo/localization.py"
