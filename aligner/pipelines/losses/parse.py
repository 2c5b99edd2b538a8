"""Read loss curves from training logs (text, CSV, JSON, JSONL); knows nothing about comparing them.

Text, CSV and JSONL logs are read line by line: time is linear in the file size and memory grows with the number of
losses read (a few arrays), not with the file (the text is not kept). Every default regex is written so that it
cannot backtrack more than linearly (possessive quantifiers; the step/loss form is found by one token scan instead of
a lazy `.*?` search). A JSON document (not JSON lines) is parsed whole, up to the `INDEX` size cap.
"""
from __future__ import annotations

import csv
import json
import math
import re
import struct
from array import array
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

from aligner.core.errors import AlignerError
from aligner.core.files import INDEX, Cap, open_text
from aligner.core.nesting import NestingError, json_loads

_NUM = r"\[?\s*+(?P<loss>[-+]?(?:nan|inf(?:inity)?|\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))"
_LOSS = r"\b(?:train_)?loss\b\s*+(?:is|[:=])?\s*+" + _NUM
_EPOCH = r"(?:\bepoch\b\s*[:=]?\s*\[?(?P<epoch>\d+)\b.*?)?"

# Tried in order; the first one that matches any line of a file is used for the whole file. The second is matched by
# `_step_loss_tokens` (the result of a regex search with its pattern, in linear time); reports show the pattern.
DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("MindSpore LossMonitor 'epoch: E step: S, loss is X'",
     r"\bepoch:\s*+(?P<epoch>\d++),?\s++step:\s*+(?P<step>\d++),?\s++loss is\s*+" + _NUM),
    ("'[epoch E ...] step S ... loss X'",
     _EPOCH + r"\bstep\b\s*[:=]?\s*\[?(?P<step>\d+)\b.*?\b(?:train_)?loss\b\s*(?:is|[:=])?\s*" + _NUM),
    ("'loss X' (no step: consecutive indices)", _LOSS),
)
# One pass over a line finds every epoch, step and loss token of the second default pattern (tokens never overlap).
_TOKENS = re.compile(r"\bepoch\b\s*+[:=]?\s*+\[?(?P<epoch>\d++)\b|\bstep\b\s*+[:=]?\s*+\[?(?P<step>\d++)\b|" + _LOSS,
                     re.IGNORECASE)

LOSS_KEYS = ("loss", "train_loss", "train/loss")
STEP_KEYS = ("step", "global_step", "iteration", "iter")
EPOCH_KEYS = ("epoch",)
FORMATS = ("text", "csv", "json", "jsonl")
MAX_STEP = 10 ** 15        # a step or epoch number above this is corrupt, not a training (1e15 steps)
MAX_LINE = 1 << 20         # characters; a longer line is skipped and counted (no log line is a megabyte)
SNIFF_CHARS = 1 << 20      # the format of a larger file is decided from its first SNIFF_CHARS characters
_MAX_FIELD_NAMES = 100     # field names remembered for the "no loss field" message
_LINE_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # str.splitlines breaks besides \n and \r


@dataclass(frozen=True)
class LossCurve:
    """One run's losses indexed by 1-based global step, with where they came from."""

    path: str
    format: str                   # one of FORMATS
    steps: tuple[int, ...]        # global step of each loss, strictly increasing, 1-based
    losses: tuple[float, ...]
    resolution: float             # the log's rounding: finest last printed digit ('0.1235' -> 1e-4), 0 if none seen
    epoch_starts: frozenset[int]  # global steps where a new epoch begins (after the first epoch)
    pattern: str | None = None    # the regex that matched, for text logs
    pattern_name: str | None = None
    long_lines: int = 0           # lines over MAX_LINE characters, skipped unread
    first_long_line: int | None = None


class _Points:
    """The entries one reading (a pattern, or a table format) found, in compact arrays; the text is not kept.

    A malformed step or loss is remembered, not raised, so that a default pattern the file does not end up using
    cannot fail the read; `curve` raises it, step errors first, as a whole-file read would.
    """

    def __init__(self, path: Path, unit: str) -> None:
        self.path, self.unit = path, unit
        self.numbers, self.steps, self.epochs = array("q"), array("q"), array("q")  # -1: no step/epoch given
        self.losses = array("d")
        self.resolution = math.inf
        self.step_error: AlignerError | None = None
        self.loss_error: AlignerError | None = None

    def where(self, i: int) -> str:
        """'line 7' for the i-th entry."""
        return f"{self.unit} {self.numbers[i]}"

    def add(self, number: int, token: str, step: Any, epoch: Any) -> None:
        """One entry: its line/record number, the loss as written and the raw step and epoch (None: absent)."""
        if self.step_error is not None:
            return
        values = []
        for name, value in (("step", step), ("epoch", epoch)):
            try:
                values.append(_whole(value))
            except ValueError as exc:
                self.step_error = AlignerError(f"{self.path} {self.unit} {number}: {name} {_short(value)} {exc}")
                return
        step_value, epoch_value = values
        try:
            loss = float(token.strip().lstrip("["))
            self.resolution = min(self.resolution, _unit(token))
        except ValueError:  # kept as NaN so that the steps are checked first, as they are for every other entry
            loss = math.nan
            if self.loss_error is None:
                self.loss_error = AlignerError(f"{self.path} {self.unit} {number}: loss {_short(token)} is not a "
                                               "number")
        self.numbers.append(number)
        self.steps.append(-1 if step_value is None else step_value)
        self.epochs.append(-1 if epoch_value is None else epoch_value)
        self.losses.append(loss)

    def curve(self, fmt: str, long_lines: list[int], pattern: tuple[str, str] | None = None) -> LossCurve:
        """The curve, or the first error of this reading."""
        if self.step_error is not None:
            raise self.step_error
        steps, epoch_starts = _global_steps(self)
        if self.loss_error is not None:
            raise self.loss_error
        return LossCurve(
            path=str(self.path), format=fmt, steps=tuple(steps), losses=tuple(self.losses),
            resolution=0.0 if math.isinf(self.resolution) else self.resolution,
            epoch_starts=frozenset(epoch_starts), pattern=pattern[1] if pattern else None,
            pattern_name=pattern[0] if pattern else None, long_lines=len(long_lines),
            first_long_line=long_lines[0] if long_lines else None)


def detect_format(path: Path, text: str) -> str:
    """Pick the reader from the suffix, else from the content: JSON, JSON lines, or plain text."""
    suffix = _suffix_format(path)
    if suffix is not None:
        return suffix
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            json_loads(text)
            return "json"
        except ValueError:  # not JSON, or nested too deep
            return _first_line_format(stripped)
    return "text"


def compile_pattern(pattern: str, option: str = "--pattern") -> re.Pattern[str]:
    """Compile a user regex; it must have a named group `loss` (`step` and `epoch` are optional)."""
    try:
        regex = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise AlignerError(f"{option}: invalid regular expression {pattern!r}: {exc}") from exc
    if "loss" not in regex.groupindex:
        raise AlignerError(f"{option}: {pattern!r} has no named group (?P<loss>...)")
    return regex


def read_losses(path: str | Path, pattern: str | None = None, option: str = "--pattern",
                require_text: bool = True) -> LossCurve:
    """Read one run's loss curve; `pattern` replaces the default regexes of text logs.

    A pattern given for a CSV/JSON/JSONL file is an error, or ignored when `require_text` is False (a pattern
    shared by two logs of different formats). `option` names the pattern's source in messages.
    """
    path = Path(path)
    if not path.is_file():
        raise AlignerError(f"{path}: no such file" if not path.exists() else f"{path} is not a file")
    try:
        fmt = _sniff(path)
        if pattern is not None and fmt != "text" and require_text:
            raise AlignerError(f"{option} applies to text logs, but {path} is {fmt.upper()}")
        if fmt == "json":
            return _read_json(path)
        with _open(path, newline="" if fmt == "csv" else None) as handle:
            if fmt == "csv":
                return _read_csv(path, handle)
            long_lines: list[int] = []
            lines = _lines(handle, long_lines)
            if fmt == "jsonl":
                points = _table_points(path, _jsonl_rows(path, lines), "line")
                return points.curve(fmt, long_lines)
            return _read_text(path, lines, long_lines, pattern, option)
    except OSError as exc:
        raise AlignerError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _open(path: Path, newline: str | None = None, cap: Cap | None = None) -> TextIO:
    """The regular file as text: UTF-8 with an optional BOM (spreadsheets write one), undecodable bytes replaced;
    `cap` for a file read whole (logs read line by line need none: their memory does not grow with the file)."""
    return open_text(path, cap, encoding="utf-8-sig", errors="replace", newline=newline)


def _suffix_format(path: Path) -> str | None:
    """The format a suffix names, if any."""
    return {".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(path.suffix.lower())


def _first_line_format(stripped: str) -> str:
    """Not one JSON document: JSON lines when the first line is a JSON object, else text."""
    try:
        return "jsonl" if isinstance(json_loads(stripped.splitlines()[0]), dict) else "text"
    except ValueError:
        return "text"


def _sniff(path: Path) -> str:
    """`detect_format` on the file, reading only its first SNIFF_CHARS characters.

    A longer file that starts like JSON is decided from how a JSON parse of that head fails: a failure well inside
    the head would fail the whole file too; a head that is valid so far may be one large JSON document.
    """
    with _open(path) as handle:
        head = handle.read(SNIFF_CHARS + 1)
        while len(head) > SNIFF_CHARS and not head.strip():  # a megabyte of blank lines: look further
            head = handle.read(SNIFF_CHARS + 1)
    if not head.strip():
        raise AlignerError(f"{path} is empty")
    if len(head) <= SNIFF_CHARS or _suffix_format(path) is not None:
        return detect_format(path, head)
    stripped = head.lstrip()
    if not stripped.startswith(("{", "[")):
        return "text"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string") or exc.pos >= len(stripped) - 64:
            return "json"
    except RecursionError:
        return "json"  # nested deeper than Python parses: the JSON reader says so
    else:
        if not stripped[end:].strip():
            return "json"
    return _first_line_format(stripped)


def _lines(handle: TextIO, long_lines: list[int]) -> Iterator[tuple[int, str]]:
    """(number, line) as `str.splitlines` numbers the text's lines, read one at a time; a line longer than MAX_LINE
    characters is skipped unread and its number appended to `long_lines`."""
    number = 0
    while chunk := handle.readline(MAX_LINE + 1):
        if len(chunk) > MAX_LINE and not chunk.endswith("\n"):
            long_lines.append(number + 1)
            breaks = 1
            while chunk and not chunk.endswith("\n"):
                breaks += len(_LINE_BREAKS.findall(chunk))
                chunk = handle.readline(MAX_LINE)
            number += breaks + len(_LINE_BREAKS.findall(chunk))
            continue
        for line in chunk.splitlines():
            number += 1
            yield number, line


def _read_text(path: Path, lines: Iterable[tuple[int, str]], long_lines: list[int], pattern: str | None,
               option: str) -> LossCurve:
    """Match every line against the user's regex, or the default patterns: the first that matches any line wins.

    All default patterns are tried on each line until one has matched; from then on only it and those before it.
    """
    matchers: list[tuple[str, str, Callable[[str], tuple[str, Any, Any] | None]]]
    if pattern is not None:
        matchers = [("custom", pattern, _regex_matcher(compile_pattern(pattern, option)))]
    else:
        monitor, step_loss, loss_only = DEFAULT_PATTERNS
        matchers = [(*monitor, _regex_matcher(re.compile(monitor[1], re.IGNORECASE))),
                    (*step_loss, _step_loss_tokens),
                    (*loss_only, _regex_matcher(re.compile(loss_only[1], re.IGNORECASE)))]
    found = [_Points(path, "line") for _ in matchers]
    alive = len(matchers)  # matchers[:alive] can still win
    for number, line in lines:
        for i in range(alive):
            match = matchers[i][2](line)
            if match is not None:
                found[i].add(number, *match)
                alive = i + 1
                break
    for (name, rx, _), points in zip(matchers, found):
        if len(points.losses) or points.step_error or points.loss_error:
            return points.curve("text", long_lines, (name, rx))
    if pattern is not None:
        raise AlignerError(f"no losses found in {path}: no line matches {option} {pattern!r}")
    tried = "; ".join(name for name, _ in DEFAULT_PATTERNS)
    raise AlignerError(f"no losses found in {path}: tried the default patterns {tried} "
                       f"(pass {option} REGEX with a (?P<loss>...) group)")


def _regex_matcher(regex: re.Pattern[str]) -> Callable[[str], tuple[str, Any, Any] | None]:
    """(loss, step, epoch) of a regex's first match in a line, None without a match or a loss."""
    def match(line: str) -> tuple[str, Any, Any] | None:
        found = regex.search(line)
        if found is None or found.group("loss") is None:
            return None
        groups = found.groupdict()
        return found.group("loss"), groups.get("step"), groups.get("epoch")
    return match


def _step_loss_tokens(line: str) -> tuple[str, Any, Any] | None:
    """The second default pattern's match, found by one scan of the line's epoch, step and loss tokens.

    A regex search returns the leftmost match: an epoch before the first step (if any), that first step, then the
    first loss after it. One token scan finds the same in linear time; the lazy regex takes cubic time on lines of
    repeated 'epoch 1 step 1' without a loss.
    """
    epoch = step = None
    for token in _TOKENS.finditer(line):
        if step is None:
            if token["step"] is not None:
                step = token["step"]
            elif epoch is None and token["epoch"] is not None:
                epoch = token["epoch"]
        elif token["loss"] is not None:
            return token["loss"], step, epoch
    return None


def _read_csv(path: Path, handle: TextIO) -> LossCurve:
    """Rows of a CSV file with a header line, numbered as a spreadsheet shows them (the header is row 1)."""
    try:
        return _table_points(path, enumerate(csv.DictReader(handle), start=2), "row").curve("csv", [])
    except csv.Error as exc:
        raise AlignerError(f"{path}: not a readable CSV file: {exc}") from exc


def _read_json(path: Path) -> LossCurve:
    """Rows from a JSON list of records, a dict of columns, or a dict holding a list of records (read whole)."""
    with _open(path, cap=INDEX) as handle:
        text = handle.read()
    try:
        data = json_loads(text, parse_float=str, parse_int=str)
    except NestingError as exc:
        raise AlignerError(f"{path}: not readable JSON: {exc}") from None
    except ValueError as exc:
        raise AlignerError(f"{path}: not valid JSON: {exc}") from exc
    del text
    if isinstance(data, dict):
        loss_key = next((k for k in LOSS_KEYS if isinstance(data.get(k), list)), None)
        if loss_key is not None:  # columns: {"step": [...], "loss": [...]}
            columns = {k: v for k, v in data.items() if isinstance(v, list) and len(v) == len(data[loss_key])}
            data = [dict(zip(columns, values)) for values in zip(*columns.values())]
        else:  # e.g. a Hugging Face trainer_state.json: {"log_history": [{...}, ...]}
            data = next((v for v in data.values() if isinstance(v, list) and any(
                isinstance(r, dict) and any(k in r for k in LOSS_KEYS) for r in v)), None)
    if not isinstance(data, list):
        raise AlignerError(f"{path}: expected a JSON list of records with a loss field, "
                           f"or an object of columns (keys tried: {', '.join(LOSS_KEYS)})")
    rows = ((number, row) for number, row in enumerate(data, start=1) if isinstance(row, dict))
    return _table_points(path, rows, "record").curve("json", [])


def _jsonl_rows(path: Path, lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows from JSON lines; blank lines are skipped, anything else must be a JSON object."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            row = json_loads(line, parse_float=str, parse_int=str)
        except NestingError as exc:
            raise AlignerError(f"{path} line {number}: not readable JSON: {exc}") from None
        except ValueError as exc:
            raise AlignerError(f"{path} line {number}: not valid JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise AlignerError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _table_points(path: Path, rows: Iterable[tuple[int, dict[Any, Any]]], unit: str) -> _Points:
    """Entries from rows with a loss field (and optional step/epoch fields); rows without a loss are skipped."""
    points = _Points(path, unit)
    seen_keys: set[str] = set()
    for number, raw_row in rows:
        row = {str(k).strip().lower(): v for k, v in raw_row.items() if k is not None}
        if len(seen_keys) < _MAX_FIELD_NAMES:
            seen_keys.update(row)
        loss_key = next((k for k in LOSS_KEYS if k in row and row[k] not in (None, "")), None)
        if loss_key is None:
            continue
        step_key = next((k for k in STEP_KEYS if row.get(k) not in (None, "")), None)
        epoch_key = next((k for k in EPOCH_KEYS if row.get(k) not in (None, "")), None)
        points.add(number, str(row[loss_key]), row[step_key] if step_key else None,
                   row[epoch_key] if epoch_key else None)
        if points.step_error or points.loss_error:
            break  # the reading cannot succeed: stop at its first error
    if not (len(points.losses) or points.step_error or points.loss_error):
        found = ", ".join(sorted(seen_keys)) or "none"
        raise AlignerError(f"no losses found in {path}: no field named {', '.join(LOSS_KEYS)} (fields found: {found})")
    return points


def _short(value: Any) -> str:
    """repr of a value for a message, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: Any) -> int | None:
    """A step/epoch number in 0..MAX_STEP (integral floats such as '3.0' too), None for None or ''; else ValueError
    saying what is wrong with it."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and len(value) < 16 and value.isdecimal():  # the usual case, without Decimal
        return int(value)
    try:
        number = Decimal(str(value).strip())
        if not number.is_finite() or number != number.to_integral_value() or number < 0:
            raise InvalidOperation
    except (InvalidOperation, ValueError):
        raise ValueError("is not a non-negative whole number") from None
    if not number.is_zero() and number.adjusted() >= 16 or number > MAX_STEP:  # adjusted() first: no 10**1e9 built
        raise ValueError(f"is beyond {MAX_STEP:.0e}: not a step counter")
    return int(number)


def _unit(token: str) -> float:
    """The last-digit unit of a rounded loss ('0.1235' -> 1e-4); inf when it shows no rounding.

    A loss written as an exact float32 value ('2.5', or Python's repr of a float32 loss) shows no rounding, and
    nan/inf show nothing.
    """
    try:
        number = Decimal(token.strip().lstrip("[").strip())
    except InvalidOperation:  # a form float() reads but Decimal does not: no digit count to learn from
        return math.inf
    exponent = number.as_tuple().exponent  # 'n', 'N' or 'F' for nan, snan and infinity
    if not isinstance(exponent, int) or _is_float32(float(number)):  # past 1e308, float() is inf: a float32
        return math.inf
    return 10.0 ** exponent


def _is_float32(value: float) -> bool:
    """Whether `value` is exactly representable as a float32."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:
        return False


def _global_steps(points: _Points) -> tuple[array[int], list[int]]:
    """1-based global steps: per-epoch step counters are chained, missing steps become consecutive indices."""
    records, path = points.steps, points.path
    missing = next((i for i, step in enumerate(records) if step < 0), None)
    if missing is not None:
        if any(step >= 0 for step in records):
            raise AlignerError(f"{path} {points.where(missing)}: a loss without a step number, while other entries "
                               "have one")
        indices = array("q", range(1, len(records) + 1))
        return indices, _epoch_changes(points.epochs, indices)
    epochs = points.epochs
    shift = 1 if records[0] == 0 else 0  # a 0-based counter: its step 0 is everyone's step 1
    steps = array("q")
    offset = 0
    for i, step in enumerate(records):
        raw = step + shift
        if i:
            previous_step, epoch, previous_epoch = records[i - 1], epochs[i], epochs[i - 1]
            new_epoch = epoch >= 0 and epoch != previous_epoch
            if epoch >= 0 and previous_epoch >= 0 and epoch < previous_epoch:
                raise AlignerError(f"{path} {points.where(i)}: epoch {epoch} comes after epoch {previous_epoch}; "
                                   "is this two runs in one file?")
            if new_epoch and raw <= previous_step + shift:  # the step counter restarted with the epoch
                offset = steps[-1]
            elif raw <= previous_step + shift:
                raise AlignerError(f"{path} {points.where(i)}: step {step} comes after step {previous_step}; "
                                   "is this two runs in one file?")
            if offset + raw <= steps[-1]:  # a 1-based log whose counter restarts at 0 in a new epoch
                raise AlignerError(f"{path} {points.where(i)}: step {step} of epoch {epoch} would repeat global "
                                   f"step {steps[-1]}: the counter starts at {records[0]} but restarts at {step}")
        if offset + raw > MAX_STEP:
            raise AlignerError(f"{path} {points.where(i)}: the global step passes {MAX_STEP:.0e} (epoch counters "
                               "chained): not a training log")
        steps.append(offset + raw)
    return steps, _epoch_changes(epochs, steps)


def _epoch_changes(epochs: array[int], steps: Iterable[int]) -> list[int]:
    """Global steps at which the epoch number changes (-1: no epoch given)."""
    changes, previous = [], -1
    for epoch, step in zip(epochs, steps):
        if previous >= 0 and epoch >= 0 and epoch != previous:
            changes.append(step)
        previous = epoch if epoch >= 0 else previous
    return changes
