"""`align diff`: real one-step trainings of the twin CNN in PyTorch and MindSpore, saved and diffed through the CLI."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from aligner.io import open_checkpoint
from aligner.pipelines.convert.checkpoint import plan_conversion
from tests.support.cli import assert_one_line_error
from tests.support.twin_models import example_input, make_twins

TRAINABLE = ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight", "conv2.bias", "bn2.weight",
             "bn2.bias", "fc.weight", "fc.bias"]
LABELS = np.array([1, 3], np.int32)


def train_torch(path: Path, lr: float = 0.1, frozen: str | None = None, init: Path | None = None) -> None:
    """One SGD step of the torch twin (seed 0); `frozen` is left out of the optimizer."""
    import torch

    net, _ = make_twins("cnn", 0)
    if init is not None:
        torch.save(net.state_dict(), init)
    opt = torch.optim.SGD([p for n, p in net.named_parameters() if n != frozen], lr=lr)
    loss = torch.nn.functional.cross_entropy(net(torch.tensor(example_input("cnn"))), torch.tensor(LABELS).long())
    loss.backward()
    opt.step()
    torch.save(net.state_dict(), path)


def train_mindspore(path: Path, lr: float = 0.1, frozen: str | None = None, bn_momentum: float | None = None) -> None:
    """One SGD step of the MindSpore twin (same weights); `frozen` (MindSpore name) is left out of the optimizer;
    `bn_momentum` rebuilds both BatchNorms with that momentum (fresh BatchNorms hold the same values as torch's)."""
    import mindspore as ms
    from mindspore import nn

    _, net = make_twins("cnn", 0)
    if bn_momentum is not None:
        net.bn1 = nn.BatchNorm2d(4, momentum=bn_momentum)
        net.bn2 = nn.BatchNorm2d(8, momentum=bn_momentum)
        net.set_train(True)
    opt = nn.SGD([p for p in net.trainable_params() if p.name != frozen], learning_rate=lr)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    _, grads = grad_fn(ms.Tensor(example_input("cnn")), ms.Tensor(LABELS))
    opt(grads)
    ms.save_checkpoint(net, str(path))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """init.pth, the clean pair, a wrong-lr MindSpore run, MindSpore and torch runs with fc.bias left out of the
    optimizer, and a MindSpore run with torch's BatchNorm momentum number (0.1) copied without conversion."""
    d = tmp_path_factory.mktemp("diff")
    files = {k: d / v for k, v in {"init": "init.pth", "pt": "step1_pt.pth", "ms": "step1_ms.ckpt",
                                   "ms_lr": "lr_ms.ckpt", "ms_frozen": "frozen_ms.ckpt",
                                   "pt_frozen": "frozen_pt.pth", "ms_bn": "bn_momentum_ms.ckpt"}.items()}
    train_torch(files["pt"], init=files["init"])
    train_torch(files["pt_frozen"], frozen="fc.bias")
    train_mindspore(files["ms"])
    train_mindspore(files["ms_lr"], lr=0.11)
    train_mindspore(files["ms_frozen"], frozen="fc.bias")
    train_mindspore(files["ms_bn"], bn_momentum=0.1)
    return files


def test_clean_step_matches(align, ckpts):
    proc = align("diff", ckpts["ms"], ckpts["pt"], "--init", ckpts["init"], "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["equal"] and result["differences"] == []
    compared = {p["name"]: p for p in result["params"] if p["metrics"]}
    assert len(compared) == 14  # 10 trainable + 4 BatchNorm running stats; num_batches_tracked is only in B
    assert all(p["metrics"]["max_abs_err"] < 1e-6 for p in compared.values())
    assert (result["a"]["tensors"], result["b"]["tensors"]) == (14, 16)
    # parameters and buffers by name on both sides; trainable is unknown from a file (no requires_grad in it)
    assert (result["a"]["parameters"], result["a"]["buffers"]) == (10, 4)
    assert (result["b"]["parameters"], result["b"]["buffers"]) == (10, 6)
    assert result["b"]["parameter_elements"] == 1722
    assert result["a"]["trainable"] is None and result["b"]["trainable"] is None
    assert result["hints"] == [] and result["passed"]
    # The conv biases feed a training-mode BatchNorm: zero gradient in exact arithmetic, but whether rounding leaves
    # them bit-identical to init depends on the machine's summation order, so they may or may not be listed.
    assert set(result["frozen_both"]) <= {"conv1.bias", "conv2.bias"}


def test_frozen_on_both_sides_is_named(align, ckpts):
    proc = align("diff", ckpts["ms_frozen"], ckpts["pt_frozen"], "--init", ckpts["init"], "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert "fc.bias" in result["frozen_both"]
    assert set(result["frozen_both"]) - {"fc.bias"} <= {"conv1.bias", "conv2.bias"}  # see test_clean_step_matches


def test_clean_step_text(align, ckpts):
    proc = align("diff", ckpts["ms"], ckpts["pt"], "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("14 of 16 tensors compared, all agree within tolerance (per dtype, as torch.testing (float32: "
            "rtol=1.3e-06, atol=1e-05)); not compared: 2 buffers A's framework does not have, listed below."
            ) in proc.stdout
    assert "bn1.moving_mean" in proc.stdout and "trainable unknown" in proc.stdout


def test_wrong_lr_names_every_updated_param(align, ckpts):
    proc = align("diff", ckpts["ms_lr"], ckpts["pt"], "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    # conv biases feed a training-mode BatchNorm: (near) zero gradient, so a wrong lr cannot show there
    updated = set(TRAINABLE) - {"conv1.bias", "conv2.bias"}
    assert set(result["differences"]) == updated
    # lr 0.11 vs 0.1 makes every update 10% larger, so |A - B| / |B - init| is 0.1 per parameter. The 5% margin
    # covers the two frameworks' float32 gradients differing in their last bits; a real mismatch would be far off.
    with open_checkpoint(ckpts["ms_lr"]) as a, open_checkpoint(ckpts["pt"]) as b, \
            open_checkpoint(ckpts["init"]) as init:
        moved = dict(plan_conversion(a, like=b).tensors(a))
        ratio = {n: float(np.linalg.norm(moved[n].astype(np.float64) - b.get(n)) / np.linalg.norm(
            b.get(n).astype(np.float64) - init.get(n))) for n in updated}
    assert all(abs(r - 0.1) < 0.1 * 0.05 for r in ratio.values()), ratio


def test_wrong_lr_text_names_params(align, ckpts):
    proc = align("diff", ckpts["ms_lr"], ckpts["pt"], "--rtol", "1e-4", "--atol", "1e-6")
    assert proc.returncode == 1
    assert "parameter(s) different" in proc.stdout and "fc.weight" in proc.stdout
    assert "conv1.weight" in proc.stdout


def test_frozen_param_named_with_init(align, ckpts, tmp_path):
    out = tmp_path / "diff.json"
    proc = align("diff", ckpts["ms_frozen"], ckpts["pt"], "--init", ckpts["init"], "--json", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fc.bias: updated in B, NOT updated in A" in proc.stdout
    result = json.loads(out.read_text())
    row = next(p for p in result["params"] if p["name"] == "fc.bias")
    assert (row["status"], row["updated_a"], row["updated_b"]) == ("update differs", False, True)
    assert result["differences"] == ["fc.bias"]


def test_frozen_param_without_init_is_only_a_value_difference(align, ckpts):
    proc = align("diff", ckpts["ms_frozen"], ckpts["pt"], "--json", "-")
    assert proc.returncode == 1
    row = next(p for p in json.loads(proc.stdout)["params"] if p["name"] == "fc.bias")
    assert row["status"] == "different" and row["updated_a"] is None


def test_init_in_other_framework(align, ckpts):
    proc = align("diff", ckpts["pt"], ckpts["ms_frozen"], "--init", ckpts["init"], "--json", "-")
    assert proc.returncode == 1
    row = next(p for p in json.loads(proc.stdout)["params"] if p["name"] == "fc.bias")
    assert (row["updated_a"], row["updated_b"]) == (True, False)


def test_map_renames_a(align, ckpts, tmp_path):
    import torch

    state = torch.load(ckpts["pt"])
    state["head.bias"] = state.pop("fc.bias")
    renamed = tmp_path / "renamed.pth"
    torch.save(state, renamed)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("rename:\n  head.bias: fc.bias\n")
    proc = align("diff", renamed, ckpts["pt"], "--map", mapping)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All 16 compared tensors agree" in proc.stdout


def test_missing_and_unexpected_keys_fail_only_with_strict(align, ckpts, tmp_path):
    import torch

    state = torch.load(ckpts["pt"])
    state["extra.weight"] = torch.zeros(3)
    del state["fc.bias"]
    edited = tmp_path / "edited.pth"
    torch.save(state, edited)
    proc = align("diff", edited, ckpts["pt"], "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    status = {p["name"]: p["status"] for p in result["params"]}
    assert status["fc.bias"] == "missing" and status["extra.weight"] == "unexpected"
    assert result["one_side"] == ["fc.bias", "extra.weight"] and not result["equal"] and result["passed"]
    text = align("diff", edited, ckpts["pt"])
    assert text.returncode == 0 and "missing" in text.stdout and "extra.weight" in text.stdout
    # the verdict line itself carries what was not compared (it used to say "All 15 compared parameters agree")
    assert ("15 of 17 tensors compared, all agree within tolerance (per dtype, as torch.testing (float32: "
            "rtol=1.3e-06, atol=1e-05)); not compared: 1 only in B; 1 only in A (--strict fails on keys on one side "
            "only), listed below.") in text.stdout
    assert result["compared"] == 15
    strict = align("diff", edited, ckpts["pt"], "--strict", "--json", "-")
    assert strict.returncode == 1 and not json.loads(strict.stdout)["passed"]


def test_shape_mismatch(align, ckpts, tmp_path):
    import torch

    state = torch.load(ckpts["pt"])
    state["fc.bias"] = torch.zeros(7)
    edited = tmp_path / "shape.pth"
    torch.save(state, edited)
    proc = align("diff", edited, ckpts["pt"], "--json", "-")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["differences"] == ["fc.bias"]


def test_different_models(align, ckpts, tmp_path):
    import torch

    other = tmp_path / "other.pth"
    torch.save({f"layer{i}.weight": torch.zeros(i + 2) for i in range(20)}, other)
    assert_one_line_error(align("diff", other, ckpts["pt"]), "different models")
    assert_one_line_error(align("diff", ckpts["ms"], ckpts["pt"], "--init", other), "different models")


@pytest.mark.parametrize("args,needle", [
    (["missing.ckpt", "{pt}"], "no such file"),
    (["{corrupt}", "{pt}"], "corrupt"),
    (["{ms}", "{pt}", "--rtol", "abc", "--atol", "0"], "--rtol must be a number"),
    (["{ms}", "{pt}", "--atol", "-1", "--rtol", "0"], "--atol must be a finite number"),
    (["{ms}", "{pt}", "--rtol", "1e-4"], "give both or neither"),
    (["{ms}", "{pt}", "--map", "nomap.yaml"], "nomap.yaml"),
    (["{ms}", "{pt}", "--map", "{badmap}"], "badmap.yaml"),
    (["{ms}", "{pt}", "--init", "noinit.pth"], "no such file"),
    (["{ms}", "{pt}", "--json", "{existing}"], "already exists"),
    (["{ms}", "{pt}", "--json", "{existing}", "--force", "--init", "noinit.pth"], "no such file"),
    (["{ms}", "{pt}", "--bogus"], "no such option"),
])
def test_bad_input(align, ckpts, tmp_path, args, needle):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"\x0a\x05garbage-not-a-checkpoint")
    badmap = tmp_path / "badmap.yaml"
    badmap.write_text("rename: [unclosed\n")
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    paths = {"pt": ckpts["pt"], "ms": ckpts["ms"], "corrupt": corrupt, "badmap": badmap, "existing": existing}
    proc = align("diff", *[a.format(**paths) for a in args], cwd=tmp_path)
    assert_one_line_error(proc, needle)
    assert existing.read_text() == "{}"


def test_allow_pickle_needed_for_pickled_pth(align, ckpts, tmp_path):
    import torch

    pickled = tmp_path / "pickled.pth"
    torch.save({"model": torch.load(ckpts["pt"]), "args": argparse.Namespace(lr=0.1)}, pickled)
    proc = align("diff", pickled, ckpts["pt"])
    assert proc.returncode == 2 and "pickle" in proc.stderr.lower(), proc.stderr
    assert align("diff", pickled, ckpts["pt"], "--trust-pickle").returncode == 0
    assert align("diff", pickled, ckpts["pt"], "--allow-pickle").returncode == 0  # the old spelling, hidden


def test_wrong_lr_hint_names_the_ratio(align, ckpts):
    proc = align("diff", ckpts["ms_lr"], ckpts["pt"], "--init", ckpts["init"], "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    hints = {h["rule"]: h for h in json.loads(proc.stdout)["hints"]}
    assert set(hints) == {"learning-rate-ratio"}, hints
    assert "1.1x" in hints["learning-rate-ratio"]["message"]
    assert set(hints["learning-rate-ratio"]["where"]) <= set(TRAINABLE) and "fc.weight" in hints[
        "learning-rate-ratio"]["where"]
    text = align("diff", ckpts["ms_lr"], ckpts["pt"], "--init", ckpts["init"])
    assert "hint: every updated parameter moved 1.1x as far in A as in B" in text.stdout
    assert "learning rate differs" in text.stdout


def test_bn_momentum_in_the_other_convention_is_named(align, ckpts):
    # MindSpore momentum=0.1 keeps 10% of the old statistic where torch's 0.1 keeps 90%: A's statistics move 9x as far
    proc = align("diff", ckpts["ms_bn"], ckpts["pt"], "--init", ckpts["init"], "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["differences"]) == {"bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                                          "bn2.running_var"}
    (hint,) = result["hints"]
    assert hint["rule"] == "bn-momentum" and "9x" in hint["message"] and "A's momentum" in hint["message"]
    assert sorted(hint["where"]) == sorted(result["differences"])
    # without --init, one step from a fresh BatchNorm (mean 0, variance 1) tells the same
    bare = json.loads(align("diff", ckpts["ms_bn"], ckpts["pt"], "--json", "-").stdout)
    assert [h["rule"] for h in bare["hints"]] == ["bn-momentum"] and "pass --init" in bare["hints"][0]["message"]
    # the other way round B is the one in the wrong convention (ratio 1/9)
    swapped = json.loads(align("diff", ckpts["pt"], ckpts["ms_bn"], "--json", "-").stdout)
    assert [h["rule"] for h in swapped["hints"]] == ["bn-momentum"] and "B's momentum" in swapped["hints"][0][
        "message"]
    text = align("diff", ckpts["ms_bn"], ckpts["pt"])
    assert "hint: BatchNorm running statistics moved 9x as far in A as in B" in text.stdout


def test_updated_on_one_side_hint(align, ckpts):
    proc = align("diff", ckpts["ms_frozen"], ckpts["pt"], "--init", ckpts["init"], "--json", "-")
    hints = json.loads(proc.stdout)["hints"]
    assert [h["rule"] for h in hints] == ["updated-one-side"]
    assert hints[0]["where"] == ["fc.bias"] and "updated in B only" in hints[0]["message"]
    assert "left out of A's optimizer" in hints[0]["message"]


def test_no_hints_on_the_clean_pair_with_init(align, ckpts):
    result = json.loads(align("diff", ckpts["ms"], ckpts["pt"], "--init", ckpts["init"], "--json", "-").stdout)
    assert result["hints"] == []


def test_json_is_strict_even_with_infinite_metrics(align, ckpts, tmp_path):
    import torch

    state = torch.load(ckpts["pt"])
    state["fc.bias"] = torch.full_like(state["fc.bias"], float("inf"))
    edited = tmp_path / "inf.pth"
    torch.save(state, edited)
    out = tmp_path / "d.json"
    for target in ("-", out):
        proc = align("diff", edited, ckpts["pt"], "--json", target)
        assert proc.returncode == 1, proc.stderr
        text = proc.stdout if target == "-" else out.read_text()
        assert "Infinity" not in text and "NaN" not in text
        json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_library_result_is_typed():
    from aligner.pipelines.diff.checkpoints import DiffResult, DiffStatus, diff_checkpoints  # noqa: F401

    assert DiffStatus("update differs") is DiffStatus.UPDATE_DIFFERS and DiffStatus.EQUAL.value == "equal"


def test_per_name_tolerance_override(align, ckpts):
    # a loose tolerance on every parameter lets the 10% lr error pass; a tight one on fc.* still catches it there
    loose = align("diff", ckpts["ms_lr"], ckpts["pt"], "--rtol", "1", "--atol", "1", "--json", "-")
    assert loose.returncode == 0, loose.stdout[-500:]
    mixed = align("diff", ckpts["ms_lr"], ckpts["pt"], "--rtol", "1", "--atol", "1", "--rtol", "fc.*:0",
                  "--atol", "fc.*:0", "--json", "-")
    assert mixed.returncode == 1
    assert set(json.loads(mixed.stdout)["differences"]) == {"fc.weight", "fc.bias"}


def test_nothing_compared_is_never_a_pass(align, tmp_path):
    """Two checkpoints holding no tensor: nothing was compared, and the verdict says so with exit code 1 (it said
    "All 0 compared parameters agree", exit 0)."""
    from safetensors.numpy import save_file

    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    proc = align("diff", empty, empty, "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["passed"] is False and json.loads(proc.stdout)["compared"] == 0
    text = align("diff", empty, empty)
    assert text.returncode == 1 and "Nothing compared" in text.stdout and "not a pass" in text.stdout


def test_names_of_no_known_convention_are_paired_as_they_are(align, tmp_path):
    """Neither checkpoint's names tell a framework: diff pairs them as they are (it used to ask for a --from option
    that diff does not have) and counts the key on one side only in its verdict line."""
    from safetensors.numpy import save_file

    save_file({"w": np.ones((3, 3), np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"w": np.ones((3, 3), np.float32), "v": np.ones(2, np.float32)}, str(tmp_path / "b.safetensors"))
    proc = align("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 of 2 tensors compared, all agree" in proc.stdout and "not compared: 1 only in B" in proc.stdout
    other = align("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--strict")
    assert other.returncode == 1, other.stdout + other.stderr


def test_saved_map_of_convert_works_in_the_natural_order(align, tmp_path):
    """`convert pt -> ms --save-map map.yaml`, then `diff converted.ckpt pt.pth --map map.yaml` (A the converted
    file, B the original: the map names B's tensors as its sources). diff refused it ("rename target(s) not in
    pt.pth"); it now reads the map backwards, as compare does either way round. The map crosses two blocks of one
    layout (structural matching would pair them in order, wrongly) and splits a fused qkv, so only the map, applied
    backwards (renames inverted, the split as a concat), pairs every tensor with its own values."""
    import mindspore as ms
    import torch

    rng = np.random.default_rng(0)
    pt = {"first.weight": rng.standard_normal((4, 3)), "second.weight": rng.standard_normal((4, 3)),
          "attn.qkv.weight": rng.standard_normal((12, 4)), "attn.qkv.bias": rng.standard_normal(12)}
    torch.save({k: torch.tensor(v, dtype=torch.float32) for k, v in pt.items()}, tmp_path / "pt.pth")
    like = {"x.weight": (4, 3), "y.weight": (4, 3), **{f"attn.{p}.{leaf}": (4, 4) if leaf == "weight" else (4,)
                                                         for p in "qkv" for leaf in ("weight", "bias")}}
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(np.zeros(s, np.float32))} for k, s in like.items()],
                       str(tmp_path / "like.ckpt"))
    (tmp_path / "cross.yaml").write_text("rename: {first.weight: y.weight, second.weight: x.weight}\n")
    conv = align("convert", tmp_path / "pt.pth", "-o", tmp_path / "conv.ckpt", "--like", tmp_path / "like.ckpt",
                 "--map", tmp_path / "cross.yaml", "--save-map", tmp_path / "map.yaml")
    assert conv.returncode == 0, conv.stdout + conv.stderr
    assert "op: split" in (tmp_path / "map.yaml").read_text()
    proc = align("diff", tmp_path / "conv.ckpt", tmp_path / "pt.pth", "--map", tmp_path / "map.yaml", "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["compared"] == 4 and not result["differences"] and not result["one_side"]
    rows = {p["name"]: p["sources"] for p in result["params"]}
    assert rows["first.weight"] == ["y.weight"] and rows["attn.qkv.weight"] == ["attn.q.weight", "attn.k.weight",
                                                                                "attn.v.weight"]
    assert any("applied in reverse" in n for n in result["notes"])
    # the map's own direction still works; without the map diff cannot pair them (no pass)
    assert align("diff", tmp_path / "pt.pth", tmp_path / "conv.ckpt", "--map", tmp_path / "map.yaml").returncode == 0
    assert align("diff", tmp_path / "conv.ckpt", tmp_path / "pt.pth").returncode != 0


def test_reversed_map_inverts_each_transform(tmp_path):
    """UserMap.reversed: a tied rename's second name dropped, transpose by the inverse permutation, reshape back
    to the source's shape, concat of equal parts as a split; regex rules cannot run backwards (one clear error)."""
    from aligner.core.errors import AlignerError
    from aligner.io.base import TensorInfo
    from aligner.mapping import load_user_map
    from aligner.mapping.transforms import Concat, Reshape, Split, Transpose

    path = tmp_path / "m.yaml"
    path.write_text("rename: {e.weight: [emb.w, head.w]}\ntransforms:\n"
                    "  - {op: transpose, source: t, perm: [1, 2, 0], target: t2}\n"
                    "  - {op: reshape, source: r, shape: [4, 1, 3], target: r2}\n"
                    "  - {op: concat, sources: [a, b], axis: 0, target: ab}\n")
    shapes = {"r": TensorInfo((4, 3), "float32"), "a": TensorInfo((2, 3), "float32"),
              "b": TensorInfo((2, 3), "float32")}
    back = load_user_map(str(path)).reversed(shapes)
    assert back.rename == {"emb.w": ["e.weight"]} and back.targets("head.w") == []
    ops = {t.sources: t.outputs for t in back.transforms}
    assert ops[("t2",)] == (("t", Transpose((2, 0, 1))),) and ops[("r2",)] == (("r", Reshape((4, 3))),)
    assert ops[("ab",)] == (("a", Split(0, 2, 0)), ("b", Split(0, 2, 1)))
    x = np.arange(24).reshape(2, 3, 4)
    assert np.array_equal(Transpose((2, 0, 1)).apply([Transpose((1, 2, 0)).apply([x])]), x)
    path.write_text("transforms:\n  - {op: split, source: qkv, axis: 0, targets: [q, k, v]}\n")
    assert load_user_map(str(path)).reversed({}).transforms[0].outputs == (("qkv", Concat(0)),)
    path.write_text("regex: [['^a\\\\.(.*)', 'b.\\\\1']]\n")
    with pytest.raises(AlignerError, match="regex rules cannot be read backwards"):
        load_user_map(str(path)).reversed({})
