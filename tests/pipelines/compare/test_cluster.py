"""`align compare --engine ray`: a real two-CPU Ray cluster computes the metrics, and every row, metric and verdict
equals the local run's; a cluster that is not there is a one-line error (exit 2), never a silent local run."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from aligner.pipelines.compare import distributed
from aligner.pipelines.compare.engine import Engine, open_engine
from aligner.pipelines.compare.run import compare
from aligner.render.compare import to_json
from tests.support.cli import align_in_process, assert_one_line_error, run_align

# Set when this module is collected, before any test imports Ray: Ray reads them once, at its first import in the
# process (a test of this module that imports Ray without the cluster fixture, run first in a shuffled order, would
# otherwise fix the driver's auth mode to "disabled" while the cluster the fixture starts wants a token). The first
# keeps a new cluster (and the processes that join it, which inherit this environment) on the loopback interface
# instead of this machine's outward address; the second is what Ray sets for a local cluster: joiners send the token.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "token"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Engine, str]]:
    """A throwaway local Ray cluster of 2 CPUs started through `--address local`'s code path, and its address."""
    engine = open_engine("ray", "local", workers=2)
    try:
        import ray

        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:"), address
        assert engine.workers == 2
        yield engine, address
    finally:
        engine.close()


def _plain_pair(root: Path) -> None:
    """16 pairs of small tensors: the second half diverges, one holds a NaN, one file is truncated."""
    rng = np.random.default_rng(0)
    for side in "ab":
        (root / side).mkdir(parents=True)
    for i in range(16):
        ref = rng.standard_normal(4096, dtype=np.float32)
        other = ref.copy()
        if i >= 8:
            other[i * 100] += 0.5
        if i == 11:
            other[3] = np.nan
        np.save(root / "a" / f"{i:03d}_layer{i}.npy", other)
        np.save(root / "b" / f"{i:03d}_layer{i}.npy", ref)
    (root / "a" / "013_layer13.npy").write_bytes(b"\x93NUMPY truncated")


def _report(result: Any) -> dict[str, Any]:
    return json.loads(json.dumps(to_json(result)))


def test_plain_dirs_give_the_local_rows(cluster: tuple[Engine, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine, _ = cluster
    _plain_pair(tmp_path)
    # relative paths from another working directory than the workers': the tasks must carry absolute ones
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(distributed, "MIN_TASK_ELEMENTS", 1)  # small tensors, yet several tasks: order must hold
    pairs = compare("a", "b").rows
    assert len(distributed.batches([r.pair for r in pairs], engine.workers)) == 8  # 2 workers x TASKS_PER_WORKER
    local, remote = _report(compare("a", "b")), _report(compare("a", "b", engine=engine))
    assert remote == local
    statuses = [r["status"] for r in local["rows"]]
    assert statuses == ["ok"] * 8 + ["diverged"] * 5 + ["error"] + ["diverged"] * 2
    assert local["rows"][11]["nan_a"] == 1 and local["rows"][8]["label"] == "introduced"


def test_twin_dumps_give_the_local_verdict(cluster: tuple[Engine, str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    ms = pytest.importorskip("mindspore")
    import aligner
    from tests.support.twin_models import example_input, make_twins

    engine, _ = cluster
    monkeypatch.chdir(tmp_path)  # MindSpore may write rank_0/ into the working directory
    tnet, mnet = make_twins("block")
    tnet.mlp.act.approximate = "tanh"  # the injected bug: tanh-approximated GELU on the PyTorch side
    x = example_input("block")
    with aligner.dump(tnet, tmp_path / "pt", inputs=True, leaves_only=False):
        tnet(torch.from_numpy(x)).square().mean().backward()
    with aligner.dump(mnet, tmp_path / "ms", inputs=True, leaves_only=False):
        ms.value_and_grad(lambda t: mnet(t).square().mean(), None, mnet.trainable_params())(ms.Tensor(x))
    monkeypatch.setattr(distributed, "MIN_TASK_ELEMENTS", 1)
    local = _report(compare(str(tmp_path / "ms"), str(tmp_path / "pt")))
    remote = _report(compare(str(tmp_path / "ms"), str(tmp_path / "pt"), engine=engine))
    assert remote == local
    first = local["findings"][0]
    assert local["exit_code"] == 1 and first["origin_module"] == "mlp.act" and first["module"] == "mlp.act"
    assert sum(r["status"] == "ok" for r in local["rows"]) > 10  # the rows before the bug were compared too


def test_calibration_on_the_cluster_gives_the_local_tolerances(cluster: tuple[Engine, str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--calibrate's float64 noise is measured by the cluster's workers too: the same noise, tolerances and report as
    measured here."""
    torch = pytest.importorskip("torch")
    ms = pytest.importorskip("mindspore")
    import aligner
    from tests.support.twin_models import example_input, make_twins

    engine, _ = cluster
    monkeypatch.chdir(tmp_path)  # MindSpore may write rank_0/ into the working directory
    tnet, mnet = make_twins("block")
    x = example_input("block")
    with aligner.dump(tnet, tmp_path / "pt"):
        tnet(torch.from_numpy(x)).square().mean().backward()
    with aligner.dump(mnet, tmp_path / "ms"):
        ms.value_and_grad(lambda t: mnet(t).square().mean(), None, mnet.trainable_params())(ms.Tensor(x))
    aligner.noise_floor(tnet, torch.from_numpy(x), tmp_path / "f64", loss_fn=lambda out: out.square().mean())
    monkeypatch.setattr(distributed, "MIN_TASK_ELEMENTS", 1)  # several tasks, so their order must hold
    tasks: list[tuple[object, int]] = []  # what the engine was handed: the function and the number of tasks
    handed = engine.map
    monkeypatch.setattr(engine, "map", lambda fn, items, done=None: (tasks.append((fn, len(items))),
                                                                    handed(fn, items, done))[1])
    calibrate = str(tmp_path / "f64")
    local = compare(str(tmp_path / "ms"), str(tmp_path / "pt"), calibrate=calibrate)
    remote = compare(str(tmp_path / "ms"), str(tmp_path / "pt"), calibrate=calibrate, engine=engine)
    assert _report(remote) == _report(local)
    assert [r.noise for r in remote.rows] == [r.noise for r in local.rows]
    assert sum(r.noise is not None for r in local.rows) > 10
    assert any(fn is distributed.measure_batch and n > 1 for fn, n in tasks)  # the noise went out as tasks


def test_cli_joins_a_running_cluster(cluster: tuple[Engine, str], tmp_path: Path) -> None:
    _, address = cluster  # another process (as verl's driver would be) joins it by address
    _plain_pair(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    here = run_align("compare", a, b, "--json", tmp_path / "local.json")
    there = run_align("compare", a, b, "--engine", "ray", "--address", address, "--json", tmp_path / "ray.json")
    assert here.returncode == there.returncode == 1, there.stderr
    assert "Traceback" not in there.stderr
    local, remote = (json.loads((tmp_path / f).read_text()) for f in ("local.json", "ray.json"))
    assert remote == local


def test_bisect_with_a_cluster_is_refused(cluster: tuple[Engine, str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _plain_pair(tmp_path)
    # no --address: this process is connected already (the fixture), so the CLI uses that cluster
    proc = align_in_process(capsys, "compare", tmp_path / "a", tmp_path / "b", "--engine", "ray", "--bisect")
    assert_one_line_error(proc, "--bisect", "--engine ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_cluster_at_the_address_is_one_line(tmp_path: Path) -> None:
    _plain_pair(tmp_path)
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there: the connection is refused
    proc = run_align("compare", tmp_path / "a", tmp_path / "b", "--engine", "ray", "--address", address,
                     "--json", tmp_path / "out.json")
    assert_one_line_error(proc, address, "no Ray cluster reachable")
    assert not (tmp_path / "out.json").exists()


def test_a_port_that_is_no_ray_head_gives_up_in_bounded_time(tmp_path: Path) -> None:
    # a listener that completes TCP handshakes but never speaks: ray.init alone would retry for minutes, its C++ core
    # writing a warning to stderr every 5 s (held back: the failure is one line); 7 s lets the first one come
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        script = ("import sys\nfrom aligner.core.errors import AlignerError\n"
                  "from aligner.pipelines.compare import engine\nengine.CONNECT_TIMEOUT = 7\n"
                  f"try:\n    engine.open_engine('ray', {address!r})\n"
                  "except AlignerError as exc:\n    print(exc)\n    sys.exit(2)\n")
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout.strip() == f"could not join the Ray cluster at {address}: no answer within 7 s (is it a Ray " \
                                  f"head node's address?)"
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (("--engine", "dask"), "--engine dask: unknown engine"),
    (("--address", "127.0.0.1:6379"), "only for --engine ray"),
    (("--engine", "ray", "--address", "127.0.0.1:6379", "--workers", "2"), "--workers"),
])
def test_bad_engine_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                         needle: str) -> None:
    _plain_pair(tmp_path)
    proc = align_in_process(capsys, "compare", tmp_path / "a", tmp_path / "b", *args)
    assert_one_line_error(proc, needle)
