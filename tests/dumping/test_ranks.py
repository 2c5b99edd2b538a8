"""Multi-rank dumps, rank-by-rank compare and the multi-card checks, on real runs: torch.distributed on gloo (2 and 4
ranks, DistributedDataParallel) and MindSpore's mccl collectives launched by msrun (2 ranks), each training a tiny
MLP for 2 steps under aligner.dump(..., params=True) (tests/support/ranks_job.py; one launch per framework for the
module, ~8 s torch, ~25 s MindSpore, run side by side)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.dumping.ranks import Layout, _checked_groups
from aligner.dumping.read.source import load_tensor, read_source
from aligner.pipelines.check.ranks import check_ranks
from aligner.pipelines.compare import ranks as ranks_pipeline
from aligner.pipelines.compare.engine import LocalEngine
from aligner.pipelines.compare.ranks import RankStatus, compare_ranks
from tests.support.cli import align_in_process, assert_one_line_error
from tests.support.paths import SUPPORT

JOB = SUPPORT / "ranks_job.py"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], out: Path, env: dict[str, str], log: str) -> subprocess.Popen:
    """A launcher in a session of its own, so that a hung run is ended with every rank it started."""
    with open(out / log, "w") as fh:
        return subprocess.Popen(args, cwd=out, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, what: str, log: Path) -> None:
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{what} failed: " + log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT with every variant of tests/support/ranks_job.py (torch and MindSpore launched at once)."""
    out = tmp_path_factory.mktemp("ranks")
    # msrun starts `python` from PATH: this venv's first
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", GLOG_v="3",
               PYTHONWARNINGS="ignore")
    ms = _start([str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
                 "--join=True", f"--log_dir={out / 'logs'}", str(JOB), "mindspore", str(out)], out, env, "msrun.log")
    torch_run = _start([sys.executable, str(JOB), "torch", str(out)], out, env, "torch.log")
    try:
        _finish(torch_run, "the torch.distributed run", out / "torch.log")
    finally:
        worker_logs = out / "logs" / "worker_1.log"
        _finish(ms, "the msrun run", worker_logs if worker_logs.exists() else out / "msrun.log")
    return out


def _header(folder: Path) -> dict:
    with open(folder / "manifest.jsonl", encoding="utf-8") as fh:
        return json.loads(fh.readline())


def test_each_rank_writes_its_folder_with_the_layout_in_its_header(runs: Path) -> None:
    assert sorted(p.name for p in (runs / "torch_clean").iterdir()) == ["rank0", "rank1"]
    assert sorted(p.name for p in (runs / "torch4_nan").iterdir()) == ["rank0", "rank1", "rank2", "rank3"]
    head = _header(runs / "torch_clean" / "rank1")
    assert (head["rank"], head["world_size"], head["comm"]) == (1, 2, "torch.distributed:gloo")
    assert head["groups"] == {"world": [[0, 1]]}  # the inner module was dumped: no DDP process group to read
    head = _header(runs / "torch4_nan" / "rank2")  # the DDP wrapper was dumped, and a "tp" layout passed
    assert head["groups"] == {"world": [[0, 1, 2, 3]], "dp": [[0, 1, 2, 3]], "tp": [[0, 1], [2, 3]]}
    head = _header(runs / "ms_clean" / "rank1")
    assert (head["rank"], head["world_size"], head["comm"]) == (1, 2, "mindspore.communication:mccl")


def test_single_process_dump_keeps_its_layout(tmp_path: Path) -> None:
    import torch

    import aligner

    net = torch.nn.Linear(3, 2)
    with aligner.dump(net, tmp_path / "d"):
        net(torch.ones(1, 3)).sum().backward()
    head = _header(tmp_path / "d")
    assert {k: head[k] for k in ("rank", "world_size", "groups", "comm")} == dict.fromkeys(
        ("rank", "world_size", "groups", "comm"))
    assert {it.record.io for it in read_source(tmp_path / "d").items if it.record.kind == "param_grad"} == {"grad"}


def test_hooks_see_each_ranks_gradient_before_the_all_reduce(runs: Path) -> None:
    """Why the multi-card check reads 'reduced' records: DDP averages after the parameter hooks ran."""
    sides = [read_source(runs / "torch_clean" / f"rank{r}") for r in (0, 1)]
    grads = [{(it.record.step, it.record.module, it.record.io): it for it in s.items if it.record.kind == "param_grad"}
             for s in sides]
    assert len(grads[0]) == 16  # 4 parameters x 2 steps x (hook's "grad", .grad's "reduced")
    for key in (k for k in grads[0] if k[2] == "grad"):
        local = [load_tensor(g[key]) for g in grads]
        reduced = [load_tensor(g[(key[0], key[1], "reduced")]) for g in grads]
        assert not np.array_equal(local[0], local[1])  # each rank's own batch
        assert reduced[0].tobytes() == reduced[1].tobytes()  # every rank gets the same bits
        # DDP's float32 average of two float32 gradients: within an ulp or two of the float64 mean (rtol 1e-6
        # allows ~8 ulps; a sum without the division, or one rank's own gradient, is off by 50% or more)
        np.testing.assert_allclose(reduced[0], (local[0].astype(np.float64) + local[1]) / 2, rtol=1e-6, atol=1e-7)


def test_clean_torch_and_mindspore_runs_match_on_every_rank(runs: Path) -> None:
    result = compare_ranks(runs / "ms_clean", runs / "torch_clean")
    assert result.passed and int(result.exit_code) == 0 and result.world_size == 2
    assert [o.status for o in result.ranks] == [RankStatus.MATCH, RankStatus.MATCH]
    for outcome in result.ranks:
        assert outcome.result is not None
        reduced = [r for r in outcome.result.rows if r.pair.ref.record.io == "reduced" and r.pair.a is not None]
        assert len(reduced) == 8  # MindSpore's DistributedGradReducer output (save_grads) paired with DDP's .grad


def test_parallel_ranks_give_the_sequential_answer(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked per-rank processes against one after another in this process. These dumps are far below the size
    where forking pays (compare_ranks keeps them in one process), so the thresholds are lowered to fork them."""
    sequential = compare_ranks(runs / "torch_bug1", runs / "ms_clean", workers=2)
    assert sequential.processes == 1
    monkeypatch.setattr(ranks_pipeline, "_FORK_MIN_BYTES_PER_RECORD", 0)
    monkeypatch.setattr(ranks_pipeline, "_FORK_MIN_BYTES_PER_RANK", 0)
    parallel = compare_ranks(runs / "torch_bug1", runs / "ms_clean", workers=2)
    assert parallel.processes == 2
    assert [(o.status, o.first) for o in parallel.ranks] == [(o.status, o.first) for o in sequential.ranks]


def test_a_bug_on_rank_1_names_rank_1_first(runs: Path, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    result = compare_ranks(runs / "torch_bug1", runs / "ms_clean")
    assert result.first_divergent == [1]
    # rank 0 diverges too, later: its gradient after the all-reduce carries rank 1's share
    assert result.diverged == [1, 0]
    rank1, rank0 = result.ranks[1].result, result.ranks[0].result
    assert rank1 is not None and rank0 is not None
    first1 = min((rank1.rows[f.first].pair.ref.record for f in rank1.verdict.findings), key=lambda r: (r.step, r.seq))
    assert (first1.step, first1.module, first1.kind, first1.io) == (0, "act", "forward", "output")
    first0 = min((rank0.rows[f.first].pair.ref.record for f in rank0.verdict.findings), key=lambda r: (r.step, r.seq))
    assert (first0.step, first0.kind, first0.io) == (0, "param_grad", "reduced")
    proc = align_in_process(capsys, "compare", runs / "torch_bug1", runs / "ms_clean", "--json", tmp_path / "r.json")
    assert proc.returncode == 1, proc.stdout
    assert "Rank 1 diverges first (step 0, act (GELU) forward output)" in proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["first_divergent"], data["diverged"], data["exit_code"]) == ([1], [1, 0], 1)
    assert data["ranks"][1]["compare"]["findings"][0]["module"] == "act"


def test_a_missing_rank_folder_is_reported_and_the_others_compared(runs: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(runs / "torch_clean", tmp_path / "torch")
    shutil.rmtree(tmp_path / "torch" / "rank1")
    result = compare_ranks(runs / "ms_clean", tmp_path / "torch")
    assert [o.status for o in result.ranks] == [RankStatus.MATCH, RankStatus.MISSING]
    assert result.missing("second") == [1] and result.missing("first") == []
    proc = align_in_process(capsys, "compare", runs / "ms_clean", tmp_path / "torch")
    assert proc.returncode == 1, proc.stdout
    assert "No folder for rank(s) 1 in" in proc.stdout and "1 rank(s) match" in proc.stdout
    proc = align_in_process(capsys, "check", tmp_path / "torch")
    assert proc.returncode == 1 and "missing rank(s) 1" in proc.stdout


def test_mixed_world_sizes_are_one_line_and_exit_2(runs: Path, tmp_path: Path) -> None:
    from tests.support.cli import run_align

    assert_one_line_error(run_align("compare", runs / "torch4_nan", runs / "ms_clean"), "mixed world sizes",
                          "4 ranks", "by 2")
    # a folder left over from a 4-rank run inside a 2-rank dump: its header says 4
    shutil.copytree(runs / "torch_clean", tmp_path / "stale")
    shutil.copytree(runs / "torch4_nan" / "rank3", tmp_path / "stale" / "rank3")
    assert_one_line_error(run_align("compare", tmp_path / "stale", runs / "ms_clean"), "mixed world sizes")
    assert_one_line_error(run_align("check", tmp_path / "stale"), "mixed world sizes")
    # one side a single rank's folder
    assert_one_line_error(run_align("compare", runs / "ms_clean" / "rank0", runs / "torch_clean"),
                          "mixed world sizes", "rank0")


def test_seed_inconsistency_across_ranks_is_found(runs: Path) -> None:
    clean = check_ranks(runs / "ms_clean")
    assert clean.findings == [] and int(clean.exit_code) == 0
    assert {"rank-weights", "rank-grads", "rank-nonfinite"} <= set(clean.evaluation.checked)
    for name in ("ms_seed", "torch_stats_seed"):  # MindSpore broadcasts nothing; by-hand all-reduce, stats only
        report = check_ranks(runs / name)
        (found,) = report.findings
        assert (found.rule, found.step, int(report.exit_code)) == ("rank-weights", 0, 1)
        assert "rank 1 from rank 0" in found.message and "did not start from the same weights" in found.message
    # DistributedDataParallel broadcasts rank 0's weights at construction: the same planted seed bug is repaired;
    # and BatchNorm's running statistics, which each rank's own batch moved by step 1, are not taken for weights
    stats = [read_source(runs / "torch_ddpseed" / f"rank{r}").params[(1, "bn.running_mean")].record.file
             for r in (0, 1)]
    assert stats[0] != stats[1]
    assert check_ranks(runs / "torch_ddpseed").findings == []


def test_gradients_not_all_reduced_are_found(runs: Path) -> None:
    report = check_ranks(runs / "torch_nosync")
    assert [(f.rule, f.step) for f in report.findings] == [("rank-grads", 0), ("rank-weights", 1)]
    assert "drift apart at step 1" in report.findings[1].message


def test_nan_on_rank_2_names_the_earliest_rank_and_step(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = check_ranks(runs / "torch4_nan")
    assert report.dp_named and report.dp_groups == [[0, 1, 2, 3]]  # from DistributedDataParallel's process group
    (found,) = [f for f in report.findings if f.rule == "rank-nonfinite"]
    assert found.step == 1 and found.message.startswith("the first NaN/Inf over 4 ranks is on rank 2 at step 1")
    assert "then rank 0 at step 1 (the gradient after the all-reduce" in found.message
    proc = align_in_process(capsys, "check", runs / "torch4_nan", "--json", "-")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert [f["rule"] for f in data["findings"]] == ["rank-nonfinite"]
    assert data["ranks"]["2"]["findings"][0]["rule"] == "nonfinite"


def test_rank_mode_refuses_single_rank_outputs(runs: Path) -> None:
    from tests.support.cli import run_align

    assert_one_line_error(run_align("compare", runs / "ms_clean", runs / "torch_clean", "--html", "x.html"),
                          "--html", "rank0")
    assert_one_line_error(run_align("check", runs / "ms_clean", "--html", "x.html"), "--html")


def test_a_cluster_engine_gets_the_ranks(runs: Path) -> None:
    """compare_ranks hands its per-rank tasks to a given engine's map (as a Ray engine would get them)."""

    class Counting(LocalEngine):
        name = "counting"
        tasks = 0

        def map(self, fn, items, done=None):  # type: ignore[no-untyped-def]
            self.tasks += len(items)
            return super().map(fn, items, done)

    engine = Counting()
    result = compare_ranks(runs / "ms_clean", runs / "torch_clean", engine=engine)
    assert engine.tasks == 2 and result.passed and result.engine == "counting"


def test_groups_are_checked() -> None:
    assert _checked_groups({"dp": [[0, 2], [1, 3]], "tp": [1, 0]}, 1, 4) == {"dp": [[0, 2], [1, 3]], "tp": [[0, 1]]}
    for bad, needle in (({"dp": [[0, 1], [1, 2]]}, "twice"), ({"dp": [0, 5]}, "ranks 0..3"),
                        ({"dp": [2, 3]}, "leaves out"), ({"dp": "0,1"}, "list of ranks"), ([0, 1], "map names")):
        with pytest.raises(AlignerError, match=needle):
            _checked_groups(bad, 1, 4)  # type: ignore[arg-type]
    assert not Layout(0, 1).distributed and Layout(0, 2).distributed
