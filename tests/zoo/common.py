"""The shared shape of a zoo pair: a torch model, its MindSpore twin, inputs, and the `align convert` step."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


def align_cmd() -> list[str]:
    """The `align` CLI of the interpreter running the tests (the console script, else `python -m aligner.cli`)."""
    script = Path(sys.executable).with_name("align")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "aligner.cli"]


def run_align(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*align_cmd(), *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"align {' '.join(map(str, args))} exited {proc.returncode}\n"
                           f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def seed_all(seed: int) -> None:
    import mindspore as ms
    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)
    ms.set_seed(seed)


def perturb_constants_(model: Any, seed: int = 0, scale: float = 0.1) -> None:
    """Give every constant float parameter/buffer of a torch model (norm gammas/betas, zero biases, BatchNorm
    running stats) random values, so that a swapped or dropped tensor in the conversion changes the outputs."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in tensors:
            if not t.is_floating_point() or t.numel() < 2 or float(t.std()) != 0.0:
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype) * scale
            if name.endswith("running_var"):
                t.copy_(t + noise.abs() * 5)  # stays positive
            else:
                t.add_(noise)


def torch_default_init_(model: Any) -> None:
    """Re-initialise every Linear/Conv/Embedding with torch's own default (`reset_parameters`: uniform
    +-1/sqrt(fan_in), N(0, 1) embeddings). Zoo inits (std 0.02) keep activations so small that e.g. tanh vs erf GELU
    or LayerNorm eps 1e-7 vs 1e-6 stay below 1e-5 in the logits; with O(1) activations they show."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Embedding)
    for module in model.modules():
        if isinstance(module, kinds):
            module.reset_parameters()


@dataclass
class Pair:
    """One torch zoo model and its MindSpore zoo twin.

    `torch_inputs` / `ms_inputs` are keyword arguments (numpy arrays) for each side's forward; `output(...)` picks
    the compared tensor out of each side's return value. `user_map` is a `--map` YAML text for `align convert`, or
    None when `--like` alone resolves every key.
    """
    name: str
    torch_model: Any
    ms_model: Any
    torch_inputs: dict[str, np.ndarray]
    ms_inputs: dict[str, np.ndarray]
    torch_output: Callable[[Any], Any] = lambda out: out
    ms_output: Callable[[Any], Any] = lambda out: out
    user_map: str | None = None
    notes: list[str] = field(default_factory=list)
    convert_stdout: str = ""

    # -- forward -------------------------------------------------------------------------------------------
    def torch_tensors(self) -> dict[str, Any]:
        import torch

        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.torch_inputs.items()}

    def ms_tensors(self) -> dict[str, Any]:
        import mindspore as ms

        return {k: ms.Tensor(np.ascontiguousarray(v)) for k, v in self.ms_inputs.items()}

    def run_torch(self) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.torch_output(self.torch_model(**self.torch_tensors()))
        return out.detach().float().numpy()

    def run_ms(self) -> np.ndarray:
        out = self.ms_output(self.ms_model(**self.ms_tensors()))
        return out.float().asnumpy() if hasattr(out, "float") else out.asnumpy()

    # -- conversion ----------------------------------------------------------------------------------------
    def save_torch(self, path: str | os.PathLike) -> Path:
        import torch

        path = Path(path)
        torch.save(self.torch_model.state_dict(), path)
        return path

    def save_ms_init(self, path: str | os.PathLike) -> Path:
        import mindspore as ms

        path = Path(path)
        ms.save_checkpoint(self.ms_model, str(path))
        return path

    def make_equal(self, tmpdir: str | os.PathLike) -> Path:
        """torch state_dict -> `align convert --like <MindSpore init ckpt> [--map]` -> strict load into ms_model."""
        import mindspore as ms

        tmp = Path(tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        src = self.save_torch(tmp / f"{self.name}_torch.pth")
        like = self.save_ms_init(tmp / f"{self.name}_ms_init.ckpt")
        out = tmp / f"{self.name}_converted.ckpt"
        args = ["convert", src, "-o", out, "--like", like, "--force"]
        if self.user_map is not None:
            map_path = tmp / f"{self.name}_map.yaml"
            map_path.write_text(self.user_map)
            args += ["--map", map_path]
        self.convert_stdout = run_align(*args).stdout
        params = ms.load_checkpoint(str(out))
        not_loaded, unused = ms.load_param_into_net(self.ms_model, params, strict_load=True)
        if not_loaded or unused:
            raise AssertionError(f"{self.name}: strict load left parameters unloaded {not_loaded} "
                                 f"or checkpoint keys unused {unused}")
        return out

    def max_abs_diff(self) -> float:
        a, b = self.run_torch(), self.run_ms()
        if a.shape != b.shape:
            raise AssertionError(f"{self.name}: output shapes differ: torch {a.shape} vs mindspore {b.shape}")
        return float(np.max(np.abs(a - b)))
