"""Name mapping between PyTorch and MindSpore: data rules (mappings/), user maps, and target-guided matching.

The names below are imported on first use: `align compare` reads the op table (aligner.mapping.ops) only for op
records, the user map only with --map (or msprobe's mapping files beside an msprobe dump) and the conversion planner
only for PyTorch/MindSpore parameter gradients."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.mapping.msprobe_maps import MsprobeMap, load_msprobe_maps
    from aligner.mapping.ops import canonical_op, input_role
    from aligner.mapping.plan import FAILING, Entry, Plan, build_plan
    from aligner.mapping.usermap import UserMap, load_user_map

_LAZY = {"FAILING": "aligner.mapping.plan", "Entry": "aligner.mapping.plan", "Plan": "aligner.mapping.plan",
         "build_plan": "aligner.mapping.plan", "UserMap": "aligner.mapping.usermap",
         "load_user_map": "aligner.mapping.usermap", "canonical_op": "aligner.mapping.ops",
         "input_role": "aligner.mapping.ops",
         "MsprobeMap": "aligner.mapping.msprobe_maps", "load_msprobe_maps": "aligner.mapping.msprobe_maps"}

__all__ = ["FAILING", "Entry", "MsprobeMap", "Plan", "UserMap", "build_plan", "canonical_op", "input_role",
           "load_msprobe_maps", "load_user_map"]


__getattr__ = lazy.attributes(__name__, _LAZY)
