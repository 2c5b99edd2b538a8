"""Other tools' dumps given to `align compare`: msprobe folders and MindSpore's native (GRAPH_MODE / @jit) dump,
against aligner's own dumps of the twin models (tests/support/twin_models.py, identical weights).

msprobe dumps are real ones, made once by msprobe 26.2.0 (tests/data/msprobe/make_fixtures.py says how and what was
changed); MindSpore native dumps are made here by a real GRAPH_MODE / @jit run in a subprocess (MindSpore reads
MINDSPORE_DUMP_CONFIG at its first graph). The native `statistic.csv`, which MindSpore 2.10 refuses to write on CPU,
is built from its documented columns.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

import aligner  # noqa: E402
from aligner.core.errors import AlignerError  # noqa: E402
from aligner.dumping.read.source import load_tensor, read_source  # noqa: E402
from aligner.pipelines.compare.run import compare  # noqa: E402
from aligner.render.compare import to_json  # noqa: E402
from tests.support import paths  # noqa: E402
from tests.support.cli import assert_one_line_error, run_align  # noqa: E402
from tests.support.twin_models import example_input, make_twins  # noqa: E402

DATA = paths.DATA / "msprobe"
SECRET = np.array([1234.5, 6789.25, 31337.0, 4242.125], np.float32)  # values that must never reach a report


def _torch_dump(tmp: Path, kind: str, tweak: Callable[[Any], None] | None = None, *, train: bool = True,
                backward: bool = True, stats_only: bool = False) -> Path:
    """aligner's dump of the torch twin: one forward (and backward of out.square().mean()), as the fixtures ran."""
    tnet, _ = make_twins(kind, train=train)
    if tweak:
        with torch.no_grad():
            tweak(tnet)
    out = tmp / f"pt_{kind}"
    with aligner.dump(tnet, out, stats_only=stats_only):
        y = tnet(torch.from_numpy(example_input(kind)))
        if backward:
            y.square().mean().backward()
    return out


def _result(a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    result = compare(str(a), str(b))
    return int(result.exit_code), json.loads(json.dumps(to_json(result)))


def _origins(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["phase"], f["origin_module"]) for f in result["findings"]]


def _copy(name: str, tmp: Path) -> Path:
    """A writable copy of a fixture's rank folder."""
    out = tmp / name
    shutil.copytree(DATA / name / "step0" / "rank0", out)
    return out


# --- msprobe -------------------------------------------------------------------------------------------------------

def test_msprobe_mindspore_tensor_dump_pairs_with_aligner_torch_dump(tmp_path: Path) -> None:
    code, result = _result(DATA / "ms_L0_tensor", _torch_dump(tmp_path, "block"))
    assert code == 0, result["summary"]
    assert result["findings"] == [] and result["manifest_problems"] == []
    assert result["counts"]["name"] >= 59  # every module's forward, backward and parameter gradient, by name
    compared = [r for r in result["rows"] if r["status"] == "ok"]
    assert {r["method"] for r in compared} == {"elements"}  # the .npy files, element by element
    assert {r["kind"] for r in compared} == {"forward", "backward", "param_grad"}
    assert result["reference"].endswith("(pytorch)")  # the framework msprobe wrote in dump.json decides the side


@pytest.mark.parametrize("layer", ["attn.v", "mlp.fc1"])
def test_a_bug_in_one_layer_is_named_against_an_msprobe_dump(tmp_path: Path, layer: str) -> None:
    def bump(net: Any) -> None:  # 1e-2 on one weight: 10^4 times float32 rounding at these sizes
        net.get_submodule(layer).weight[0, 0] += 0.01

    code, result = _result(DATA / "ms_L0_tensor", _torch_dump(tmp_path, "block", bump))
    assert code == 1 and _origins(result)[0] == ("forward", layer)


def test_aligner_mindspore_dump_against_msprobe_torch_statistics(tmp_path: Path) -> None:
    """Vice versa: msprobe's PyTorch statistics dump is the reference, aligner dumps the MindSpore twin."""
    for bug, expected in ((None, []), (0.5, [("forward", "mlp.fc1")])):
        _, mnet = make_twins("block")
        if bug is not None:
            weight = mnet.mlp.fc1.weight
            weight.set_data(weight + ms.Tensor(np.eye(*weight.shape, dtype=np.float32) * bug))
        out = tmp_path / f"ms_{bug}"
        loss = ms.value_and_grad(lambda x, net=mnet: net(x).square().mean(), None, mnet.trainable_params())
        with aligner.dump(mnet, out):
            loss(ms.Tensor(example_input("block")))
        code, result = _result(out, DATA / "pt_L0_statistics")
        assert _origins(result)[:1] == expected, result["summary"]
        assert code == (1 if expected else 0)
        assert {r["method"] for r in result["rows"] if r["status"] == "ok"} == {"stats"}
        assert result["counts"]["name"] >= 59


def test_mix_level_api_calls_become_op_records_under_their_module(tmp_path: Path) -> None:
    source = read_source(DATA / "ms_cnn_mix_statistics")
    assert source.framework == "mindspore" and source.mode == "stats" and source.problems == []
    conv1 = [(r.kind, r.type, r.io) for r in (it.record for it in source.items) if r.module == "conv1"]
    # the module call first, then the API calls inside it (read in that order: see msprobe.read)
    assert conv1[:2] == [("forward", "Conv2d", "input"), ("forward", "Conv2d", "output")]
    assert ("op", "ops.Conv2D", "output") in conv1 and ("op", "ops.BiasAdd", "output") in conv1
    for bug, expected in ((None, []), (0.05, [("forward", "conv2")])):
        def bump(net: Any, bug: float | None = bug) -> None:
            if bug is not None:
                net.conv2.weight[0, 0, 0, 0] += bug

        reference = tmp_path / str(bug)
        reference.mkdir()
        code, result = _result(DATA / "ms_cnn_mix_statistics", _torch_dump(reference, "cnn", bump, stats_only=True))
        assert _origins(result)[:1] == expected and code == (1 if expected else 0), result["summary"]
        assert result["counts"]["name"] >= 40


def test_pt_tensors_need_the_opt_in_and_load_weights_only(tmp_path: Path) -> None:
    fixture = DATA / "pt_L0_tensor_fc2"
    proc = run_align("compare", fixture, _torch_dump(tmp_path, "block"))
    assert_one_line_error(proc, "torch pickles (.pt)", "--trust-pickle")
    with_opt_in = run_align("compare", fixture, _torch_dump(tmp_path / "again", "block"), "--trust-pickle")
    assert with_opt_in.returncode == 0, with_opt_in.stderr  # the same tensors, read: the clean pair agrees
    source = read_source(fixture, trust_pickle=True)
    loaded = {it.record.io: load_tensor(it) for it in source.items if it.load is not None}
    tnet, _ = make_twins("block")
    hidden = []
    tnet.mlp.fc2.register_forward_hook(lambda m, i, o: hidden.extend([i[0], o]))
    tnet(torch.from_numpy(example_input("block")))
    # same weights, same input, same torch build: msprobe saved these tensors, up to the CPU's kernels (the fixture
    # was saved where matmul sums in another order than AVX512 does here: 1.2e-07 apart). torch.testing's float32
    # tolerance (rtol 1.3e-6, atol 1e-5) holds a few ulps; a reader handing back another tensor is off by O(1)
    for io, live in (("input", hidden[0]), ("output", hidden[1])):
        torch.testing.assert_close(torch.from_numpy(np.asarray(loaded[io])), live.detach())


def test_a_pt_that_needs_code_is_refused_even_with_the_opt_in(tmp_path: Path) -> None:
    run = _copy("pt_L0_tensor_fc2", tmp_path)
    marker = tmp_path / "pwned"
    target = run / "dump_tensor_data" / "Module.mlp.fc2.Linear.forward.0.output.0.pt"

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    torch.save({"x": Evil()}, target)
    source = read_source(run, trust_pickle=True)
    item = next(it for it in source.items if it.record.io == "output" and it.load is not None)
    with pytest.raises(ValueError, match="not a torch tensor file"):
        load_tensor(item)
    assert not marker.exists()


def test_malformed_dump_json_is_one_line(tmp_path: Path) -> None:
    reference = _torch_dump(tmp_path, "block", backward=False)
    for name, text in (("truncated", '{"task": "tensor", "data": {"Cell.ln1'), ("not_object", "[1, 2]"),
                       ("no_data", '{"task": "tensor", "framework": "mindspore"}')):
        run = tmp_path / name
        run.mkdir()
        (run / "dump.json").write_text(text)
        proc = run_align("compare", run, reference)
        assert_one_line_error(proc, "dump.json")


def test_missing_npy_marks_its_row_and_the_rest_is_compared(tmp_path: Path) -> None:
    run = _copy("ms_L0_tensor", tmp_path)
    (run / "dump_tensor_data" / "Cell.mlp.fc1.Dense.forward.0.output.0.npy").unlink()
    out = tmp_path / "r.json"
    proc = run_align("compare", run, _torch_dump(tmp_path, "block"), "--json", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # unreadable row, nothing diverged
    rows = json.loads(out.read_text())["rows"]
    bad = [r for r in rows if r["status"] == "error"]
    assert [(r["module"], r["io"]) for r in bad] == [("mlp.fc1", "output")] and "file missing" in bad[0]["error"]
    assert sum(r["status"] == "ok" for r in rows) >= 58


def test_tensor_names_leading_out_of_the_folder_are_never_read(tmp_path: Path) -> None:
    np.save(tmp_path / "secret.npy", SECRET.reshape(1, 1, 4))
    run = _copy("ms_L0_tensor", tmp_path)
    data = json.loads((run / "dump.json").read_text())
    outputs = [data["data"][f"Cell.{m}.forward.0"]["output"][0] for m in ("ln1.LayerNorm", "attn.q.Dense",
                                                                          "attn.k.Dense", "ln2.LayerNorm")]
    outputs[0]["data_name"] = "../../secret.npy"
    outputs[1]["data_name"] = str(tmp_path / "secret.npy")
    outputs[2]["data_name"] = "link.npy"
    outputs[3]["data_name"] = "sub/../../../secret.npy"
    (run / "dump_tensor_data" / "link.npy").symlink_to(tmp_path / "secret.npy")
    (run / "dump.json").write_text(json.dumps(data))
    out = tmp_path / "r.json"
    proc = run_align("compare", run, _torch_dump(tmp_path, "block"), "--json", out)
    assert proc.returncode == 2, proc.stderr
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kind"] == "forward" and r["io"] == "output"]
    refused = {r["module"]: r["error"] for r in rows if r["status"] == "error"}
    assert set(refused) == {"ln1", "attn.q", "attn.k", "ln2"} and all("refused" in e for e in refused.values())
    for value in ("1234.5", "6789.25", "31337", "4242.125"):
        assert value not in out.read_text() and value not in proc.stdout


def test_a_dump_of_several_ranks_asks_for_one(tmp_path: Path) -> None:
    for rank in ("rank0", "rank1"):
        shutil.copytree(DATA / "ms_L0_tensor" / "step0" / "rank0", tmp_path / "dump" / "step0" / rank)
    proc = run_align("compare", tmp_path / "dump", _torch_dump(tmp_path, "block"))
    assert_one_line_error(proc, "2 ranks", "rank0")
    assert read_source(tmp_path / "dump" / "step0" / "rank1").items  # naming one rank's folder reads it


def test_msprobe_step_folders_are_steps(tmp_path: Path) -> None:
    for step in ("step0", "step1"):
        shutil.copytree(DATA / "ms_L0_tensor" / "step0" / "rank0", tmp_path / "dump" / step / "rank0")
    items = read_source(tmp_path / "dump").items
    by_step = {step: [(it.record.module, it.record.kind, it.record.io) for it in items if it.record.step == step]
               for step in (0, 1)}
    assert len(items) == 2 * len(by_step[0]) and by_step[0] == by_step[1]
    assert [it.record.step for it in items] == sorted(it.record.step for it in items)


# --- MindSpore native dump -----------------------------------------------------------------------------------------

_NATIVE_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import numpy as np
    import aligner
    aligner.native_dump_config({out!r})  # before the first graph: MindSpore reads it when it compiles
    import mindspore as ms
    from mindspore import nn
    from tests.support.twin_models import example_input, make_twins
    kind, how, bug = {kind!r}, {how!r}, {bug!r}
    _, net = make_twins(kind, train=how == "train")
    if bug:
        weight = dict(net.parameters_and_names())[bug]
        value = weight.asnumpy().copy()
        value.flat[0] += 0.01  # one weight off by 1e-2: 10^4 times float32 rounding at these sizes
        weight.set_data(ms.Tensor(value))
    x = ms.Tensor(example_input(kind))
    if how == "graph":
        ms.set_context(mode=ms.GRAPH_MODE)
        net(x)
    elif how == "jit":
        ms.jit(net)(x)
    elif how == "jit_function":
        @ms.jit
        def run(t):
            return net(t)
        run(x)
    else:  # one training step through MindSpore's wrappers, lr 0: the weights stay the torch twin's
        ms.set_context(mode=ms.GRAPH_MODE)
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.0))
        step.set_train(True)
        step(x, ms.Tensor(np.zeros((2, 10), np.float32)))
""")


def _native(tmp: Path, kind: str, how: str, bug: str | None = None) -> Path:
    """A real MindSpore native dump of the twin, run in its own process (cwd: tmp, for anything MindSpore writes)."""
    out = tmp / f"native_{kind}_{how}_{(bug or '').replace('.', '_')}"
    script = tmp / f"{out.name}.py"  # a file: MindSpore compiles a @jit function from its source
    script.write_text(_NATIVE_RUN.format(root=str(paths.ROOT), out=str(out), kind=kind, how=how, bug=bug))
    proc = subprocess.run([sys.executable, script], cwd=tmp, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def native_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("native")
    return {"block": _native(tmp, "block", "graph"), "block_bug": _native(tmp, "block", "graph", "mlp.fc1.weight"),
            "cnn_jit": _native(tmp, "cnn", "jit"), "cnn_jit_bug": _native(tmp, "cnn", "jit", "conv2.weight"),
            "cnn_train": _native(tmp, "cnn", "train"), "jit_function": _native(tmp, "block", "jit_function")}


@pytest.mark.parametrize("dump, kind, origin", [("block", "block", None), ("block_bug", "block", "mlp.fc1"),
                                                ("cnn_jit", "cnn", None), ("cnn_jit_bug", "cnn", "conv2")])
def test_native_graph_and_jit_dumps_pair_with_aligner_torch_dump(tmp_path: Path, native_dumps: dict[str, Path],
                                                                 dump: str, kind: str, origin: str | None) -> None:
    reference = _torch_dump(tmp_path, kind, train=False)  # backward records too: one side only, listed
    code, result = _result(native_dumps[dump], reference)
    assert _origins(result)[:1] == ([("forward", origin)] if origin else []), result["summary"]
    assert code == (1 if origin else 0) and result["manifest_problems"] == []
    forward = {r["module"]: r for r in result["rows"] if r["kind"] == "forward" and r["io"] == "output"
               and r["matched_by"] == "name"}
    # every layer's output paired by name (containers whose output is their last child's fold away on both sides)
    layers = {"cnn": {"conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2", "flatten", "fc"},
              "block": {"ln1", "attn.q", "attn.k", "attn.v", "attn.softmax", "attn.out", "ln2", "mlp.fc1",
                        "mlp.act", "mlp.fc2"}}[kind]
    assert set(forward) == layers
    assert all(r["shape_a"] == r["shape_b"] for r in forward.values())  # Dense outputs viewed back to [2, 4, C]


def test_native_training_step_peels_mindspore_wrappers(tmp_path: Path, native_dumps: dict[str, Path]) -> None:
    source = read_source(native_dumps["cnn_train"])
    modules = {it.record.module for it in source.items if it.record.kind == "forward"}
    assert modules == {"conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2", "flatten", "fc"}
    code, result = _result(native_dumps["cnn_train"], _torch_dump(tmp_path, "cnn", train=True))
    assert code == 0 and result["findings"] == [], result["summary"]


def test_native_dump_without_cell_scopes_is_one_line(tmp_path: Path, native_dumps: dict[str, Path]) -> None:
    proc = run_align("compare", native_dumps["jit_function"], _torch_dump(tmp_path, "block", train=False))
    assert_one_line_error(proc, "no op of this native dump ran inside a cell's scope", "ms.jit(cell)")


def test_native_dump_of_another_version_is_one_line(tmp_path: Path, native_dumps: dict[str, Path]) -> None:
    reference = _torch_dump(tmp_path, "block", train=False, backward=False)
    copy = tmp_path / "old"
    shutil.copytree(native_dumps["block"], copy)
    metadata = copy / "rank_0" / ".dump_metadata" / "config.json"
    metadata.write_text(json.dumps({"device_target": "CPU", "ms_version": "2.3.1"}))
    assert_one_line_error(run_align("compare", copy, reference), "MindSpore 2.3.1", "2.10")
    metadata.unlink()
    assert_one_line_error(run_align("compare", copy / "rank_0", reference), "unknown version")


def test_native_statistic_csv_from_its_documented_columns(tmp_path: Path, native_dumps: dict[str, Path]) -> None:
    """statistic.csv (GPU/Ascend; MindSpore 2.10 refuses it on CPU) written from the real dump's tensors in the
    documented columns, the tensor files removed: the records become stats-only and still name the bug."""
    for name, origin in (("block", None), ("block_bug", "mlp.fc1")):
        copy = tmp_path / name
        shutil.copytree(native_dumps[name], copy)
        folder = copy / "rank_0" / "Net" / "0" / "0"
        rows = ["Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,"
                "Avg Value,L2Norm Value,Count,NaN Count"]
        for path in sorted(folder.glob("*.npy")):
            op_type, rest = path.name.split(".", 1)
            op_name, task, stream, stamp, io, slot, _, dtype = rest[:-4].rsplit(".", 7)
            a = np.load(path).astype(np.float64)
            shape = '"(' + ",".join(map(str, a.shape)) + ')"'
            rows.append(f"{op_type},{op_name},{task},{stream},{stamp},{io},{slot},{a.nbytes // 2},{dtype.lower()},"
                        f"{shape},{a.max()!r},{a.min()!r},{a.mean()!r},{np.sqrt((a * a).sum())!r},{a.size},0")
            path.unlink()
        (folder / "statistic.csv").write_text("\n".join(rows) + "\n")
        source = read_source(copy)
        assert source.mode == "stats" and all(it.path is None for it in source.items)
        reference = tmp_path / f"ref_{name}"
        reference.mkdir()
        code, result = _result(copy, _torch_dump(reference, "block", train=False, backward=False))
        assert _origins(result)[:1] == ([("forward", origin)] if origin else []), result["summary"]


def test_native_dump_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINDSPORE_DUMP_CONFIG", raising=False)
    path = aligner.native_dump_config(tmp_path / "d", iteration="0|2-3", kernels=["Default/fc-Dense/MatMul-op0"])
    assert os.environ["MINDSPORE_DUMP_CONFIG"] == str(path)
    settings = json.loads(path.read_text())["common_dump_settings"]
    assert settings["path"] == str(tmp_path / "d") and settings["dump_mode"] == 1 and settings["iteration"] == "0|2-3"
    (tmp_path / "d" / "rank_0").mkdir()
    for bad in ({"directory": tmp_path / "d"}, {"directory": tmp_path / "e", "iteration": "every"},
                {"directory": tmp_path / "e", "net_name": "a/b"}, {"directory": tmp_path / "e.f"}):
        with pytest.raises(AlignerError):
            aligner.native_dump_config(**bad)  # type: ignore[arg-type]
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.f").exists()
