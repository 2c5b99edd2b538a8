"""aligner.record_data: what a data dump holds, the dump conventions (refused existing folder, overwrite, rank
folders, nothing half-written) and every bad source as one AlignerError line."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from aligner.dumping.data_format import FieldKind, Layout, read_data_dump


def _loader(n: int = 40, batch: int = 16) -> Any:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 8, 8, 3, generator=g)          # HWC
    labels = torch.arange(n) % 5
    ids = torch.randint(5, 50, (n, 10), generator=g)
    ids[::2, 7:] = 0                                      # half the rows padded on the right with 0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels, ids), batch_size=batch)


def test_record_contents(tmp_path: Path) -> None:
    out = tmp_path / "d"
    record = aligner.record_data(_loader(), out, fields=["image", "label", "ids"], tensors=True)
    assert (record.samples, record.batches) == (40, 3)
    dump = read_data_dump(out)
    image, label, ids = dump.fields
    assert (image.kind, image.spec.layout, image.spec.shape) == (FieldKind.IMAGE, Layout.HWC, (3, 8, 8))
    assert label.kind == FieldKind.LABEL and ids.kind == FieldKind.SEQUENCE and ids.spec.pad == 0
    assert dump.batch_sizes == [[16, 16, 8]] and dump.samples[17].tolist() == [0, 1, 1]
    # per-channel statistics of sample 17 are those of the tensor the loader gave, channels-first
    source = _loader().dataset.tensors[0][17].numpy()
    assert image.stats is not None
    np.testing.assert_allclose(image.stats[17, :, 0], source.mean(axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(image.stats[17, :, 3], source.max(axis=(0, 1)), rtol=1e-6)
    assert ids.seq is not None and ids.seq[0].tolist() == [7, 0, 3] and ids.seq[1].tolist() == [10, 0, 0]
    # the thumbnail: per channel the means of a 4 x 4 grid of 2 x 2 blocks
    assert image.thumb is not None
    blocks = source.reshape(4, 2, 4, 2, 3).mean(axis=(1, 3))            # [4, 4, channel]
    np.testing.assert_allclose(image.thumb[17], np.moveaxis(blocks, 2, 0).reshape(3, 16), rtol=1e-6)
    assert label.label is not None and label.label.tolist() == [i % 5 for i in range(40)]
    recorded = dump.tensor(image, 17)
    assert recorded is not None and np.array_equal(recorded, np.moveaxis(source, 2, 0))
    # equal samples, equal digests; different samples, different digests
    again = tmp_path / "again"
    aligner.record_data(_loader(), again, fields=["image", "label", "ids"])
    assert np.array_equal(read_data_dump(again).fields[0].digest, image.digest)
    assert len({row.tobytes() for row in image.digest}) == 40


def test_pad_found_in_a_later_batch(tmp_path: Path) -> None:
    """Dynamic padding: the first batch's sequences all have one length (no pad token to see), the second pads
    with 1 (RoBERTa's pad id) on the right."""
    first = torch.tensor([[5, 6, 7], [8, 9, 10]])
    second = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 1, 1, 1]])
    aligner.record_data([first, second], tmp_path / "d")
    ids = read_data_dump(tmp_path / "d").fields[0]
    assert ids.spec.pad == 1 and ids.seq is not None
    assert ids.seq.tolist() == [[3, 0, 0], [3, 0, 0], [5, 0, 0], [2, 0, 3]]


def test_thumbnail_uneven_blocks(tmp_path: Path) -> None:
    """A 10 x 7 image: blocks of 2-3 rows and 1-2 columns, each the mean of its own pixels."""
    image = torch.arange(70, dtype=torch.float32).reshape(1, 1, 10, 7)
    aligner.record_data([image], tmp_path / "d")
    thumb = read_data_dump(tmp_path / "d").fields[0].thumb
    rows, cols = [0, 2, 5, 7, 10], [0, 1, 3, 5, 7]
    expected = [image[0, 0, rows[i]:rows[i + 1], cols[j]:cols[j + 1]].mean().item() for i in range(4) for j in range(4)]
    assert thumb is not None
    np.testing.assert_allclose(thumb[0, 0], expected, rtol=1e-6)


def test_mindspore_dataset_and_epochs(tmp_path: Path) -> None:
    import mindspore.dataset as ds

    data = ds.NumpySlicesDataset({"x": np.arange(30, dtype=np.float32).reshape(10, 3), "y": np.arange(10)},
                                 shuffle=True).batch(4)
    record = aligner.record_data(data, tmp_path / "d", batches=2, epochs=2)
    dump = read_data_dump(tmp_path / "d")
    assert record.samples == 16 and dump.batch_sizes == [[4, 4], [4, 4]] and dump.framework == "mindspore"
    assert [f.name for f in dump.fields] == ["x", "y"]


def test_existing_folder_and_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "d"
    aligner.record_data(_loader(), out)
    with pytest.raises(AlignerError, match="not empty"):
        aligner.record_data(_loader(), out)
    aligner.record_data(_loader(8, 4), out, overwrite=True)
    assert read_data_dump(out).header["samples"] == 8
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(AlignerError, match="not a data dump"):
        aligner.record_data(_loader(), other, overwrite=True)
    assert (other / "notes.txt").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["d", "mine"]  # no temp folder left


def test_rank_folders(tmp_path: Path) -> None:
    for rank in range(2):
        aligner.record_data(_loader(8, 4), tmp_path / "d", rank=rank, world_size=2)
    assert sorted(os.listdir(tmp_path / "d")) == ["rank0", "rank1"]
    assert read_data_dump(tmp_path / "d" / "rank1").header["rank"] == 1
    with pytest.raises(AlignerError, match="together"):
        aligner.record_data(_loader(), tmp_path / "e", rank=0)


class _Raising:
    """A source whose third batch fails, as a corrupt file fails a decode."""

    def __iter__(self) -> Iterator[Any]:
        for i in range(5):
            if i == 2:
                raise OSError("image file is truncated")
            yield torch.ones(4, 3)


def _ms_raising() -> Any:
    import mindspore.dataset as ds

    def gen() -> Iterator[tuple[np.ndarray]]:
        for i in range(6):
            if i == 3:
                raise ValueError("bad record")
            yield (np.ones(3, np.float32),)

    return ds.GeneratorDataset(gen, ["x"]).batch(2)


@pytest.mark.parametrize("source, needle", [
    ([], "no batch"),
    ([torch.ones(2, 3), (torch.ones(2, 3), torch.ones(2))], "differ from the first batch"),
    ([{"text": ["a", "b"]}], "digests numbers only"),
    ([(torch.ones(2, 3), torch.ones(3))], "disagree on the batch size"),
    (_Raising(), "raised at epoch 0 batch 2"),
    (42, "got int"),
])
def test_bad_sources_one_line(source: Any, needle: str, tmp_path: Path) -> None:
    with pytest.raises(AlignerError, match=needle) as info:
        aligner.record_data(source, tmp_path / "d")
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == []  # nothing half-written, no temp folder


def test_mindspore_raising_mid_iteration(tmp_path: Path) -> None:
    with pytest.raises(AlignerError, match="the data source raised") as info:
        aligner.record_data(_ms_raising(), tmp_path / "d")
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs, needle", [
    ({"batches": 0}, "batches"), ({"epochs": True}, "epochs"), ({"fields": "image"}, "fields"),
    ({"fields": ["a", "b"]}, "fields names 2"),
])
def test_bad_arguments(kwargs: dict[str, Any], needle: str, tmp_path: Path) -> None:
    with pytest.raises(AlignerError, match=needle):
        aligner.record_data(_loader(), tmp_path / "d", **kwargs)
