"""Real multi-rank training runs for tests/dumping/test_ranks.py: a tiny MLP trained data-parallel for 2 steps under
`aligner.dump(..., params=True)`, in variants that each plant one multi-card bug.

    python tests/support/ranks_job.py torch OUT      # torch.distributed on gloo: a 2-rank run, then a 4-rank run
    msrun --worker_num=2 ... tests/support/ranks_job.py mindspore OUT   # mindspore.communication (mccl on CPU)

torch ranks are forked from this script's process after it imported torch (and DistributedDataParallel's lazy
imports), so each rank skips the ~5 s of imports a spawned one pays; the parent runs no torch computation before
forking. Both frameworks start from the same numpy weights and feed rank r, step s the same numpy batch, so the
torch and MindSpore dumps of one rank compare record for record.

Variants (each a dump directory under OUT holding rank{N}/):
  torch_clean      DDP, 2 ranks
  torch_bug1       rank 1 alone uses GELU where the model has ReLU (a bug on one rank)
  torch_nosync     every step under DDP.no_sync(): the gradients are never all-reduced
  torch_ddpseed    rank 1 draws other initial weights, but DDP broadcasts rank 0's at construction; a BatchNorm
                   whose running statistics each rank's batch updates
  torch_stats_seed no DDP: gradients all-reduced by hand inside the dump context; rank 1 draws other initial weights;
                   a stats-only dump
  torch4_nan       4 ranks, the DDP wrapper dumped (its process group gives "dp"), a "tp" layout passed by hand, and
                   rank 2's batch holds a NaN at step 1
  ms_clean         MindSpore, 2 ranks, nn.DistributedGradReducer, reduced gradients recorded with save_grads
  ms_seed          as ms_clean, but rank 1 draws other initial weights (MindSpore broadcasts nothing)
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Any

import numpy as np

import aligner
from aligner.dumping import save_grads

IN, HIDDEN, OUT, BATCH, STEPS, LR = 8, 16, 4, 4, 2, 0.1
SHAPES = {"fc1.weight": (HIDDEN, IN), "fc1.bias": (HIDDEN,), "fc2.weight": (OUT, HIDDEN), "fc2.bias": (OUT,)}


def weights(seed: int) -> dict[str, np.ndarray]:
    """Initial weights drawn from `seed` (the same arrays go into either framework)."""
    rng = np.random.default_rng(seed)
    return {name: (0.3 * rng.standard_normal(shape)).astype(np.float32) for name, shape in SHAPES.items()}


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s batch at `step` (each rank its own shard)."""
    rng = np.random.default_rng(1000 * rank + step)
    return (rng.standard_normal((BATCH, IN)).astype(np.float32),
            rng.standard_normal((BATCH, OUT)).astype(np.float32))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- torch -------------------------------------------------------------------------------------------------------
def torch_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    class Mlp(nn.Module):
        def __init__(self, gelu: bool, bn: bool) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT)
            self.act = nn.GELU() if gelu else nn.ReLU()
            self.bn = nn.BatchNorm1d(HIDDEN) if bn else nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.bn(self.fc1(x))))

    def train(name: str, *, gelu: bool = False, seed: int = 0, nosync: bool = False, nan_at: int | None = None,
              dump_wrapper: bool = False, groups: dict[str, Any] | None = None, by_hand: bool = False,
              bn: bool = False) -> None:
        net = Mlp(gelu, bn)
        with torch.no_grad():
            for pname, value in weights(seed).items():
                net.get_parameter(pname).copy_(torch.from_numpy(value))
        ddp = net if by_hand else nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        for step in range(STEPS):
            x, y = (torch.from_numpy(a) for a in batch(rank, step))
            if nan_at == step:
                x[0, 0] = float("nan")
            with aligner.dump(ddp if dump_wrapper else net, os.path.join(out, name), step=step, params=True,
                              groups=groups, stats_only=by_hand), ddp.no_sync() if nosync else contextlib.nullcontext():
                loss = nn.functional.mse_loss(ddp(x), y)
                aligner.save("loss", loss)
                loss.backward()
                for p in net.parameters() if by_hand else ():  # the all-reduce written out, no DDP
                    dist.all_reduce(p.grad)
                    p.grad /= world
            opt.step()
            opt.zero_grad()

    if world == 2:
        train("torch_clean")
        train("torch_bug1", gelu=rank == 1)
        train("torch_nosync", nosync=True)
        train("torch_ddpseed", seed=rank, bn=True)
        train("torch_stats_seed", seed=rank, by_hand=True)
    else:
        train("torch4_nan", nan_at=1 if rank == 2 else None, dump_wrapper=True,
              groups={"tp": [[0, 1], [2, 3]]})
    dist.destroy_process_group()


def run_torch(out: str) -> None:
    import torch._dynamo  # noqa: F401  (DistributedDataParallel imports it on construction: once, before forking)
    import torch.multiprocessing as mp

    for world in (2, 4):
        mp.start_processes(torch_rank, args=(world, free_port(), out), nprocs=world, start_method="fork")


# -- MindSpore -----------------------------------------------------------------------------------------------------
def run_mindspore(out: str) -> None:
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    init()
    rank, world = get_rank(), get_group_size()

    class Mlp(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Dense(IN, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, OUT)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    def train(name: str, seed: int = 0) -> None:
        net = Mlp()
        params = dict(net.parameters_and_names())
        for pname, value in weights(seed).items():
            params[pname].set_data(ms.Tensor(value))
        opt = nn.SGD(net.trainable_params(), learning_rate=LR)
        reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=world)
        loss_fn = nn.MSELoss()
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
        for step in range(STEPS):
            x, y = (ms.Tensor(a) for a in batch(rank, step))
            with aligner.dump(net, os.path.join(out, name), step=step, params=True):
                loss, grads = grad_fn(x, y)
                aligner.save("loss", loss)
                grads = reducer(grads)
                save_grads(zip((p.name for p in opt.parameters), grads))
            opt(grads)

    train("ms_clean")
    train("ms_seed", seed=rank)


if __name__ == "__main__":
    {"torch": run_torch, "mindspore": run_mindspore}[sys.argv[1]](sys.argv[2])
