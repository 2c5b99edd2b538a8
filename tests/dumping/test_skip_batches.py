"""`aligner.skip_batches`: resuming at step D sees the batches the uninterrupted run saw from batch D on, in both
frameworks."""
from __future__ import annotations

import mindspore as ms
import mindspore.dataset as msds
import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import AlignerError

DATA = np.arange(40, dtype=np.float32).reshape(20, 2)


def _loader(seed: int) -> torch.utils.data.DataLoader:
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(DATA))
    return torch.utils.data.DataLoader(dataset, batch_size=3, shuffle=True,
                                       generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n", [0, 1, 4, 7])
def test_torch_resumed_loader_gives_the_remaining_batches_of_the_same_order(n):
    full = [b[0].numpy() for b in _loader(5)]
    resumed = [b[0].numpy() for b in aligner.skip_batches(_loader(5), n)]
    assert len(resumed) == len(full) - n
    for a, b in zip(resumed, full[n:]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(full[0], [b[0].numpy() for b in _loader(6)][0])  # the order is really shuffled


def test_mindspore_dataset_skips_batches():
    def source() -> msds.Dataset:
        return msds.NumpySlicesDataset({"x": DATA}, shuffle=False).batch(3)
    full = [d["x"] for d in source().create_dict_iterator(output_numpy=True)]
    resumed = [d["x"] for d in aligner.skip_batches(source(), 2).create_dict_iterator(output_numpy=True)]
    assert len(resumed) == len(full) - 2
    for a, b in zip(resumed, full[2:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("data,n,needle", [
    (None, 1, "DataLoader"), ("loader", -1, ">= 0"), ("loader", True, ">= 0"), ("loader", 99, "cannot skip 99")])
def test_bad_input_is_one_clear_error(data, n, needle):
    with pytest.raises(AlignerError, match=needle):
        aligner.skip_batches(_loader(0) if data == "loader" else data, n)


def test_ms_tensor_is_not_a_dataset():
    with pytest.raises(AlignerError, match="mindspore.dataset"):
        aligner.skip_batches(ms.Tensor(DATA), 1)
