"""Who is blamed, on small hand-made PyTorch/MindSpore pairs with one bug at a time (the zoo pairs are in tests/zoo).

Dump format v2 records each call's inputs as links to the record that returned them, or as data when code between
module calls computed them; compare blames that code's module (PARENT_CODE) when such an input is the first thing
that differs, the module itself when its recorded input matched (MODULE), and the data when the model's own input
differs (MODEL_INPUT). Also: BatchNorm buffers after a training-mode forward, modules whose children never run,
version handling, and refusing two different models.
"""
from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT
from aligner.pipelines.compare.verdict import Culprit
from aligner.render.words import say
from tests.support.cli import assert_one_line_error, run_align

ms.set_context(mode=ms.PYNATIVE_MODE)
X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


class TorchBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * self.scale)  # glue between two child calls


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blk, self.head = TorchBlock(), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blk(x))


class MsBlock(ms.nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = ms.nn.Dense(8, 8), ms.nn.Dense(8, 8)
        self.scale = 0.5

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.b(ms.ops.relu(self.a(x)) * self.scale)


class MsNet(ms.nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.blk, self.head = MsBlock(), ms.nn.Dense(8, 3)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.head(self.blk(x))


def twins() -> tuple[TorchNet, MsNet]:
    torch.manual_seed(0)
    tnet, mnet = TorchNet().eval(), MsNet()
    mnet.set_train(False)
    params = dict(mnet.parameters_and_names())
    for name, value in tnet.state_dict().items():
        params[name].set_data(ms.Tensor(value.numpy()))
    return tnet, mnet


def dump_pair(tmp_path, tnet, mnet, x_ms=X, **options):
    pt, ms_dir = tmp_path / "pt", tmp_path / "ms"
    with torch.no_grad(), aligner.dump(tnet, pt, progress=SILENT, **options):
        tnet(torch.from_numpy(X))
    with aligner.dump(mnet, ms_dir, progress=SILENT, **options):
        mnet(ms.Tensor(x_ms))
    return ms_dir, pt


def both_orders(ms_dir, pt):
    """The first finding of `compare ms pt` and `compare pt ms` (PyTorch is the reference either way)."""
    out = []
    for a, b in ((ms_dir, pt), (pt, ms_dir)):
        result = aligner.compare(a, b, progress=SILENT)
        out.append((result, result.verdict.findings[0] if result.verdict.findings else None))
    return out


def test_clean_twins_agree_in_both_orders(tmp_path):
    for result, finding in both_orders(*dump_pair(tmp_path, *twins())):
        assert finding is None and result.exit_code == 0 and not result.unmatched


def test_glue_code_between_calls_blames_the_parent(tmp_path):
    tnet, mnet = twins()
    mnet.blk.scale = 0.4  # the bug is in MsBlock.construct's own arithmetic, between self.a and self.b
    for result, f in both_orders(*dump_pair(tmp_path, tnet, mnet)):
        assert result.exit_code == 1
        assert (f.culprit, f.blame) == (Culprit.PARENT_CODE, "blk")
        rec = result.rows[f.origin].pair.ref.record
        assert (rec.module, rec.io, rec.same_as) == ("blk.b", "input", None)  # b's input: computed, stored
    proc = run_align("compare", tmp_path / "ms", tmp_path / "pt")
    assert proc.returncode == 1
    assert "the code in the forward of blk between its module calls" in proc.stdout
    assert "ops=True, scope='blk'" in proc.stdout  # the zoom-in command for both sides


def test_a_wrong_weight_blames_the_module_whose_input_matched(tmp_path):
    tnet, mnet = twins()
    w = mnet.blk.b.weight
    w.set_data(ms.Tensor(w.asnumpy().T.copy()))
    for _, f in both_orders(*dump_pair(tmp_path, tnet, mnet)):
        assert (f.culprit, f.blame) == (Culprit.MODULE, "blk.b")
        assert "its input matched" in say(f.reason)


def test_a_different_model_input_blames_the_data(tmp_path):
    tnet, mnet = twins()
    for result, f in both_orders(*dump_pair(tmp_path, tnet, mnet, x_ms=X + 1e-2)):
        assert (f.culprit, f.blame) == (Culprit.MODEL_INPUT, "")
        rec = result.rows[f.origin].pair.ref.record
        assert (rec.module, rec.io, rec.parent) == ("", "input", None)


def test_without_input_records_the_report_says_what_is_not_known(tmp_path):
    tnet, mnet = twins()
    mnet.blk.scale = 0.4
    result, f = both_orders(*dump_pair(tmp_path, tnet, mnet, inputs=False))[0]
    assert (f.culprit, f.blame) == (Culprit.MODULE, "blk.b")  # nothing recorded tells b from blk's code
    assert "the numbers part between blk.a" in say(f.reason) and "inside the forward of blk" in say(f.reason)


def test_inputs_are_links_unless_computed_between_calls(tmp_path):
    tnet, _ = twins()
    with torch.no_grad(), aligner.dump(tnet, tmp_path / "d", progress=SILENT):
        tnet(torch.from_numpy(X))
    lines = (tmp_path / "d" / "manifest.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["version"] == 2
    recs = {(r["module"], r["io"]): r for r in map(json.loads, lines[1:])}
    assert recs[("", "input")]["parent"] is None and recs[("", "input")]["file"]        # the model's input: data
    assert recs[("blk.a", "input")]["same_as"] == recs[("", "input")]["seq"]           # the same tensor: a link
    assert recs[("blk.a", "input")]["file"] is None
    assert recs[("blk.b", "input")]["same_as"] is None and recs[("blk.b", "input")]["file"]  # relu * scale: data
    assert recs[("head", "input")]["parent"] == "" and recs[("blk.b", "input")]["parent"] == "blk"
    assert recs[("head", "input")]["same_as"] == recs[("blk.b", "output")]["seq"]  # blk returned b's output itself
    assert recs[("blk.b", "input")]["call"] == recs[("blk.b", "output")]["call"] != recs[("blk.a", "output")]["call"]


def test_a_module_whose_children_never_run_is_recorded_in_both_frameworks(tmp_path):
    tmha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()  # out_proj is used functionally
    mmha = ms.nn.MultiheadAttention(8, 2, batch_first=True)
    mmha.set_train(False)
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    with torch.no_grad(), aligner.dump(tmha, tmp_path / "pt", progress=SILENT):
        tmha(*(torch.from_numpy(x),) * 3)
    with aligner.dump(mmha, tmp_path / "ms", progress=SILENT):
        mmha(*(ms.Tensor(x),) * 3)
    for d in ("pt", "ms"):
        recs = [json.loads(line) for line in (tmp_path / d / "manifest.jsonl").read_text().splitlines()[1:]]
        outputs = [(r["module"], r["index"]) for r in recs if r["kind"] == "forward" and r["io"] == "output"]
        assert outputs and {m for m, _ in outputs} == {""}, (d, outputs)  # the MHA itself (the model root here)


def test_batchnorm_buffers_are_recorded_after_a_training_forward_and_name_a_momentum_bug(tmp_path):
    x = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)

    def run(ms_momentum: float, label: str):
        tbn = torch.nn.BatchNorm1d(4, momentum=0.1).train()
        mbn = ms.nn.BatchNorm1d(4, momentum=ms_momentum)  # MindSpore's momentum weighs the old value: 0.9 == 0.1
        mbn.set_train(True)
        with torch.no_grad(), aligner.dump(tbn, tmp_path / f"pt{label}", progress=SILENT):
            tbn(torch.from_numpy(x))
        with aligner.dump(mbn, tmp_path / f"ms{label}", progress=SILENT):
            mbn(ms.Tensor(x))
        return aligner.compare(tmp_path / f"ms{label}", tmp_path / f"pt{label}", progress=SILENT)

    clean = run(0.9, "ok")
    assert clean.exit_code == 0
    buffers = [(r.pair.ref.record.io, r.pair.a.record.io) for r in clean.rows if r.pair.ref.record.kind == "buffer"]
    assert buffers == [("running_mean", "running_mean"), ("running_var", "running_var")]
    assert "training mode" in clean.tolerance.describe()  # batch statistics: the float32 default is widened
    bug = run(0.1, "bug")  # PyTorch's number in MindSpore's convention: the outputs agree, the statistics do not
    f = bug.verdict.findings[0]
    assert bug.exit_code == 1 and (f.culprit, f.blame) == (Culprit.MODULE, "")
    assert bug.rows[f.origin].pair.ref.record.kind == "buffer"
    assert all(r.status.value == "ok" for r in bug.rows if r.pair.ref.record.kind == "forward")
    tbn = torch.nn.BatchNorm1d(4).eval()
    with torch.no_grad(), aligner.dump(tbn, tmp_path / "eval", progress=SILENT):
        tbn(torch.from_numpy(x))
    assert '"buffer"' not in (tmp_path / "eval" / "manifest.jsonl").read_text()  # eval mode changes no buffer


def test_version_1_dumps_are_read_and_newer_ones_refused(tmp_path):
    tnet, mnet = twins()
    ms_dir, pt = dump_pair(tmp_path, tnet, mnet, inputs=False)
    for d in (ms_dir, pt):  # rewrite as version 1: header version 1, no v2 fields
        lines = (d / "manifest.jsonl").read_text().splitlines()
        header = json.loads(lines[0]) | {"version": 1}
        recs = [{k: v for k, v in json.loads(line).items() if k not in ("call", "parent", "same_as", "source")}
                for line in lines[1:] if json.loads(line)["kind"] != "block"]  # version 1 had no block records
        (d / "manifest.jsonl").write_text("\n".join(json.dumps(x) for x in [header, *recs]) + "\n")
    assert aligner.compare(ms_dir, pt, progress=SILENT).exit_code == 0
    lines = (pt / "manifest.jsonl").read_text().splitlines()
    (pt / "manifest.jsonl").write_text("\n".join([json.dumps(json.loads(lines[0]) | {"version": 3}), *lines[1:]]))
    assert_one_line_error(run_align("compare", ms_dir, pt), "dump format version 3", "reads versions 1, 2")


def test_dumps_of_two_different_models_are_refused(tmp_path):
    a = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])
    b = torch.nn.Sequential(*[torch.nn.Conv2d(3, 3, 3) for _ in range(6)])
    with torch.no_grad(), aligner.dump(a, tmp_path / "a", progress=SILENT):
        a(torch.ones(2, 8))
    with torch.no_grad(), aligner.dump(b, tmp_path / "b", progress=SILENT):
        b(torch.ones(1, 3, 16, 16))
    assert_one_line_error(run_align("compare", tmp_path / "a", tmp_path / "b"), "look like dumps of different models")
    with pytest.raises(AlignerError, match="different models"):
        aligner.compare(tmp_path / "a", tmp_path / "b", progress=SILENT)


class TorchMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MsMlp(ms.nn.Cell):
    """The same MLP with the activation written as a function call in construct: no cell to pair with `act`."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.fc1, self.fc2, self.approximate = ms.nn.Dense(8, 16), ms.nn.Dense(16, 8), approximate

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.fc2(ms.ops.gelu(self.fc1(x), approximate=self.approximate))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_module_with_no_twin_is_blamed_when_what_it_returned_differs(tmp_path, approximate):
    torch.manual_seed(0)
    tnet, mnet = TorchMlp().eval(), MsMlp(approximate)
    params = dict(mnet.parameters_and_names())
    for name, value in tnet.state_dict().items():
        params[name].set_data(ms.Tensor(value.numpy()))
    x = (np.random.default_rng(3).standard_normal((4, 8)) * 3).astype(np.float32)
    with torch.no_grad(), aligner.dump(tnet, tmp_path / "pt", progress=SILENT):
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, tmp_path / "ms", progress=SILENT):
        mnet(ms.Tensor(x))
    for result, f in both_orders(tmp_path / "ms", tmp_path / "pt"):
        assert [r.pair.ref.record.module for r in result.rows if r.pair.a is None] == ["act", "act"]  # in, out
        if approximate == "none":
            assert result.exit_code == 0 and f is None  # a record on one side only is listed, not a failure
        else:
            assert (f.culprit, f.blame) == (Culprit.MODULE, "act")
            assert "act has no twin on the other side" in say(f.reason)
