"""Fixtures shared by the zoo test modules."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest


@pytest.fixture(scope="module")
def pair_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Any]]:
    """family -> tests.zoo.localization.PairRun (built, converted, torch reference dumps made once), built on first
    use; the ms_compat routes are installed for the requesting module only."""
    from tests.zoo import localization as loc
    from tests.zoo import ms_compat

    ms_compat.install()
    work = tmp_path_factory.mktemp("pairs")
    runs: dict[str, loc.PairRun] = {}

    def get(family: str) -> loc.PairRun:
        if family not in runs:
            runs[family] = loc.build_pair(family, work)
        return runs[family]
    yield get
    runs.clear()
    ms_compat.uninstall()
