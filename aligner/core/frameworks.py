"""The frameworks aligner speaks, spelled one way everywhere (`Framework.PYTORCH.value == "pytorch"`)."""
from __future__ import annotations

import enum

from aligner.core.errors import AlignerError


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


class Reference(enum.StrEnum):
    """Which side of a comparison is the reference (`--ref`): an argument's place, or the side a framework made."""

    FIRST = "first"
    SECOND = "second"
    PYTORCH = "pytorch"
    MINDSPORE = "mindspore"

    @classmethod
    def parse(cls, ref: str | None) -> Reference | None:
        """`--ref` as given (None: the default; a framework in any spelling `Framework.parse` reads); AlignerError
        naming the choices for anything else."""
        if ref is None:
            return None
        text = str(ref).strip().lower()
        fw = Framework.parse(text)
        if text not in cls._value2member_map_ and fw in (Framework.PYTORCH, Framework.MINDSPORE):
            text = str(fw)
        try:
            return cls(text)
        except ValueError:
            raise AlignerError(f"--ref must be one of {', '.join(cls)}, got {ref!r}") from None


def reference_index(ref: str | None, frameworks: tuple[str, str]) -> int:
    """Index (0 or 1) of the reference side of two sides made by `frameworks`, as `--ref` says (default PyTorch, else
    the second); AlignerError for a choice `Reference` does not hold, or a framework neither or both sides have."""
    chosen = Reference.parse(ref)
    if chosen is None:
        return 0 if frameworks[0] == Framework.PYTORCH and frameworks[1] != Framework.PYTORCH else 1
    if chosen in (Reference.FIRST, Reference.SECOND):
        return 0 if chosen is Reference.FIRST else 1
    sides = [i for i, fw in enumerate(frameworks) if fw == chosen]
    if len(sides) != 1:
        raise AlignerError(f"--ref {chosen}: {'neither' if not sides else 'both'} side(s) were dumped by {chosen} "
                           f"(manifests say {frameworks[0]} and {frameworks[1]}); use --ref first|second")
    return sides[0]
