"""Which framework's naming convention a checkpoint uses: declared, known from its format, or guessed from names."""
from __future__ import annotations

from aligner.io.base import TensorInfo, TensorSource
from aligner.mapping.rules import FRAMEWORKS, group_names, load_rules


def guess_framework(infos: dict[str, TensorInfo]) -> str | None:
    """The naming convention of a name set, from leaves that only one framework's rules use (None if no clue)."""
    votes = {fw: 0 for fw in FRAMEWORKS}
    for rule in load_rules():
        ms_only = set(rule.rename.values()) - set(rule.rename)
        pt_only = set(rule.rename) - set(rule.rename.values())
        for leaves in group_names(infos).values():
            votes["mindspore"] += len(ms_only & set(leaves))
            votes["pytorch"] += len(pt_only & set(leaves) - {"weight", "bias"})
    if votes["mindspore"] == votes["pytorch"]:
        return None
    return max(votes, key=votes.get)


def source_framework(source: TensorSource, declared: str | None = None) -> str | None:
    """The naming convention of a checkpoint: declared by the user, known from its format, or guessed from names."""
    return declared or source.framework or guess_framework(source.infos)
