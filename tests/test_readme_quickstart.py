"""README's quickstart, run as written: its files written, its commands run in order in an empty directory, each exit
code the one its `# exit N` comment gives (0 where none), and every output the prose quotes found in what the
command block before it printed. A step that stops working, or an output the README misquotes, fails here (the runner:
tests/support/quickstart.py, which docs/doctor.md's quickstart test shares)."""
from __future__ import annotations

from tests.support.paths import ROOT
from tests.support.quickstart import run_quickstart, section


def test_the_quickstart_runs_as_written(tmp_path):
    ran, quoted = run_quickstart(section(ROOT / "README.md"), tmp_path)
    assert ran >= 12 and quoted >= 5, (ran, quoted)  # the section was read: every step's command and quotes
