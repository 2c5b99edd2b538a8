"""The frameworks aligner speaks, spelled one way everywhere (`Framework.PYTORCH.value == "pytorch"`)."""
from __future__ import annotations

import enum


class Framework(str, enum.Enum):
    """A framework; a str subclass, so it compares equal to (and serializes as) its name."""

    PYTORCH = "pytorch"
    MINDSPORE = "mindspore"
    NUMPY = "numpy"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """How messages name it: torch, MindSpore, NumPy."""
        return _LABELS[self]

    @property
    def other(self) -> "Framework":
        """The other side of a PyTorch <-> MindSpore migration."""
        return Framework.MINDSPORE if self is Framework.PYTORCH else Framework.PYTORCH

    @classmethod
    def parse(cls, name: str | None) -> "Framework | None":
        """From any spelling a manifest, checkpoint or user gives ('torch', 'PyTorch', 'ms', ...); None if unknown."""
        if name is None:
            return None
        key = str(name).strip().lower()
        return _ALIASES.get(key)


_ALIASES = {"pytorch": Framework.PYTORCH, "torch": Framework.PYTORCH, "pt": Framework.PYTORCH,
            "mindspore": Framework.MINDSPORE, "ms": Framework.MINDSPORE, "numpy": Framework.NUMPY,
            "np": Framework.NUMPY}
_LABELS = {Framework.PYTORCH: "torch", Framework.MINDSPORE: "MindSpore", Framework.NUMPY: "NumPy"}
