"""Suite-wide pytest set-up: the fuzz budgets (hypothesis profiles) and the `align` fixture; the CLI harness itself
is tests/support/cli.py."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.support.cli import run_align

# Triton's interpreter runs the GPU statistics kernel on CPU tensors (tests/metrics/test_triton_stats.py). It must be
# on before `triton.language` is first imported (its jitted helpers are defined then), so for the whole test process;
# nothing else here runs Triton (this suite runs on machines without a GPU).
os.environ["TRITON_INTERPRET"] = "1"

# Fuzz budgets: `make test` runs the bounded one; `pytest --fuzz-long` (or ALIGNER_FUZZ=long) the long one. Fuzz tests
# take their example count from the active profile (`@settings()` without max_examples).
settings.register_profile("bounded", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-long", action="store_true", help="run the fuzz tests with the long example budget")


def pytest_configure(config: pytest.Config) -> None:
    long = config.getoption("--fuzz-long") or os.environ.get("ALIGNER_FUZZ") == "long"
    settings.load_profile("long" if long else "bounded")


@pytest.fixture
def align():
    """The `run_align` helper as a fixture."""
    return run_align
