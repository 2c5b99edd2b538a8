"""Name mapping between PyTorch and MindSpore: data rules (mappings/), user maps, and target-guided matching."""
from aligner.mapping.plan import FAILING, Entry, Plan, build_plan
from aligner.mapping.usermap import UserMap, load_user_map

__all__ = ["FAILING", "Entry", "Plan", "UserMap", "build_plan", "load_user_map"]
