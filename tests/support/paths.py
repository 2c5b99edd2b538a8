"""Where the checkout's parts are, for a test at any depth of the tree."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
DATA = TESTS / "data"
SUPPORT = TESTS / "support"
