"""`align data check DIR`: one recorded pipeline on its own. A real image folder read by mindspore.dataset (with a
duplicated file, a class nearly emptied) and a tabular torch set with NaN and sentinel values, each problem named
by its rule; the clean folder has no finding."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import aligner
from aligner.pipelines.data import DataCheckResult
from aligner.pipelines.data.rules import DataRule
from tests.support import data_pipelines as pipes
from tests.support.cli import align_in_process, assert_one_line_error


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pipes.make_images(tmp_path_factory.mktemp("images"), per_class=12)


def _record_ms(root: Path, out: Path) -> Path:
    aligner.record_data(pipes.ms_images(root), out)
    return out


def _rules(result: DataCheckResult) -> list[DataRule]:
    return [f.rule for f in result.all_findings]


def test_clean_folder(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _record_ms(folder, tmp_path / "d")
    result = aligner.check_data(out)
    assert not result.all_findings and result.passed
    assert result.fields[1].histogram == ((0, 12), (1, 12), (2, 12), (3, 12))
    proc = align_in_process(capsys, "data", "check", out, "--json", "-")
    assert proc.returncode == 0 and json.loads(proc.stdout)["samples"] == 48


def test_duplicates_imbalance_rare(folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "images"
    shutil.copytree(folder, root)
    shutil.copy(root / "cat" / "000.png", root / "cat" / "zzz.png")   # the same file listed twice
    for extra in sorted((root / "owl").iterdir())[1:]:                 # owl: 1 sample against 12/13
        extra.unlink()
    result = aligner.check_data(_record_ms(root, tmp_path / "d"))
    assert sorted(r.value for r in _rules(result)) == ["class-imbalance", "duplicates", "rare-class"]
    found = {f.rule: f for f in result.findings}
    assert found[DataRule.DUPLICATES].evidence["count"] == 1
    assert found[DataRule.CLASS_IMBALANCE].evidence["low"] == 3 and found[DataRule.RARE_CLASS].evidence["count"] == 1
    assert result.passed  # warnings


def test_labels_out_of_range(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _record_ms(folder, tmp_path / "d")
    result = aligner.check_data(out, classes=3)
    assert _rules(result) == [DataRule.LABEL_RANGE] and result.findings[0].evidence["samples"] == 12
    proc = align_in_process(capsys, "data", "check", out, "--classes", "3")
    assert proc.returncode == 1 and "label-range" in proc.stdout
    page = tmp_path / "check.html"
    assert align_in_process(capsys, "data", "check", out, "--classes", "3", "--html", page).returncode == 1
    assert "label-range" in page.read_text() and "<script" not in page.read_text()
    assert_one_line_error(align_in_process(capsys, "data", "check", out, "--classes", "x"), "--classes")


def test_missing_values_sentinels_constant(tmp_path: Path) -> None:
    """A tabular set: NaN in two rows of the features, -1 standing for an unknown label, a constant mask."""
    features = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    features[[5, 17], 2] = float("nan")
    labels = torch.arange(40) % 4
    labels[9] = -1
    mask = torch.ones(40, 6)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels, mask), batch_size=8)
    aligner.record_data(loader, tmp_path / "d", fields=["x", "y", "mask"])
    result = aligner.check_data(tmp_path / "d")
    found = {(f.rule, f.field): f for f in result.findings}
    assert set(found) == {(DataRule.MISSING_VALUES, "x"), (DataRule.SENTINEL, "y"), (DataRule.CONSTANT_FIELD, "mask")}
    assert found[DataRule.MISSING_VALUES, "x"].evidence == {"samples": 2, "values": 2, "first": 5}
    assert DataCheckResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert found[DataRule.SENTINEL, "y"].evidence["value"] == -1
    assert result.exit_code == 1


def test_ranks_same_shard(folder: Path, tmp_path: Path) -> None:
    for rank in range(2):
        aligner.record_data(pipes.ms_images(folder, num_shards=2, shard_id=0), tmp_path / "d", rank=rank,
                            world_size=2)
    result = aligner.check_data(tmp_path / "d")
    assert [f.rule for f in result.findings] == [DataRule.SAME_SHARD] and not result.passed


def test_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(align_in_process(capsys, "data", "check", tmp_path / "none"), "no such directory")
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.jsonl").write_text(json.dumps({"format": "aligner-dump", "version": 2}) + "\n")
    assert_one_line_error(align_in_process(capsys, "data", "check", model), "model dump")
    aligner.record_data([np.ones((2, 3))], tmp_path / "d")
    (tmp_path / "d" / "arrays" / "f0.hash.npy").unlink()
    assert_one_line_error(align_in_process(capsys, "data", "check", tmp_path / "d"), "incomplete")


@pytest.mark.parametrize("damage, needle", [
    ("sizes", "batch_sizes"), ("count", "counts 9 samples"), ("positions", "outside the recorded batches"),
    ("pickle", "not a readable array"), ("shape", "does not hold 4 samples"), ("link", "is a link"),
])
def test_damaged_dump_one_line(damage: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A data dump edited or broken after recording: each damage one line, exit 2, never a traceback."""
    out = tmp_path / "d"
    aligner.record_data([np.ones((2, 3, 8, 8), np.float32)] * 2, out)
    manifest, arrays = out / "manifest.jsonl", out / "arrays"
    header = json.loads(manifest.read_text())
    if damage in ("sizes", "count"):
        header["batch_sizes"] = "many" if damage == "sizes" else [[2, 7]]
        manifest.write_text(json.dumps(header) + "\n")
    elif damage == "positions":
        np.save(arrays / "samples.npy", np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 5, 1]]))
    elif damage == "pickle":
        np.save(arrays / "f0.stats.npy", np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True)
    elif damage == "shape":
        np.save(arrays / "f0.stats.npy", np.zeros((4, 2, 4)))
    else:
        (arrays / "f0.thumb.npy").unlink()
        (arrays / "f0.thumb.npy").symlink_to(tmp_path / "elsewhere.npy")
    assert_one_line_error(align_in_process(capsys, "data", "check", out), needle)


def test_random_transform_between_epochs(folder: Path, tmp_path: Path) -> None:
    """RandomHorizontalFlip left in an evaluation pipeline: the images of the second epoch are not the first's."""
    aligner.record_data(pipes.ms_images(folder, bug="flip"), tmp_path / "flip", epochs=2)
    result = aligner.check_data(tmp_path / "flip")
    assert [(f.rule, f.field) for f in result.findings] == [(DataRule.RANDOM_TRANSFORM, "image")]
    # p=0.5 per sample and epoch: a sample comes out unchanged in half the draws; 48 samples, beyond 4 sigma
    assert 8 <= result.findings[0].evidence["changed"] <= 40
    aligner.record_data(pipes.ms_images(folder), tmp_path / "clean", epochs=2)
    assert not aligner.check_data(tmp_path / "clean").all_findings
