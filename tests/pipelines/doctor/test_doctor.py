"""`align doctor` / `aligner.doctor`: the whole migration check in one call.

Hand-made pairs (tests/support/doctor_pairs.py: the twin pre-norm block, clean or with one bug in the MindSpore port)
check each stage's evidence and the verdict; zoo pairs (tests/zoo/, code none of us wrote) check that the doctor names
the module the hand-run workflow names (`compare(ms_dump, pt_dump).verdict.findings[0].blame`, scored strictly by
tests/zoo/test_localization.py: every bug chosen here is a hit there, so its `Bug.expected` is what the hand-run
workflow names) for a dozen injected bugs, and exits 0 on each clean pair. Bad input: one line naming the stage, exit
2, the stages already finished kept on disk.

Run time on the shared 2-core machine (load average ~10 from other jobs): the whole file 35 tests in ~5 min; the
hand-made tests ~1.5 min (the docs quickstart's two CLI runs 30 s), the zoo cases (skipped without the zoo) ~3 min,
ResNet-50 (cnn) the slowest at 30-42 s per doctor run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")

import aligner
from aligner.pipelines.doctor import CulpritKind, SkipReason, Stage, Status
from aligner.render.doctor import verdict_lines
from aligner.render.words import say
from tests.support import doctor_pairs
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.paths import ROOT
from tests.support.quickstart import QUOTE, run_quickstart, section

PAIRS = Path(doctor_pairs.__file__)
SHAPE = ",".join(map(str, doctor_pairs.INPUT_SHAPE))


def spec(name: str) -> str:
    """FILE.py:CALLABLE, as a user gives a factory."""
    return f"{PAIRS}:{name}"


def example() -> Any:
    from tests.support import twin_models

    return twin_models.example_input("block")


def statuses(result: Any) -> dict[str, str]:
    return {s.stage.value: s.status.value for s in result.stages}


# -- hand-made pairs -------------------------------------------------------------------------------------------------

def test_clean_pair_passes_every_stage_and_keeps_each_stages_files(tmp_path: Path) -> None:
    out = tmp_path / "doc"
    result = aligner.doctor(spec("torch_block"), spec("ms_block"), example(), out=out)
    assert result.exit_code == 0 and result.passed and bool(result), verdict_lines(result)
    assert statuses(result) == {"build": "passed", "audit": "passed", "weights": "passed", "determinism": "passed",
                                "forward": "passed", "train": "passed", "repro": "skipped"}
    assert result.stage("repro").skipped is SkipReason.NOTHING_TO_REPRO
    train = result.stage("train").outcome
    assert train.steps == 3 and train.first_loss_step is None and train.update is not None
    assert train.losses[0] == pytest.approx(train.losses[1], rel=1e-6)  # float32: 3 steps of a 2k-parameter block
    assert train.losses[0][2] < train.losses[0][0]  # it trained (SGD on the mean square of the outputs)
    for rel in ("doctor.html", "doctor.json", "audit/audit.json", "weights/converted.ckpt", "weights/convert.json",
                "determinism/determinism.json", "forward/compare.html", "forward/pytorch/manifest.jsonl",
                "train/compare.html", "train/train.json"):
        assert (out / rel).is_file(), rel
    data = json.loads((out / "doctor.json").read_text())
    assert data["passed"] is True and data["exit_code"] == 0
    assert [s["stage"] for s in data["stages"]] == [s.value for s in Stage]
    weights = next(s for s in data["stages"] if s["stage"] == "weights")
    assert weights["command"].startswith("align convert ") and "--like" in weights["command"]
    page = (out / "doctor.html").read_text()
    assert page.index("PASSED") < page.index("Chain of evidence")  # the verdict first
    assert 'href="forward/compare.html"' in page and "align audit " in page


def test_gelu_default_named_with_its_setting_fix_replay_and_repro(tmp_path: Path) -> None:
    result = aligner.doctor(spec("torch_block"), spec("ms_gelu_tanh"), example(), out=tmp_path / "doc")
    assert result.exit_code == 1
    b = result.blame
    assert (b.stage, b.kind, b.torch_path, b.ms_path) == (Stage.FORWARD, CulpritKind.MODULE, "mlp.act", "mlp.act")
    assert [s.name for s in b.settings] == ["approximate"]
    assert [say(f.fix) for f in b.audit] == ["nn.GELU(..., approximate=False)"]
    assert b.op == "F.gelu" and "twin_models.py:" in b.source and "twin_models.py:" in b.source_ms  # the zoom-in
    assert (b.replay, b.replay_blame) == ("layer", "mlp.act")
    assert result.stage("train").skipped is SkipReason.FORWARD_DIFFERS
    lines = verdict_lines(result)
    assert lines[0].startswith("FAILED: the forward parts at 'mlp.act'")
    assert any(line.startswith("Fix: nn.GELU(..., approximate=False)") for line in lines)
    repro = result.stage("repro").outcome.repro
    done = subprocess.run([sys.executable, str(repro.directory / "repro.py")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # the two GELUs differ on torch's recorded inputs


def test_code_between_calls_named_with_its_op_and_source_line(tmp_path: Path) -> None:
    result = aligner.doctor(spec("torch_block_only"), spec("ms_glue_scale"), example(), out=tmp_path / "doc")
    b = result.blame
    assert result.exit_code == 1 and b.kind is CulpritKind.PARENT_CODE and b.torch_path == ""  # the model's forward
    assert b.op is not None and b.source is not None and "twin_models.py" in b.source, b
    assert b.source_ms is not None and "doctor_pairs.py" in b.source_ms  # the line with the extra 0.5
    assert (b.replay, b.replay_blame) == ("parent_code", "")
    assert result.stage("train").skipped is SkipReason.NO_OPTIMIZER


def test_optimizer_term_explained_when_the_forward_agrees(tmp_path: Path) -> None:
    result = aligner.doctor(spec("torch_block"), spec("ms_half_lr"), example(), out=tmp_path / "doc")
    assert statuses(result)["forward"] == "passed" and statuses(result)["train"] == "failed"
    train = result.stage("train").outcome
    assert train.first_loss_step == 2  # step 1 runs on equal weights; the update after it differs
    b = result.blame
    assert b.stage is Stage.TRAIN and b.kind is CulpritKind.OPTIMIZER and b.terms
    assert "learning rate 0.5x" in say(b.terms[0].message)
    audit = result.stage("audit").outcome  # the audit read it from the live optimizers too
    assert any(f.rule.startswith("optimizer-lr") for f in audit.findings)


def test_a_side_that_differs_from_itself_is_the_verdict(tmp_path: Path) -> None:
    result = aligner.doctor(spec("torch_block"), spec("ms_noisy"), example(), out=tmp_path / "doc")
    assert statuses(result)["determinism"] == "failed" and result.exit_code == 1
    det = result.stage("determinism").outcome
    assert det.reports[0].deterministic and not det.reports[1].deterministic
    assert det.reports[1].compared > 1  # rerun with every module's output recorded, to say where it starts
    b = result.blame
    assert b.kind is CulpritKind.NONDETERMINISM and b.torch_path is None and b.ms_path is not None
    assert verdict_lines(result)[0].startswith("FAILED: not deterministic: two runs on the same inputs differ on "
                                               "MindSpore (first: ")


def test_stage_selection(tmp_path: Path) -> None:
    result = aligner.doctor(spec("torch_block"), spec("ms_block"), example(), out=tmp_path / "a",
                            only="audit,weights")
    assert statuses(result) == {"build": "passed", "audit": "passed", "weights": "passed", "determinism": "skipped",
                                "forward": "skipped", "train": "skipped", "repro": "skipped"}
    assert result.stage("forward").skipped is SkipReason.NOT_SELECTED and result.exit_code == 0
    result = aligner.doctor(spec("torch_block"), spec("ms_block"), example(), out=tmp_path / "b",
                            skip=["audit", "train"], steps=0)
    assert statuses(result)["audit"] == "skipped" and statuses(result)["forward"] == "passed"


def test_docs_quickstart_runs_as_written(tmp_path: Path) -> None:
    """docs/doctor.md's quickstart in an empty directory: its file written, its commands run in order with the exit
    codes their `# exit N` comments give, every output its prose quotes found in what the command before printed
    (tests/support/quickstart.py, README's quickstart's runner; here the verdict's lines quoted whole count too)."""
    verdict = re.compile(r"`((?:FAILED|PASSED|Setting|Fix|Replay|Repro)[^`]*)`")
    ran, quoted = run_quickstart(section(ROOT / "docs" / "doctor.md"), tmp_path, (QUOTE, verdict))
    assert ran == 2 and quoted >= 6, (ran, quoted)


# -- the command line, bad input -------------------------------------------------------------------------------------

def doctor_cli(capsys: pytest.CaptureFixture[str], out: Path, a: str, b: str, *extra: str
               ) -> subprocess.CompletedProcess:
    return align_in_process(capsys, "doctor", spec(a), spec(b), "--input-shape", SHAPE, "-o", out, *extra)


def test_cli_json_on_stdout_holds_the_whole_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = doctor_cli(capsys, tmp_path / "doc", "torch_block", "ms_gelu_tanh", "--json", "-", "--skip", "repro")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["blame"]["torch_path"] == "mlp.act" and data["verdict"][0].startswith("FAILED")
    forward = next(s for s in data["stages"] if s["stage"] == "forward")
    assert forward["reports"] == ["forward/compare.html", "forward/compare.json", "forward/zoom.html",
                                  "forward/replay.json"]
    assert "align replay " in forward["command"] and "--weights" in forward["command"]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for line in forward["command"].splitlines():  # the commands the page shows rerun the stage by hand, as shown
        done = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, (line, done.stdout, done.stderr)  # each finds the GELU again
        assert "mlp.act" in done.stdout, (line, done.stdout)


@pytest.mark.parametrize("a,b,stage,needle", [
    ("torch_block", "raises", "build", "raised ValueError: config file missing"),
    ("torch_block", "not_a_model", "build", "returned dict, not a torch.nn.Module"),
    ("torch_block", "torch_block_only", "build", "both factories"),
    ("torch_wide", "ms_narrow", "weights", "parameter counts differ: torch 136 elements"),
])
def test_bad_factories_one_line_naming_the_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str], a: str,
                                                 b: str, stage: str, needle: str) -> None:
    out = tmp_path / "doc"
    proc = align_in_process(capsys, "doctor", spec(a), spec(b), "--input-shape", "2,16", "-o", out)
    assert_one_line_error(proc, f"doctor: stage {stage}: ", needle)
    data = json.loads((out / "doctor.json").read_text())  # what finished is kept, and says where it stopped
    assert data["error"]["stage"] == stage
    if stage == "weights":
        assert (out / "audit" / "audit.json").is_file()  # the audit finished before the weights stage stopped


def test_wrong_input_shape_named_at_the_first_stage_that_runs_the_models(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    proc = align_in_process(capsys, "doctor", spec("torch_block"), spec("ms_block"), "--input-shape", "2,4,17",
                            "-o", tmp_path / "a")
    assert_one_line_error(proc, "doctor: stage audit: ", "rejects the example input")
    proc = align_in_process(capsys, "doctor", spec("torch_block"), spec("ms_block"), "--input-shape", "2,4,17",
                            "-o", tmp_path / "b", "--skip", "audit")
    assert_one_line_error(proc, "doctor: stage determinism: ", "the pytorch model rejected the inputs ([2, 4, 17])")
    assert (tmp_path / "b" / "weights" / "converted.ckpt").is_file()


def test_usage_errors_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = doctor_cli(capsys, tmp_path / "a", "torch_block", "ms_block", "--only", "audit,forwrd")
    assert_one_line_error(proc, "--only 'forwrd': not a stage")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    proc = doctor_cli(capsys, tmp_path / "full", "torch_block", "ms_block")
    assert_one_line_error(proc, "not an empty directory")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    proc = align_in_process(capsys, "doctor", spec("torch_block"), spec("ms_block"), "--input-shape", SHAPE,
                            "--input", "x.npz", "-o", tmp_path / "b")
    assert_one_line_error(proc, "not both")
    proc = align_in_process(capsys, "doctor", spec("torch_block"), spec("ms_block"), "-o", tmp_path / "c")
    assert_one_line_error(proc, "the stages determinism, forward, train run the models: give example inputs")
    assert not (tmp_path / "c").exists()  # refused before anything ran
    proc = align_in_process(capsys, "doctor", spec("torch_block"), spec("ms_block"), "-o", tmp_path / "d",
                            "--only", "audit,weights")
    assert proc.returncode == 0, proc.stderr  # no inputs needed: the audit then checks what needs no input size


# -- zoo pairs: the same culprit as the hand-run workflow ---------------------------------------------------------

# a dozen catalogue bugs, each a strict hit of the hand-run workflow (tests/zoo/test_localization.py), across nine
# pair families and the culprit kinds: a module's own settings or code, parent code, wiring, module-level functions
ZOO_BUGS = ["cnn-conv-pad-same", "vit-glue-scale", "vit-attn-scale", "vit-gelu-tanh", "vit-layernorm-eps",
            "bert-missing-residual", "llama-softmax-axis", "siglip-mha-scale", "moe-top1", "qwen2-gate-up-swap",
            "t5-num-buckets", "swin-shift-size", "swin-mask-off"]
# the families whose bugs replay blames on the same module by hand (tests/zoo/test_replay_zoo.py); replay re-runs
# each module alone, so an MoE block's routing shows there as its expert's input (parent code of the expert)
REPLAYED = ("cnn", "vit", "encoder_lm", "decoder_lm", "mha", "upsample")
SETTING = {"vit-gelu-tanh": "approximate", "vit-layernorm-eps": "eps"}  # the module's setting that differs
ZOO_CLEAN = ["cnn", "vit", "encoder_lm", "decoder_lm", "mha", "moe_lm", "gqa_lm", "encdec", "swin"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Any]]:
    """family -> (pair, --map path or None), built once; the MindSpore side keeps its own random init (the doctor's
    weights stage converts the torch weights into it)."""
    import importlib

    from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)
    for name in ("timm", "mindcv", "transformers", "mindone.transformers"):
        pytest.importorskip(name)
    from tests.zoo import ms_compat

    ms_compat.install()
    work = tmp_path_factory.mktemp("zoo_maps")
    built: dict[str, Any] = {}

    def get(family: str) -> Any:
        if family not in built:
            pair = importlib.import_module(f"tests.zoo.{family}").build(seed=0)
            path = None
            if pair.user_map is not None:
                path = work / f"{family}.yaml"
                path.write_text(pair.user_map)
            built[family] = (pair, path)
        return built[family]
    yield get
    built.clear()
    ms_compat.uninstall()


def zoo_doctor(pair: Any, map_path: Path | None, out: Path) -> Any:
    return aligner.doctor(lambda: pair.torch_model, lambda: pair.ms_model, pair.torch_inputs, out=out,
                          map_path=None if map_path is None else str(map_path))


def test_every_culprit_compare_names_has_a_kind_and_words() -> None:
    """The doctor's verdict takes compare's culprit: a culprit compare gained (`argument`, a call's tensor argument
    passed on one side only) made the doctor raise "'argument' is not a valid CulpritKind" on swin-mask-off."""
    from aligner.pipelines.compare.verdict import Culprit
    from aligner.render.doctor import KIND_WORDS

    for culprit in Culprit:
        assert KIND_WORDS[CulpritKind.of(culprit)], culprit


@pytest.mark.parametrize("family", ZOO_CLEAN)
def test_zoo_clean_pair_exits_0(zoo: Callable[[str], Any], tmp_path: Path, family: str) -> None:
    pair, map_path = zoo(family)
    result = zoo_doctor(pair, map_path, tmp_path / "doc")
    assert result.exit_code == 0, verdict_lines(result) + [f"{s.stage}: {s.status}" for s in result.stages]
    assert {s.stage.value for s in result.stages if s.status is Status.PASSED} >= {"audit", "weights", "determinism",
                                                                                     "forward"}


@pytest.mark.parametrize("bug_id", ZOO_BUGS)
def test_zoo_bug_named_as_the_hand_run_workflow_names_it(zoo: Callable[[str], Any], tmp_path: Path,
                                                         bug_id: str) -> None:
    from tests.zoo import localization as loc

    bug = next(b for b in loc.CATALOGUE if b.id == bug_id)
    assert bug.now == "hit" and bug.variant is None and not bug.train
    pair, map_path = zoo(bug.family)
    restore = bug.inject(pair)
    try:
        result = zoo_doctor(pair, map_path, tmp_path / "doc")
    finally:
        restore()
    assert result.exit_code == 1, verdict_lines(result)
    b = result.blame
    assert b is not None and b.stage is Stage.FORWARD and b.torch_path == bug.expected, (b, bug.expected)
    forward = result.stage("forward").outcome
    if b.kind is CulpritKind.PARENT_CODE:  # code in a forward: the zoom-in names the op and its line
        assert b.op is not None and b.source is not None, forward.zoom_error
    if bug.id in SETTING:  # the setting, where the hand-run compare names one (its own settings rule)
        assert SETTING[bug.id] in [x.name for x in b.settings], b.settings
    if bug.family in REPLAYED and b.kind in (CulpritKind.MODULE, CulpritKind.PARENT_CODE):
        assert b.replay_blame == bug.expected, (b.replay, b.replay_blame)  # replay agrees, as by hand
