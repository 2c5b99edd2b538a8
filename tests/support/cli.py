"""The suite's one CLI harness: `align` as a user runs it (a subprocess) or in-process (fast), and one check of what a
user error looks like."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aligner.cli import main


def run_align(*args: object, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run `align ARGS...` in a subprocess with this interpreter; returns the completed process (text output)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3")
    return subprocess.run([sys.executable, "-m", "aligner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def align_in_process(capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess:
    """Run `align ARGS...` in this process (no interpreter start-up); same result type as `run_align`."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    code = exit_info.value.code
    return subprocess.CompletedProcess(["align", *map(str, args)], code if isinstance(code, int) else 0,
                                       captured.out, captured.err)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    """A user error: the exit code, one `align: error:` line on stderr containing each needle, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle.lower() in err.lower(), err
