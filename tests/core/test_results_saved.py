"""The result contract (aligner.core.result, issue 29 item 3) for the results tests/core/test_results.py does not build:
`align check` (one dump, rank by rank), `align replay`, `align convert` (with --optimizer) and `align diff --grads`.
Each is a real result of real torch and MindSpore runs; its saved JSON read back with from_dict and written again is
the same text, and `align report` shows the saved check and replay again as the command printed them."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import ExitCode
from aligner.core.result import PassedByExitCode, Result
from aligner.pipelines.check import check
from aligner.pipelines.check.ranks import RankedCheckReport, check_ranks
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.convert import TrainingConvertResult, convert_training_state
from aligner.pipelines.convert.checkpoint import ConvertResult, convert
from aligner.pipelines.diff import DiffUpdates, UpdateReport, diff_checkpoints, explain_updates
from aligner.pipelines.replay.result import ReplayResult, ReplayVerdict
from aligner.pipelines.replay.run import replay_dumps
from aligner.render.check import write_check_json
from aligner.render.check_ranks import write_check_ranks_json
from aligner.render.jsonout import dumps as dumps_json
from tests.pipelines.check.test_check import SYMPTOMS, Case, train_ms, train_torch
from tests.pipelines.diff import test_update_rule as update_rule_runs
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.paths import ROOT
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


def _scale(cell: Any, name: str, factor: float) -> None:
    param = dict(cell.parameters_and_names())[name]
    param.set_data(ms.Tensor(param.asnumpy() * np.float32(factor)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Trained MLPs dumped with params=True (tests/pipelines/check/test_check.py's): torch clean, torch whose gradients
    explode to Inf at step 2, MindSpore clean; two- and three-rank dumps made of the clean torch one (rank 1 missing
    from the second); the cnn twins dumped with conv2 1.001x wrong on the MindSpore side, the factory and weights for
    replay."""
    root = tmp_path_factory.mktemp("saved")
    out = {"pt": train_torch(Case(), root / "pt"), "pt_explode": train_torch(SYMPTOMS["exploding"][0], root / "ex"),
           "ms": train_ms(Case(), root / "ms")}
    for name, ranks in (("ranks", (0, 1)), ("ranks_gap", (0, 2))):
        for rank in ranks:
            shutil.copytree(out["pt"], root / name / f"rank{rank}")
        out[name] = root / name
    tnet, mnet = make_twins("cnn", train=False)
    _scale(mnet, "conv2.weight", 1.001)
    x = example_input("cnn")
    with aligner.dump(tnet, root / "twin_pt", backward=False), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, root / "twin_ms", backward=False):
        mnet(ms.Tensor(x))
    shutil.copytree(root / "twin_pt", root / "twin_pt_damaged")
    with open(root / "twin_pt_damaged" / "manifest.jsonl", "a", encoding="utf-8") as fh:
        fh.write("{not a record\n")
    ms.save_checkpoint(mnet, str(root / "ms.ckpt"))
    (root / "factory.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.support.twin_models import mindspore_model\n\n"
        "def make():\n    m = mindspore_model('cnn')\n    m.set_train(False)\n    return m\n", encoding="utf-8")
    out |= {"twin_pt": root / "twin_pt", "twin_ms": root / "twin_ms", "twin_pt_damaged": root / "twin_pt_damaged",
            "factory": root / "factory.py", "weights": root / "ms.ckpt"}
    return out


def _replay_args(runs: dict[str, Path], reference: str, *more: str) -> list[object]:
    return ["replay", runs[reference], runs["twin_ms"], "--factory", f"{runs['factory']}:make", "--weights",
            runs["weights"], *more]


# case -> (align arguments, its exit code); the dumps as `runs` names them
CLI = {
    "check, clean": (("check", "pt"), ExitCode.OK),
    "check, exploding": (("check", "pt_explode"), ExitCode.FOUND),
    "check, mindspore": (("check", "ms"), ExitCode.OK),
    "check, two ranks": (("check", "ranks"), ExitCode.OK),
    "check, rank 1 missing": (("check", "ranks_gap"), ExitCode.FOUND),
    "replay, conv2 wrong": (("replay", "twin_pt"), ExitCode.FOUND),
    "replay, conv1 and bn1": (("replay", "twin_pt", "--modules", "^(conv1|bn1)$"), ExitCode.OK),
    "replay, damaged manifest": (("replay", "twin_pt_damaged", "--modules", "^(conv1|bn1)$"), ExitCode.USAGE),
}


def _argv(runs: dict[str, Path], args: tuple[str, ...]) -> list[object]:
    if args[0] == "replay":
        return _replay_args(runs, args[1], *args[2:])
    return [args[0], runs[args[1]]]


@pytest.fixture(scope="module")
def results(runs: dict[str, Path], update_runs: dict[str, Any]) -> dict[str, tuple[Any, ExitCode]]:
    """The library's results of the same runs, each with the exit code it must give."""
    built = {}
    for case, (args, code) in CLI.items():
        if args[0] == "check":
            path = runs[args[1]]
            built[case] = (check_ranks(path) if (path / "rank0").is_dir() else check(path), code)
    mnet = make_twins("cnn", train=False)[1]
    ms.load_param_into_net(mnet, ms.load_checkpoint(str(runs["weights"])))
    built["replay, conv2 wrong"] = (replay_dumps(runs["twin_pt"], runs["twin_ms"], mnet), ExitCode.FOUND)
    built["replay, damaged manifest"] = (replay_dumps(runs["twin_pt_damaged"], runs["twin_ms"], mnet,
                                                      modules="^(conv1|bn1)$"), ExitCode.USAGE)
    return built | _conversions(runs["pt"].parent.parent / "convert") | _updates(update_runs)


@pytest.fixture(scope="module")
def update_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/pipelines/diff/test_update_rule.py's runs (final and initial checkpoints, gradient dumps): SGD momentum in
    both frameworks, and MindSpore's clipped at every step."""
    root = tmp_path_factory.mktemp("update")
    made = {}
    for name in ("ms_momentum", "ms_momentum_clip", "pt_momentum"):
        framework, make_opt, options = update_rule_runs.PAIR_RUNS[name]
        train = update_rule_runs.train_torch if framework == "pt" else update_rule_runs.train_ms
        made[name] = train(root / name, make_opt, **options)
    return made


def _diff_args(run_a: Any, run_b: Any) -> list[object]:
    """align diff A B --init A0 --init-b B0 --grads DA DB."""
    return ["diff", run_a.final, run_b.final, "--init", run_a.init, "--init-b", run_b.init, "--grads", run_a.grads,
            run_b.grads]


def _updates(made: dict[str, Any]) -> dict[str, tuple[Any, ExitCode]]:
    """align diff --grads's update-rule reports: the same rule on both sides, and one side clipped at every step
    against the other unclipped (a clipping finding); the second also with the checkpoint diff beside it."""
    def explain(a: str, b: str) -> Any:
        ra, rb = made[a], made[b]
        return explain_updates(str(ra.final), str(rb.final), str(ra.grads), str(rb.grads), init_a=str(ra.init),
                               init_b=str(rb.init))

    clipped = explain("ms_momentum_clip", "pt_momentum")
    ra, rb = made["ms_momentum_clip"], made["pt_momentum"]
    diff = diff_checkpoints(str(ra.final), str(rb.final), init_path=str(ra.init))
    return {"update rule, same": (explain("ms_momentum", "pt_momentum"), ExitCode.OK),
            "update rule, clipped": (clipped, ExitCode.FOUND),
            "diff --grads, clipped": (DiffUpdates(diff, clipped), ExitCode.FOUND)}


def _conversions(root: Path) -> dict[str, tuple[Any, ExitCode]]:
    """align convert of a Conv1d/BatchNorm/Linear model (the Conv1d weight gains an axis: an op in the plan), the
    same with a --like target one key longer (nothing written), and its training state (Adam) to MindSpore nn.Adam
    (legacy: its notes) and to mint Adam."""
    root.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3, 3)).pow(2).mean().backward()
        opt.step()
    torch.save(model.state_dict(), root / "m.pth")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 2}, root / "train.pth")
    convert(str(root / "m.pth"), str(root / "m.ckpt"))
    like = dict(ms.load_checkpoint(str(root / "m.ckpt")))
    extra = [{"name": "extra.weight", "data": ms.Tensor(np.zeros(3, np.float32))}]
    ms.save_checkpoint([{"name": n, "data": v} for n, v in like.items()] + extra, str(root / "like.ckpt"))
    return {
        "convert": (convert(str(root / "m.pth"), str(root / "a.ckpt")), ExitCode.OK),
        "convert, --like one key longer": (convert(str(root / "m.pth"), str(root / "b.ckpt"),
                                                   like_path=str(root / "like.ckpt")), ExitCode.FOUND),
        "convert --optimizer ms:Adam": (convert_training_state(str(root / "train.pth"), str(root / "t.ckpt"),
                                                               optimizer="ms:Adam"), ExitCode.OK),
        "convert --optimizer mint:Adam": (convert_training_state(str(root / "train.pth"), str(root / "u.ckpt"),
                                                                 optimizer="mint:Adam"), ExitCode.OK),
    }


def _saved(result: Any) -> str:
    """The text `--json` writes for this result."""
    if isinstance(result, (CheckReport, RankedCheckReport)):
        buf = io.StringIO()
        (write_check_ranks_json if isinstance(result, RankedCheckReport) else write_check_json)(result, buf)
        return buf.getvalue()
    return dumps_json(result.to_dict()) + "\n"


def test_results_keep_the_contract_and_read_back_byte_for_byte(results) -> None:
    """exit_code is the one each case must give, passed and bool say the same, every result is frozen and a
    `Result`; its saved JSON read back and written again is the same text."""
    for case, (result, code) in results.items():
        assert result.exit_code is code, case
        assert result.passed is (code is ExitCode.OK) and bool(result) is result.passed, case
        assert type(result).__dataclass_params__.frozen and isinstance(result, Result), case
        text = _saved(result)
        again = type(result).from_dict(json.loads(text))
        assert _saved(again) == text and again.exit_code is code, case
    explode = results["check, exploding"][0]
    assert any(f.rule == "nonfinite" for f in explode.errors)  # the Inf gradient norms read back as "inf"
    assert any(not np.isfinite(v) for s in explode.evaluation.grad_norms.values() for v in s.values())
    assert results["check, rank 1 missing"][0].missing == [1]
    wrong = results["replay, conv2 wrong"][0]
    assert wrong.verdict is ReplayVerdict.LAYER and wrong.blame == "conv2"
    damaged = results["replay, damaged manifest"][0]
    assert damaged.verdict is ReplayVerdict.MATCH and damaged.problems  # agreeing, but not all read: not passed
    assert any(e.ops for e in results["convert"][0].entries)  # the Conv1d weight's unsqueeze reads back
    assert [e.target for e in results["convert, --like one key longer"][0].failures] == ["extra.weight"]
    clipped = results["update rule, clipped"][0]
    assert [f.rule for f in clipped.differences] == ["grad-clipping"] and clipped.a.clipping.assumed
    legacy = results["convert --optimizer ms:Adam"][0].optimizer
    assert legacy.exactness.value == "legacy" and legacy.hyper.betas is not None and legacy.notes


def test_report_shows_a_saved_diff_with_its_update_rule_as_diff_did(update_runs, tmp_path, capsys) -> None:
    """align diff --grads's table, rules and findings, printed again from its JSON, with its exit code."""
    saved = tmp_path / "d.json"
    ran = align_in_process(capsys, *_diff_args(update_runs["ms_momentum_clip"], update_runs["pt_momentum"]),
                           "--json", saved)
    shown = align_in_process(capsys, "report", saved)
    assert ran.returncode == shown.returncode == 1, (ran.stderr, shown.stderr)
    assert shown.stdout == ran.stdout, (shown.stdout, ran.stdout)
    assert "does not clip" in shown.stdout


@pytest.mark.parametrize("case", list(CLI))
def test_report_shows_a_saved_check_or_replay_as_the_command_did(runs, tmp_path, capsys, case) -> None:
    """`align report r.json` prints what `align check|replay ... --json r.json` printed, with its exit code and, for
    an incomplete replay, the same one-line error."""
    args, code = CLI[case]
    saved = tmp_path / "r.json"
    ran = align_in_process(capsys, *_argv(runs, args), "--json", saved)
    shown = align_in_process(capsys, "report", saved)
    assert ran.returncode == shown.returncode == int(code), (ran.stderr, shown.stderr)
    assert shown.stdout == ran.stdout and shown.stdout.strip() and shown.stderr == ran.stderr


def test_report_writes_a_saved_check_page(runs, tmp_path, capsys) -> None:
    """The one-dump check's page from its saved JSON is the page align check wrote; rank by rank has none."""
    saved, page, again = tmp_path / "c.json", tmp_path / "c.html", tmp_path / "again.html"
    ran = align_in_process(capsys, "check", runs["pt_explode"], "--json", saved, "--html", page)
    shown = align_in_process(capsys, "report", saved, "--html", again)
    assert ran.returncode == shown.returncode == 1 and again.read_bytes() == page.read_bytes()
    align_in_process(capsys, "check", runs["ranks"], "--json", saved, "--force")
    assert_one_line_error(align_in_process(capsys, "report", saved, "--html", tmp_path / "r.html"), "--html")


def test_damaged_saved_check_is_one_line(results, tmp_path, capsys) -> None:
    data = json.loads(_saved(results["check, exploding"][0]))
    data["series"]["loss"] = {"zero": 1.0}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert_one_line_error(align_in_process(capsys, "report", path), "c.json", "damaged saved check")


def test_results_without_a_passed_of_their_own_take_it_from_the_exit_code() -> None:
    """The mixin is the one place `passed` and bool come from the exit code."""
    for cls in (CheckReport, RankedCheckReport, ReplayResult, ConvertResult, TrainingConvertResult, UpdateReport,
                DiffUpdates):
        assert issubclass(cls, PassedByExitCode), cls
        assert "passed" not in vars(cls) and "__bool__" not in vars(cls), cls



def test_no_result_spells_out_passed_from_its_exit_code_again() -> None:
    """Every `passed` under pipelines/ that is only "exit code 0" comes from the mixin; the ones left mean more."""
    import ast

    own = {}
    for path in (ROOT / "aligner" / "pipelines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "passed":
                returned = [ast.unparse(n.value) for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
                own[f"{path.name}:{node.lineno}"] = returned
    assert own and all(r not in (["self.exit_code is ExitCode.OK"], ["self.exit_code == ExitCode.OK"])
                       for r in own.values()), own
