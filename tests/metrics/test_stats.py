"""`Stats`, the typed statistics of a record: decoded with the manifest line, written back byte for byte (a statistic
recorded as null stays null, one not recorded stays absent, keys of a newer dump are dropped), and absent vs None keep
their two meanings for the readers (compare skips an absent statistic, fails a None against a number)."""
from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from aligner.dumping.manifest import _DECODER, Record
from aligner.metrics.measure import compare_stats
from aligner.metrics.stats import STAT_KEYS, Stats, extrema_only, known, tensor_stats


def _line(stats: dict | None) -> bytes:
    record = {"seq": 0, "module": "fc", "type": "Linear", "kind": "forward", "io": "output", "index": 0,
              "dtype": "float32", "shape": [4], "step": 0, "stats": stats, "file": None, "call": None,
              "parent": None, "same_as": None, "source": None}
    return json.dumps(record, separators=(",", ":")).encode()


@pytest.mark.parametrize("stats", [
    tensor_stats(np.arange(-3.0, 5.0, dtype=np.float32)).to_dict(),             # every statistic a dump writes
    extrema_only(-1.5, 2.0, 8).to_dict(),                                        # a light record: nulls kept
    {"min": 0.0, "max": 0.0, "nan": 0, "inf": 0},                                 # an older dump: the rest absent
    {"max": 1.0, "min": -1.0, "mean": None, "l2": 3.0},                           # foreign key order: field order
    None,
])
def test_a_manifest_line_is_written_back_as_it_was_read(stats: dict | None) -> None:
    line = _line(stats)
    rec = _DECODER.decode(line)
    assert isinstance(rec.stats, (Stats, type(None)))
    expected = line if stats is None else _line({k: stats[k] for k in STAT_KEYS if k in stats})
    assert rec.to_json().encode() == expected


def test_unknown_keys_are_ignored_and_bad_values_refused() -> None:
    rec = _DECODER.decode(_line({"min": 1.0, "max": 2.0, "p99": 1.9, "hist": [1, 2]}))
    assert rec.stats == Stats(min=1.0, max=2.0) and rec.stats.to_dict() == {"min": 1.0, "max": 2.0}
    for bad in ({"min": "1.0"}, {"nan": True}, {"nan": 1.5}):
        with pytest.raises(msgspec.ValidationError, match=r"stats\."):
            _DECODER.decode(_line(bad))


def test_absent_and_none_mean_different_things() -> None:
    empty = Stats()
    assert not empty and not Stats().has("min") and Stats(min=None).has("min") and Stats(min=None)
    assert known(Stats().mean) is None and known(Stats(mean=2.0).mean) == 2.0
    a = np.linspace(-1, 1, 64, dtype=np.float32)
    full = tensor_stats(a)
    # msprobe leaves Mean/Norm out at times: a statistic not recorded is not compared; one recorded as None (no
    # finite element on that side) against a number is a mismatch
    absent = msgspec.structs.replace(full, mean=msgspec.UNSET, l2=msgspec.UNSET)
    assert compare_stats(full, absent, a.shape, a.shape, "float32", "float32").mismatched == 0
    none = msgspec.structs.replace(full, mean=None)
    assert compare_stats(full, none, a.shape, a.shape, "float32", "float32").mismatched == 1


def test_a_record_holds_stats_not_a_dict() -> None:
    rec = Record(seq=0, module="m", kind="forward", dtype="float32", shape=[2], stats=tensor_stats(np.ones(2)))
    assert rec.stats is not None and rec.stats.numel == 2 and rec.stats.mean == 1.0
