"""Which framework's naming convention a checkpoint uses: declared, known from its format, or guessed from names."""
from __future__ import annotations

from aligner.core.frameworks import Framework
from aligner.io.base import TensorInfo, TensorSource
from aligner.mapping.rules import group_names, load_layer_rules


def guess_framework(infos: dict[str, TensorInfo]) -> Framework | None:
    """The naming convention of a name set, from leaves that only one framework's rules use (None if no clue)."""
    ms_votes = pt_votes = 0
    for rule in load_layer_rules():
        ms_only = set(rule.rename.values()) - set(rule.rename)
        pt_only = set(rule.rename) - set(rule.rename.values())
        for leaves in group_names(infos).values():
            ms_votes += len(ms_only & set(leaves))
            pt_votes += len(pt_only & set(leaves) - {"weight", "bias"})
    if ms_votes == pt_votes:
        return None
    return Framework.MINDSPORE if ms_votes > pt_votes else Framework.PYTORCH


def source_framework(source: TensorSource, declared: str | None = None) -> str | None:
    """The naming convention of a checkpoint: declared by the user, known from its format, or guessed from names."""
    return declared or source.framework or guess_framework(source.infos)
