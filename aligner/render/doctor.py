"""`align doctor`'s words: the verdict, one line per stage, the exact command that reruns each stage by hand, each
stage's own report written into its folder, and one HTML page (verdict first, then the chain of evidence).

Everything from a model, a dump or a path is data: shell words are shlex-quoted, Python names repr'd, page text
escaped (htmltext.page_text), terminal text printed by the SafeConsole (no markup)."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import IO, Any, Callable

from rich.console import Console

from aligner.core.atomic import atomic_open
from aligner.pipelines.doctor import Blame, CulpritKind, DoctorResult, SkipReason, Stage, StageRun, Status
from aligner.pipelines.doctor.result import (
    DeterminismOutcome,
    ForwardOutcome,
    ReproOutcome,
    Sides,
    TrainOutcome,
    WeightsOutcome,
)
from aligner.render import compare as compare_text
from aligner.render.audit import finding_line
from aligner.render.compare import settings_text
from aligner.render.console import styled
from aligner.render.html import write_html
from aligner.render.htmltext import page_text
from aligner.render.jsonout import write_json
from aligner.render.replay import summary as replay_summary
from aligner.render.repro import size_text
from aligner.render.update_rule import finding_lines
from aligner.render.words import say

STATUS_STYLE = {Status.PASSED: "green", Status.FAILED: "bold red", Status.SKIPPED: "dim", Status.ERROR: "bold red"}
SKIP_WORDS = {
    SkipReason.NOT_SELECTED: "not selected (--only/--skip)",
    SkipReason.EARLIER_ERROR: "not run: an earlier stage stopped on bad input",
    SkipReason.NO_OPTIMIZER: "no optimizer: a factory returning (model, optimizer[, scheduler][, loss_fn]) on both "
                             "sides trains N steps",
    SkipReason.NO_STEPS: "--steps 0",
    SkipReason.FORWARD_DIFFERS: "the forward already differs: step 1's loss cannot agree (fix the forward first)",
    SkipReason.NOTHING_TO_REPRO: "no module to pack (none blamed, or the model's own forward code is)",
    SkipReason.NEEDS_FORWARD: "needs the forward stage's dumps (it did not run)",
    SkipReason.REPRO_REFUSED: "the blamed module could not be packed",
}
KIND_WORDS = {
    CulpritKind.MODULE: "its own computation differs (its inputs agree)",
    CulpritKind.PARENT_CODE: "code in its forward, between module calls, computes an input that differs",
    CulpritKind.OP: "one operation differs",
    CulpritKind.MODEL_INPUT: "the data given to the model differs",
    CulpritKind.WIRING: "its forward hands a call another module's output",
    CulpritKind.ARGUMENT: "its forward passes a call a tensor argument on one side only",
    CulpritKind.OPTIMIZER: "the optimizer's update differs",
    CulpritKind.NONDETERMINISM: "a side does not agree with itself",
}


def _module(path: str | None) -> str:
    return "the model" if not path else repr(path)


def _q(path: Any) -> str:
    return shlex.quote(str(path))


def _file(path: str | None) -> str:
    """`.../site-packages/timm/models/vit.py:123` -> `vit.py:123`."""
    return path.rsplit("/", 1)[-1] if path else "?"


# -- the verdict ----------------------------------------------------------------------------------------------------

def _forward_finding(result: DoctorResult) -> Any:
    run = result.stage(Stage.FORWARD)
    if run is not None and isinstance(run.outcome, ForwardOutcome) and run.outcome.compare.verdict.findings:
        return run.outcome.compare.verdict.findings[0]
    return None


def verdict_lines(result: DoctorResult) -> list[str]:
    """The verdict first: what differs, where, the setting or code line, the fix when known; or why it stopped."""
    if result.error is not None:
        return [f"ERROR in stage {result.error.stage}: {result.error.error}",
                "The stages before it are kept in " + str(result.out) + "."]
    b = result.blame
    if result.passed:
        ran = [s.stage.value for s in result.stages if s.stage is not Stage.BUILD and s.status is Status.PASSED]
        return [f"PASSED: the MindSpore port agrees with the torch model ({', '.join(ran)})."]
    if b is None:
        failed = [s.stage.value for s in result.stages if s.status is Status.FAILED]
        return [f"FAILED: {', '.join(failed) or 'nothing was checked'} (no module to blame: see the stages below)."]
    return [f"FAILED: {_headline(b)}", *_details(result, b)]


def _headline(b: Blame) -> str:
    if b.kind is CulpritKind.OPTIMIZER:
        return "the forward agrees; the training step differs: the optimizer's update differs."
    if b.kind is CulpritKind.NONDETERMINISM:
        sides = [f"{fw} (first: {name})" for fw, name in (("torch", b.torch_path), ("MindSpore", b.ms_path)) if name]
        return (f"not deterministic: two runs on the same inputs differ on {' and '.join(sides)}; fix that before "
                "comparing the frameworks (random ops, functional dropout, seeds set after the model was built).")
    where = _module(b.torch_path) + (f" (MindSpore {_module(b.ms_path)})" if b.ms_path not in (None, b.torch_path)
                                     else "")
    what = {Stage.FORWARD: "the forward parts at", Stage.TRAIN: "training parts at",
            Stage.AUDIT: "the audit finds a setting that changes the numbers at"}.get(b.stage, "at")
    return f"{what} {where}: {KIND_WORDS[b.kind]}."


def _details(result: DoctorResult, b: Blame) -> list[str]:
    lines = []
    finding = _forward_finding(result) if b.stage is Stage.FORWARD else None
    if finding is not None and finding.settings:
        lines.append("Setting (MindSpore vs torch): "
                     + settings_text(finding).removeprefix(" Its settings differ (first vs reference): "))
    if b.op is not None:
        lines.append(f"Code line: {b.op} at {_file(b.source)} (torch)"
                     + (f", {_file(b.source_ms)} (MindSpore)" if b.source_ms else "") + ".")
    for f in b.audit:
        lines.append(f"Audit: {say(f.message)}")
        if f.fix:
            lines.append(f"Fix: {say(f.fix)}")
    for f in b.terms:
        lines.append(f"Update: {say(f.message)}.")
        if f.fix:
            lines.append(f"Fix: {say(f.fix)}.")
    if b.replay is not None:
        agrees = b.replay_blame == b.torch_path
        lines.append(f"Replay on torch's recorded inputs: {b.replay}"
                     + (f" at {_module(b.replay_blame)}" if b.replay_blame is not None else "")
                     + (" (the same module: its own error, not inherited)." if agrees and b.replay == "layer" else
                        " (the same code)." if agrees else
                        " (each module re-run alone on torch's inputs: another view than the data flow above; "
                        "forward/replay.json has every module's own and inherited error)."))
    repro = result.stage(Stage.REPRO)
    if repro is not None and isinstance(repro.outcome, ReproOutcome) and repro.outcome.repro is not None:
        lines.append(f"Repro: python {_q(repro.outcome.repro.directory / 'repro.py')}")
    return lines


# -- one line per stage ---------------------------------------------------------------------------------------------

def stage_summary(run: StageRun) -> str:
    """What the stage found, in one line (why it did not run, when it did not)."""
    if run.status is Status.ERROR:
        return run.error or ""
    if run.status is Status.SKIPPED and not isinstance(run.outcome, ReproOutcome):
        return SKIP_WORDS[run.skipped] if run.skipped is not None else ""
    o = run.outcome
    if isinstance(o, Sides):
        return (f"torch {o.classes[0]} ({o.parameters[0]:,} parameters"
                + (f", {o.optimizers[0]}" if o.optimizers[0] else "") + f"), MindSpore {o.classes[1]} "
                f"({o.parameters[1]:,} parameters" + (f", {o.optimizers[1]}" if o.optimizers[1] else "") + ")")
    if isinstance(o, WeightsOutcome):
        kinds = ", ".join(f"{len(v)} {k}" for k, v in o.convert.summary().items() if v)
        return (f"converted {o.torch_weights} into {o.converted} (--like {o.ms_init}): {len(o.convert.entries)} "
                f"tensors{' (' + kinds + ')' if kinds else ''}; loaded into the MindSpore model")
    if isinstance(o, DeterminismOutcome):
        off = sum(len(x) for x in o.dropout_off)
        return (f"seed {o.seed}, {off} dropout module(s) off; torch: {o.reports[0].summary}; MindSpore: "
                f"{o.reports[1].summary}")
    if isinstance(o, ForwardOutcome):
        return _forward_summary(o)
    if isinstance(o, TrainOutcome):
        return _train_summary(o)
    if isinstance(o, ReproOutcome):
        if o.repro is None:
            return f"{SKIP_WORDS[SkipReason.REPRO_REFUSED]}: {o.module}: {o.refused}"
        return (f"{_module(o.module)} packed into {o.repro.directory}/ ({len(o.repro.files)} files, "
                f"{size_text(o.repro.size_bytes)})")
    if o is not None and hasattr(o, "findings"):  # the audit report
        return _audit_summary(o)
    return ""


def _audit_summary(report: Any) -> str:
    counts = {sev: sum(1 for f in report.findings if f.severity.value == sev) for sev in ("error", "warning", "info")}
    text = (f"{len(report.pairs)} layer pairs; {counts['error']} errors, {counts['warning']} warnings, "
            f"{counts['info']} infos")
    if report.not_audited:
        text += f", {len(report.not_audited)} layers not audited (INCOMPLETE)"
    return text + (f"; first error: {finding_line(report.errors[0])}" if report.errors else "")


def _forward_summary(o: ForwardOutcome) -> str:
    r = o.compare
    f = r.verdict.findings[0] if r.verdict.findings else None
    text = f"{r.compared} records compared: " + (
        "no divergence" if r.passed else
        f"first divergence at {_module(r.module(f.first))}, origin {_module(f.blame)} ({f.culprit})" if f else
        "nothing was compared, not a pass")
    if o.zoom is not None:
        z = o.zoom.verdict.findings[0] if o.zoom.verdict.findings else None
        text += f"; zoom-in on {_module(o.zoom_scopes[0] if o.zoom_scopes else None)}: " + (
            f"first divergent op {z.op or o.zoom.rows[z.origin].pair.ref.record.type} at {_file(z.source)}"
            if z is not None and z.culprit.value == "op" else
            f"origin {_module(z.blame)} ({z.culprit})" if z is not None else "no op diverges")
    elif o.zoom_error:
        text += f"; no zoom-in: {o.zoom_error}"
    if o.replay is not None:
        text += f"; replay: {o.replay.verdict.value}" + (f" at {_module(o.replay.blame)}" if o.replay.blame is not None
                                                          else "")
    elif o.replay_error:
        text += f"; no replay: {o.replay_error}"
    return text


def _losses(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def _train_summary(o: TrainOutcome) -> str:
    text = (f"{o.steps} steps; losses torch {_losses(o.losses[0])} vs MindSpore {_losses(o.losses[1])}"
            + (f" (first differing step {o.first_loss_step})" if o.first_loss_step else " (agree)"))
    f = o.compare.verdict.findings[0] if o.compare.verdict.findings else None
    text += "; dumps: " + ("agree" if o.compare.passed else
                           f"first divergence at {_module(o.compare.module(f.first))} step "
                           f"{o.compare.rows[f.first].pair.ref.record.step} ({f.phase})" if f else "nothing compared")
    if o.update is not None:
        diffs = o.update.differences
        text += "; update rule: " + ("the same on both sides" if not diffs
                                     else "; ".join(say(f.message) for f in diffs))
    elif o.update_error:
        text += f"; update rule not fitted: {o.update_error}"
    return text


# -- commands to rerun each stage by hand ------------------------------------------------------------------------

def _input_args(result: DoctorResult) -> str:
    spec = result.inputs
    if spec.shape is not None:
        return " --input-shape " + ",".join(map(str, spec.shape))
    if spec.path is not None:
        return " --input " + _q(spec.path)
    return " --input inputs.npz  # the example inputs (np.savez)"


def commands(result: DoctorResult) -> dict[Stage, str]:
    """The exact command(s) that rerun each stage that ran, by hand (paths as this run wrote them)."""
    out: dict[Stage, str] = {}
    pt, ms = result.specs
    mapping = f" --map {_q(result.map_path)}" if result.map_path else ""
    if pt and ms:
        out[Stage.AUDIT] = f"align audit {_q(pt)} {_q(ms)}{_input_args(result)}"
    else:
        out[Stage.AUDIT] = "aligner.audit(torch_model, ms_model, example_inputs=x)"
    runs = {s.stage: s for s in result.stages}
    w = runs[Stage.WEIGHTS].outcome if Stage.WEIGHTS in runs else None
    if isinstance(w, WeightsOutcome):
        out[Stage.WEIGHTS] = (f"align convert {_q(w.torch_weights)} -o {_q(w.converted)} --like {_q(w.ms_init)}"
                              f"{mapping} --force")
    out[Stage.DETERMINISM] = ("aligner.fix_random(" + str(result.seed) + ")  # before building each model\n"
                              "with aligner.disable_dropout(model):\n"
                              "    print(aligner.check_determinism(lambda: model(x), model=model))")
    f = runs[Stage.FORWARD].outcome if Stage.FORWARD in runs else None
    if isinstance(f, ForwardOutcome):
        lines = [f"align compare {_q(f.dumps[1])} {_q(f.dumps[0])}{mapping} --html "
                 f"{_q(result.out / 'forward' / 'compare_rerun.html')}"]
        if f.zoom_dumps is not None:
            lines.append(f"align compare {_q(f.zoom_dumps[1])} {_q(f.zoom_dumps[0])}{mapping}")
        if f.replay is not None or f.replay_error is not None:
            weights = f" --weights {_q(w.converted)}" if isinstance(w, WeightsOutcome) else ""
            factory = f"--factory {_q(ms)}" if ms else "--factory MAKE_MS"
            modules = f" --modules {_q(f.replay_modules)}" if f.replay_modules else ""
            lines.append(f"align replay {_q(f.dumps[0])} {_q(f.dumps[1])} {factory}{weights}{modules}")
        out[Stage.FORWARD] = "\n".join(lines)
    t = runs[Stage.TRAIN].outcome if Stage.TRAIN in runs else None
    if isinstance(t, TrainOutcome):
        out[Stage.TRAIN] = (f"align compare {_q(t.dumps[1])} {_q(t.dumps[0])}{mapping}\n"
                            f"align diff {_q(t.checkpoints[1])} {_q(t.checkpoints[0])} --grads {_q(t.dumps[1])} "
                            f"{_q(t.dumps[0])}{mapping}")
    r = runs[Stage.REPRO].outcome if Stage.REPRO in runs else None
    if isinstance(r, ReproOutcome) and isinstance(f, ForwardOutcome):
        factories = "".join(f" {opt} {_q(spec)}" for opt, spec in (("--factory-a", ms), ("--factory-b", pt)) if spec)
        out[Stage.REPRO] = (f"align repro {_q(f.dumps[1])} {_q(f.dumps[0])} --module {_q(r.module)} -o "
                            f"{_q(result.out / 'repro_rerun')}{factories}"
                            + (f"\npython {_q(r.repro.directory / 'repro.py')}" if r.repro is not None else ""))
    return out


# -- the stages' own reports ----------------------------------------------------------------------------------------

def _html(result: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with atomic_open(path, "w") as fh:
            write_html(result, fh)
    return write


def _json(data: Any) -> Callable[[Path], None]:
    return lambda path: write_json(data, str(path))


def stage_reports(result: DoctorResult) -> dict[Stage, list[tuple[str, Callable[[Path], None]]]]:
    """Each stage's own report(s): (path relative to the output folder, writer)."""
    out: dict[Stage, list[tuple[str, Callable[[Path], None]]]] = {}
    for run in result.stages:
        o, files = run.outcome, []
        if isinstance(o, ForwardOutcome):
            files += [("forward/compare.html", _html(o.compare)), ("forward/compare.json", _json(o.compare.to_dict()))]
            if o.zoom is not None:
                files.append(("forward/zoom.html", _html(o.zoom)))
            if o.replay is not None:
                files.append(("forward/replay.json", _json(o.replay.to_dict())))
        elif isinstance(o, TrainOutcome):
            files += [("train/compare.html", _html(o.compare)), ("train/train.json", _json(o.to_dict()))]
        elif isinstance(o, (WeightsOutcome, DeterminismOutcome)) or (o is not None and run.stage is Stage.AUDIT):
            report = {Stage.WEIGHTS: "weights/convert.json", Stage.DETERMINISM: "determinism/determinism.json",
                      Stage.AUDIT: "audit/audit.json"}[run.stage]
            files.append((report, _json(o.to_dict())))
        if files:
            out[run.stage] = files
    return out


def write_reports(result: DoctorResult) -> dict[Stage, list[str]]:
    """Write every stage's own report into its folder, then doctor.json and doctor.html; returns the reports by
    stage (paths relative to the output folder)."""
    written: dict[Stage, list[str]] = {}
    repro = result.stage(Stage.REPRO)
    if repro is not None and isinstance(repro.outcome, ReproOutcome) and repro.outcome.repro is not None:
        here = repro.outcome.repro.directory.relative_to(result.out)  # repro wrote its own README and repro.json
        written[Stage.REPRO] = [str(here / "README.md"), str(here / "repro.py")]
    for stage, files in stage_reports(result).items():
        for rel, writer in files:
            path = result.out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            writer(path)
            written.setdefault(stage, []).append(rel)
    write_json(to_json(result, written), str(result.out / "doctor.json"))
    with atomic_open(result.out / "doctor.html", "w") as fh:
        write_page(result, written, fh)
    return written


def to_json(result: DoctorResult, reports: dict[Stage, list[str]] | None = None) -> dict[str, Any]:
    """The whole chain as data, with the verdict's words, each stage's line, command and reports."""
    cmds = commands(result)
    data = result.to_dict()
    data["verdict"] = verdict_lines(result)
    for entry, run in zip(data["stages"], result.stages):
        entry["summary"] = stage_summary(run)
        entry["command"] = cmds.get(run.stage)
        entry["reports"] = (reports or {}).get(run.stage, [])
    return data


# -- terminal ---------------------------------------------------------------------------------------------------

def print_doctor(result: DoctorResult, console: Console) -> None:
    """The verdict first, then one line per stage, then where everything is."""
    lines = verdict_lines(result)
    style = "bold green" if result.passed else "bold red"
    console.print(styled((lines[0], style)))
    for line in lines[1:]:
        console.print(styled(("  " + line, "")))
    console.print("")
    for run in result.stages:
        console.print(styled((f"{run.stage.value:<12}", "bold"), (f"{run.status.value:<8}", STATUS_STYLE[run.status]),
                             f"{run.seconds:6.1f}s  ", stage_summary(run)))
    console.print("")
    console.print(styled("Every stage's files, its report and the command that reruns it: "
                         f"{result.out / 'doctor.html'}"))


# -- one HTML page --------------------------------------------------------------------------------------------------

_CSS = ("body{font-family:system-ui,sans-serif;margin:0;color:#222}main{max-width:1400px;margin:0 auto;"
        "padding:1.2em 1.5em 3em}header{border-left:10px solid #999;background:#f6f6f6;padding:1em 1.4em}"
        "header.bad{border-color:#c62828;background:#fdecea}header.good{border-color:#2e7d32;background:#edf7ed}"
        "table{border-collapse:collapse;font-size:13px;width:100%}td,th{border:1px solid #ddd;padding:4px 6px;"
        "vertical-align:top}th{background:#eee}tr.failed td.status,tr.error td.status{color:#b00;font-weight:bold}"
        "tr.passed td.status{color:#2e7d32}tr.skipped{color:#777}pre{margin:0;white-space:pre-wrap;"
        "font-size:12px;background:#f4f4f4;padding:4px}td.name{white-space:nowrap}")


def write_page(result: DoctorResult, reports: dict[Stage, list[str]], fh: IO[str]) -> None:
    """One standalone page: the verdict first, then the chain of evidence (each stage, its report, its command),
    with what was skipped and why; every string escaped."""
    e = page_text
    lines = verdict_lines(result)
    cmds = commands(result)
    fh.write('<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>align doctor</title><style>'
             f"{_CSS}</style></head><body><main>\n")
    fh.write(f'<header class="{"good" if result.passed else "bad"}"><h1>align doctor</h1>'
             f"<p><b>{e(lines[0])}</b></p>" + "".join(f"<p>{e(line)}</p>" for line in lines[1:])
             + f'<p class="note">{e(" vs ".join(s or "(a callable)" for s in result.specs))}; files in '
             f"{e(result.out)}</p></header>\n")
    fh.write('<section id="chain"><h2>Chain of evidence</h2><table><tr><th>stage</th><th>status</th><th>time</th>'
             "<th>what it found</th><th>report</th><th>rerun by hand</th></tr>\n")
    for run in result.stages:
        links = " ".join(f'<a href="{e(rel)}">{e(rel)}</a>' for rel in reports.get(run.stage, []))
        cmd = cmds.get(run.stage) if run.status is not Status.SKIPPED or run.outcome is not None else None
        fh.write(f'<tr class="{run.status.value}" id="stage-{run.stage.value}"><td class="name">{e(run.stage.value)}'
                 f'</td><td class="status">{e(run.status.value)}</td><td>{run.seconds:.1f}s</td>'
                 f"<td>{e(stage_summary(run))}</td><td>{links or '-'}</td>"
                 f"<td>{'<pre>' + e(cmd) + '</pre>' if cmd else '-'}</td></tr>\n")
    fh.write("</table></section>\n")
    f = _forward_finding(result)
    if f is not None:
        forward = result.stage(Stage.FORWARD)
        assert forward is not None and isinstance(forward.outcome, ForwardOutcome)
        fh.write(f'<section id="forward"><h2>Forward comparison</h2><p>'
                 f"{e(compare_text.summary(forward.outcome.compare))}</p>")
        if forward.outcome.replay is not None:
            fh.write(f"<p>{e(replay_summary(forward.outcome.replay))}</p>")
        fh.write("</section>\n")
    t = result.stage(Stage.TRAIN)
    if t is not None and isinstance(t.outcome, TrainOutcome) and t.outcome.update is not None:
        fh.write('<section id="update"><h2>Update rule</h2>' + "".join(
            f"<p>{e(line)}</p>" for line in finding_lines(t.outcome.update)) + "</section>\n")
    fh.write('<p class="note">The whole chain as data: <a href="doctor.json">doctor.json</a>.</p></main></body>'
             "</html>\n")
