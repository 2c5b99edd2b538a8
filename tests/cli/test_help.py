"""`align --help`'s "Typical workflow" is README's workflow table in short: every step, in the table's order, each
naming only commands the table names for it, and together every command there is."""
from __future__ import annotations

import re

import pytest

from aligner.cli import COMMANDS
from tests.support.cli import align_in_process
from tests.support.paths import ROOT

README = ROOT / "README.md"
STEP = re.compile(r"\d+[a-z]?\. ")  # "0. ", "3a. "
COMMAND = re.compile(r"\balign (\w+)")


def readme_steps() -> list[tuple[str, set[str]]]:
    """(step label, the `align` commands its row names) for each row of README's workflow table, in order."""
    section = README.read_text(encoding="utf-8").split("## The migration workflow", 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ")]
    return [(row[0], set(COMMAND.findall(row[-1]))) for row in rows if STEP.match(row[0])]


def help_steps(text: str) -> list[tuple[str, set[str]]]:
    """(the step's first line, the `align` commands in its lines) for each step of the help's workflow."""
    block = text.split("Typical workflow", 1)[1].split("\n\n", 1)[0]
    steps: list[tuple[str, set[str]]] = []
    for line in block.splitlines()[1:]:
        if STEP.match(line.strip()):
            steps.append((line.strip(), set()))
        if steps:
            steps[-1][1].update(COMMAND.findall(line))
    return steps


def name(step: str) -> str:
    """A step's number and name: "4c. training health" from "4c. training health (one side)" or "4c. ...: more"."""
    return re.split(r":| \(", step, maxsplit=1)[0]


def test_help_workflow_is_readme_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The help listed 5 commands (no audit, check, replay or repro) under no step names."""
    proc = align_in_process(capsys, "--help")
    assert proc.returncode == 0, proc.stderr
    table, shown = readme_steps(), help_steps(proc.stdout)
    assert len(table) >= 9, table  # the table was read: steps 0 to 5
    assert [name(line) for line, _ in shown] == [name(label) for label, _ in table], shown
    for (label, named), (line, commands) in zip(table, shown):
        assert commands <= named, (label, line, commands - named)  # only what README names for that step
    # every command has its step; `align doctor` runs them all (shown above the steps), `align report` shows a saved
    # result again (no step of its own)
    assert set().union(*(commands for _, commands in shown)) == set(COMMANDS) - {"doctor", "report"}
