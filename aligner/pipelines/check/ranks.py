"""`align check DUMP` of a multi-rank dump (DUMP holds rank{N}/ folders): each rank's own health check, and what the
migration guides ask of multi-card runs, compared across the ranks of each data-parallel group:

* rank-weights: parameter values (dump params=True) identical at every dumped step; at the first, the initial weights
  (seed consistency), later the updates kept in sync (buffers and normalisation statistics, which each rank's
  batches update, are not compared);
* rank-grads: gradients after the all-reduce identical (`param_grad` records with io "reduced": torch reads `.grad`
  when the dump context exits, MindSpore records what `DistributedGradReducer` returned with `save_grads`). The io
  "grad" records are each rank's own gradient, seen by a hook before the all-reduce (measured with DDP on gloo), so
  they differ across ranks by design and are not compared;
* rank-nonfinite: the first NaN/Inf over all ranks, by step then execution order, and on which rank.

Full dumps compare tensors (bit-exact at max_abs 0: content-addressed files with the same name are the same bytes),
stats-only dumps compare the recorded statistics.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.findings import Finding, Severity
from aligner.core.result import PassedByExitCode, typed
from aligner.core.words import Text, words
from aligner.dumping.manifest import Io, Record
from aligner.dumping.read.ranks import read_header, read_ranks
from aligner.dumping.read.source import Item, TensorError, load_tensor, read_source
from aligner.dumping.read.stream import UnorderedError, open_stream
from aligner.metrics.stats import Stats, known
from aligner.pipelines.check.config import RuleConfig
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.check.rules import Evaluation
from aligner.pipelines.check.run import check_source, check_stream
from aligner.pipelines.check.says import Say
from aligner.pipelines.check.view import PARAM, PARAM_GRAD, SkipError, nonfinite

_REDUCED = Io.REDUCED  # bound once: `see` compares every record with it
# normalisation statistics: each rank's own batches update them (DDP's broadcast_buffers copies rank 0's at the next
# forward, after the step started; MindSpore keeps them as Parameters), so they differ across ranks without a bug
_RUNNING = frozenset({"running_mean", "running_var", "num_batches_tracked", "moving_mean", "moving_variance"})


@dataclasses.dataclass(frozen=True)
class RankedCheckReport(PassedByExitCode):
    """A multi-rank dump's check: per-rank reports, the cross-rank findings, and what could not be read (a `Result`:
    `passed` is exit code 0)."""

    directory: str
    world_size: int
    dp_groups: list[list[int]]          # the data-parallel groups compared
    dp_named: bool                      # True: from the headers' "dp" groups; False: the whole world, none was named
    ranks: dict[int, CheckReport]       # each present rank's own check
    evaluation: Evaluation              # the cross-rank rules: findings, skipped with reasons, notes
    missing: list[int] = dataclasses.field(default_factory=list)           # rank folders absent
    unreadable: dict[int, str] = dataclasses.field(default_factory=dict)   # rank -> the one-line error reading it

    @property
    def findings(self) -> list[Finding]:
        """The cross-rank findings (each rank's own are in `ranks`)."""
        return self.evaluation.findings

    @property
    def errors(self) -> list[Finding]:
        """Error-severity findings, cross-rank and per rank."""
        own = [f for report in self.ranks.values() for f in report.errors]
        return [f for f in self.findings if f.severity is Severity.ERROR] + own

    @property
    def exit_code(self) -> ExitCode:
        """1 for an error-severity finding or a missing rank (a rank that did not dump is a failed run); else 2 when
        a rank could not be read; else 0."""
        if self.errors or self.missing:
            return ExitCode.FOUND
        return ExitCode.USAGE if self.unreadable else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        ev = self.evaluation
        return {"directory": self.directory, "world_size": self.world_size, "dp_groups": self.dp_groups,
                "dp_named": self.dp_named, "exit_code": int(self.exit_code), "missing": self.missing,
                "unreadable": self.unreadable, "findings": [f.to_dict() for f in self.findings],
                "checked": ev.checked, "skipped": ev.skipped, "notes": ev.notes,
                "ranks": {str(r): report.to_dict() for r, report in self.ranks.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCheckReport:
        """The report `to_dict` gave (as --json saved it, its verdict line ignored), back. The cross-rank rules'
        steps are not saved: they read back empty."""
        evaluation = Evaluation([Finding.from_dict(f) for f in data["findings"]],
                                {str(k): str(v) for k, v in data["skipped"].items()},
                                [str(c) for c in data["checked"]], [str(n) for n in data["notes"]])
        groups = [[typed(r, int, "dp_groups") for r in group] for group in data["dp_groups"]]
        return cls(typed(data["directory"], str, "directory"), typed(data["world_size"], int, "world_size"), groups,
                   typed(data["dp_named"], bool, "dp_named"),
                   {int(r): CheckReport.from_dict(report) for r, report in data["ranks"].items()}, evaluation,
                   [typed(r, int, "missing") for r in data["missing"]],
                   {int(r): str(why) for r, why in data["unreadable"].items()})


@dataclasses.dataclass
class _Rank:
    """One rank's dump as the cross-rank rules read it, gathered as its records pass (`see`): its weights' values
    and its gradients after the all-reduce by (step, name), the steps of its records, its first record holding
    NaN/Inf, and its parameter values holding NaN/Inf (the last value read of each)."""

    rank: int
    params: dict[tuple[int, str], Item] = dataclasses.field(default_factory=dict)
    reduced: dict[tuple[int, str], Item] = dataclasses.field(default_factory=dict)
    steps: set[int] = dataclasses.field(default_factory=set)
    first: Record | None = None
    nonfinite_params: dict[tuple[int, str], Record] = dataclasses.field(default_factory=dict)

    def see(self, item: Item) -> None:
        """One item of the rank's dump, in execution order."""
        rec = item.record
        key = (rec.step, rec.module)
        if rec.kind == PARAM:
            self.nonfinite_params.pop(key, None)  # the last value read of a parameter is the one checked
            if nonfinite(rec.stats):
                self.nonfinite_params[key] = rec
            self.params.pop(key, None)
            if rec.type == "Parameter" and rec.module.rsplit(".", 1)[-1] not in _RUNNING:
                self.params[key] = item
            return
        self.steps.add(rec.step)
        if self.first is None and nonfinite(rec.stats):
            self.first = rec
        if rec.kind == PARAM_GRAD and rec.io == _REDUCED:
            self.reduced[key] = item


def _dp_groups(headers: list[dict[str, Any]], world: int) -> tuple[list[list[int]], bool]:
    """The data-parallel groups the headers name (their union: a rank may write only its own group), else the world;
    AlignerError when two headers put a rank in different groups."""
    named: dict[int, tuple[int, ...]] = {}
    for header in headers:
        groups = header.get("groups")
        dp = groups.get("dp") if isinstance(groups, dict) else None
        for group in dp if isinstance(dp, list) else ():
            if not isinstance(group, list) or not all(isinstance(r, int) and 0 <= r < world for r in group):
                continue
            for rank in group:
                if named.setdefault(rank, tuple(sorted(group))) != tuple(sorted(group)):
                    raise AlignerError(f"the rank folders' headers disagree on rank {rank}'s data-parallel group "
                                       f"({list(named[rank])} and {sorted(group)})")
    if not named:
        return [list(range(world))], False
    return [list(g) for g in sorted(set(named.values()))], True


def _differ(a: Item, b: Item, limit: float) -> float | None:
    """How far two records' values are apart (max |a - b|; from statistics when either has no tensor file or one
    that cannot be read), or None when within `limit`. NaN and Inf in the same places agree; a different shape or
    placement is inf."""
    if a.record.file is not None and a.record.file == b.record.file and not a.error and not b.error:
        return None  # content-addressed: the same file name is the same dtype, shape and bytes
    if a.record.shape != b.record.shape:
        return math.inf
    arrays: tuple[np.ndarray, np.ndarray] | None = None
    if a.path is not None and b.path is not None and not a.error and not b.error:
        try:
            arrays = load_tensor(a), load_tensor(b)
        except TensorError:  # missing, truncated, not a regular file: the statistics the manifest holds decide
            pass
    if arrays is not None:
        x, y = arrays
        if x.dtype != y.dtype:
            return math.inf
        if limit == 0:
            return None if x.tobytes() == y.tobytes() else _max_abs(x, y)
        diff = _max_abs(x, y)
        return None if diff <= limit else diff
    sa, sb = a.record.stats or Stats(), b.record.stats or Stats()
    if known(sa.nan) != known(sb.nan) or known(sa.inf) != known(sb.inf):
        return math.inf
    values = [(known(x), known(y)) for x, y in ((sa.min, sb.min), (sa.max, sb.max), (sa.mean, sb.mean), (sa.l2, sb.l2))]
    if any((x is None) != (y is None) for x, y in values):
        return math.inf
    diff = max((abs(float(x or 0) - float(y or 0)) for x, y in values if x is not None), default=0.0)
    return None if diff <= limit else diff


def _max_abs(x: np.ndarray, y: np.ndarray) -> float:
    """max |x - y| in float64, NaN/Inf in the same places agreeing (inf where they do not)."""
    a, b = x.astype(np.float64, copy=False).ravel(), y.astype(np.float64, copy=False).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = ~finite & ((a == b) | (np.isnan(a) & np.isnan(b)))
    if not np.all(finite | same_special):
        return math.inf
    # equal bytes differ only by the sign of a zero or a NaN payload: report the smallest nonzero, not 0
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0)) or float(np.finfo(np.float64).tiny)


def _mismatches(ranks: dict[int, _Rank], groups: list[list[int]], pick: str, limit: float
                ) -> tuple[list[tuple[int, int, int, str, float]], int]:
    """(step, rank, reference rank, name, max |diff|) of every record `pick` ("params" | "reduced") that differs
    from its group's lowest present rank, and how many records were compared."""
    out, compared = [], 0
    for group in groups:
        present = [r for r in group if r in ranks]
        if len(present) < 2:
            continue
        base = getattr(ranks[present[0]], pick)
        for other in present[1:]:
            mine = getattr(ranks[other], pick)
            steps = {s for s, _ in base} & {s for s, _ in mine}
            for key in sorted(k for k in base.keys() | mine.keys() if k[0] in steps):
                compared += 1
                if key not in base or key not in mine:
                    out.append((key[0], other, present[0], key[1], math.inf))
                    continue
                diff = _differ(base[key], mine[key], limit)
                if diff is not None:
                    out.append((key[0], other, present[0], key[1], diff))
    return out, compared


def _describe(found: list[tuple[int, int, int, str, float]], step: int) -> dict[str, Any]:
    """The words' data of the mismatches at `step`: who (each rank and the rank it differs from), name (the first
    parameter), diff (its difference, inf: not comparable), names (how many parameters differ)."""
    at = [f for f in found if f[0] == step]
    _, _, _, name, diff = at[0]
    return {"who": tuple(sorted({(r, ref) for _, r, ref, _, _ in at})), "name": name, "diff": diff,
            "names": len({n for _, _, _, n, _ in at})}


@dataclasses.dataclass
class _Ctx:
    """What each cross-rank rule gets: the ranks read, the data-parallel groups, the thresholds, the output."""

    directory: str
    ranks: dict[int, _Rank]
    groups: list[list[int]]
    config: RuleConfig
    out: Evaluation

    def finding(self, rule: str, message: Text, step: int, fix: Text, value: float | None = None,
                where: str | None = None) -> Finding:
        return Finding(rule, self.config.severity(rule), message, (where,) if where else (), step, fix,
                       values=(value,) if value is not None else ())


def _first_mismatch(ctx: _Ctx, pick: str, limit: float, what: str) -> tuple[int, dict[str, Any]] | None:
    """(step, what differs there: `_describe`) of the first step where `pick` records differ across the ranks of a
    group, None when they agree; SkipError when no two ranks of a group share a step of them."""
    found, compared = _mismatches(ctx.ranks, ctx.groups, pick, limit)
    if not compared:
        raise SkipError(f"needs {what} of 2+ ranks of one data-parallel group at a common step")
    if not found:
        return None
    step = min(f[0] for f in found)
    return step, _describe(found, step)


def _rule_weights(ctx: _Ctx) -> list[Finding]:
    limit = ctx.config("rank-weights", "max_abs")
    if not any(r.params for r in ctx.ranks.values()):
        raise SkipError("the dump has no parameter values (dump with aligner.dump(..., params=True))")
    first = _first_mismatch(ctx, "params", limit, "parameter values")
    if first is None:
        return []
    step, differ = first
    first_step = min(s for r in ctx.ranks.values() for s, _ in r.params)
    message, fix = (Say.RANK_WEIGHTS_START, Say.FIX_RANK_WEIGHTS_START) if step == first_step else \
        (Say.RANK_WEIGHTS_DRIFT, Say.FIX_RANK_WEIGHTS_DRIFT)
    return [ctx.finding("rank-weights", words(message, step=step, **differ), step, words(fix), differ["diff"],
                        differ["name"])]


def _rule_grads(ctx: _Ctx) -> list[Finding]:
    limit = ctx.config("rank-grads", "max_abs")
    ctx.out.notes.append(words(Say.RANK_GRADS_NOTE))
    if not any(r.reduced for r in ctx.ranks.values()):
        raise SkipError("the dump has no gradients after the all-reduce (param_grad io 'reduced'): torch records .grad "
                    "when a multi-rank dump context exits (run backward inside it); MindSpore: "
                    "aligner.dumping.save_grads(...) with what DistributedGradReducer returned")
    first = _first_mismatch(ctx, "reduced", limit, "reduced gradients")
    if first is None:
        return []
    step, differ = first
    return [ctx.finding("rank-grads", words(Say.RANK_GRADS, step=step, **differ), step, words(Say.FIX_RANK_GRADS),
                        differ["diff"], differ["name"])]


def _first_nonfinite(rank: _Rank) -> Record | None:
    """The rank's first record holding NaN/Inf in execution order, parameter values included (on a tie, not one)."""
    found = [(r.step, r.seq, 1, r) for r in rank.nonfinite_params.values()]
    if rank.first is not None:
        found.append((rank.first.step, rank.first.seq, 0, rank.first))
    return min(found, key=lambda f: f[:3])[3] if found else None


def _rule_nonfinite(ctx: _Ctx) -> list[Finding]:
    origins = {rank: rec for rank, r in ctx.ranks.items() if (rec := _first_nonfinite(r)) is not None}
    if not origins:
        return []
    order = sorted(origins, key=lambda rank: (origins[rank].step, origins[rank].seq, rank))
    rank, rec = order[0], origins[order[0]]
    st = rec.stats or Stats()
    later = tuple((r, origins[r].step, origins[r].kind, origins[r].io, origins[r].module) for r in order[1:])
    message = words(Say.RANK_NONFINITE, ranks=len(ctx.ranks), rank=rank, step=rec.step, kind=rec.kind, io=rec.io,
                    module=rec.module, type=rec.type or rec.kind, nan=st.nan or 0, inf=st.inf or 0, later=later)
    return [ctx.finding("rank-nonfinite", message, rec.step,
                        words(Say.FIX_RANK_NONFINITE, rank=rank, directory=ctx.directory), where=rec.module)]


_RULES = {"rank-weights": _rule_weights, "rank-grads": _rule_grads, "rank-nonfinite": _rule_nonfinite}


def _check_rank(rank: int, folder: Path, config: RuleConfig) -> tuple[CheckReport, _Rank]:
    """One rank's own check and what the cross-rank rules read of it, in one pass over its records (read whole when
    they are out of execution order)."""
    gathered = _Rank(rank)
    try:
        with open_stream(folder) as stream:
            return check_stream(stream, config, str(folder), gathered.see), gathered
    except UnorderedError:
        gathered = _Rank(rank)
        return check_source(read_source(folder), config, str(folder), gathered.see), gathered


@gc_paused()  # as check's: records pass by the million
def check_ranks(directory: str | os.PathLike, rules: Mapping[str, Any] | None = None) -> RankedCheckReport:
    """Check a multi-rank dump: each rank with `check`'s rules, then the cross-rank rules within each data-parallel
    group; AlignerError for mixed world sizes or a directory without rank folders."""
    config = RuleConfig.load(rules)
    dump = read_ranks(directory)
    if not dump.folders:
        raise AlignerError(f"{directory}: no rank{{N}}/ folders (not a multi-rank dump)")
    world = dump.world_size if dump.world_size is not None else max(dump.folders) + 1
    groups, named = _dp_groups([read_header(f) for f in dump.folders.values()], world)
    ranks: dict[int, _Rank] = {}
    reports: dict[int, CheckReport] = {}
    unreadable: dict[int, str] = {}
    for rank, folder in sorted(dump.folders.items()):
        try:
            reports[rank], ranks[rank] = _check_rank(rank, folder, config)
        except AlignerError as exc:
            unreadable[rank] = str(exc)
    out = Evaluation(steps=sorted({s for r in ranks.values() for s in r.steps}))
    ctx = _Ctx(str(directory), ranks, groups, config, out)
    for name, rule in _RULES.items():
        if not config.enabled(name):
            out.skipped[name] = f"disabled (--rule {name}.enabled=false)"
            continue
        try:
            out.findings.extend(rule(ctx))
            out.checked.append(name)
        except SkipError as why:
            out.skipped[name] = str(why)
    severity = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    out.findings.sort(key=lambda f: (severity[f.severity], f.step if f.step is not None else -1))
    if not named:
        out.notes.append(words(Say.RANKS_AS_ONE, world=world))
    return RankedCheckReport(str(directory), world, groups, named, reports, out,
                             [r for r in range(world) if r not in dump.folders], unreadable)
