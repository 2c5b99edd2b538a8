"""`align report RESULT.json`: a saved result read back into the result object it was written from, so render/ shows
it again (terminal, --html) without the dumps and without running the pipeline again.

Which kind of result a file holds is told by the keys its `to_dict` writes (SAVED, most specific first). The file is
opened through aligner.core.files (a regular file, at most the cap on dump indices) and parsed with the nesting
bound; anything wrong with it is one AlignerError line naming the file.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from aligner.core.errors import AlignerError
from aligner.core.files import INDEX, read_text
from aligner.core.nesting import json_loads
from aligner.core.result import NotAResultError, Result, check_schema
from aligner.pipelines.audit.report import AuditReport
from aligner.pipelines.audit.source import SourceAuditReport
from aligner.pipelines.check.ranks import RankedCheckReport
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.compare.ranks import RankedCompareResult
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.data.result import DataCheckResult, DataCompareResult
from aligner.pipelines.diff.checkpoints import DiffResult
from aligner.pipelines.diff.grads import DiffUpdates
from aligner.pipelines.doctor.result import SAVED_KEYS as DOCTOR_KEYS
from aligner.pipelines.doctor.result import DoctorResult
from aligner.pipelines.inspect import InspectResult
from aligner.pipelines.losses.diagnose import SAVED_KEYS as LOSSES_KEYS
from aligner.pipelines.losses.diagnose import LossReport
from aligner.pipelines.replay.result import ReplayResult

# (what the keys say, keys every saved one holds, its loader): the results whose renderers can show them again
SAVED: tuple[tuple[str, tuple[str, ...], Callable[[Mapping[str, Any]], Result]], ...] = (
    ("multi-rank compare", ("world_size", "ranks", "first_divergent"), RankedCompareResult.from_dict),
    ("compare", ("reference", "rows", "findings", "counts"), CompareResult.from_dict),
    ("replay", ("reference", "replayed", "verdict", "rows"), ReplayResult.from_dict),
    ("multi-rank check", ("world_size", "dp_groups", "ranks", "findings"), RankedCheckReport.from_dict),
    ("check", ("directory", "framework", "mode", "records", "series"), CheckReport.from_dict),
    ("audit", ("torch_model", "ms_model", "pairs", "findings"), AuditReport.from_dict),
    ("source audit", ("path", "files", "findings", "skipped"), SourceAuditReport.from_dict),
    ("inspect", ("summary", "tensors"), InspectResult.from_dict),
    ("diff --grads", ("a", "b", "params", "differences", "one_side", "update_rule"), DiffUpdates.from_dict),
    ("diff", ("a", "b", "params", "differences", "one_side"), DiffResult.from_dict),
    ("data compare", ("framework_a", "framework_b", "samples_a", "samples_b", "pairing", "fields"),
     DataCompareResult.from_dict),
    ("data check", ("directory", "framework", "samples", "fields", "findings"),
     DataCheckResult.from_dict),
    ("losses", LOSSES_KEYS, LossReport.from_dict),
    ("doctor", DOCTOR_KEYS, DoctorResult.from_dict),
)


def load_report(path: str | os.PathLike[str]) -> Result:
    """The result saved in `path` (`align compare --json` or `align check --json`, single or multi-rank; `align
    audit --json`, with or without --source; `align inspect`, `align diff` (with --grads too), `align replay`,
    `align data --json`, `align losses --json` or `align doctor`'s doctor.json); AlignerError (one line) for a file
    that cannot be read, is not JSON, or holds no result of a kind aligner can show again."""
    try:
        data = json_loads(read_text(path, INDEX))
    except (OSError, UnicodeDecodeError) as exc:
        raise AlignerError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    except ValueError as exc:  # not JSON, or nested too deep
        raise AlignerError(f"{path}: not a JSON result ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise AlignerError(f"{path}: not a saved result (a JSON {type(data).__name__}, not an object)")
    for what, keys, load in SAVED:
        if all(k in data for k in keys):
            try:
                return load(check_schema(data, what, keys))
            except NotAResultError as exc:
                raise AlignerError(f"{path}: {exc}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field missing or of the wrong type
                why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
                raise AlignerError(f"{path}: a damaged saved {what} result ({why[:160]})") from None
    kinds = ", ".join(what for what, _, _ in SAVED)
    raise AlignerError(f"{path}: not a saved result aligner can show again (it reads {kinds} results, as "
                       f"--json writes them)")
