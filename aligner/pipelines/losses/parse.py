"""Read loss curves from training logs (text, CSV, JSON, JSONL); knows nothing about comparing them."""
from __future__ import annotations

import csv
import io
import json
import re
import struct
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable

from aligner.core.errors import AlignerError

_NUM = r"\[?\s*(?P<loss>[-+]?(?:nan|inf(?:inity)?|\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))"
_EPOCH = r"(?:\bepoch\b\s*[:=]?\s*\[?(?P<epoch>\d+)\b.*?)?"

# Tried in order; the first one that matches any line of a file is used for the whole file.
DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("MindSpore LossMonitor 'epoch: E step: S, loss is X'",
     r"\bepoch:\s*(?P<epoch>\d+),?\s+step:\s*(?P<step>\d+),?\s+loss is\s*" + _NUM),
    ("'[epoch E ...] step S ... loss X'",
     _EPOCH + r"\bstep\b\s*[:=]?\s*\[?(?P<step>\d+)\b.*?\b(?:train_)?loss\b\s*(?:is|[:=])?\s*" + _NUM),
    ("'loss X' (no step: consecutive indices)", r"\b(?:train_)?loss\b\s*(?:is|[:=])?\s*" + _NUM),
)

LOSS_KEYS = ("loss", "train_loss", "train/loss")
STEP_KEYS = ("step", "global_step", "iteration", "iter")
EPOCH_KEYS = ("epoch",)
FORMATS = ("text", "csv", "json", "jsonl")


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


@dataclass(frozen=True)
class _Record:
    """One raw loss entry before steps are made global."""

    where: str            # "line 7" or "record 3", for messages
    token: str            # the loss as written
    step: int | None
    epoch: int | None


def detect_format(path: Path, text: str) -> str:
    """Pick the reader from the suffix, else from the content: JSON, JSON lines, or plain text."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix == ".json":
        return "json"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            json.loads(text)
            return "json"
        except ValueError:
            first = stripped.splitlines()[0]
            try:
                return "jsonl" if isinstance(json.loads(first), dict) else "text"
            except ValueError:
                return "text"
    return "text"


def compile_pattern(pattern: str, option: str = "--pattern") -> re.Pattern[str]:
    """Compile a user regex; it must have a named group `loss` (`step` and `epoch` are optional)."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
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
        text = path.read_text(encoding="utf-8-sig", errors="replace")  # -sig: spreadsheets write a BOM
    except OSError as exc:
        raise AlignerError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not text.strip():
        raise AlignerError(f"{path} is empty")
    fmt = detect_format(path, text)
    if pattern is not None and fmt != "text" and require_text:
        raise AlignerError(f"{option} applies to text logs, but {path} is {fmt.upper()}")
    regex_used: tuple[str, str] | None = None
    if fmt == "text":
        records, regex_used = _text_records(path, text, pattern, option)
    elif fmt == "csv":
        records = _table_records(path, _csv_rows(path, text), "row")
    elif fmt == "json":
        records = _table_records(path, _json_rows(path, text), "record")
    else:
        records = _table_records(path, _jsonl_rows(path, text), "line")
    steps, epoch_starts = _global_steps(path, records)
    losses = tuple(_to_float(path, r) for r in records)
    return LossCurve(
        path=str(path), format=fmt, steps=tuple(steps), losses=losses,
        resolution=_resolution(records), epoch_starts=frozenset(epoch_starts),
        pattern=regex_used[1] if regex_used else None, pattern_name=regex_used[0] if regex_used else None,
    )


def _text_records(path: Path, text: str, pattern: str | None, option: str) -> tuple[list[_Record], tuple[str, str]]:
    """Match every line against the user's regex, or the first default regex that matches anything."""
    if pattern is not None:
        candidates = [("custom", compile_pattern(pattern, option))]
    else:
        candidates = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in DEFAULT_PATTERNS]
    lines = text.splitlines()
    for name, regex in candidates:
        records = []
        for number, line in enumerate(lines, start=1):
            match = regex.search(line)
            if match is None or match.group("loss") is None:
                continue
            groups = match.groupdict()
            records.append(_Record(
                where=f"line {number}", token=match.group("loss"),
                step=_int_or_none(path, f"line {number}", "step", groups.get("step")),
                epoch=_int_or_none(path, f"line {number}", "epoch", groups.get("epoch")),
            ))
        if records:
            return records, (name, regex.pattern)
    if pattern is not None:
        raise AlignerError(f"no losses found in {path}: no line matches {option} {pattern!r}")
    tried = "; ".join(name for name, _ in DEFAULT_PATTERNS)
    raise AlignerError(f"no losses found in {path}: tried the default patterns {tried} "
                       f"(pass {option} REGEX with a (?P<loss>...) group)")


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """Yield (row number, row) from a CSV file with a header line."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        return [(number, row) for number, row in enumerate(reader, start=2)]
    except csv.Error as exc:
        raise AlignerError(f"{path}: not a readable CSV file: {exc}") from exc


def _json_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows from a JSON list of records, a dict of columns, or a dict holding a list of records."""
    try:
        data = json.loads(text, parse_float=str, parse_int=str)
    except ValueError as exc:
        raise AlignerError(f"{path}: not valid JSON: {exc}") from exc
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
    return [(number, row) for number, row in enumerate(data, start=1) if isinstance(row, dict)]


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows from JSON lines; blank lines are skipped, anything else must be a JSON object."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_float=str, parse_int=str)
        except ValueError as exc:
            raise AlignerError(f"{path} line {number}: not valid JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise AlignerError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _table_records(path: Path, rows: Iterable[tuple[int, dict[str, Any]]], unit: str) -> list[_Record]:
    """Turn rows with a loss field (and optional step/epoch fields) into records; rows without a loss are skipped."""
    records: list[_Record] = []
    seen_keys: set[str] = set()
    for number, raw_row in rows:
        row = {str(k).strip().lower(): v for k, v in raw_row.items() if k is not None}
        seen_keys.update(row)
        loss_key = next((k for k in LOSS_KEYS if k in row and row[k] not in (None, "")), None)
        if loss_key is None:
            continue
        where = f"{unit} {number}"
        step_key = next((k for k in STEP_KEYS if row.get(k) not in (None, "")), None)
        epoch_key = next((k for k in EPOCH_KEYS if row.get(k) not in (None, "")), None)
        records.append(_Record(
            where=where, token=str(row[loss_key]),
            step=_int_or_none(path, where, step_key, row[step_key]) if step_key else None,
            epoch=_int_or_none(path, where, epoch_key, row[epoch_key]) if epoch_key else None,
        ))
    if not records:
        found = ", ".join(sorted(seen_keys)) or "none"
        raise AlignerError(f"no losses found in {path}: no field named {', '.join(LOSS_KEYS)} (fields found: {found})")
    return records


def _int_or_none(path: Path, where: str, name: str, value: Any) -> int | None:
    """Parse a step/epoch number; integral floats such as '3.0' are accepted."""
    if value is None or value == "":
        return None
    try:
        number = Decimal(str(value).strip())
        if number != number.to_integral_value() or number < 0:
            raise InvalidOperation
    except (InvalidOperation, ValueError):
        raise AlignerError(f"{path} {where}: {name} {value!r} is not a non-negative whole number") from None
    return int(number)


def _to_float(path: Path, record: _Record) -> float:
    """Parse a loss; nan and inf are kept (they are reported, not rejected)."""
    try:
        return float(record.token.strip().lstrip("["))
    except ValueError:
        raise AlignerError(f"{path} {record.where}: loss {record.token!r} is not a number") from None


def _resolution(records: list[_Record]) -> float:
    """The finest last-digit unit among rounded losses ('0.1235' -> 1e-4), 0.0 when no loss looks rounded.

    A loss written as an exact float32 value ('2.5', or Python's repr of a float32 loss) shows no rounding, and
    nan/inf show nothing, so they are left out.
    """
    units = []
    for record in records:
        try:
            number = Decimal(record.token.strip().lstrip("[").strip())
        except InvalidOperation:  # a form float() reads but Decimal does not: no digit count to learn from
            continue
        exponent = number.as_tuple().exponent  # 'n', 'N' or 'F' for nan, snan and infinity
        if isinstance(exponent, int) and not _is_float32(float(number)):
            units.append(10.0 ** exponent)
    return min(units, default=0.0)


def _is_float32(value: float) -> bool:
    """Whether `value` is exactly representable as a float32."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0] == value
    except OverflowError:
        return False


def _global_steps(path: Path, records: list[_Record]) -> tuple[list[int], list[int]]:
    """1-based global steps: per-epoch step counters are chained, missing steps become consecutive indices."""
    counters = [r.step for r in records if r.step is not None]
    if not counters:
        return list(range(1, len(records) + 1)), _epoch_changes(records, range(1, len(records) + 1))
    if len(counters) != len(records):
        missing = next(r for r in records if r.step is None)
        raise AlignerError(f"{path} {missing.where}: a loss without a step number, while other entries have one")
    shift = 1 if counters[0] == 0 else 0  # a 0-based counter: its step 0 is everyone's step 1
    steps: list[int] = []
    offset = 0
    for i, (record, step) in enumerate(zip(records, counters)):
        raw = step + shift
        if i:
            previous, previous_step = records[i - 1], counters[i - 1]
            epoch, previous_epoch = record.epoch, previous.epoch
            new_epoch = epoch is not None and epoch != previous_epoch
            if epoch is not None and previous_epoch is not None and epoch < previous_epoch:
                raise AlignerError(f"{path} {record.where}: epoch {epoch} comes after epoch {previous_epoch}; "
                                   "is this two runs in one file?")
            if new_epoch and raw <= previous_step + shift:  # the step counter restarted with the epoch
                offset = steps[-1]
            elif raw <= previous_step + shift:
                raise AlignerError(f"{path} {record.where}: step {step} comes after step {previous_step}; "
                                   "is this two runs in one file?")
        steps.append(offset + raw)
    return steps, _epoch_changes(records, steps)


def _epoch_changes(records: list[_Record], steps: Iterable[int]) -> list[int]:
    """Global steps at which the epoch number changes."""
    changes, previous = [], None
    for record, step in zip(records, steps):
        if previous is not None and record.epoch is not None and record.epoch != previous:
            changes.append(step)
        previous = record.epoch if record.epoch is not None else previous
    return changes
