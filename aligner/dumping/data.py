"""Resume a run's data order at a step: the batches a loader would give from batch `n` on, without the first `n`.

The checklist's comparison method resumes both frameworks from the checkpoint of step D-1 and skips the data already
seen, so step D sees the same batch on both sides. torch: a new DataLoader over the remaining batches of the
original's batch sampler (indices only: no sample is loaded to be thrown away). MindSpore: `dataset.skip(n)` on the
batched dataset.
"""
from __future__ import annotations

import sys
from typing import Any

from aligner.core.errors import AlignerError


def skip_batches(data: Any, n: int) -> Any:
    """A torch DataLoader or a batched mindspore.dataset that starts at batch `n` (0 gives the same batches).

    torch: the original's batch sampler is iterated once for its index lists (its random draws are made as iterating
    the loader would make them, so the order is the one the original would have given next; a shuffling sampler
    needs a seeded `generator` for two runs to agree at all); the returned loader keeps the dataset, collate_fn,
    workers and worker_init_fn, and seeds its workers as the original would have. Call it where you would have
    iterated the original loader."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise AlignerError(f"aligner.skip_batches needs a whole number of batches >= 0, got {n!r}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.utils.data.DataLoader):
        return _torch_loader(torch, data, n)
    ms = sys.modules.get("mindspore")
    if ms is not None and isinstance(data, ms.dataset.Dataset):
        return data.skip(n) if n else data
    raise AlignerError(f"aligner.skip_batches needs a torch DataLoader or a mindspore.dataset Dataset, got "
                       f"{type(data).__name__}")


def _torch_loader(torch: Any, loader: Any, n: int) -> Any:
    if loader.batch_sampler is None:
        raise AlignerError("aligner.skip_batches: this DataLoader has batch_size=None (no batches to count); skip "
                           "samples in the dataset instead")
    # as DataLoader.__iter__ does: the workers' base seed is drawn from the generator before the sampler draws its
    # order; the new loader gets a generator at that same state, so its workers are seeded as the original's were
    state = loader.generator.get_state() if loader.generator is not None else torch.get_rng_state()
    order = iter(loader.batch_sampler)
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
    batches = list(order)
    generator = torch.Generator()
    generator.set_state(state)
    if n > len(batches):
        raise AlignerError(f"aligner.skip_batches: the loader has {len(batches)} batches per epoch, cannot skip {n}")
    return torch.utils.data.DataLoader(
        loader.dataset, batch_sampler=batches[n:], num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        generator=generator, persistent_workers=loader.persistent_workers if loader.num_workers else False)
