"""Checkpoint conversion as a library call: read -> plan names -> stream tensors into the output format.

`convert(...)` returns a `ConvertResult` (the plan, whether anything was written, the exit code); it prints nothing.
The summary it carries is the one Hugging Face prints when loading weights: missing, unexpected and mismatched-shape
keys, plus what was dropped, created or transformed on purpose, which fused tensors were split to fit `--like`, and
which layer types were guessed from names.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping

import numpy as np

from aligner.core.atomic import check_output
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Framework
from aligner.core.progress import SILENT, Progress, Task
from aligner.core.result import PassedByExitCode, typed
from aligner.core.words import words
from aligner.io import TensorSource, detect_format, open_checkpoint, write_checkpoint
from aligner.io.base import ArraySource
from aligner.mapping import Plan, build_plan, load_user_map
from aligner.mapping.detect import source_framework
from aligner.mapping.fused import FusedSplit
from aligner.mapping.plan import Entry, EntryStatus, Guess
from aligner.mapping.savemap import write_map
from aligner.pipelines.convert.says import Say

FORMAT_FRAMEWORK = {"pytorch": Framework.PYTORCH, "mindspore": Framework.MINDSPORE}  # output format -> names

@dataclasses.dataclass(frozen=True)
class ConvertResult(PassedByExitCode):
    """What `align convert` did: the plan, whether the output was written, and the keys grouped by what happened (a
    `Result`: `passed` when the output was written)."""

    source: str
    output: str
    plan: Plan
    written: bool
    like: str | None = None

    @property
    def exit_code(self) -> ExitCode:
        """FOUND when target keys stayed unfilled or mismatched and nothing was written."""
        return ExitCode.OK if self.written else ExitCode.FOUND

    # the plan's rows, failures and notes, so a result reads like the plan it wraps
    @property
    def entries(self) -> list[Entry]:
        return self.plan.entries

    @property
    def failures(self) -> list[Entry]:
        return self.plan.failures

    @property
    def notes(self) -> list[str]:
        return self.plan.notes

    def with_status(self, *statuses: EntryStatus) -> list[Entry]:
        return self.plan.with_status(*statuses)

    @property
    def splits(self) -> list[FusedSplit]:
        """Fused source tensors (qkv, gate_up) split into the --like target's separate tensors."""
        return self.plan.splits

    @property
    def guessed(self) -> list[Entry]:
        """Entries whose layer type was read from names and shapes that fit another layer type too."""
        return [e for e in self.plan.entries if e.guessed]

    def summary(self) -> dict[str, list[dict[str, Any]]]:
        """{group: [{name, sources, reason}]}: the failures first, then what was changed on purpose."""
        def rows(*statuses: EntryStatus) -> list[dict[str, Any]]:
            return [{"name": e.target or e.sources[0], "sources": list(e.sources), "reason": e.reason,
                     "shape": list(e.info.shape) if e.info else None} for e in self.with_status(*statuses)]

        return {"missing": rows(EntryStatus.MISSING), "unexpected": rows(EntryStatus.UNEXPECTED),
                "shape_mismatch": rows(EntryStatus.SHAPE_MISMATCH), "ambiguous": rows(EntryStatus.AMBIGUOUS),
                "dropped": rows(EntryStatus.DROPPED), "created": rows(EntryStatus.CREATED),
                "transformed": rows(EntryStatus.TRANSFORMED), "structural": rows(EntryStatus.STRUCTURAL)}

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "output": self.output, "like": self.like, "written": self.written,
                "src_framework": self.plan.src_framework, "dst_framework": self.plan.dst_framework,
                "tensors_written": len(self.plan.outputs) if self.written else 0,
                "counts": {str(k): v for k, v in self.plan.counts().items()}, **self.summary(),
                "splits": [s.to_dict() for s in self.plan.splits],
                "guesses": [g.to_dict() for g in self.plan.guesses],
                "by_position": [{"source": s, "target": t} for s, t in self.plan.by_position],
                "notes": list(self.plan.notes),
                "entries": [e.to_dict() for e in self.plan.entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConvertResult:
        """The result `to_dict` gave (as --json saved it), back: the plan whole, its tensors not (none were read)."""
        plan = Plan(typed(data["src_framework"], str, "src_framework"), typed(data["dst_framework"], str,
                                                                                "dst_framework"),
                    [Entry.from_dict(e) for e in data["entries"]], [str(n) for n in data["notes"]],
                    [Guess.from_dict(g) for g in data["guesses"]], [FusedSplit.from_dict(s) for s in data["splits"]],
                    [(str(p["source"]), str(p["target"])) for p in data["by_position"]])
        like = data["like"]
        return cls(typed(data["source"], str, "source"), typed(data["output"], str, "output"), plan,
                   typed(data["written"], bool, "written"), like if like is None else typed(like, str, "like"))


def plan_conversion(source: TensorSource, dst: str | None = None, src: str | None = None,
                    map_path: str | None = None, like: TensorSource | None = None) -> Plan:
    """Plan how `source` becomes a checkpoint in framework `dst` (default: the target's, else the other one)."""
    src = source_framework(source, src)
    if dst is None and like is not None:
        dst = source_framework(like)
    if src is None:
        if dst is None and like is None:
            raise AlignerError(f"{source.path}: cannot tell which framework's names it uses: pass --from")
        # neither side's convention shows (diff, convert --like): pair the names as they are
        src = dst = dst or Framework.PYTORCH
    if dst is None:
        dst = Framework.MINDSPORE if src == Framework.PYTORCH else Framework.PYTORCH
    user = load_user_map(map_path) if map_path else None
    reversed_note = None
    if user is not None and like is not None and user.hits(like.infos, source.infos) > user.hits(source.infos,
                                                                                                  like.infos):
        user = user.reversed(like.infos)
        reversed_note = words(Say.MAP_REVERSED, map=map_path, like=like.path, source=source.path)
    plan = build_plan(source.infos, src, dst, user, like.infos if like is not None else None, source.tied)
    if reversed_note is not None:
        plan.notes.append(reversed_note)
    if user and like is not None:
        unknown = sorted({t for ts in user.rename.values() for t in ts} - set(like.infos))
        if unknown:
            raise AlignerError(f"{map_path}: rename target(s) not in {like.path}: {', '.join(unknown[:5])}")
    plan.notes.extend(source.notes)
    return plan


def _counted(items: Iterator[tuple[str, np.ndarray]], task: Task) -> Iterator[tuple[str, np.ndarray]]:
    """The tensors to write, advancing the progress task as each one is handed to the writer."""
    for item in items:
        yield item
        task.advance()


def convert(src_path: str, out_path: str, *, like_path: str | None = None, map_path: str | None = None,
            to: str | None = None, src: str | None = None, force: bool = False, allow_incomplete: bool = False,
            trust_pickle: bool = False, save_map: str | None = None, progress: Progress = SILENT) -> "ConvertResult":
    """Convert a checkpoint file. Nothing is written when the plan has failures (missing, mismatched or ambiguous
    target keys) unless `allow_incomplete`; bad input raises AlignerError before anything is written."""
    out_fmt = detect_format(out_path, for_output=True)
    check_output(out_path, force)
    if save_map:
        check_output(save_map, force)
    with open_checkpoint(src_path, allow_pickle=trust_pickle) as source:
        like = open_checkpoint(like_path, allow_pickle=trust_pickle) if like_path else None
        try:
            dst = to or FORMAT_FRAMEWORK.get(out_fmt)
            if dst is None and like is None:  # safetensors output: keep the source's names unless told otherwise
                dst = source_framework(source, src)
            plan = plan_conversion(source, dst, src, map_path, like)
        finally:
            if like is not None:
                like.close()
        if plan.failures and not allow_incomplete:
            return ConvertResult(src_path, out_path, plan, written=False, like=like_path)
        if save_map:
            write_map(plan, save_map)
        with progress.task("converting", total=len(plan.outputs)) as task:
            write_checkpoint(out_path, out_fmt, _counted(plan.tensors(source), task), plan.output_infos(),
                             plan.dst_framework)
    return ConvertResult(src_path, out_path, plan, written=True, like=like_path)


def state_dict_to(framework: str, state: dict[str, np.ndarray], src: str) -> dict[str, np.ndarray]:
    """Convert an in-memory {name: array} state dict from framework `src`'s names to `framework`'s, with the same
    layer rules as `align convert` (no file involved: for scripts and tests); AlignerError if a key cannot be filled."""
    source = ArraySource("<memory>", src, state)
    plan = build_plan(source.infos, src, framework)
    if plan.failures:
        raise AlignerError("cannot convert: " + "; ".join(f"{e.target}: {e.reason}" for e in plan.failures))
    return dict(plan.tensors(source))
