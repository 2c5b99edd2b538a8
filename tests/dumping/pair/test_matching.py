"""Record matching: names first (with call occurrences), then content, type and shape in the gaps; pass-through
calls folded; unmatched reported."""
from __future__ import annotations

import numpy as np
import pytest

from aligner.dumping.manifest import Record
from aligner.dumping.pair.matching import match, passthrough
from aligner.dumping.read.source import Item
from aligner.metrics.stats import tensor_stats
from aligner.pipelines.compare.run import compare
from aligner.render.compare import summary
from tests.support.compare_fixtures import write_dump


def _items(names: list[str], shapes: list[list[int]] | None = None, kind: str = "forward") -> list[Item]:
    shapes = shapes or [[4]] * len(names)
    return [Item(Record(seq=i, module=n, type="", kind=kind, io="output", index=0, dtype="float32", shape=s))
            for i, (n, s) in enumerate(zip(names, shapes))]


def _pairs(pairs: list) -> list[tuple]:
    return [(p.a.record.module if p.a else None, p.b.record.module if p.b else None, p.matched_by) for p in pairs]


def test_repeated_calls_match_by_occurrence() -> None:
    a, b = _items(["enc", "act", "enc", "act"]), _items(["enc", "act", "enc", "act"])
    pairs = match(a, b)
    assert [(p.a.record.seq, p.b.record.seq) for p in pairs] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_renamed_records_fall_back_to_order_and_shape() -> None:
    a = _items(["conv", "bn_x", "relu", "fc_x"], [[8], [8], [8], [2]])
    b = _items(["conv", "bn", "relu", "extra", "fc"], [[8], [8], [8], [3], [2]])
    assert _pairs(match(a, b)) == [("conv", "conv", "name"), ("bn_x", "bn", "content"), ("relu", "relu", "name"),
                                   (None, "extra", None), ("fc_x", "fc", "content")]


def test_only_in_first_side_rows_sit_after_their_predecessor() -> None:
    a, b = _items(["x", "debug", "y"], [[4], [9], [4]]), _items(["x", "y"])
    assert _pairs(match(a, b)) == [("x", "x", "name"), ("debug", None, None), ("y", "y", "name")]


def test_forward_and_backward_records_do_not_cross_match() -> None:
    a = _items(["fc"]) + _items(["fc_grad"], kind="backward")
    b = _items(["fc"]) + _items(["fc_g"], kind="backward")
    assert [p.matched_by for p in match(a, b)] == ["name", "content"]
    assert [p.matched_by for p in match(_items(["fc_x"]), _items(["fc"], kind="backward"))] == [None, None]


def test_thousands_of_records_with_renames_scattered_through_them() -> None:
    n = 20000
    names = [f"layers.{i // 4}.op{i % 4}" for i in range(n)]
    a = _items([nm if i % 10 else nm + "_renamed" for i, nm in enumerate(names)])
    b = _items(names)
    pairs = match(a, b)  # anchors + per-gap alignment: an O(n*m) table would be 4e8 cells
    assert len(pairs) == n and all(p.a is not None and p.b is not None for p in pairs)
    assert sum(p.matched_by == "content" for p in pairs) == n // 10


def _resnet_like(tmp_path, bug: str | None = None):
    """Dumps of two residual blocks as timm writes them (Identity `drop_block`/`aa`, one module per activation) and
    as mindcv does (one `relu` cell called twice per block); `bug` names the MindSpore call that is made wrong."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    weights = [rng.standard_normal((16, 16)).astype(np.float32) / 4 for _ in range(4)]
    pt, ms = [], []
    for blk in range(2):
        shortcut = x
        h1 = x @ weights[2 * blk]
        b1 = (h1 - h1.mean(0)) / (h1.std(0) + 1e-5)
        a1 = np.maximum(b1, 0)
        h2 = a1 @ weights[2 * blk + 1]
        b2 = (h2 - h2.mean(0)) / (h2.std(0) + 1e-5)
        out = np.maximum(b2 + shortcut, 0)
        bad_a1 = np.where(b1 > 0, b1, 0.01 * b1) if bug == f"{blk}.relu#0" else a1
        bad_out = np.where(b2 + shortcut > 0, b2 + shortcut, 0.01 * (b2 + shortcut)) if bug == f"{blk}.relu#1" else out
        p = f"layer1.{blk}"
        pt += [(f"{p}.conv1", "Conv2d", h1), (f"{p}.bn1", "BatchNorm2d", b1), (f"{p}.drop_block", "Identity", b1),
               (f"{p}.act1", "ReLU", a1), (f"{p}.aa", "Identity", a1), (f"{p}.conv2", "Conv2d", h2),
               (f"{p}.bn2", "BatchNorm2d", b2), (f"{p}.act2", "ReLU", out)]
        h2_ms = bad_a1 @ weights[2 * blk + 1]
        b2_ms = (h2_ms - h2_ms.mean(0)) / (h2_ms.std(0) + 1e-5)
        ms += [(f"{p}.conv1", "Conv2d", h1), (f"{p}.bn1", "BatchNorm2d", b1), (f"{p}.relu", "ReLU", bad_a1),
               (f"{p}.conv2", "Conv2d", h2_ms), (f"{p}.bn2", "BatchNorm2d", b2_ms),
               (f"{p}.relu", "ReLU", bad_out if bug == f"{blk}.relu#1" else np.maximum(b2_ms + shortcut, 0))]
        x = out
    write_dump(tmp_path / "pt", "pytorch", [{"module": m, "type": t, "array": a} for m, t, a in pt])
    write_dump(tmp_path / "ms", "mindspore", [{"module": m, "type": t, "array": a} for m, t, a in ms])
    return tmp_path / "ms", tmp_path / "pt"


def test_identity_modules_and_a_reused_cell_pair_by_content(tmp_path) -> None:
    ms, pt = _resnet_like(tmp_path)
    for a, b in ((ms, pt), (pt, ms)):
        result = compare(str(a), str(b))
        assert result.passed and result.exit_code == 0, summary(result)
        pairs = {(r.pair.a.record.module if r.pair.a else None, r.pair.b.record.module if r.pair.b else None,
                  r.pair.matched_by) for r in result.rows}
        assert ("layer1.0.relu", "layer1.0.act1", "content") in pairs and \
            ("layer1.0.relu", "layer1.0.act2", "content") in pairs
        assert result.matched["folded_b"] == 4 and result.matched["unmatched_a"] == result.matched["unmatched_b"] == 0


@pytest.mark.parametrize("bug, origin", [("0.relu#0", "layer1.0.act1"), ("1.relu#1", "layer1.1.act2")])
def test_a_bug_in_a_reused_cell_is_named_in_both_orders(tmp_path, bug, origin) -> None:
    ms, pt = _resnet_like(tmp_path, bug)
    for a, b in ((ms, pt), (pt, ms)):
        result = compare(str(a), str(b))
        assert result.exit_code == 1
        assert result.module(result.verdict.findings[0].origin) == origin, summary(result)


def _backward_tail(tmp_path):
    """The backward of a downsample branch and a classifier as the zoo pair's dumps hold them: MindSpore fires a
    cell's parameter hooks before its grad_output/grad_input (and names it `down_sample`, `classifier`), PyTorch fires
    grad_output before the parameter gradients (`downsample`, `fc`); timm flattens [1, C, 1, 1] -> [1, C] in a
    separate `global_pool.flatten` that mindcv's pooling does inside one cell."""
    rng = np.random.default_rng(1)
    g_logits, g_feat = rng.standard_normal((1, 10)).astype(np.float32), rng.standard_normal((1, 8)).astype(np.float32)
    g_w, g_b = rng.standard_normal((10, 8)).astype(np.float32), g_logits[0].copy()
    g_pool_in = rng.standard_normal((1, 8, 2, 2)).astype(np.float32)
    g_bn_out, g_bn_in = (rng.standard_normal((1, 8, 2, 2)).astype(np.float32) for _ in range(2))
    g_gamma, g_beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    bw, pg = dict(kind="backward"), dict(kind="param_grad", io="grad", type="Parameter")
    ms = [dict(module="classifier.bias", array=g_b, **pg), dict(module="classifier.weight", array=g_w, **pg),
          dict(module="classifier", type="Dense", io="grad_output", array=g_logits, **bw),
          dict(module="classifier", type="Dense", io="grad_input", array=g_feat, **bw),
          dict(module="pool", type="GlobalAvgPooling", io="grad_output", array=g_feat, **bw),
          dict(module="pool", type="GlobalAvgPooling", io="grad_input", array=g_pool_in, **bw),
          dict(module="down_sample.1.gamma", array=g_gamma, **pg),
          dict(module="down_sample.1.beta", array=g_beta, **pg),
          dict(module="down_sample.1", type="BatchNorm2d", io="grad_output", array=g_bn_out, **bw),
          dict(module="down_sample.1", type="BatchNorm2d", io="grad_input", array=g_bn_in, **bw)]
    pt = [dict(module="fc", type="Linear", io="grad_output", array=g_logits, **bw),
          dict(module="fc.bias", array=g_b, **pg), dict(module="fc.weight", array=g_w, **pg),
          dict(module="fc", type="Linear", io="grad_input", array=g_feat, **bw),
          dict(module="global_pool.flatten", type="Flatten", io="grad_output", array=g_feat, **bw),
          dict(module="global_pool.flatten", type="Flatten", io="grad_input", array=g_feat.reshape(1, 8, 1, 1), **bw),
          dict(module="global_pool.pool", type="AdaptiveAvgPool2d", io="grad_output", array=g_feat.reshape(1, 8, 1, 1),
               **bw),
          dict(module="global_pool.pool", type="AdaptiveAvgPool2d", io="grad_input", array=g_pool_in, **bw),
          dict(module="downsample.1", type="BatchNorm2d", io="grad_output", array=g_bn_out, **bw),
          dict(module="downsample.1.weight", array=g_gamma, **pg), dict(module="downsample.1.bias", array=g_beta, **pg),
          dict(module="downsample.1", type="BatchNorm2d", io="grad_input", array=g_bn_in, **bw)]
    write_dump(tmp_path / "pt", "pytorch", pt)
    write_dump(tmp_path / "ms", "mindspore", ms)
    return tmp_path / "ms", tmp_path / "pt"


def test_grad_output_pairs_across_parameter_gradients_fired_in_another_order(tmp_path) -> None:
    ms, pt = _backward_tail(tmp_path)
    for a, b in ((ms, pt), (pt, ms)):
        result = compare(str(a), str(b))
        assert result.passed and result.exit_code == 0, summary(result)
        assert result.matched["unmatched_a"] == result.matched["unmatched_b"] == 0, summary(result)
        pairs = {frozenset((r.pair.a.record.module, r.pair.b.record.module)) | {r.pair.a.record.io}
                 for r in result.rows if r.pair.a and r.pair.b}
        assert frozenset({"classifier", "fc", "grad_output"}) in pairs
        assert frozenset({"down_sample.1", "downsample.1", "grad_output"}) in pairs
        assert frozenset({"classifier.bias", "fc.bias", "grad"}) in pairs
        # the Flatten of [1, 8, 1, 1] into [1, 8] is a pass-through (both of its records fold)
        assert result.matched["folded_a"] + result.matched["folded_b"] == 2, result.matched


def test_a_squeeze_with_other_values_does_not_fold() -> None:
    def item(seq, module, io, arr):
        arr = np.asarray(arr, np.float32)
        return Item(Record(seq=seq, module=module, type="", kind="forward", io=io, index=0, dtype="float32",
                           shape=list(arr.shape), stats=tensor_stats(arr)))
    x = np.arange(4, dtype=np.float32).reshape(1, 4, 1)
    assert passthrough([item(0, "p", "output", x), item(1, "flat", "output", x.reshape(1, 4))]) == {1: 0}
    assert passthrough([item(0, "p", "output", x), item(1, "flat", "output", x.reshape(1, 4) + 1)]) == {}
    assert passthrough([item(0, "p", "output", x), item(1, "flat", "output", x.reshape(2, 2))]) == {}


@pytest.mark.parametrize("prefix", ["module.", "_backbone.", "network._backbone."])
@pytest.mark.parametrize("wrapped_first", [True, False])
def test_a_wrapper_prefix_on_one_side_still_pairs_by_name(prefix: str, wrapped_first: bool) -> None:
    # DDP's `module.`, MindSpore's TrainOneStepCell `network._backbone.`: one side's paths carry the wrapper; every
    # record still pairs by name (same shapes everywhere, so a content pairing could not tell the layers apart)
    names = [f"layers.{i}.{part}" for i in range(6) for part in ("fc", "act")]
    wrapped, plain = _items([prefix + n for n in names]), _items(names)
    a, b = (wrapped, plain) if wrapped_first else (plain, wrapped)
    pairs = match(a, b)
    assert all(p.matched_by == "name" for p in pairs)
    assert [p.b.record.module.removeprefix(prefix) for p in pairs] == names
    assert [p.a.record.module.removeprefix(prefix) for p in pairs] == names


def test_a_prefix_only_some_records_share_is_not_stripped() -> None:
    # names that mostly agree already: nothing is stripped (the `block.` of two records is not a wrapper)
    a = _items(["stem", "block.fc", "block.act", "head"])
    b = _items(["stem", "fc", "act", "head"])
    assert [p.matched_by for p in match(a, b)] == ["name", "content", "content", "name"]
