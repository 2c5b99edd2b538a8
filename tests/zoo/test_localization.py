"""Localization regression set: one migration bug at a time in the MindSpore twin of a real zoo pair; `align compare`
must name the module where it was put (tests/zoo/localization.py holds the catalogue; results in LOCALIZATION.md).

Scoring is strict (tests/zoo/LOCALIZATION.md): the blamed module (`verdict.findings[0].blame`) must EQUAL the injected
one (a child or the next block is a miss) in both argument orders; `--bisect` in both orders must name it too or say
that it could not confirm its answer (`bisect_confirmed` not true, no "confirms" / "introduced here" in its text);
no summary (aligner.render.compare.summary) may say "introduced here", "confirms" or "No divergence" of a wrong
answer; for code in a parent's forward the op-level zoom-in must name an op. docs/compare.md must show the
catalogue's table. The catalogue's current misses are strict xfails (reason: what aligner says vs what is true), so a
fix that turns a miss into a hit fails here until the catalogue (`Bug.now`), docs/compare.md and LOCALIZATION.md are
updated. An injection or dump that raises is a real failure, not an xfail. Also: each clean pair compared in both
argument orders must not diverge (the four newer pair families in eval and training mode, leaves_only True and False).

Skipped when the zoo is not installed (scripts/install_zoo.sh). Each pair is built, converted and its torch reference
dumped once per module run: about 160 s for the whole file on the shared 2-core machine (65 s before the four newer
pair families; not marked slow).
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

# Clean configurations (family, training mode, leaves_only) compared in both orders; value: None (must pass) or the
# xfail reason (a known false divergence: what aligner says, and why it is false).
CLEAN = {
    ("cnn", False, True): None, ("vit", False, True): None, ("encoder_lm", False, True): None,
    ("decoder_lm", False, True): None, ("mha", False, True): None, ("upsample", False, True): None,
    ("cnn", True, True): None,
    # every module recorded whole (leaves_only=False): a one-sided call argument crashed the data flow on BERT
    **{(f, False, False): None for f in ("cnn", "vit", "encoder_lm", "decoder_lm", "mha", "upsample")},
    **{(f, t, lo): None for f in ("encdec", "gqa_lm") for t in (False, True) for lo in (True, False)},
    **{("moe_lm", t, lo): None for t in (False, True) for lo in (True, False)},
    **{("swin", t, lo): None for t in (False, True) for lo in (True, False)},
}


def _bug_param(bug: loc.Bug):
    """A catalogue entry; its current misses are strict xfails (the reason: what aligner says vs what is true)."""
    marks = ()
    if bug.now == "miss":
        marks = pytest.mark.xfail(strict=True, raises=AssertionError, reason=bug.why)
    return pytest.param(bug, id=bug.id, marks=marks)


def _clean_param(family: str, train: bool, leaves_only: bool, reason: str | None):
    """One clean configuration; a known false divergence is a strict xfail."""
    marks = pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason) if reason else ()
    name = f"{family}{'-train' if train else ''}{'' if leaves_only else '-all-modules'}"
    return pytest.param(family, train, leaves_only, id=name, marks=marks)


@pytest.mark.parametrize("family,train,leaves_only", [_clean_param(*k, r) for k, r in CLEAN.items()])
def test_clean_pair_has_no_false_divergence(pair_runs, family, train, leaves_only):
    rows = loc.clean_orders(pair_runs(family), train=train, leaves_only=leaves_only)
    assert all(rc == 0 for _, rc, _ in rows), f"{family}: false divergence on the clean pair: {rows}"


@pytest.mark.parametrize("bug", [_bug_param(b) for b in loc.CATALOGUE])
def test_compare_names_the_bug(pair_runs, bug):
    outcome = loc.run_bug(pair_runs(bug.family), bug)
    if outcome.status == "error":
        raise RuntimeError(f"{bug.id}: {outcome.detail}")  # not an xfail: the benchmark itself broke
    assert outcome.exit_code == 1, f"{bug.id}: compare found no divergence (exit {outcome.exit_code})"
    assert outcome.named == bug.expected, (f"{bug.id}: named {outcome.named!r} (MindSpore {outcome.named_ms!r}), "
                                           f"expected {bug.expected!r}")
    assert not outcome.disagreements, f"{bug.id}: the other argument order or --bisect blames another module: " \
                                      f"{outcome.disagreements}"
    assert not outcome.false_claims, f"{bug.id}: false claims in the text: {outcome.false_claims}"
    if outcome.culprit == "parent_code":  # code in the parent's forward: the zoom-in must name the op
        assert outcome.zoom and outcome.zoom.startswith("op: "), f"{bug.id}: zoom-in gave {outcome.zoom!r}"


def test_docs_show_the_catalogues_table():
    page = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text()
    assert loc.catalogue_matrix() in page, "docs/compare.md's localization table differs from tests/zoo/localization.py"
