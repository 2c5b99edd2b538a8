"""Fuzz the loss-log readers and `align losses` (issue 13): generated text, CSV, JSON and JSONL logs, random bytes,
huge numbers, long lines, NUL bytes and invalid UTF-8 give exit 0, 1 or 2 (one `align: error:` line for 2), never an
internal error; the linear-time matchers agree with the regexes they replace. Budget: the hypothesis profile
(`bounded` by default, `long` with --fuzz-long)."""
from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.core.errors import AlignerError
from aligner.pipelines.losses.parse import DEFAULT_PATTERNS, LossCurve, _step_loss_tokens, read_losses
from tests.support.cli import align_in_process

# The default regexes as they were before the linear-time rewrite: the oracle on lines short enough for them.
_OLD_NUM = r"\[?\s*(?P<loss>[-+]?(?:nan|inf(?:inity)?|\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))"
OLD_PATTERNS = (
    r"\bepoch:\s*(?P<epoch>\d+),?\s+step:\s*(?P<step>\d+),?\s+loss is\s*" + _OLD_NUM,
    r"(?:\bepoch\b\s*[:=]?\s*\[?(?P<epoch>\d+)\b.*?)?"
    r"\bstep\b\s*[:=]?\s*\[?(?P<step>\d+)\b.*?\b(?:train_)?loss\b\s*(?:is|[:=])?\s*" + _OLD_NUM,
    r"\b(?:train_)?loss\b\s*(?:is|[:=])?\s*" + _OLD_NUM,
)

# Pieces that log lines are made of: the keywords, their separators, numbers, and near misses.
PIECES = ["epoch", "Epoch", "EPOCH:", "step", "Step", "step:", "loss", "train_loss", "Loss", "loss is", "lossy",
          "xstep", "is", " ", "  ", "\t", ":", "=", ",", "[", "]", "/", "|", "0", "1", "12", "3.5", ".5", "1e-3",
          "2E+4", "-", "+", "nan", "inf", "Infinity", "x", "_", "\u00a0", "\u0663", "\x00", "\ufffd"]
line_text = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)


def _old_match(index: int, line: str) -> tuple[str, Any, Any] | None:
    """(loss, step, epoch) of the old regex's first match, as the reader takes it."""
    found = re.compile(OLD_PATTERNS[index], re.IGNORECASE).search(line)
    if found is None or found.group("loss") is None:
        return None
    groups = found.groupdict()
    return found.group("loss"), groups.get("step"), groups.get("epoch")


@settings()
@given(line=line_text)
def test_default_patterns_match_as_the_old_regexes(line):
    """Each rewritten matcher finds what the old regex found, on any line made of log pieces."""
    for index in (0, 2):
        new = re.compile(DEFAULT_PATTERNS[index][1], re.IGNORECASE).search(line)
        assert (None if new is None else (new["loss"], new.groupdict().get("step"), new.groupdict().get("epoch"))) \
            == _old_match(index, line)
    assert _step_loss_tokens(line) == _old_match(1, line)


def _check_curve(curve: LossCurve) -> None:
    """What every read curve promises."""
    assert len(curve.steps) == len(curve.losses) >= 1
    assert curve.steps[0] >= 1 and all(a < b for a, b in zip(curve.steps, curve.steps[1:]))
    assert curve.resolution >= 0 and curve.format in ("text", "csv", "json", "jsonl")


numbers = st.one_of(
    st.integers(-2, 10 ** 30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1e99999999", "-1e99999999", "1e-99999999", "0E+99999999", "9" * 400, "NaN", "Infinity",
                     "-0", "1.0", "3.", ".5", "1_000", "0x10", "", "[1.5]"]))
text_lines = st.one_of(
    line_text,
    st.builds("epoch: {}, step: {}, loss is {}".format, numbers, numbers, numbers),
    st.builds("epoch {} step {} | loss {} | lr 0.1".format, numbers, numbers, numbers),
    st.builds("loss = {}".format, numbers))
json_values = st.one_of(numbers.map(lambda n: n if re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", n) else f'"{n}"'),
                        st.sampled_from(["null", "true", "[]", "{}", "NaN", "Infinity", '"x"', "1e99999999"]))
jsonl_lines = st.one_of(
    st.builds('{{"step": {}, "loss": {}}}'.format, json_values, json_values),
    st.builds('{{"epoch": {}, "iter": {}, "train/loss": {}}}'.format, json_values, json_values, json_values),
    st.sampled_from(["", "{}", "[1]", "not json", "{\"loss\": [[[[]]]]}", "[" * 3000]))
csv_lines = st.builds("{},{},{}".format, numbers, numbers, numbers)


def _file(draw: st.DrawFn) -> tuple[str, bytes]:
    """A generated log: a name whose suffix picks (or leaves open) the reader, and its bytes."""
    kind = draw(st.sampled_from(["text", "jsonl", "csv", "json", "bytes"]))
    if kind == "bytes":
        data = draw(st.binary(max_size=400))
    elif kind == "text":
        data = "\n".join(draw(st.lists(text_lines, max_size=12))).encode()
    elif kind == "jsonl":
        data = "\n".join(draw(st.lists(jsonl_lines, max_size=12))).encode()
    elif kind == "csv":
        data = ("step,epoch,loss\n" + "\n".join(draw(st.lists(csv_lines, max_size=12)))).encode()
    else:
        data = ("[" + ",".join(draw(st.lists(jsonl_lines.filter(lambda x: x.startswith('{"')), max_size=8)))
                + "]").encode()
    if draw(st.booleans()):  # corrupt: NUL bytes, invalid UTF-8, a BOM, CR line ends
        position = draw(st.integers(0, len(data)))
        corruption = draw(st.sampled_from([b"\x00", b"\xff\xfe", b"\xc3", b"\r", b"\x0c"]))
        data = data[:position] + corruption + data[position:]
    suffix = {"text": ".log", "jsonl": ".jsonl", "csv": ".csv", "json": ".json", "bytes": ".log"}[kind]
    return draw(st.sampled_from([suffix, ".txt"])), data


@st.composite
def log_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """See `_file`."""
    return _file(draw)


@settings()
@given(log=log_files())
def test_readers_return_a_valid_curve_or_a_user_error(tmp_path_factory, log):
    path = tmp_path_factory.mktemp("fuzz") / f"run{log[0]}"
    path.write_bytes(log[1])
    try:
        curve = read_losses(path)
    except AlignerError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000
        return
    _check_curve(curve)


@settings()
@given(a=log_files(), b=log_files(), json_out=st.booleans())
def test_align_losses_exits_0_1_or_2_with_one_error_line(capsys, tmp_path_factory, a, b, json_out):
    folder = tmp_path_factory.mktemp("fuzz")
    paths = []
    for name, (suffix, data) in (("a", a), ("b", b)):
        paths.append(folder / f"{name}{suffix}")
        paths[-1].write_bytes(data)
    proc = align_in_process(capsys, "losses", *paths, *(["--json", "-"] if json_out else []))
    assert proc.returncode in (0, 1, 2), proc
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        assert proc.stderr.startswith("align: error: ") and proc.stderr.count("\n") == 1, proc.stderr


# Lines that made the old regexes backtrack super-linearly, at sizes where quadratic time takes minutes and cubic
# time years. Read in linear time, each whole command takes 1-2 s here (interpreter start included).
LONG_LINES = {
    "epoch-step": "epoch 1 step 1 " * 50_000,
    "epoch-step-loss miss": "Epoch [1/3] Step [5/9] loss x " * 25_000,
    "spaces after loss": "loss" + " " * 700_000 + "x",
    "train_loss colons": "train_loss: : " * 50_000,
    "epoch: step: loss is": "epoch: 1 step: 1, loss is " * 25_000,
}
TIMEOUT_S = 60  # ~30x the measured time: fails only when a line costs far more than linear time


@pytest.mark.parametrize("jsonl", [False, True])
@pytest.mark.parametrize("name", sorted(LONG_LINES))
def test_long_pathological_lines_take_linear_time(tmp_path, name, jsonl):
    """`align losses` on a log holding one pathological line, as text or as a JSONL string field."""
    folder = tmp_path
    line = LONG_LINES[name]
    if jsonl:
        text = f'{{"step": 1, "loss": 0.5}}\n{{"note": "{line}", "step": 2, "loss": 0.25}}\n'
        log = folder / "a.jsonl"
    else:
        text = f"step 1 loss 0.5\n{line}\nstep 2 loss 0.25\n"
        log = folder / "a.log"
    log.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "aligner.cli", "losses", str(log), str(log)], capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode in (0, 1, 2) and "internal error" not in proc.stderr, proc.stderr

