"""`align data A B` on real pipelines: torchvision (ImageFolder, transforms, DataLoader) against mindspore.dataset
(ImageFolderDataset, vision) over 200 generated PNG images, and a small text set tokenised on each side; one bug
injected at a time must be named by its rule, the clean pairs must pass. Rules: mappings/data_rules.yaml."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aligner
from aligner.core.errors import AlignerError
from aligner.pipelines.data import DataCompareResult
from aligner.pipelines.data.rules import DataRule
from aligner.render.data import finding_text
from tests.support import data_pipelines as pipes
from tests.support.cli import align_in_process, assert_one_line_error


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pipes.make_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def reference(images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision's clean pipeline, two epochs, tensors kept."""
    out = tmp_path_factory.mktemp("ref") / "pt"
    aligner.record_data(pipes.torch_images(images), out, tensors=True, epochs=2, fields=["image", "label"])
    return out


def _ms(images: Path, out: Path, **kw: Any) -> Path:
    aligner.record_data(pipes.ms_images(images, **kw), out, tensors=True, epochs=2)
    return out


def _rules(result: Any) -> list[DataRule]:
    return [f.rule for f in result.all_findings]


def test_clean_pair_passes(images: Path, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ms = _ms(images, tmp_path / "ms")
    result = aligner.compare_data(reference, ms)
    assert result.passed and not result.all_findings, [finding_text(f) for f in result.all_findings]
    # every sample agrees: torchvision's and vision's float32 normalisations differ only in the last bits
    assert result.identical == 200 and result.first_difference is None
    proc = align_in_process(capsys, "data", reference, ms, "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["identical"] == 200


# bug -> the rule that must name it (and no error-severity rule besides)
IMAGE_BUGS = {
    "hwc": DataRule.LAYOUT,                          # HWC2CHW forgotten
    "no-normalize": DataRule.NORMALIZATION_MISSING,  # Normalize forgotten (dp.01)
    "twice": DataRule.NORMALIZATION_TWICE,           # Normalize applied twice
    "constants": DataRule.NORMALIZATION_CONSTANTS,   # other mean/std
    "bgr": DataRule.CHANNEL_ORDER,                   # RGB -> BGR
    "size": DataRule.IMAGE_SIZE,                     # CenterCrop(28)
    "flip": DataRule.AUGMENTATION,                   # RandomHorizontalFlip at evaluation (dp.02)
    "offset": DataRule.LABEL_OFFSET,                 # labels + 1
    "one-hot": DataRule.ONE_HOT,                     # OneHot on one side
}


@pytest.mark.parametrize("bug", sorted(IMAGE_BUGS))
def test_image_pipeline_bug_named(bug: str, images: Path, reference: Path, tmp_path: Path) -> None:
    result = aligner.compare_data(reference, _ms(images, tmp_path / "ms", bug=bug))
    errors = [f.rule for f in result.all_findings if f.severity.value == "error"]
    assert errors == [IMAGE_BUGS[bug]], [finding_text(f) for f in result.all_findings]
    assert result.exit_code == 1
    for finding in result.all_findings:  # every template fills in from its evidence
        says, fix = finding_text(finding)
        assert says and fix and "{" not in says


def test_diagnosis_details(images: Path, reference: Path, tmp_path: Path) -> None:
    """The numbers a fix needs: the missing constants recovered to 3 digits (ImageNet's), the flip's side named, the
    order of the swapped classes."""
    missing = aligner.compare_data(reference, _ms(images, tmp_path / "a", bug="no-normalize")).findings[0]
    assert missing.evidence["mean"] == "[0.485, 0.456, 0.406]" and missing.evidence["std"] == "[0.229, 0.224, 0.225]"
    assert missing.evidence["side"] == str(tmp_path / "a")
    reverse = aligner.compare_data(tmp_path / "a", reference).findings[0]  # the sides named the other way round
    assert (reverse.rule, reverse.evidence["mean"], reverse.evidence["std"], reverse.evidence["side"]) == (
        DataRule.NORMALIZATION_MISSING, missing.evidence["mean"], missing.evidence["std"], str(tmp_path / "a"))
    flip = aligner.compare_data(reference, _ms(images, tmp_path / "b", bug="flip"))
    found = next(f for f in flip.findings if f.rule == DataRule.AUGMENTATION)
    assert found.evidence["active"] == f" on side {tmp_path / 'b'}"  # from its two epochs; the reference repeats
    # a flip changes about half the samples (p=0.5, 200 draws: 70..130 is beyond 4 standard deviations)
    assert 70 <= found.evidence["changed"] <= 130
    perm = aligner.compare_data(reference, _ms(images, tmp_path / "c", class_indexing={
        "dog": 0, "cat": 1, "fox": 2, "owl": 3}))
    assert _rules(perm) == [DataRule.LABEL_PERMUTATION]
    assert perm.findings[0].evidence["pairs"] == "0 -> 1, 1 -> 0"


def test_value_range(images: Path, tmp_path: Path) -> None:
    """ToTensor (0-1) on one side, no Rescale (0-255) on the other, neither normalised."""
    pt = tmp_path / "pt"
    aligner.record_data(pipes.torch_images(images, normalize=False), pt, fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images, bug="range"), tmp_path / "ms")
    result = aligner.compare_data(pt, tmp_path / "ms")
    assert _rules(result) == [DataRule.VALUE_RANGE]
    assert result.findings[0].evidence["side"] == str(tmp_path / "ms")
    assert abs(result.findings[0].evidence["scale"] - 255) < 0.01


def test_interpolation_effect_size(images: Path, tmp_path: Path) -> None:
    """Resize 36 -> 32 bilinear in PIL (torchvision, antialiased) and in OpenCV (vision): small everywhere."""
    aligner.record_data(pipes.torch_images(images, resize=32), tmp_path / "pt", tensors=True, fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images, resize=32), tmp_path / "ms", tensors=True)
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == [DataRule.INTERPOLATION]
    assert result.passed  # a warning: the effect is measured, the user decides
    image = result.fields[0]
    # measured 44.3 dB: well above the 30 dB limit separating resampling from augmentation, far from lossless
    assert image.psnr is not None and 35 < image.psnr < 60



def test_nearest_against_bilinear_over_two_epochs(images: Path, tmp_path: Path) -> None:
    """NEAREST on one side, BILINEAR on the other: a large difference in every sample (median 31 dB, a share of the
    samples below the 30 dB that a single epoch calls strong, and so augmentation), but the same in both epochs on
    both sides: resampling, not augmentation."""
    aligner.record_data(pipes.torch_images(images, resize=32, nearest=True), tmp_path / "pt", tensors=True,
                        epochs=2, fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images, resize=32), tmp_path / "ms", tensors=True, epochs=2)
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == [DataRule.INTERPOLATION]
    assert result.findings[0].evidence["alike"] == ", alike in both epochs"
    image = result.fields[0]
    assert image.psnr is not None and image.psnr < 45  # measured below the bilinear pair's 44.3 dB


ORDER_CASES = {
    "shuffle-one-side": (dict(shuffle=True), {}, DataRule.SHUFFLE_ONE_SIDE),
    "shuffle-seed": (dict(shuffle=True), dict(shuffle=True), DataRule.SHUFFLE_SEED),
    "drop-last": (dict(drop_last=True), {}, DataRule.DROP_LAST),
    "batch-size": ({}, dict(batch=16), DataRule.BATCH_COMPOSITION),
}


@pytest.mark.parametrize("case", sorted(ORDER_CASES))
def test_order_bug_named(case: str, images: Path, tmp_path: Path) -> None:
    pt_kw, ms_kw, rule = ORDER_CASES[case]
    aligner.record_data(pipes.torch_images(images, **pt_kw), tmp_path / "pt", epochs=2, fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images, **ms_kw), tmp_path / "ms", epochs=2)
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == [rule], [finding_text(f) for f in result.all_findings]


def test_missing_samples(images: Path, reference: Path, tmp_path: Path) -> None:
    """A class folder the port does not read (class_indexing names three classes: MindSpore skips the fourth)."""
    ms = _ms(images, tmp_path / "ms", class_indexing={"cat": 0, "dog": 1, "fox": 2})
    result = aligner.compare_data(reference, ms)
    assert DataRule.SAMPLES_MISSING in _rules(result)
    assert result.findings[0].evidence["missing"] == 50


TEXT_CASES = {
    "pad-side": (dict(side="left"), {}, DataRule.PAD_SIDE),
    "pad-value": ({}, dict(pad=1), DataRule.PAD_VALUE),
    "truncation": ({}, dict(max_len=12), DataRule.TRUNCATION),
}


@pytest.mark.parametrize("case", [None, *sorted(TEXT_CASES)])
def test_text_pipelines(case: str | None, tmp_path: Path) -> None:
    sentences = pipes.make_sentences()
    pt_kw, ms_kw, rule = TEXT_CASES[case] if case else ({}, {}, None)
    aligner.record_data(pipes.torch_text(sentences, **pt_kw), tmp_path / "pt")
    aligner.record_data(pipes.ms_text(sentences, **ms_kw), tmp_path / "ms", fields=["ids", "label"])
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == ([rule] if rule else []), [finding_text(f) for f in result.all_findings]
    assert result.passed == (rule is None)


def _sharded(images: Path, out: Path, shards: list[tuple[int, int]], torch_side: bool, shuffle: bool = False) -> Path:
    import torch

    for rank, (num, shard) in enumerate(shards):
        if torch_side:
            data = pipes.torch_images(images)
            sampler = torch.utils.data.DistributedSampler(data.dataset, num_replicas=num, rank=shard, shuffle=shuffle)
            source = pipes.torch_images(images, sampler=sampler)
            aligner.record_data(source, out, fields=["image", "label"], rank=rank, world_size=len(shards))
        else:
            source = pipes.ms_images(images, num_shards=num, shard_id=shard, shuffle=shuffle)
            aligner.record_data(source, out, rank=rank, world_size=len(shards))
    return out


@pytest.fixture(scope="module")
def pt_sharded(images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch's two ranks: DistributedSampler(num_replicas=2, rank=0 and 1)."""
    return _sharded(images, tmp_path_factory.mktemp("sharded") / "pt", [(2, 0), (2, 1)], True)


@pytest.mark.parametrize("case", ["clean", "same-shard", "shard-missing"])
def test_sharding(case: str, images: Path, pt_sharded: Path, tmp_path: Path) -> None:
    """DistributedSampler(num_replicas=2) against num_shards/shard_id: the same shard on both ranks, or a third of the
    data left out (num_shards=3 on two ranks)."""
    pt = pt_sharded
    shards = {"clean": [(2, 0), (2, 1)], "same-shard": [(2, 0), (2, 0)], "shard-missing": [(3, 0), (3, 1)]}[case]
    ms = _sharded(images, tmp_path / "ms", shards, False)
    assert sorted(os.listdir(ms)) == ["rank0", "rank1"]
    result = aligner.compare_data(pt, ms)
    sharding = [f.rule for f in result.findings]
    if case == "clean":
        assert result.passed and not result.all_findings, [finding_text(f) for f in result.all_findings]
    else:
        assert DataRule(case) in sharding and not result.passed, sharding
    if case == "shard-missing":  # MindSpore's two ranks read 2 x 67 of the 200 samples, torch's ranks all 200
        found = next(f for f in result.findings if f.rule == DataRule.SHARD_MISSING)
        assert found.evidence["side"] == str(ms) and found.evidence["missing"] == 200 - 2 * 67


def test_bad_inputs_one_line(reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing folder, not a data dump, a model dump, a FIFO manifest, different fields: one line, exit 2."""
    assert_one_line_error(align_in_process(capsys, "data", reference, tmp_path / "nope"), "no such directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(align_in_process(capsys, "data", reference, tmp_path / "empty"), "not a data dump")
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.jsonl").write_text(json.dumps({"format": "aligner-dump", "version": 2}) + "\n")
    assert_one_line_error(align_in_process(capsys, "data", reference, model), "is a model dump")
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.jsonl")
    assert_one_line_error(align_in_process(capsys, "data", reference, fifo), "FIFO")
    other = tmp_path / "other"
    aligner.record_data([{"x": [[1.0, 2.0]], "y": [1]}], other)
    assert_one_line_error(align_in_process(capsys, "data", reference, other), "different fields")
    with pytest.raises(AlignerError, match="different fields"):
        aligner.compare_data(reference, other)
    assert_one_line_error(align_in_process(capsys, "data", reference), "two data dump folders")
    ranks = tmp_path / "ranks"
    aligner.record_data([{"x": [[1.0, 2.0]], "y": [1]}], ranks, rank=0, world_size=1)
    assert_one_line_error(align_in_process(capsys, "data", reference, ranks), "rank folders")


def test_reports_written(images: Path, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ms = _ms(images, tmp_path / "ms<b>", bug="bgr")
    proc = align_in_process(capsys, "data", reference, ms, "--json", tmp_path / "r.json", "--html", tmp_path / "r.html")
    assert proc.returncode == 1 and "channel-order" in proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert [f["rule"] for f in data["findings"]] == ["channel-order"] and "BGR" in data["findings"][0]["says"]
    assert DataCompareResult.from_dict(data) == aligner.compare_data(reference, ms)  # the report reads back
    page = (tmp_path / "r.html").read_text()
    assert "ms&lt;b&gt;" in page and "ms<b>" not in page  # the folder name is data, escaped
    again = align_in_process(capsys, "data", reference, ms, "--json", tmp_path / "r.json")
    assert_one_line_error(again, "exists")


def test_more_image_and_label_rules(images: Path, reference: Path, tmp_path: Path) -> None:
    """uint8 on both sides (PILToTensor / no Rescale) is clean; a float cast of the same values is only a dtype
    note, for images and for labels; two classes folded into one id is a label mapping that is no permutation."""
    raw = tmp_path / "pt"
    aligner.record_data(pipes.torch_images(images, to_tensor=False, normalize=False), raw, tensors=True,
                        fields=["image", "label"])
    clean = aligner.compare_data(raw, _ms(images, tmp_path / "u8", bug="uint8"))
    assert not clean.all_findings and clean.identical == 200
    cast = aligner.compare_data(raw, _ms(images, tmp_path / "f32", bug="float"))
    assert _rules(cast) == [DataRule.DTYPE] and cast.passed
    merged = aligner.compare_data(raw, _ms(images, tmp_path / "merge", bug="merge"))
    assert DataRule.LABELS_DIFFER in _rules(merged) and not merged.passed
    floats = aligner.compare_data(reference, _ms(images, tmp_path / "float-label", bug="float-label"))
    assert [(f.rule, f.field) for f in floats.findings] == [(DataRule.DTYPE, "label")] and floats.passed


def test_augmentation_without_tensors(images: Path, tmp_path: Path) -> None:
    """A flip keeps every per-channel statistic: without tensors, the share of changed samples (about half) tells a
    random transform from resampling (which changes every sample)."""
    aligner.record_data(pipes.torch_images(images), tmp_path / "pt", fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images, bug="flip"), tmp_path / "ms")
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == [DataRule.AUGMENTATION]
    assert "record epochs=2" in result.findings[0].evidence["active"]  # one epoch: which side cannot be told


class _Epochs:
    """A training loop's view of a DataLoader with a DistributedSampler: set_epoch(e) before each epoch, or not."""

    def __init__(self, loader: Any, set_epoch: bool) -> None:
        self.loader, self.set_epoch, self.epoch = loader, set_epoch, 0

    def __iter__(self) -> Any:
        if self.set_epoch:
            self.loader.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)


def test_reshuffle_per_epoch_and_fixed_order(images: Path, tmp_path: Path) -> None:
    import torch

    def shuffled(set_epoch: bool) -> _Epochs:
        data = pipes.torch_images(images).dataset
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
        return _Epochs(pipes.torch_images(images, sampler=sampler), set_epoch)

    aligner.record_data(shuffled(True), tmp_path / "a", epochs=2, fields=["image", "label"])
    aligner.record_data(shuffled(False), tmp_path / "b", epochs=2, fields=["image", "label"])
    result = aligner.compare_data(tmp_path / "a", tmp_path / "b")
    assert _rules(result) == [DataRule.RESHUFFLE_PER_EPOCH]
    assert result.findings[0].evidence["side"] == str(tmp_path / "a")
    # a fixed order on each side, but not the same one (a file list read backwards)
    backwards = pipes.torch_images(images, sampler=list(range(199, -1, -1)))
    aligner.record_data(backwards, tmp_path / "c", epochs=2, fields=["image", "label"])
    aligner.record_data(pipes.ms_images(images), tmp_path / "d", epochs=2)
    fixed = aligner.compare_data(tmp_path / "c", tmp_path / "d")
    assert _rules(fixed) == [DataRule.ORDER_DIFFERS] and "again" in fixed.findings[0].evidence["note"]


@pytest.mark.parametrize("ms_kw, rule", [(dict(pad_to=20), DataRule.PAD_LENGTH),
                                         (dict(missing_word="fox"), DataRule.TOKENS_DIFFER),
                                         (dict(special=True), DataRule.SPECIAL_TOKENS)])
def test_more_text_rules(ms_kw: dict[str, Any], rule: DataRule, tmp_path: Path) -> None:
    sentences = pipes.make_sentences()
    aligner.record_data(pipes.torch_text(sentences), tmp_path / "pt")
    aligner.record_data(pipes.ms_text(sentences, **ms_kw), tmp_path / "ms", fields=["ids", "label"])
    result = aligner.compare_data(tmp_path / "pt", tmp_path / "ms")
    assert _rules(result) == [rule], [finding_text(f) for f in result.all_findings]


def test_shuffled_shards_are_clean(images: Path, tmp_path: Path) -> None:
    """Both sides shard a shuffle (DistributedSampler(shuffle=True), shuffle=True with num_shards): each rank reads
    other samples on the two sides, all ranks together the same ones: no error, the assignment noted."""
    pt = _sharded(images, tmp_path / "pt", [(2, 0), (2, 1)], True, shuffle=True)
    ms = _sharded(images, tmp_path / "ms", [(2, 0), (2, 1)], False, shuffle=True)
    result = aligner.compare_data(pt, ms)
    assert result.passed, [finding_text(f) for f in result.all_findings]
    assert [f.rule for f in result.findings] == [DataRule.SHARD_ASSIGNMENT]


def test_shard_overlap(images: Path, pt_sharded: Path, tmp_path: Path) -> None:
    """Rank 1 told num_shards=3: its shard [1, 4, 7, ...] shares a sixth of its samples with rank 0's [0, 2, 4, ...]."""
    ms = _sharded(images, tmp_path / "ms", [(2, 0), (3, 1)], False)
    result = aligner.compare_data(pt_sharded, ms)
    overlap = next(f for f in result.findings if f.rule == DataRule.SHARD_OVERLAP)
    assert overlap.evidence["shared"] == len(set(range(0, 200, 2)) & set(range(1, 200, 3)))


def test_tensor_field_values_differ(tmp_path: Path) -> None:
    """Tabular features standardised on one side only: no image rule applies, the field is named with its count."""
    rng = np.random.default_rng(0)
    x = rng.normal(5, 2, (64, 6)).astype(np.float32)
    aligner.record_data([(x[i:i + 16], np.arange(i, i + 16)) for i in range(0, 64, 16)], tmp_path / "a")
    z = (x - x.mean(0)) / x.std(0)
    aligner.record_data([(z[i:i + 16], np.arange(i, i + 16)) for i in range(0, 64, 16)], tmp_path / "b")
    result = aligner.compare_data(tmp_path / "a", tmp_path / "b")
    assert _rules(result) == [DataRule.VALUES_DIFFER] and result.findings[0].evidence["changed"] == 64
