"""Hand-made factories for `align doctor` tests (tests/pipelines/doctor/test_doctor.py): the twin pre-norm block of
tests/support/twin_models.py, clean or with one migration bug in its MindSpore port, with an optimizer on each side.

Each is a MODULE:CALLABLE / FILE.py:CALLABLE factory as the doctor's resolver takes it (called with no arguments).
The MindSpore models come with their own random init: the doctor's weights stage converts the torch weights into them.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # loaded by file path (FILE.py:CALLABLE) from another directory
    sys.path.insert(0, str(ROOT))

from tests.support import twin_models as tm  # noqa: E402

LR = 0.1
INPUT_SHAPE = tm.BLOCK_INPUT


def torch_block() -> Any:
    """The torch block in eval mode with SGD(momentum 0.9)."""
    import torch

    model = tm.torch_model("block", seed=0).eval()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def torch_block_only() -> Any:
    return tm.torch_model("block", seed=0).eval()


def _ms(lr: float = LR) -> tuple[Any, Any]:
    from mindspore import nn

    model = tm.mindspore_model("block")
    model.set_train(False)
    return model, nn.Momentum(model.trainable_params(), learning_rate=lr, momentum=0.9)


def ms_block() -> Any:
    """The faithful port: nn.Momentum is torch's SGD(momentum) with dampening 0."""
    return _ms()


def ms_block_only() -> Any:
    return _ms()[0]


def ms_gelu_tanh() -> Any:
    """mlp.act left at MindSpore's default GELU (tanh approximation; torch's is exact erf)."""
    from mindspore import nn

    model, opt = _ms()
    model.mlp.act = nn.GELU()
    return model, opt


def ms_glue_scale() -> Any:
    """The block's own construct scales the attention branch by 0.5 before the residual add (code between calls)."""
    model, opt = _ms()

    def construct(self: Any, x: Any) -> Any:
        x = x + 0.5 * self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
    model.construct = types.MethodType(construct, model)
    return model, opt


def ms_noisy() -> Any:
    """A random op in the port's forward that no seed or dropout switch stops: each call draws new noise."""
    from mindspore import ops

    model, opt = _ms()

    def construct(self: Any, x: Any) -> Any:
        x = x + self.attn(self.ln1(x)) + 1e-3 * ops.standard_normal(x.shape)
        return x + self.mlp(self.ln2(x))
    model.construct = types.MethodType(construct, model)
    return model, opt


def ms_half_lr() -> Any:
    """Forward identical; the optimizer's learning rate is half torch's."""
    return _ms(lr=LR / 2)


def raises() -> Any:
    raise ValueError("config file missing")


def not_a_model() -> Any:
    return {"weights": 1}


def torch_wide() -> Any:
    """A torch model whose parameter count differs from ms_narrow's (same input, same layer kinds)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 8)).eval()


def ms_narrow() -> Any:
    from mindspore import nn

    model = nn.SequentialCell([nn.Dense(16, 4)])
    model.set_train(False)
    return model
