"""`align losses` on hostile and broken logs (issue 13): linear-time parsing of pathological lines, absurd steps,
memory that does not grow with the file, over-long lines, huge files sniffed from their head, deep JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from aligner.core.errors import AlignerError
from aligner.pipelines.losses.parse import MAX_LINE, MAX_STEP, SNIFF_CHARS, read_losses
from tests.support.cli import align_in_process, assert_one_line_error

# Pathological lines (issue 13): with the old lazy step/loss regex a 3 KB line of the first took 5 s and a 6 KB one
# 27 s (cubic). At 0.9 MB (under MAX_LINE) each would take years; read in linear time, the whole command
# runs in about 2 s here.
PATHOLOGICAL = {
    "epoch-step repeated": "epoch 1 step 1 " * 60_000,
    "step repeated, loss without a number": "step 1 " * 128_000 + "loss x",
    "epoch then whitespace": "epoch: " + " " * 900_000 + "x",
    "step then whitespace": "step" + " " * 900_000 + "x",
    "loss then whitespace": "loss is [" + " " * 900_000 + "x",
    "loss repeated without a number": "loss: " * 150_000,
    "digit run": "step " + "1" * 900_000 + "x loss 1",
}
LIMIT_S = 60  # about 30x the time these take (measured 0.5-2 s on 2 shared cores, interpreter start included)


def write(tmp_path: Path, name: str, text: str) -> Path:
    """A file in the test's directory."""
    path = tmp_path / name
    path.write_text(text)
    return path


def run_align_limited(*args: object) -> subprocess.CompletedProcess:
    """`align ARGS` in a subprocess that must finish within LIMIT_S (subprocess.TimeoutExpired fails the test)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "aligner.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=LIMIT_S)


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_lines_parse_in_linear_time(tmp_path, name):
    log = write(tmp_path, "a.log", "step 1 loss 2.5\n" + PATHOLOGICAL[name] + "\nstep 2 loss 2.25\n")
    other = write(tmp_path, "b.log", "step 1 loss 2.5\nstep 2 loss 2.25\n")
    proc = run_align_limited("losses", log, other)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr  # the line matches no step/loss: ignored


@pytest.mark.parametrize("step, message", [
    ("1e99999999", "is beyond 1e+15"),           # Decimal would build 10**99999999: hung before
    ('"' + "9" * 100_000 + '"', "is beyond 1e+15"),
    ("1e16", "is beyond 1e+15"),
    ("NaN", "is not a non-negative whole number"),
    ("Infinity", "is not a non-negative whole number"),  # int(Decimal('Infinity')): OverflowError before
    ("-1", "is not a non-negative whole number"),
    ("1e-99999999", "is not a non-negative whole number"),
    ("[1]", "is not a non-negative whole number"),
])
def test_absurd_jsonl_step_is_a_one_line_error(tmp_path, step, message):
    log = write(tmp_path, "a.jsonl", '{"step": 1, "loss": 2.5}\n{"step": ' + step + ', "loss": 2.25}\n')
    proc = run_align_limited("losses", log, log)
    assert_one_line_error(proc, "line 2: step", message)
    assert len(proc.stderr) < 300  # the value is cut in the message


def test_steps_up_to_the_bound_and_zero_with_a_huge_exponent_are_read(tmp_path):
    log = write(tmp_path, "a.jsonl", '{"step": 0E+99999999, "loss": 2.5}\n{"step": 999999999999999, "loss": 2}\n')
    assert read_losses(log).steps == (1, MAX_STEP)  # 0-based: shifted by one


def test_chained_epoch_counters_cannot_pass_the_bound(tmp_path):
    log = write(tmp_path, "a.log", f"epoch 1 step {MAX_STEP} loss 1\nepoch 2 step 1 loss 1\n")
    with pytest.raises(AlignerError, match="line 2: the global step passes 1e"):
        read_losses(log)


def test_text_step_with_a_million_digits_is_an_error(tmp_path):
    log = write(tmp_path, "a.log", "step 1 loss 2\nstep " + "9" * 1_000_000 + " loss 1\n")
    with pytest.raises(AlignerError, match=r"line 2: step '9{36}\.\.\. is beyond 1e\+15"):
        read_losses(log)


def test_a_line_longer_than_the_limit_is_skipped_with_a_warning(capsys, tmp_path):
    a = write(tmp_path, "a.log", "step 1 loss 2.5\n" + "x" * (MAX_LINE + 1) + " step 9 loss 1\nstep 2 loss 2.25\n")
    b = write(tmp_path, "b.log", "step 1 loss 2.5\nstep 2 loss 2.25\n")
    proc = align_in_process(capsys, "losses", a, b, "--json", "-")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["a"]["long_lines_skipped"] == 1 and report["b"]["long_lines_skipped"] == 0
    assert proc.stderr == (f"align: warning: A ({a}): skipped 1 line(s) longer than {MAX_LINE} characters (first: "
                           "line 2); no log line is that long\n")


def test_line_numbers_after_a_skipped_line_count_every_line_break(tmp_path):
    # '\x0c' breaks a line for str.splitlines: the skipped physical line 2 is lines 2-3, so the bad step is line 5
    text = "step 5 loss 1\n" + "y" * MAX_LINE + "\x0c" + "y" * 10 + "\n\x0cstep 3 loss 1\n"
    with pytest.raises(AlignerError, match="line 5: step 3 comes after step 5"):
        read_losses(write(tmp_path, "a.log", text))
    assert "step 3" in (text.splitlines()[4])


def test_a_line_of_exactly_the_limit_is_read(tmp_path):
    line = "step 2 loss 1 " + "z" * (MAX_LINE - 14)
    assert len(line) == MAX_LINE
    assert read_losses(write(tmp_path, "a.log", "step 1 loss 2\n" + line + "\n")).steps == (1, 2)


@pytest.mark.parametrize("head, body, fmt", [
    ("[WARNING] ME(1) start\n", "epoch: 1 step: {i}, loss is 0.5\n", "text"),  # starts like JSON, is a text log
    ("", '{{"step": {i}, "loss": 0.5}}\n', "jsonl"),
    ("[\n", '  {{"step": {i}, "loss": 0.5}},\n', "json"),                         # one large JSON document
])
def test_files_larger_than_the_sniffed_head_get_the_same_format(tmp_path, head, body, fmt):
    lines = [head]
    i = 0
    while sum(map(len, lines)) <= SNIFF_CHARS + 100:
        i += 1
        lines.append(body.format(i=i))
    text = "".join(lines) + (f'  {{"step": {i + 1}, "loss": 0.5}}\n]\n' if fmt == "json" else "")
    curve = read_losses(write(tmp_path, "train.log", text))
    assert (curve.format, curve.steps[-1]) == (fmt, i + (fmt == "json"))


def test_a_megabyte_of_blank_lines_before_the_log_is_not_empty(tmp_path):
    curve = read_losses(write(tmp_path, "a.log", "\n" * (SNIFF_CHARS + 5) + "loss 1\n"))
    assert (curve.losses, curve.format) == ((1.0,), "text")


@pytest.mark.parametrize("name", ["a.json", "a.jsonl", "a.log"])
def test_deeply_nested_json_is_a_one_line_error(tmp_path, name):
    log = write(tmp_path, name, "[" * 200_000 + "\n")
    with pytest.raises(AlignerError, match="nested more than 64 lists or objects deep|no losses found"):
        read_losses(log)


def test_losses_of_opposite_huge_signs_raise_no_numpy_warning(capsys, tmp_path):
    a = write(tmp_path, "a.log", "loss 1.5e308\n")
    b = write(tmp_path, "b.log", "loss -1.5e308\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow warning would become an internal error
        proc = align_in_process(capsys, "losses", a, b)
    assert proc.returncode == 1 and "Step 1 differs" in proc.stdout, proc.stderr


def _peak_rss_mib(log: Path, other: Path) -> float:
    """Peak RSS of `align losses LOG OTHER` in a fresh interpreter (read from resource.getrusage of that child)."""
    code = ("import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'aligner.cli', 'losses', "
            f"{str(log)!r}, {str(other)!r}, '--show', '0'], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout) / 1024


def test_memory_does_not_grow_with_the_file(tmp_path):
    """A 128 MiB log of mostly non-loss lines (one loss line per ~2 KB, 65k losses) costs a few MiB over a tiny log.

    Before, the text and its list of lines were held: at least 2x the file (256 MiB) over the baseline. The bound,
    a quarter of the file (32 MiB), is ~4x what the arrays and the parsing need here (measured: 5-9 MiB).
    """
    noise = "".join(f"[INFO] data loader worker {k} prefetch queue depth 8, elapsed 0.0012 s\n" for k in range(28))
    big = tmp_path / "big.log"
    size = 128 << 20
    with open(big, "w") as out:
        step = 0
        while out.tell() < size:
            block = []
            for _ in range(1000):
                step += 1
                block.append(f"epoch: 1 step: {step}, loss is {2.0 / step:.7f}\n{noise}")
            out.write("".join(block))
    small = write(tmp_path, "small.log", "".join(f"epoch: 1 step: {s}, loss is {2.0 / s:.7f}\n" for s in range(1, 5)))
    baseline, peak = _peak_rss_mib(small, small), _peak_rss_mib(big, small)
    assert peak - baseline < big.stat().st_size / 4 / 2 ** 20, (baseline, peak)
