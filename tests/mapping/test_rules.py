"""The mapping layer without running models: target-guided structural matching, ambiguity, user maps, --save-map,
tied weights and num_batches_tracked. Checkpoints are real files (torch.save / mindspore.save_checkpoint) holding
random values, and every test checks where each value ends up, not only the names."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from aligner.cli import main as align_main
from aligner.core.errors import AlignerError
from aligner.pipelines.convert.checkpoint import convert, state_dict_to
from tests.support.checkpoints import rand, read, save_ckpt, save_pth

# ------------------------------------------------------------------------------------------------------- helpers

def bn_torch(rng: np.random.Generator, prefix: str, c: int) -> dict[str, np.ndarray]:
    return {f"{prefix}.weight": rand(rng, c), f"{prefix}.bias": rand(rng, c), f"{prefix}.running_mean": rand(rng, c),
            f"{prefix}.running_var": rng.uniform(0.5, 2, c).astype(np.float32),
            f"{prefix}.num_batches_tracked": np.array(17, np.int64)}


def bn_ms(rng: np.random.Generator, prefix: str, c: int) -> dict[str, np.ndarray]:
    return {f"{prefix}.moving_mean": rand(rng, c),
            f"{prefix}.moving_variance": rng.uniform(0.5, 2, c).astype(np.float32),
            f"{prefix}.gamma": rand(rng, c), f"{prefix}.beta": rand(rng, c)}


def cli(*args) -> int:
    """`align ...` in-process; returns the exit code."""
    try:
        align_main([str(a) for a in args])
    except SystemExit as exit_info:
        return exit_info.code if isinstance(exit_info.code, int) else 0
    return 0


def statuses(plan) -> dict[str, str]:
    """target (or first source, for entries not written) -> status."""
    return {e.target or e.sources[0]: e.status for e in plan.entries}


# ------------------------------------------------------------------------------------ structural matching (--like)

def resnet_like_torch(rng):
    state = {"conv1.weight": rand(rng, 8, 3, 3, 3), **bn_torch(rng, "bn1", 8),
             "layer1.0.conv1.weight": rand(rng, 16, 8, 3, 3), **bn_torch(rng, "layer1.0.bn1", 16),
             "layer1.0.downsample.0.weight": rand(rng, 16, 8, 1, 1), **bn_torch(rng, "layer1.0.downsample.1", 16),
             "fc.weight": rand(rng, 10, 16), "fc.bias": rand(rng, 10)}
    return state


def resnet_like_ms_init(rng):
    """The MindSpore twin's names: `down_sample` and `classifier` differ beyond the rules."""
    return {"conv1.weight": rand(rng, 8, 3, 3, 3), **bn_ms(rng, "bn1", 8),
            "layer1.0.conv1.weight": rand(rng, 16, 8, 3, 3), **bn_ms(rng, "layer1.0.bn1", 16),
            "layer1.0.down_sample.0.weight": rand(rng, 16, 8, 1, 1), **bn_ms(rng, "layer1.0.down_sample.1", 16),
            "classifier.weight": rand(rng, 10, 16), "classifier.bias": rand(rng, 10)}


def test_structural_match_with_like_places_renamed_modules(tmp_path) -> None:
    rng = np.random.default_rng(0)
    src = resnet_like_torch(rng)
    like = save_ckpt(tmp_path / "init.ckpt", resnet_like_ms_init(rng))
    plan = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), like_path=like)
    assert not plan.failures, [e.to_dict() for e in plan.failures]
    st = statuses(plan)
    assert st["layer1.0.down_sample.0.weight"] == "structural"
    assert st["layer1.0.down_sample.1.gamma"] == "structural"
    assert st["classifier.weight"] == "structural" and st["classifier.bias"] == "structural"
    assert st["bn1.gamma"] == "renamed" and st["conv1.weight"] == "unchanged"

    out = read(tmp_path / "b.ckpt")
    assert set(out) == set(resnet_like_ms_init(rng))   # exactly the target's keys
    expect = {"conv1.weight": "conv1.weight", "bn1.gamma": "bn1.weight", "bn1.moving_variance": "bn1.running_var",
              "layer1.0.down_sample.0.weight": "layer1.0.downsample.0.weight",
              "layer1.0.down_sample.1.gamma": "layer1.0.downsample.1.weight",
              "layer1.0.down_sample.1.beta": "layer1.0.downsample.1.bias",
              "layer1.0.down_sample.1.moving_mean": "layer1.0.downsample.1.running_mean",
              "layer1.0.down_sample.1.moving_variance": "layer1.0.downsample.1.running_var",
              "classifier.weight": "fc.weight", "classifier.bias": "fc.bias"}
    for target, source in expect.items():
        np.testing.assert_array_equal(out[target], src[source], err_msg=target)


def test_structural_match_going_to_torch(tmp_path) -> None:
    """The same renamed modules the other way: MindSpore names, torch target; num_batches_tracked recreated."""
    rng = np.random.default_rng(1)
    src = resnet_like_ms_init(rng)
    torch_init = resnet_like_torch(rng)
    like = save_pth(tmp_path / "init.pth", torch_init)
    assert cli("convert", save_ckpt(tmp_path / "a.ckpt", src), "-o", tmp_path / "b.pth", "--like", like) == 0
    out = read(tmp_path / "b.pth")
    assert list(out) == list(torch_init)        # the target's keys, in the target's order
    np.testing.assert_array_equal(out["layer1.0.downsample.1.running_var"],
                                  src["layer1.0.down_sample.1.moving_variance"])
    np.testing.assert_array_equal(out["fc.weight"], src["classifier.weight"])
    assert out["layer1.0.downsample.1.num_batches_tracked"].dtype == np.int64
    assert int(out["layer1.0.downsample.1.num_batches_tracked"]) == 0


def test_ambiguous_match_is_reported_not_guessed(tmp_path) -> None:
    """Two source modules with the same layout and equally similar names for one target module: no guess."""
    rng = np.random.default_rng(2)
    src = {"stem.weight": rand(rng, 4, 3), "stem.bias": rand(rng, 4),
           "proj_a.weight": rand(rng, 6, 4), "proj_a.bias": rand(rng, 6),
           "proj_b.weight": rand(rng, 6, 4), "proj_b.bias": rand(rng, 6)}
    like = save_ckpt(tmp_path / "init.ckpt", {"stem.weight": rand(rng, 4, 3), "stem.bias": rand(rng, 4),
                                              "proj.weight": rand(rng, 6, 4), "proj.bias": rand(rng, 6)})
    plan = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), like_path=like)
    failing = {e.target: e for e in plan.failures}
    assert set(failing) == {"proj.weight", "proj.bias"}
    assert all(e.status == "ambiguous" for e in failing.values())
    assert "proj_a.weight" in failing["proj.weight"].reason and "proj_b.weight" in failing["proj.weight"].reason
    assert not (tmp_path / "b.ckpt").exists()      # nothing written
    # the CLI says so with exit code 1, and writes nothing either
    assert cli("convert", tmp_path / "a.pth", "-o", tmp_path / "c.ckpt", "--like", like) == 1
    assert not (tmp_path / "c.ckpt").exists()


def test_ambiguity_resolved_by_a_user_rename(tmp_path) -> None:
    rng = np.random.default_rng(3)
    src = {"proj_a.weight": rand(rng, 6, 4), "proj_a.bias": rand(rng, 6),
           "proj_b.weight": rand(rng, 6, 4), "proj_b.bias": rand(rng, 6)}
    like = save_ckpt(tmp_path / "init.ckpt", {"proj.weight": rand(rng, 6, 4), "proj.bias": rand(rng, 6)})
    (tmp_path / "m.yaml").write_text("rename: {proj_b.weight: proj.weight, proj_b.bias: proj.bias}\n"
                                     "drop: ['^proj_a\\.']\n")
    plan = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), like_path=like,
                   map_path=str(tmp_path / "m.yaml"))
    assert not plan.failures
    out = read(tmp_path / "b.ckpt")
    np.testing.assert_array_equal(out["proj.weight"], src["proj_b.weight"])
    np.testing.assert_array_equal(out["proj.bias"], src["proj_b.bias"])


# ---------------------------------------------------------------------------------------------------- user maps

USER_MAP = """
rename:
  head.weight: classifier.weight
  head.bias: classifier.bias
regex:
  - ['^blocks\\.(\\d+)\\.', 'layers.\\1.']
drop:
  - '^aux\\.'
transforms:
  - {op: split, source: attn.qkv.weight, axis: 0, targets: [attn.q.weight, attn.k.weight, attn.v.weight]}
  - {op: concat, sources: [mlp.gate.weight, mlp.up.weight], axis: 0, target: mlp.gate_up.weight}
  - {op: reshape, source: pos_embed, shape: [5, 4], target: pos_table}
  - {op: transpose, source: proj.weight, perm: [1, 0], target: proj.weight_t}
"""


def user_map_source(rng):
    return {"attn.qkv.weight": rand(rng, 12, 4), "mlp.gate.weight": rand(rng, 3, 4), "mlp.up.weight": rand(rng, 3, 4),
            "pos_embed": rand(rng, 1, 5, 4), "proj.weight": rand(rng, 3, 4),
            "head.weight": rand(rng, 2, 4), "head.bias": rand(rng, 2),
            "blocks.0.fc.weight": rand(rng, 4, 4), "blocks.1.fc.weight": rand(rng, 4, 4),
            "blocks.0.norm.weight": rand(rng, 4), "blocks.0.norm.bias": rand(rng, 4),
            "aux.weight": rand(rng, 4, 4), "aux.bias": rand(rng, 4),
            "ln.weight": rand(rng, 4), "ln.bias": rand(rng, 4)}


def check_user_map_output(out: dict[str, np.ndarray], src: dict[str, np.ndarray]) -> None:
    q, k, v = np.split(src["attn.qkv.weight"], 3, axis=0)
    np.testing.assert_array_equal(out["attn.q.weight"], q)
    np.testing.assert_array_equal(out["attn.k.weight"], k)
    np.testing.assert_array_equal(out["attn.v.weight"], v)
    np.testing.assert_array_equal(out["mlp.gate_up.weight"],
                                  np.concatenate([src["mlp.gate.weight"], src["mlp.up.weight"]], axis=0))
    np.testing.assert_array_equal(out["pos_table"], src["pos_embed"].reshape(5, 4))
    np.testing.assert_array_equal(out["proj.weight_t"], src["proj.weight"].T)
    np.testing.assert_array_equal(out["classifier.weight"], src["head.weight"])
    np.testing.assert_array_equal(out["classifier.bias"], src["head.bias"])
    np.testing.assert_array_equal(out["layers.0.fc.weight"], src["blocks.0.fc.weight"])
    np.testing.assert_array_equal(out["layers.1.fc.weight"], src["blocks.1.fc.weight"])
    # a user rule overrides the built-in rules for the names it matches: the regex keeps `weight`, not `gamma`
    np.testing.assert_array_equal(out["layers.0.norm.weight"], src["blocks.0.norm.weight"])
    # names no user rule matches still go through the built-in rules
    np.testing.assert_array_equal(out["ln.gamma"], src["ln.weight"])
    np.testing.assert_array_equal(out["ln.beta"], src["ln.bias"])
    assert set(out) == {"attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.gate_up.weight", "pos_table",
                        "proj.weight_t", "classifier.weight", "classifier.bias", "layers.0.fc.weight",
                        "layers.1.fc.weight", "layers.0.norm.weight", "layers.0.norm.bias", "ln.gamma", "ln.beta"}


def test_user_map_rename_regex_drop_and_transforms(tmp_path) -> None:
    rng = np.random.default_rng(4)
    src = user_map_source(rng)
    (tmp_path / "m.yaml").write_text(USER_MAP)
    pth = save_pth(tmp_path / "a.pth", src)
    assert cli("convert", pth, "-o", tmp_path / "b.ckpt", "--map", tmp_path / "m.yaml") == 0
    check_user_map_output(read(tmp_path / "b.ckpt"), src)


def test_user_transform_with_bad_shape_is_one_clear_error(tmp_path) -> None:
    rng = np.random.default_rng(5)
    (tmp_path / "m.yaml").write_text("transforms:\n  - {op: split, source: w, axis: 0, targets: [a, b]}\n")
    with pytest.raises(AlignerError, match="split"):
        convert(save_pth(tmp_path / "a.pth", {"w": rand(rng, 5, 4)}), str(tmp_path / "b.ckpt"),
                map_path=str(tmp_path / "m.yaml"))
    assert not (tmp_path / "b.ckpt").exists()


# ------------------------------------------------------------------------------------------- --save-map / --map

def test_save_map_reloaded_with_map_gives_the_same_checkpoint(tmp_path) -> None:
    """Rules, structural matches, drops and Conv1d/BatchNorm3d reshapes/nesting resolved with --like, saved, and
    replayed with --map alone (no --like): the same tensors under the same names."""
    rng = np.random.default_rng(6)
    src = {**resnet_like_torch(rng), "seq.conv.weight": rand(rng, 4, 3, 3), "seq.conv.bias": rand(rng, 4),
           **bn_torch(rng, "seq.bn3d", 4)}
    like_state = {**resnet_like_ms_init(rng), "seq.conv.weight": rand(rng, 4, 3, 1, 3), "seq.conv.bias": rand(rng, 4),
                  **bn_ms(rng, "seq.bn3d.bn2d", 4)}
    like = save_ckpt(tmp_path / "init.ckpt", like_state)
    pth = save_pth(tmp_path / "a.pth", src)
    assert cli("convert", pth, "-o", tmp_path / "b.ckpt", "--like", like, "--save-map", tmp_path / "m.yaml") == 0
    saved = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert saved["rename"]["fc.weight"] == "classifier.weight"
    assert saved["rename"]["seq.bn3d.weight"] == "seq.bn3d.bn2d.gamma"
    assert any(t["source"] == "seq.conv.weight" and t["shape"] == [4, 3, 1, 3] for t in saved["transforms"])

    assert cli("convert", pth, "-o", tmp_path / "c.ckpt", "--map", tmp_path / "m.yaml") == 0
    first, second = read(tmp_path / "b.ckpt"), read(tmp_path / "c.ckpt")
    assert list(first) == list(like_state)
    assert set(second) == set(first)
    for name in first:
        assert first[name].dtype == second[name].dtype
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    np.testing.assert_array_equal(first["seq.conv.weight"], src["seq.conv.weight"][:, :, None, :])


def test_save_map_with_user_transforms_reloads(tmp_path) -> None:
    rng = np.random.default_rng(7)
    src = user_map_source(rng)
    (tmp_path / "m.yaml").write_text(USER_MAP)
    pth = save_pth(tmp_path / "a.pth", src)
    assert cli("convert", pth, "-o", tmp_path / "b.ckpt", "--map", tmp_path / "m.yaml",
               "--save-map", tmp_path / "saved.yaml") == 0
    convert(pth, str(tmp_path / "c.ckpt"), map_path=str(tmp_path / "saved.yaml"))
    check_user_map_output(read(tmp_path / "c.ckpt"), src)


# ------------------------------------------------------------------------------------------------- tied weights

def tied_torch_file(path, rng) -> tuple[str, np.ndarray]:
    """A torch state_dict where the embedding and the output head are one tensor (weight tying)."""
    shared = torch.from_numpy(rand(rng, 10, 4))
    torch.save({"embedding.weight": shared, "norm.weight": torch.from_numpy(rand(rng, 4)),
                "norm.bias": torch.from_numpy(rand(rng, 4)), "head.weight": shared}, path)
    return str(path), shared.numpy().copy()


def test_tied_weights_to_mindspore_with_a_target_that_stores_them_once(tmp_path) -> None:
    """A MindSpore model that ties by sharing one Parameter saves it once: the second torch name is dropped as tied."""
    rng = np.random.default_rng(8)
    pth, shared = tied_torch_file(tmp_path / "a.pth", rng)
    like = save_ckpt(tmp_path / "init.ckpt", {"embedding.embedding_table": rand(rng, 10, 4),
                                              "norm.gamma": rand(rng, 4), "norm.beta": rand(rng, 4)})
    plan = convert(pth, str(tmp_path / "b.ckpt"), like_path=like)
    assert not plan.failures
    head = next(e for e in plan.entries if e.sources == ["head.weight"])
    assert head.status == "dropped" and "tied to embedding.weight" in head.reason
    out = read(tmp_path / "b.ckpt")
    assert set(out) == {"embedding.embedding_table", "norm.gamma", "norm.beta"}
    np.testing.assert_array_equal(out["embedding.embedding_table"], shared)


def test_tied_weights_without_target_keep_both_names(tmp_path) -> None:
    rng = np.random.default_rng(9)
    pth, shared = tied_torch_file(tmp_path / "a.pth", rng)
    plan = convert(pth, str(tmp_path / "b.ckpt"))
    assert any("tied weights" in n and "head.weight = embedding.weight" in n for n in plan.notes)
    out = read(tmp_path / "b.ckpt")
    np.testing.assert_array_equal(out["embedding.embedding_table"], shared)
    np.testing.assert_array_equal(out["head.weight"], shared)


def test_one_mindspore_tensor_to_two_tied_torch_names(tmp_path) -> None:
    """Back to torch: a rename to a list of names fills both tied keys; load_state_dict(strict) accepts it."""
    rng = np.random.default_rng(10)
    table = rand(rng, 10, 4)
    ckpt = save_ckpt(tmp_path / "a.ckpt", {"embedding.embedding_table": table, "norm.gamma": rand(rng, 4),
                                           "norm.beta": rand(rng, 4)})
    model = torch.nn.Module()
    model.embedding = torch.nn.Embedding(10, 4)
    model.norm = torch.nn.LayerNorm(4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.embedding.weight
    like = str(tmp_path / "init.pth")
    torch.save(model.state_dict(), like)
    # without a map the second name has no source: reported missing, nothing written
    plan = convert(ckpt, str(tmp_path / "b.pth"), like_path=like)
    assert [(e.target, e.status) for e in plan.failures] == [("head.weight", "missing")]
    (tmp_path / "m.yaml").write_text("rename: {embedding.embedding_table: [embedding.weight, head.weight]}\n")
    plan = convert(ckpt, str(tmp_path / "b.pth"), like_path=like, map_path=str(tmp_path / "m.yaml"))
    assert not plan.failures
    state = torch.load(tmp_path / "b.pth", weights_only=True)
    model.load_state_dict(state, strict=True)
    np.testing.assert_array_equal(model.head.weight.detach().numpy(), table)
    np.testing.assert_array_equal(state["embedding.weight"].numpy(), table)


# ------------------------------------------------------------------------------------------ num_batches_tracked

def test_mindspore_to_torch_recreates_num_batches_tracked(tmp_path) -> None:
    rng = np.random.default_rng(11)
    src = {"conv.weight": rand(rng, 4, 3, 3, 3), **bn_ms(rng, "bn", 4), **bn_ms(rng, "bn3d.bn2d", 4)}
    assert cli("convert", save_ckpt(tmp_path / "a.ckpt", src), "-o", tmp_path / "b.pth") == 0
    out = read(tmp_path / "b.pth")
    assert set(out) == {"conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                        "bn.num_batches_tracked", "bn3d.weight", "bn3d.bias", "bn3d.running_mean",
                        "bn3d.running_var", "bn3d.num_batches_tracked"}
    for prefix in ("bn", "bn3d"):
        counter = out[f"{prefix}.num_batches_tracked"]
        assert counter.dtype == np.int64 and counter.shape == () and int(counter) == 0
    np.testing.assert_array_equal(out["bn3d.running_var"], src["bn3d.bn2d.moving_variance"])
    np.testing.assert_array_equal(out["bn.weight"], src["bn.gamma"])
    # a real torch BatchNorm loads it strictly
    model = torch.nn.Module()
    model.conv, model.bn, model.bn3d = torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4), \
        torch.nn.BatchNorm3d(4)
    model.load_state_dict(torch.load(tmp_path / "b.pth", weights_only=True), strict=True)


def test_num_batches_tracked_round_trip_in_memory() -> None:
    """state_dict_to: torch -> MindSpore drops the counter, MindSpore -> torch recreates it (as 0)."""
    rng = np.random.default_rng(12)
    src = bn_torch(rng, "features.3", 5)
    ms_state = state_dict_to("mindspore", src, "pytorch")
    assert set(ms_state) == {"features.3.gamma", "features.3.beta", "features.3.moving_mean",
                             "features.3.moving_variance"}
    back = state_dict_to("pytorch", ms_state, "mindspore")
    assert set(back) == set(src)
    for name, value in src.items():
        if name.endswith("num_batches_tracked"):
            assert back[name].dtype == np.int64 and int(back[name]) == 0
        else:
            np.testing.assert_array_equal(back[name], value, err_msg=name)
