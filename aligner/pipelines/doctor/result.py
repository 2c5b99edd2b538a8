"""What `align doctor` found: one frozen result per stage, chained into a DoctorResult (verdict data, no sentences).

Each stage keeps the result object of the library call it ran (AuditReport, ConvertResult, CompareResult, ...), so
render/ can write that stage's own report and the exact command that reruns it by hand.
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any, Callable, Mapping

from aligner.core.errors import ExitCode
from aligner.core.findings import Finding
from aligner.core.result import PassedByExitCode, check_schema, typed
from aligner.dumping.determinism import DeterminismReport
from aligner.pipelines.audit import AuditReport
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.settings import SettingDiff
from aligner.pipelines.compare.verdict import Culprit
from aligner.pipelines.convert.checkpoint import ConvertResult
from aligner.pipelines.diff import UpdateReport
from aligner.pipelines.replay.result import ReplayResult
from aligner.pipelines.repro.run import ReproResult


class Stage(str, enum.Enum):
    """The stages, in the order they run (build always runs: every later stage needs the two models)."""

    BUILD = "build"
    AUDIT = "audit"
    WEIGHTS = "weights"
    DETERMINISM = "determinism"
    FORWARD = "forward"
    TRAIN = "train"
    REPRO = "repro"

    def __str__(self) -> str:
        return self.value


SELECTABLE = tuple(s for s in Stage if s is not Stage.BUILD)


class Status(str, enum.Enum):
    PASSED = "passed"      # ran, and what it checked agrees
    FAILED = "failed"      # ran, and found a difference (the evidence)
    SKIPPED = "skipped"    # did not run: see SkipReason
    ERROR = "error"        # bad input: one line, the run stops here (exit 2)

    def __str__(self) -> str:
        return self.value


class SkipReason(str, enum.Enum):
    NOT_SELECTED = "not_selected"        # --only / --skip
    EARLIER_ERROR = "earlier_error"      # a stage before it stopped the run
    NO_OPTIMIZER = "no_optimizer"        # train: a factory returned no optimizer
    NO_STEPS = "no_steps"                # train: --steps 0
    FORWARD_DIFFERS = "forward_differs"  # train: the forward already parts; step 1 cannot agree
    NOTHING_TO_REPRO = "nothing_to_repro"  # repro: no module was blamed
    NEEDS_FORWARD = "needs_forward"      # repro: its dumps come from the forward stage, which did not run
    REPRO_REFUSED = "repro_refused"      # repro: the blamed module cannot be packed (the outcome says why)

    def __str__(self) -> str:
        return self.value


class CulpritKind(str, enum.Enum):
    """What the verdict blames: compare's culprit kinds, or an optimizer term (training only)."""

    MODULE = "module"
    PARENT_CODE = "parent_code"
    OP = "op"
    MODEL_INPUT = "model_input"
    WIRING = "wiring"
    ARGUMENT = "argument"
    OPTIMIZER = "optimizer"
    NONDETERMINISM = "nondeterminism"

    @classmethod
    def of(cls, culprit: Culprit) -> "CulpritKind":
        return cls(culprit.value)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Sides:
    """What the two factories were, and what they returned (classes only: the models stay live in the pipeline)."""

    specs: tuple[str | None, str | None]       # (torch, MindSpore) factory specs; None for a callable without one
    classes: tuple[str, str]                   # model classes
    optimizers: tuple[str | None, str | None]  # optimizer classes
    schedulers: tuple[str | None, str | None]
    loss_fns: tuple[str | None, str | None]
    parameters: tuple[int, int]                # parameter counts (elements)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sides:
        specs, classes, optimizers, schedulers, loss_fns, parameters = (
            _pair(data[f.name]) for f in dataclasses.fields(cls))
        return cls(specs, classes, optimizers, schedulers, loss_fns, parameters)


@dataclasses.dataclass(frozen=True)
class WeightsOutcome:
    """The conversion of the torch weights into the MindSpore model's own names (`convert --like`)."""

    convert: ConvertResult
    torch_weights: Path       # what was converted: the torch model's own weights, or --weights
    ms_init: Path             # the MindSpore model's own fresh weights (the --like oracle)
    converted: Path           # loaded into the MindSpore model

    def to_dict(self) -> dict[str, Any]:
        return {"torch_weights": str(self.torch_weights), "ms_init": str(self.ms_init),
                "converted": str(self.converted), "convert": self.convert.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightsOutcome:
        return cls(ConvertResult.from_dict(data["convert"]), Path(data["torch_weights"]), Path(data["ms_init"]),
                   Path(data["converted"]))


@dataclasses.dataclass(frozen=True)
class DeterminismOutcome:
    """Randomness pinned, dropout off, and each side run twice on the same inputs."""

    seed: int
    pinned: dict[str, Any]
    dropout_off: tuple[tuple[str, ...], tuple[str, ...]]   # module paths switched off, (torch, MindSpore)
    reports: tuple[DeterminismReport, DeterminismReport]    # (torch, MindSpore)

    @property
    def deterministic(self) -> bool:
        return all(r.deterministic for r in self.reports)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "pinned": self.pinned, "deterministic": self.deterministic,
                "dropout_off": {"pytorch": list(self.dropout_off[0]), "mindspore": list(self.dropout_off[1])},
                "pytorch": self.reports[0].to_dict(), "mindspore": self.reports[1].to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeterminismOutcome:
        off = _sides(data["dropout_off"], lambda paths: tuple(typed(p, str, "module path") for p in paths))
        return cls(typed(data["seed"], int, "seed"), dict(typed(data["pinned"], dict, "pinned")), off,
                   _sides(data, DeterminismReport.from_dict))


@dataclasses.dataclass(frozen=True)
class ForwardOutcome:
    """Both sides dumped and compared; when they part, the op-level zoom-in and the replay of the blamed module."""

    dumps: tuple[Path, Path]                   # (torch, MindSpore)
    compare: CompareResult                     # compare(MindSpore, torch): torch is the reference
    zoom_dumps: tuple[Path, Path] | None = None
    zoom_scopes: tuple[str, str] | None = None  # (torch, MindSpore) module paths the zoom-in recorded ops of
    zoom: CompareResult | None = None
    zoom_error: str | None = None              # why no zoom-in was recorded
    replay: ReplayResult | None = None
    replay_modules: str | None = None          # the replay's `modules` regex (None: every module)
    replay_error: str | None = None            # why the replay could not run

    def to_dict(self) -> dict[str, Any]:
        return {"dumps": {"pytorch": str(self.dumps[0]), "mindspore": str(self.dumps[1])},
                "compare": self.compare.to_dict(),
                "zoom_dumps": None if self.zoom_dumps is None else
                {"pytorch": str(self.zoom_dumps[0]), "mindspore": str(self.zoom_dumps[1])},
                "zoom_scopes": None if self.zoom_scopes is None else
                {"pytorch": self.zoom_scopes[0], "mindspore": self.zoom_scopes[1]},
                "zoom": None if self.zoom is None else self.zoom.to_dict(), "zoom_error": self.zoom_error,
                "replay": None if self.replay is None else self.replay.to_dict(),
                "replay_modules": self.replay_modules, "replay_error": self.replay_error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ForwardOutcome:
        zoom_dumps, scopes, zoom, replay = data["zoom_dumps"], data["zoom_scopes"], data["zoom"], data["replay"]
        return cls(_sides(data["dumps"], Path), CompareResult.from_dict(data["compare"]),
                   None if zoom_dumps is None else _sides(zoom_dumps, Path),
                   None if scopes is None else _sides(scopes, lambda s: typed(s, str, "scope")),
                   None if zoom is None else CompareResult.from_dict(zoom), _text(data["zoom_error"]),
                   None if replay is None else ReplayResult.from_dict(replay), _text(data["replay_modules"]),
                   _text(data["replay_error"]))


@dataclasses.dataclass(frozen=True)
class TrainOutcome:
    """N training steps on both sides from the same weights and batch: losses, gradients, the update explained."""

    steps: int
    losses: tuple[tuple[float, ...], tuple[float, ...]]   # (torch, MindSpore), one per step
    first_loss_step: int | None                           # the first step (1-based) whose losses differ
    dumps: tuple[Path, Path]
    checkpoints: tuple[Path, Path]                        # weights after the last step
    compare: CompareResult
    update: UpdateReport | None = None
    update_error: str | None = None                       # why the update could not be explained

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "losses": {"pytorch": list(self.losses[0]), "mindspore": list(self.losses[1])},
                "first_loss_step": self.first_loss_step,
                "dumps": {"pytorch": str(self.dumps[0]), "mindspore": str(self.dumps[1])},
                "checkpoints": {"pytorch": str(self.checkpoints[0]), "mindspore": str(self.checkpoints[1])},
                "compare": self.compare.to_dict(), "update": None if self.update is None else self.update.to_dict(),
                "update_error": self.update_error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainOutcome:
        first, update = data["first_loss_step"], data["update"]
        return cls(typed(data["steps"], int, "steps"), _sides(data["losses"], lambda v: tuple(map(float, v))),
                   None if first is None else typed(first, int, "first_loss_step"), _sides(data["dumps"], Path),
                   _sides(data["checkpoints"], Path), CompareResult.from_dict(data["compare"]),
                   None if update is None else UpdateReport.from_dict(update), _text(data["update_error"]))


@dataclasses.dataclass(frozen=True)
class ReproOutcome:
    module: str
    repro: ReproResult | None = None
    refused: str | None = None                            # why repro could not pack the module

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "repro": None if self.repro is None else self.repro.to_dict(),
                "refused": self.refused}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReproOutcome:
        repro = data["repro"]
        return cls(typed(data["module"], str, "module"), None if repro is None else ReproResult.from_dict(repro),
                   _text(data["refused"]))


Outcome = AuditReport | WeightsOutcome | DeterminismOutcome | ForwardOutcome | TrainOutcome | ReproOutcome | Sides


@dataclasses.dataclass(frozen=True)
class StageRun:
    """One stage: its status, its outcome (the library call's result), how long it took, or why it did not run."""

    stage: Stage
    status: Status
    seconds: float = 0.0
    outcome: Outcome | None = None
    skipped: SkipReason | None = None
    error: str | None = None                              # the one-line cause (status ERROR)

    def __post_init__(self) -> None:
        # to the millisecond the saved result keeps: `align report` then prints the time `align doctor` printed
        # (0.1500004 s shows as 0.2 s, saved as 0.15 it would show as 0.1 s)
        object.__setattr__(self, "seconds", round(self.seconds, 3))

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage.value, "status": self.status.value, "seconds": self.seconds,
                "skipped": None if self.skipped is None else self.skipped.value, "error": self.error,
                "outcome": None if self.outcome is None else self.outcome.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageRun:
        stage, outcome, skipped = Stage(data["stage"]), data["outcome"], data["skipped"]
        return cls(stage, Status(data["status"]), float(data["seconds"]),
                   None if outcome is None else OUTCOMES[stage].from_dict(outcome),
                   None if skipped is None else SkipReason(skipped), _text(data["error"]))


@dataclasses.dataclass(frozen=True)
class Blame:
    """Where the two sides part and what is at fault: the verdict as data."""

    stage: Stage                                # the stage whose evidence names it
    kind: CulpritKind
    torch_path: str | None = None               # the module (reference path)
    ms_path: str | None = None
    op: str | None = None                       # the op of the zoom-in, when one diverged
    source: str | None = None                   # its file:line (reference side)
    source_ms: str | None = None
    settings: tuple[SettingDiff, ...] = ()      # the module's settings that differ (compare)
    audit: tuple[Any, ...] = ()                 # audit findings at that module (core.findings.Finding)
    terms: tuple[Any, ...] = ()                 # optimizer terms that differ (update_rule findings)
    replay: str | None = None                   # the replay verdict (ReplayVerdict value) for this module
    replay_blame: str | None = None             # the module replay blames

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage.value, "kind": self.kind.value, "torch_path": self.torch_path,
                "ms_path": self.ms_path, "op": self.op, "source": self.source, "source_ms": self.source_ms,
                "settings": [dataclasses.asdict(s) for s in self.settings],
                "audit": [f.to_dict() for f in self.audit], "terms": [f.to_dict() for f in self.terms],
                "replay": self.replay, "replay_blame": self.replay_blame}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Blame:
        return cls(Stage(data["stage"]), CulpritKind(data["kind"]), _text(data["torch_path"]),
                   _text(data["ms_path"]), _text(data["op"]), _text(data["source"]), _text(data["source_ms"]),
                   tuple(SettingDiff(**s) for s in data["settings"]),
                   tuple(Finding.from_dict(f) for f in data["audit"]),
                   tuple(Finding.from_dict(f) for f in data["terms"]),
                   _text(data["replay"]), _text(data["replay_blame"]))


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How the example inputs were given (for the commands that rerun a stage): a shape, a file, or in memory."""

    shape: tuple[int, ...] | None = None
    path: str | None = None
    names: tuple[str, ...] = ()                 # keyword inputs (an .npz's or a dict's keys)
    shapes: tuple[tuple[int, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputSpec:
        shape = data["shape"]
        return cls(None if shape is None else _shape(shape), _text(data["path"]),
                   tuple(typed(n, str, "input name") for n in data["names"]), tuple(map(_shape, data["shapes"])))


@dataclasses.dataclass(frozen=True)
class DoctorResult(PassedByExitCode):
    """The chain of stages and the verdict; `bool(result)` is `passed`, exit codes as every command."""

    out: Path
    stages: tuple[StageRun, ...]
    blame: Blame | None
    inputs: InputSpec
    specs: tuple[str | None, str | None]
    weights: str | None = None
    map_path: str | None = None
    seed: int = 0

    def stage(self, stage: Stage | str) -> StageRun | None:
        """The run of one stage (by Stage or its name)."""
        wanted = Stage(stage)
        return next((s for s in self.stages if s.stage is wanted), None)

    @property
    def error(self) -> StageRun | None:
        """The stage that stopped the run with bad input, if any."""
        return next((s for s in self.stages if s.status is Status.ERROR), None)

    @property
    def exit_code(self) -> ExitCode:
        """2 bad input (the stage that hit it is named); 1 a stage found a difference, or no stage compared anything;
        0 every stage that ran agrees."""
        if self.error is not None:
            return ExitCode.USAGE
        if any(s.status is Status.FAILED for s in self.stages):
            return ExitCode.FOUND
        ran = [s for s in self.stages if s.stage is not Stage.BUILD and s.status is Status.PASSED]
        return ExitCode.OK if ran else ExitCode.FOUND

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "exit_code": int(self.exit_code), "out": str(self.out),
                "specs": {"pytorch": self.specs[0], "mindspore": self.specs[1]}, "inputs": self.inputs.to_dict(),
                "weights": self.weights, "map": self.map_path, "seed": self.seed,
                "blame": None if self.blame is None else self.blame.to_dict(),
                "error": None if self.error is None else {"stage": self.error.stage.value, "cause": self.error.error},
                "stages": [s.to_dict() for s in self.stages]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DoctorResult:
        """The result `to_dict` gave, or `align doctor --json` wrote (its words ignored); ValueError, KeyError or
        TypeError for data that is not one."""
        data = check_schema(data, "doctor", SAVED_KEYS)
        blame, specs = data["blame"], data["specs"]
        return cls(Path(typed(data["out"], str, "out")), tuple(StageRun.from_dict(s) for s in data["stages"]),
                   None if blame is None else Blame.from_dict(blame), InputSpec.from_dict(data["inputs"]),
                   (_text(specs["pytorch"]), _text(specs["mindspore"])), _text(data["weights"]),
                   _text(data["map"]), typed(data["seed"], int, "seed"))


# the keys every saved doctor result holds (how `align report` tells one)
SAVED_KEYS = ("out", "specs", "inputs", "blame", "stages")
# what each stage's outcome is
OUTCOMES: dict[Stage, Any] = {Stage.BUILD: Sides, Stage.AUDIT: AuditReport, Stage.WEIGHTS: WeightsOutcome,
                              Stage.DETERMINISM: DeterminismOutcome, Stage.FORWARD: ForwardOutcome,
                              Stage.TRAIN: TrainOutcome, Stage.REPRO: ReproOutcome}


def _text(value: Any) -> str | None:
    return None if value is None else typed(value, str, "text")


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(typed(n, int, "dimension") for n in value)


def _pair(value: Any) -> Any:
    """A (torch, MindSpore) pair saved as a two-element list."""
    first, second = value
    return first, second


def _sides(data: Mapping[str, Any], read: Callable[[Any], Any]) -> Any:
    """(torch, MindSpore) read from a dict's "pytorch" and "mindspore" entries."""
    return read(data["pytorch"]), read(data["mindspore"])
