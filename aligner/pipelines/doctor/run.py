"""`aligner.doctor`: the whole migration check in one call, as a chain of stages (data: STAGES), each the library
call a user would run by hand, each kept on disk in its own folder of `out`."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT, Progress
from aligner.dumping.randomness import fix_random
from aligner.pipelines.audit import AuditReport
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import Culprit
from aligner.pipelines.doctor.result import (
    SELECTABLE,
    Blame,
    CulpritKind,
    DeterminismOutcome,
    DoctorResult,
    ForwardOutcome,
    InputSpec,
    Outcome,
    SkipReason,
    Stage,
    StageRun,
    Status,
    TrainOutcome,
)
from aligner.pipelines.doctor.sides import Factory, build_sides, describe, split_inputs
from aligner.pipelines.doctor.stages import (
    Context,
    SkipStage,
    run_audit,
    run_determinism,
    run_forward,
    run_repro,
    run_train,
    run_weights,
)

# the chain, in order: each stage's function (what it runs is in its docstring)
STAGES: tuple[tuple[Stage, Callable[[Context], tuple[Status, Outcome]]], ...] = (
    (Stage.AUDIT, run_audit), (Stage.WEIGHTS, run_weights), (Stage.DETERMINISM, run_determinism),
    (Stage.FORWARD, run_forward), (Stage.TRAIN, run_train), (Stage.REPRO, run_repro))

NEEDS_INPUTS = (Stage.DETERMINISM, Stage.FORWARD, Stage.TRAIN)


def parse_stages(names: Iterable[str | Stage] | str | None, option: str) -> set[Stage] | None:
    """Stage names from `--only`/`--skip` (comma-separated or a list); an unknown name is one line listing them."""
    if names is None:
        return None
    items = names.split(",") if isinstance(names, str) else list(names)
    out: set[Stage] = set()
    for item in items:
        name = str(item).strip()
        stage = next((s for s in SELECTABLE if s.value == name), None)
        if stage is None:
            names_all = ", ".join(s.value for s in SELECTABLE)
            raise AlignerError(f"{option} {name!r}: not a stage; the stages are {names_all}")
        out.add(stage)
    return out


def _output(out: str | os.PathLike | None) -> Path:
    """The folder every stage keeps its files in: new or empty (nothing of another run is overwritten)."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="aligner-doctor-"))
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise AlignerError(f"output {path} exists and is not an empty directory: give a new -o DIR")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AlignerError(f"cannot create {path}: {exc.strerror or exc}") from None
    return path


def _input_spec(given: InputSpec | None, inputs: tuple[list[Any], dict[str, Any]] | None) -> InputSpec:
    spec = given or InputSpec()
    if inputs is None:
        return spec
    args, kwargs = inputs
    return InputSpec(spec.shape, spec.path, tuple(kwargs), tuple(tuple(a.shape) for a in [*args, *kwargs.values()]))


def _forward_blame(forward: ForwardOutcome, audit: AuditReport | None) -> Blame:
    result = forward.compare
    f = result.verdict.findings[0]
    a = result.rows[f.origin].pair.a
    ms_path = f.blame_other or (a.record.parent if a is not None and f.culprit is Culprit.PARENT_CODE
                                else a.record.module if a is not None else None)
    op = source = source_ms = None
    if forward.zoom is not None and forward.zoom.verdict.findings:
        z = forward.zoom.verdict.findings[0]
        row = forward.zoom.rows[z.origin]
        if z.culprit is Culprit.OP:
            op, source = z.op or row.pair.ref.record.type, z.source or row.pair.ref.record.source
            source_ms = row.pair.a.record.source if row.pair.a is not None else None
    found = tuple(x for x in (audit.findings if audit is not None else ()) if x.torch_path == f.blame)
    replay = forward.replay
    return Blame(Stage.FORWARD, CulpritKind.of(f.culprit), f.blame, ms_path, op, source, source_ms, f.settings, found,
                 replay=replay.verdict.value if replay is not None else None,
                 replay_blame=replay.blame if replay is not None else None)


def _compare_blame(stage: Stage, result: CompareResult) -> Blame:
    f = result.verdict.findings[0]
    return Blame(stage, CulpritKind.of(f.culprit), f.blame, f.blame_other, settings=f.settings)


def blame(runs: dict[Stage, StageRun]) -> Blame | None:
    """The verdict: a side that does not agree with itself first (no difference across frameworks means anything
    then), then the most specific evidence (forward, then training, then an audit error the input did not show)."""
    def outcome(stage: Stage) -> Any:
        run = runs.get(stage)
        return run.outcome if run is not None and run.status is Status.FAILED else None

    audit_run = runs.get(Stage.AUDIT)
    audit = audit_run.outcome if audit_run is not None and isinstance(audit_run.outcome, AuditReport) else None
    forward, train, determinism = outcome(Stage.FORWARD), outcome(Stage.TRAIN), outcome(Stage.DETERMINISM)
    if isinstance(determinism, DeterminismOutcome):  # a side that differs from itself: nothing across is evidence
        pt, ms = (r.differing[0] if r.differing else None for r in determinism.reports)
        return Blame(Stage.DETERMINISM, CulpritKind.NONDETERMINISM, torch_path=pt, ms_path=ms)
    if isinstance(forward, ForwardOutcome) and forward.compare.verdict.findings:
        return _forward_blame(forward, audit)
    if isinstance(train, TrainOutcome):
        terms = tuple(train.update.differences) if train.update is not None else ()
        if terms or not train.compare.verdict.findings:  # an optimizer term: the later steps' records only inherit
            settings = tuple(f for f in (audit.findings if audit is not None else ()) if f.rule.startswith("optimizer"))
            return Blame(Stage.TRAIN, CulpritKind.OPTIMIZER, audit=settings, terms=terms)
        return _compare_blame(Stage.TRAIN, train.compare)
    if audit is not None and audit.errors:
        first = audit.errors[0]
        return Blame(Stage.AUDIT, CulpritKind.MODULE, first.torch_path, first.ms_path, audit=tuple(audit.errors))
    return None


def doctor(make_torch: Factory, make_ms: Factory, example_inputs: Any = None, *, out: str | os.PathLike | None = None,
           weights: str | None = None, map_path: str | None = None, steps: int | None = None,
           only: Iterable[str | Stage] | str | None = None, skip: Iterable[str | Stage] | str | None = None,
           seed: int = 0, progress: Progress = SILENT, input_spec: InputSpec | None = None) -> DoctorResult:
    """Run the whole migration check on two model factories and return the chain of evidence.

    Each factory is a callable or a MODULE:CALLABLE / FILE.py:CALLABLE spec returning a model or (model, optimizer
    [, scheduler][, loss_fn]); `example_inputs` an array, a sequence of arrays or a mapping of keyword arrays. Stages:
    audit, weights (convert --like), determinism, forward (dump, compare, zoom-in, replay), train (`steps`, default
    3 when both factories give an optimizer), repro. Bad input stops the run at its stage (result.error, exit 2)."""
    chosen, dropped = parse_stages(only, "--only"), parse_stages(skip, "--skip") or set()
    if steps is not None and steps < 0:
        raise AlignerError(f"--steps must be >= 0, got {steps}")
    running = [s for s, _ in STAGES if (chosen is None or s in chosen) and s not in dropped]
    if example_inputs is None and set(running) & set(NEEDS_INPUTS):
        raise AlignerError(f"the stages {', '.join(s.value for s in running if s in NEEDS_INPUTS)} run the models: "
                           "give example inputs (--input-shape or --input FILE; example_inputs=), or --only "
                           "audit,weights")
    folder = _output(out)
    inputs = split_inputs(example_inputs) if example_inputs is not None else None
    spec = _input_spec(input_spec, inputs)
    fix_random(seed)  # before the factories run: a MindSpore random op takes its generator state when it is built
    runs: dict[Stage, StageRun] = {}
    t0 = time.perf_counter()
    try:
        sides = build_sides(make_torch, make_ms)
    except AlignerError as exc:
        runs[Stage.BUILD] = StageRun(Stage.BUILD, Status.ERROR, time.perf_counter() - t0, error=str(exc))
        specs = tuple(f if isinstance(f, str) else None for f in (make_torch, make_ms))
        stages = (runs[Stage.BUILD], *(StageRun(s, Status.SKIPPED, skipped=SkipReason.EARLIER_ERROR)
                                       for s, _ in STAGES))
        return DoctorResult(folder, stages, None, spec, (specs[0], specs[1]), weights, map_path, seed)
    runs[Stage.BUILD] = StageRun(Stage.BUILD, Status.PASSED, time.perf_counter() - t0, describe(sides))
    ctx = Context(sides, inputs, folder, weights, map_path, steps, seed, progress)
    stopped = False
    with ctx.dropout:
        for stage, run in STAGES:
            if stopped:
                runs[stage] = StageRun(stage, Status.SKIPPED, skipped=SkipReason.EARLIER_ERROR)
                continue
            if (chosen is not None and stage not in chosen) or stage in dropped:
                runs[stage] = StageRun(stage, Status.SKIPPED, skipped=SkipReason.NOT_SELECTED)
                continue
            t0 = time.perf_counter()
            try:  # the calls inside draw their own bars (dump writes, convert, compare): one at a time
                status, outcome = run(ctx)
            except SkipStage as why:
                runs[stage] = StageRun(stage, Status.SKIPPED, time.perf_counter() - t0, why.outcome, why.reason)
                continue
            except AlignerError as exc:
                runs[stage] = StageRun(stage, Status.ERROR, time.perf_counter() - t0, error=str(exc))
                stopped = True
                continue
            runs[stage] = StageRun(stage, status, time.perf_counter() - t0, outcome)
            ctx.outcomes[stage], ctx.statuses[stage] = outcome, status
    stages = (runs[Stage.BUILD], *(runs[s] for s, _ in STAGES))
    return DoctorResult(folder, stages, blame(runs), spec, (sides[0].spec, sides[1].spec), weights, map_path, seed)
