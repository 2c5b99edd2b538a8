"""Atomic outputs: a report set (`align compare --json --csv --html`) appears whole or not at all, and temp files are
named after their writer, so a run removes those of dead writers only.

Real processes and files: a write fails under a real file size limit (RLIMIT_FSIZE), a rename fails on a real
directory put in the way while the writer is stopped with SIGSTOP (its margin: the compare of 3000 records, seconds,
against the few milliseconds the test needs to stop it once it has checked its outputs).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.faults.test_faults import finish, limit_file_size, one_line_error, stale_temp, start, stop, temps

REPORTS = ("r.json", "r.csv", "r.html")


def _dumps(tmp: Path, n: int) -> tuple[Path, Path]:
    """Two plain .npy dump directories of `n` records that agree."""
    a, b = tmp / "a", tmp / "b"
    for side in (a, b):
        side.mkdir()
        for i in range(n):
            np.save(side / f"{i}_layer{i}.npy", np.full((4, 8), i, np.float32))
    return a, b


def _report_args(out: Path) -> list[object]:
    return ["--json", out / "r.json", "--csv", out / "r.csv", "--html", out / "r.html"]


def _old_reports(out: Path) -> None:
    for name in REPORTS:
        (out / name).write_text(f"old {name}\n")


def _contents(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() if p.is_file() else "<dir>" for p in sorted(out.iterdir())}


@pytest.mark.parametrize("force", [False, True], ids=["new", "forced"])
def test_a_report_that_cannot_be_written_leaves_the_set_as_it_was(tmp_path: Path, force: bool) -> None:
    """Files may grow to 1 MiB: the JSON (~4 KB) and CSV (~1 KB) fit, the HTML (~5 MB, plotly inline) does not.
    Before, r.json and r.csv were written (or replaced) and r.html was not: a mixed set."""
    a, b = _dumps(tmp_path, 6)
    out = tmp_path / "out"
    out.mkdir()
    if force:
        _old_reports(out)
    before = _contents(out)
    code, _, err = finish(start("compare", a, b, *_report_args(out), *(["--force"] if force else []),
                                preexec_fn=lambda: limit_file_size(1 << 20)))
    assert code == 2
    one_line_error(err, f"cannot write {out / 'r.html'}: File too large")
    assert _contents(out) == before  # nothing new, nothing replaced, no temp file


def test_a_report_set_is_written_whole(tmp_path: Path) -> None:
    """The same reports without the limit: all three, no temp file (the failing test above can fail)."""
    a, b = _dumps(tmp_path, 6)
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = finish(start("compare", a, b, *_report_args(out)))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORTS)


@pytest.mark.parametrize("force", [False, True], ids=["new", "forced"])
def test_a_rename_failing_part_way_undoes_the_renames_done(tmp_path: Path, force: bool) -> None:
    """Renames go json, csv, html. Once the run has checked its outputs (its note on removing a stale temp file of
    r.html, checked last, says so) it is stopped, and r.html is taken: created (no --force: the no-replace rename
    refuses it) or made a directory (--force: the rename fails with EISDIR). r.json and r.csv, renamed by then, are
    undone: removed, or restored to the old reports."""
    a, b = _dumps(tmp_path, 3000)
    out = tmp_path / "out"
    out.mkdir()
    if force:
        _old_reports(out)
    stale, _ = stale_temp(out / "r.html")
    before = _contents(out)
    proc = start("compare", a, b, *_report_args(out), *(["--force"] if force else []))
    assert proc.stderr is not None
    note = proc.stderr.readline()
    assert note.startswith(f"align: removed stale temp file {stale} "), note
    stop(proc)
    assert _contents(out) == {k: v for k, v in before.items() if k != stale.name}, "margin lost: reports written"
    if force:
        (out / "r.html").unlink()
        (out / "r.html").mkdir()
        (out / "r.html" / "keep").write_text("mine")
    else:
        (out / "r.html").write_text("mine")
    expected = _contents(out)
    os.kill(proc.pid, signal.SIGCONT)
    code, _, err = finish(proc)
    assert code == 2
    one_line_error(err, str(out / "r.html"), "Is a directory" if force else "was created by another process")
    assert _contents(out) == expected  # r.json, r.csv as before the run (absent, or the old ones); no temp file
    assert not temps(out)


def test_only_temp_files_of_dead_writers_of_this_host_are_removed(tmp_path: Path) -> None:
    """Three temp files of one output: a dead writer's (removed, with one line saying so), a live writer's (this
    test's pid: left) and one from another host sharing the file system (its pid means nothing here: left)."""
    src = tmp_path / "model.pth"
    torch.save({"fc.weight": torch.ones(2, 3)}, src)
    out = tmp_path / "out" / "model.ckpt"
    out.parent.mkdir()
    stale, pid = stale_temp(out)
    host, named_pid, rest = stale.name.removeprefix(".model.ckpt.").split(".", 2)  # .NAME.HOST.PID.XXXXXXXX.tmp
    assert stale.name.startswith(".model.ckpt.") and named_pid == str(pid) and rest.endswith(".tmp")
    live = stale.with_name(f".model.ckpt.{host}.{os.getpid()}.{rest}")
    elsewhere = stale.with_name(f".model.ckpt.otherhost.{pid}.{rest}")
    for copy in (live, elsewhere):
        copy.write_bytes(stale.read_bytes())
    code, _, err = finish(start("convert", src, "-o", out))
    assert code == 0, err
    assert [line for line in err.splitlines() if "stale" in line] == \
        [f"align: removed stale temp file {stale} left by pid {pid}"]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, live.name, elsewhere.name])


def test_a_broken_symlink_as_output_is_refused_without_force(tmp_path: Path) -> None:
    """The final rename would replace the link, so it counts as an existing output."""
    src = tmp_path / "model.pth"
    torch.save({"fc.weight": torch.ones(2, 3)}, src)
    out = tmp_path / "model.ckpt"
    out.symlink_to(tmp_path / "nowhere")
    code, _, err = finish(start("convert", src, "-o", out))
    assert code == 2
    one_line_error(err, f"output {out} already exists (use --force to overwrite)")
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


def test_outputs_keep_following_the_umask(tmp_path: Path) -> None:
    """A report set written through temp files gets 0666 & ~umask (here 027: 0640), as one file does."""
    a, b = _dumps(tmp_path, 3)
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = finish(start("compare", a, b, *_report_args(out), preexec_fn=lambda: os.umask(0o027)))
    assert code == 0, err
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {n: "0o640" for n in REPORTS}
