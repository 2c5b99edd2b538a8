"""Faults while `align convert` writes its output: SIGTERM/SIGINT/SIGHUP, kill -9, two runs at once, a full disk.

Real processes, real signals, real files. Where a test must catch a writer in the middle of its write, it polls for the
writer's temp file, then stops the writer with SIGSTOP so nothing races the test; the margin is the write itself
(a 256 MiB checkpoint: about 2 s here, against a poll every 2 ms). Helpers here are shared with
tests/core/test_atomic.py.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aligner.io import open_checkpoint

ENV = dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3")


def default_signals() -> None:
    """In a child before exec: SIGINT, SIGTERM and SIGHUP as a terminal gives them (default). A disposition the test
    worker inherited would leak in otherwise: `align` keeps an ignored signal ignored (as under nohup), and a library
    loaded earlier in the same worker can leave SIGINT ignored (seen once in a shuffled run: exit 0, no message)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start(*args: object, **popen: Any) -> subprocess.Popen:
    """`align ARGS...` as a separate process (the real entry point), its output captured as text."""
    popen.setdefault("preexec_fn", default_signals)
    return subprocess.Popen([sys.executable, "-m", "aligner.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, **popen)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    """Wait for `proc`; (exit code, stdout, stderr)."""
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def temps(directory: Path) -> list[Path]:
    """The temp files in `directory` (dot-names ending in .tmp), sorted."""
    return sorted(p for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def stop(proc: subprocess.Popen) -> None:
    """SIGSTOP `proc` and wait until the kernel shows it stopped (state T), so it cannot move on behind the test."""
    os.kill(proc.pid, signal.SIGSTOP)
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.001)


def stopped_while_writing(proc: subprocess.Popen, directory: Path) -> Path:
    """Wait for `proc`'s temp file in `directory`, stop `proc`, and return the temp file (still there: checked)."""
    while not temps(directory):
        if proc.poll() is not None:
            pytest.fail(f"the writer ended (code {proc.returncode}) before its temp file was seen: margin lost; "
                        f"stderr: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.002)
    stop(proc)
    found = temps(directory)
    assert len(found) == 1, f"the writer finished while being stopped (margin lost): {found}"
    return found[0]


def stale_temp(out: Path) -> tuple[Path, int]:
    """A temp file of `out` as a writer killed by SIGKILL in the middle of its write leaves it; (file, dead pid)."""
    code = ("import os, signal, sys\nfrom aligner.core.atomic import atomic_open\n"
            "with atomic_open(sys.argv[1]) as fh:\n    fh.write(b'x' * 100000)\n    fh.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.Popen([sys.executable, "-c", code, str(out)], env=ENV)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    [left] = temps(out.parent)
    return left, killed.pid


def limit_file_size(size: int) -> None:
    """In a child before exec: files may grow to `size` bytes; beyond, write() fails with EFBIG (SIGXFSZ ignored)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("align: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256 MiB .pth in a directory of its own: converting it takes long enough to be caught writing."""
    path = tmp_path_factory.mktemp("big") / "big.pth"
    torch.save({"fc.weight": torch.ones(64, 1 << 20)}, path)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("small") / "small.pth"
    torch.save({"fc.weight": torch.full((2, 3), 7.0)}, path)
    return path


def _shape(path: Path) -> tuple[int, ...]:
    with open_checkpoint(str(path)) as src:
        return src.info("fc.weight").shape


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_writing_removes_the_temp_file(tmp_path: Path, big: Path, sig: signal.Signals) -> None:
    """The temp file (named after the writer's pid) goes at once; one line; exit 128 + signal (130 for Ctrl-C)."""
    proc = start("convert", big, "-o", tmp_path / "out.ckpt")
    tmp = stopped_while_writing(proc, tmp_path)
    assert tmp.name.startswith(".out.ckpt.") and f".{proc.pid}." in tmp.name
    os.kill(proc.pid, sig)
    os.kill(proc.pid, signal.SIGCONT)
    code, _, err = finish(proc)
    assert code == 128 + sig, (code, err)
    assert err.strip() == f"align: interrupted by {sig.name} (temp files removed)", err
    assert list(tmp_path.iterdir()) == []  # neither output nor temp file


def test_an_ignored_sighup_stays_ignored(tmp_path: Path, big: Path) -> None:
    """Under nohup (SIGHUP ignored) a hangup does not stop the conversion."""
    proc = start("convert", big, "-o", tmp_path / "out.ckpt",
                 preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    stopped_while_writing(proc, tmp_path)
    os.kill(proc.pid, signal.SIGHUP)
    os.kill(proc.pid, signal.SIGCONT)
    code, _, err = finish(proc)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["out.ckpt"]


def test_kill_9_leaves_a_temp_file_that_the_next_run_removes_and_names(tmp_path: Path, big: Path, small: Path) -> None:
    proc = start("convert", big, "-o", tmp_path / "out.ckpt")
    tmp = stopped_while_writing(proc, tmp_path)
    proc.kill()
    finish(proc)
    assert temps(tmp_path) == [tmp]  # what SIGKILL leaves: nothing can run in the killed process
    code, _, err = finish(start("convert", small, "-o", tmp_path / "out.ckpt", "--to", "pytorch"))
    assert code == 0, err
    assert f"align: removed stale temp file {tmp} left by pid {proc.pid}" in err.splitlines()
    assert [p.name for p in tmp_path.iterdir()] == ["out.ckpt"]


def test_a_live_writers_temp_file_is_left_alone_and_the_second_to_finish_fails(tmp_path: Path, big: Path,
                                                                               small: Path) -> None:
    """A (big, stopped mid-write) and B (small) write the same new output: B finishes first and never touches A's
    temp file; A then finds the output taken and fails, replacing nothing, its temp file removed."""
    out = tmp_path / "out.ckpt"
    first = start("convert", big, "-o", out)
    tmp = stopped_while_writing(first, tmp_path)
    inode = tmp.stat().st_ino
    code, _, err = finish(start("convert", small, "-o", out, "--to", "pytorch"))
    assert code == 0 and "stale" not in err, err
    assert tmp.stat().st_ino == inode  # the live writer's temp file: untouched
    os.kill(first.pid, signal.SIGCONT)
    code, _, err = finish(first)
    assert code == 2
    one_line_error(err, f"output {out} was created by another process while this one wrote it")
    assert [p.name for p in tmp_path.iterdir()] == ["out.ckpt"] and _shape(out) == (2, 3)  # B's output


def test_two_runs_to_one_output_at_once_exactly_one_succeeds(tmp_path: Path, big: Path) -> None:
    """Started together: the loser fails either up front (output exists) or at the end (output taken meanwhile)."""
    out = tmp_path / "out.pth"
    procs = [start("convert", big, "-o", out, "--to", "pytorch") for _ in range(2)]
    results = sorted(finish(p) for p in procs)
    assert [code for code, _, _ in results] == [0, 2], results
    loser = results[1][2]
    one_line_error(loser, str(out))
    assert "already exists" in loser or "was created by another process" in loser, loser
    assert [p.name for p in tmp_path.iterdir()] == ["out.pth"] and _shape(out) == (64, 1 << 20)


@pytest.mark.parametrize("ext", ["pth", "ckpt", "safetensors"])
def test_a_file_size_limit_is_one_line_and_no_temp_file(tmp_path: Path, ext: str) -> None:
    """RLIMIT_FSIZE (1 MiB, a 4 MiB tensor) makes write() fail with EFBIG, as a full disk fails with ENOSPC: before,
    .pth gave "internal error: RuntimeError: [enforce fail at inline_container.cc] unexpected pos"."""
    src = tmp_path / "in" / "model.pth"
    src.parent.mkdir()
    torch.save({"fc.weight": torch.ones(1024, 1024)}, src)
    out = tmp_path / "out" / f"model.{ext}"
    out.parent.mkdir()
    code, _, err = finish(start("convert", src, "-o", out, "--to", "pytorch",
                                preexec_fn=lambda: limit_file_size(1 << 20)))
    assert code == 2
    one_line_error(err, f"cannot write {out}: File too large")
    assert list(out.parent.iterdir()) == []


def test_a_full_file_system_is_one_line_and_no_temp_file(tmp_path: Path) -> None:
    """A real full file system: a 1 MiB tmpfs mounted in a user namespace (no root needed where the kernel allows
    unprivileged user namespaces; skipped where it does not). The listing is taken inside, before the mount goes."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True) \
        if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot create a user namespace to mount a small tmpfs in (unshare missing or not allowed)")
    src = tmp_path / "model.pth"
    torch.save({"fc.weight": torch.ones(1024, 1024)}, src)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = ('mount -t tmpfs -o size=1m tmpfs "$1" || exit 99; "$2" -m aligner.cli convert "$3" -o "$1/out.pth" '
              '>/dev/null; echo "rc=$?"; ls -A "$1"')
    run = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(mnt),
                          sys.executable, str(src)], capture_output=True, text=True, env=ENV, timeout=300)
    assert run.stdout.split() == ["rc=2"], (run.stdout, run.stderr)  # exit 2 and nothing left on the file system
    one_line_error(run.stderr, f"cannot write {mnt}/out.pth: No space left on device")


def test_the_output_is_synced_before_its_rename_and_the_directory_after(tmp_path: Path, small: Path) -> None:
    """Seen with strace: fsync of the temp file, then its link into place, then fsync of the directory."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    log = tmp_path / "trace"
    out = tmp_path / "out.ckpt"
    run = subprocess.run(["strace", "-f", "-y", "-qq", "-o", str(log), "-e", "trace=fsync,link,rename,unlink",
                          sys.executable, "-m", "aligner.cli", "convert", str(small), "-o", str(out)],
                         capture_output=True, text=True, env=ENV, timeout=300)
    if run.returncode != 0 and "ptrace" in run.stderr:
        pytest.skip(f"strace cannot trace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    calls = [line.split(None, 1)[1] for line in log.read_text().splitlines()
             if str(tmp_path) in line and "= 0" in line]
    tmp = next(c for c in calls if c.startswith("fsync(") and ".out.ckpt." in c)
    link = next(c for c in calls if c.startswith("link(") and f'"{out}"' in c)
    dir_sync = next(c for c in calls if c.startswith("fsync(") and c.rstrip().endswith(f"<{tmp_path}>) = 0"))
    assert calls.index(tmp) < calls.index(link) < calls.index(dir_sync), calls
    with open_checkpoint(str(out)) as written:
        assert np.array_equal(written.get("fc.weight"), np.full((2, 3), 7.0, np.float32))
