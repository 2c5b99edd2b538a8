"""Shared test helpers: run the real `align` CLI in a subprocess, as a user would."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_align(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run `align ARGS...` with this interpreter; returns the completed process (text output)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3")
    return subprocess.run([sys.executable, "-m", "aligner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.fixture
def align():
    """The `run_align` helper as a fixture."""
    return run_align


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
    """A user error: the given exit code, one line on stderr containing `needle`, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(err.splitlines()) == 1, err
    assert needle.lower() in err.lower(), err
