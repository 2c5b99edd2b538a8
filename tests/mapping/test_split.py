"""Regex split/concat entries in user maps, and fused-tensor detection under `--like` (qkv -> query/key/value,
gate_up -> gate/up). Checkpoints are real files (torch.save / mindspore.save_checkpoint) holding random values; every
test checks where each value ends up, and every bad map is one line on stderr with exit 2 and nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from aligner.core.errors import AlignerError
from aligner.mapping.fused import detect
from aligner.pipelines.convert.checkpoint import convert
from tests.support.checkpoints import rand, read, save_ckpt, save_pth
from tests.support.cli import align_in_process, assert_one_line_error

C, BLOCKS = 4, 12


def vit_source(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """timm-style blocks: a fused qkv Linear and a proj Linear per block."""
    state = {}
    for b in range(BLOCKS):
        state |= {f"blocks.{b}.attn.qkv.weight": rand(rng, 3 * C, C), f"blocks.{b}.attn.qkv.bias": rand(rng, 3 * C),
                  f"blocks.{b}.attn.proj.weight": rand(rng, C, C), f"blocks.{b}.attn.proj.bias": rand(rng, C)}
    return state


def hf_target(rng: np.random.Generator, blocks: range = range(BLOCKS), dtype=np.float32) -> dict[str, np.ndarray]:
    """Hugging Face ViT-style names: separate query/key/value under `attention.attention`, proj as output.dense."""
    state = {}
    for b in blocks:
        for part in ("query", "key", "value", "output_dense"):
            prefix = f"encoder.layer.{b}.attention." + ("output.dense" if part == "output_dense"
                                                        else f"attention.{part}")
            state |= {f"{prefix}.weight": rand(rng, C, C).astype(dtype), f"{prefix}.bias": rand(rng, C).astype(dtype)}
    return state


def check_qkv(out: dict[str, np.ndarray], src: dict[str, np.ndarray], blocks=range(BLOCKS)) -> None:
    """Rows [0:C] are the query, [C:2C] the key, [2C:3C] the value of each block; proj is the output dense."""
    for b in blocks:
        for leaf in ("weight", "bias"):
            fused = src[f"blocks.{b}.attn.qkv.{leaf}"]
            for i, part in enumerate(("query", "key", "value")):
                got = out[f"encoder.layer.{b}.attention.attention.{part}.{leaf}"]
                np.testing.assert_array_equal(got, fused[i * C:(i + 1) * C], err_msg=f"{b} {part} {leaf}")
            np.testing.assert_array_equal(out[f"encoder.layer.{b}.attention.output.dense.{leaf}"],
                                          src[f"blocks.{b}.attn.proj.{leaf}"])


REGEX_MAP = r"""
rename:
  blocks.0.attn.proj.weight: encoder.layer.0.attention.output.dense.weight
regex:
  - ['^blocks\.(\d+)\.attn\.proj\.(weight|bias)$', 'encoder.layer.\1.attention.output.dense.\2']
transforms:
  - {op: split, pattern: 'blocks\.(\d+)\.attn\.qkv\.(weight|bias)', axis: 0,
     targets: ['encoder.layer.\1.attention.attention.query.\2', 'encoder.layer.\1.attention.attention.key.\2',
               'encoder.layer.\1.attention.attention.value.\2']}
"""


# ------------------------------------------------------------------------------------------ regex transforms

def test_one_regex_split_entry_splits_every_block(tmp_path) -> None:
    rng = np.random.default_rng(0)
    src = vit_source(rng)
    (tmp_path / "m.yaml").write_text(REGEX_MAP)
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), map_path=str(tmp_path / "m.yaml"))
    out = read(tmp_path / "b.ckpt")
    assert len(out) == BLOCKS * 8 and result.written
    check_qkv(out, src)
    split = [e for e in result.entries if e.sources == ["blocks.7.attn.qkv.bias"]]
    assert [e.target for e in split] == [f"encoder.layer.7.attention.attention.{p}.bias" for p in ("query", "key",
                                                                                                   "value")]
    assert all(e.reason == "user transform #1 (split)" for e in split)


def test_regex_concat_groups_matches_by_their_captured_groups(tmp_path) -> None:
    """gate and up of 3 layers, listed in an order that interleaves them, are joined per layer (gate rows first)."""
    rng = np.random.default_rng(1)
    src = {}
    for b in (2, 0, 1):
        src[f"layers.{b}.mlp.up_proj.weight"] = rand(rng, 3, C)
        src[f"layers.{b}.mlp.gate_proj.weight"] = rand(rng, 3, C)
    (tmp_path / "m.yaml").write_text(
        "transforms:\n  - {op: concat, axis: 0, target: 'h.\\g<n>.gate_up.weight',\n"
        "     patterns: ['layers\\.(?P<n>\\d+)\\.mlp\\.gate_proj\\.weight',\n"
        "                'layers\\.(?P<n>\\d+)\\.mlp\\.up_proj\\.weight']}\n")
    convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), map_path=str(tmp_path / "m.yaml"))
    out = read(tmp_path / "b.ckpt")
    assert set(out) == {f"h.{b}.gate_up.weight" for b in range(3)}
    for b in range(3):
        np.testing.assert_array_equal(out[f"h.{b}.gate_up.weight"], np.concatenate(
            [src[f"layers.{b}.mlp.gate_proj.weight"], src[f"layers.{b}.mlp.up_proj.weight"]]))


def test_regex_reshape_and_transpose_with_backrefs(tmp_path) -> None:
    rng = np.random.default_rng(2)
    src = {"a.0.w": rand(rng, 2, 6), "a.1.w": rand(rng, 2, 6), "b.0.pos": rand(rng, 1, 3, 4)}
    (tmp_path / "m.yaml").write_text(
        "transforms:\n"
        "  - {op: transpose, pattern: 'a\\.(\\d)\\.w', perm: [1, 0], target: 'a.\\1.w_t'}\n"
        "  - {op: reshape, pattern: 'b\\.(\\d)\\.pos', shape: [3, 4], target: 'table.\\1'}\n")
    convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), map_path=str(tmp_path / "m.yaml"))
    out = read(tmp_path / "b.ckpt")
    assert set(out) == {"a.0.w_t", "a.1.w_t", "table.0"}
    np.testing.assert_array_equal(out["a.1.w_t"], src["a.1.w"].T)
    np.testing.assert_array_equal(out["table.0"], src["b.0.pos"].reshape(3, 4))


def test_save_map_of_a_regex_split_reloads_to_the_same_checkpoint(tmp_path) -> None:
    rng = np.random.default_rng(3)
    src = vit_source(rng)
    (tmp_path / "m.yaml").write_text(REGEX_MAP)
    pth = save_pth(tmp_path / "a.pth", src)
    convert(pth, str(tmp_path / "b.ckpt"), map_path=str(tmp_path / "m.yaml"), save_map=str(tmp_path / "saved.yaml"))
    saved = yaml.safe_load((tmp_path / "saved.yaml").read_text())
    assert len([t for t in saved["transforms"] if t["op"] == "split"]) == 2 * BLOCKS  # literal, one per tensor
    convert(pth, str(tmp_path / "c.ckpt"), map_path=str(tmp_path / "saved.yaml"))
    first, second = read(tmp_path / "b.ckpt"), read(tmp_path / "c.ckpt")
    assert set(first) == set(second)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


BAD_MAPS = {
    "bad_regex": ("transforms:\n  - {op: split, pattern: 'blocks\\.(\\d+\\.qkv', axis: 0, targets: [a, b]}\n",
                  ["transform #1 (split)", "bad regex"]),
    "matches_nothing": ("transforms:\n  - {op: split, pattern: 'block\\.(\\d+)\\.attn\\.qkv\\.weight', axis: 0, "
                        "targets: ['q.\\1', 'k.\\1', 'v.\\1']}\n",
                        ["transform #1 (split)", "matches no source name", "closest: blocks."]),
    "group_out_of_range": ("transforms:\n  - {op: split, pattern: 'blocks\\.(\\d+)\\.attn\\.qkv\\.weight', axis: 0, "
                           "targets: ['q.\\2', 'k.\\1', 'v.\\1']}\n", ["refers to group \\2", "has 1 group"]),
    "unknown_named_group": ("transforms:\n  - {op: reshape, pattern: 'blocks\\.(?P<i>\\d+)\\.attn\\.proj\\.bias', "
                            "shape: [4], target: 'p.\\g<j>'}\n", ["refers to group \\g<j>"]),
    "concat_group_counts": ("transforms:\n  - {op: concat, axis: 0, target: 'x.\\1', patterns: "
                            "['blocks\\.(\\d+)\\.attn\\.qkv\\.bias', 'blocks\\.\\d+\\.attn\\.proj\\.bias']}\n",
                            ["different numbers of groups"]),
    "concat_incomplete": ("transforms:\n  - {op: concat, axis: 0, target: 'x.\\1', patterns: "
                          "['blocks\\.(\\d+)\\.attn\\.qkv\\.bias', 'blocks\\.(1\\d)\\.attn\\.proj\\.bias']}\n",
                          ["has no match with groups ('0',)"]),
    "concat_ambiguous": ("transforms:\n  - {op: concat, axis: 0, target: 'x.\\1', patterns: "
                         "['blocks\\.(\\d+)\\.attn\\.qkv\\.bias', 'blocks\\.(\\d+)\\.attn\\.(?:proj|qkv)\\.bias']}\n",
                         ["matches both blocks.0.attn.qkv.bias and blocks.0.attn.proj.bias", "ambiguous"]),
    "same_target_twice": ("transforms:\n  - {op: split, pattern: 'blocks\\.\\d+\\.attn\\.qkv\\.weight', axis: 0, "
                          "targets: [q, k, v]}\n", ["writes q", "use \\1 groups"]),
    "overlapping_entries": ("transforms:\n  - {op: split, pattern: 'blocks\\.(\\d+)\\.attn\\.qkv\\.(\\w+)', axis: 0, "
                            "targets: ['q.\\1.\\2', 'k.\\1.\\2', 'v.\\1.\\2']}\n"
                            "  - {op: split, source: blocks.3.attn.qkv.bias, axis: 0, targets: [a, b, c]}\n",
                            ["blocks.3.attn.qkv.bias is matched by both transform #1 (split) and transform #2"]),
    "source_and_pattern": ("transforms:\n  - {op: split, source: blocks.0.attn.qkv.weight, pattern: 'x', axis: 0, "
                           "targets: [a]}\n", ["gives both source and pattern"]),
    "no_source": ("transforms:\n  - {op: split, axis: 0, targets: [a]}\n", ["missing source (or pattern)"]),
    "split_unequal": ("transforms:\n  - {op: split, pattern: 'blocks\\.(\\d+)\\.attn\\.qkv\\.bias', axis: 0, "
                      "targets: ['a.\\1', 'b.\\1', 'c.\\1', 'd.\\1', 'e.\\1']}\n",
                      ["transform #1 (split) on blocks.0.attn.qkv.bias", "cannot apply"]),
}


@pytest.mark.parametrize("case", list(BAD_MAPS))
def test_bad_regex_transforms_are_one_line_errors_naming_file_and_entry(tmp_path, capsys, case) -> None:
    text, needles = BAD_MAPS[case]
    (tmp_path / "m.yaml").write_text(text)
    pth = save_pth(tmp_path / "a.pth", vit_source(np.random.default_rng(4)))
    proc = align_in_process(capsys, "convert", pth, "-o", tmp_path / "b.ckpt", "--map", tmp_path / "m.yaml")
    assert_one_line_error(proc, "m.yaml", *needles)
    assert not (tmp_path / "b.ckpt").exists()


def test_literal_entries_may_still_reuse_one_tensor(tmp_path) -> None:
    """Two literal transforms of one source (a tensor used twice) stay allowed, as before regex entries."""
    rng = np.random.default_rng(5)
    src = {"w": rand(rng, 2, 3)}
    (tmp_path / "m.yaml").write_text("transforms:\n  - {op: transpose, source: w, perm: [1, 0], target: wt}\n"
                                     "  - {op: reshape, source: w, shape: [6], target: flat}\n")
    convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"), map_path=str(tmp_path / "m.yaml"))
    out = read(tmp_path / "b.ckpt")
    np.testing.assert_array_equal(out["wt"], src["w"].T)
    np.testing.assert_array_equal(out["flat"], src["w"].reshape(6))


# ---------------------------------------------------------------------------------- fused detection (--like)

def test_like_splits_fused_qkv_of_every_block_and_reports_it(tmp_path, capsys) -> None:
    rng = np.random.default_rng(6)
    src = vit_source(rng)
    pth, like = save_pth(tmp_path / "a.pth", src), save_ckpt(tmp_path / "like.ckpt", hf_target(rng))
    proc = align_in_process(capsys, "convert", pth, "-o", tmp_path / "b.ckpt", "--like", like, "--json",
                            tmp_path / "r.json", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_qkv(read(tmp_path / "b.ckpt"), src)
    assert ("split blocks.11.attn.qkv.weight -> encoder.layer.11.attention.attention.query.weight, ...key.weight, "
            "...value.weight (axis 0)") in proc.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert len(result["splits"]) == 2 * BLOCKS
    first = result["splits"][0]
    assert first["source"] == "blocks.0.attn.qkv.weight" and first["axis"] == 0
    assert first["targets"] == [f"encoder.layer.0.attention.attention.{p}.weight" for p in ("query", "key", "value")]
    assert "same block index" in first["why"]
    short = align_in_process(capsys, "convert", pth, "-o", tmp_path / "c.ckpt", "--like", like)
    assert short.stdout.count("\nsplit blocks.") == 5 and f"split: {2 * BLOCKS - 5} more" in short.stdout


def test_like_splits_gate_up_and_casts_to_the_target_dtype(tmp_path) -> None:
    """A Llama-style fused gate_up_proj [2I, C] into gate_proj / up_proj [I, C] of a float16 target; q_proj/k_proj/
    v_proj from a `query_key_value` module (GPT-NeoX spelling)."""
    rng = np.random.default_rng(7)
    src, target = {}, {}
    for b in range(2):
        src |= {f"h.{b}.mlp.gate_up_proj.weight": rand(rng, 6, C),
                f"h.{b}.attn.query_key_value.weight": rand(rng, 3 * C, C)}
        target |= {f"model.layers.{b}.mlp.{p}_proj.weight": rand(rng, 3, C).astype(np.float16) for p in ("gate", "up")}
        target |= {f"model.layers.{b}.self_attn.{p}_proj.weight": rand(rng, C, C).astype(np.float16)
                   for p in "qkv"}
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"),
                     like_path=save_ckpt(tmp_path / "like.ckpt", target))
    assert result.written and len(result.splits) == 4
    out = read(tmp_path / "b.ckpt")
    for b in range(2):
        gate_up = src[f"h.{b}.mlp.gate_up_proj.weight"].astype(np.float16)
        np.testing.assert_array_equal(out[f"model.layers.{b}.mlp.gate_proj.weight"], gate_up[:3])
        np.testing.assert_array_equal(out[f"model.layers.{b}.mlp.up_proj.weight"], gate_up[3:])
        qkv = src[f"h.{b}.attn.query_key_value.weight"].astype(np.float16)
        for i, p in enumerate("qkv"):
            np.testing.assert_array_equal(out[f"model.layers.{b}.self_attn.{p}_proj.weight"], qkv[i * C:(i + 1) * C])
    assert out["model.layers.0.mlp.gate_proj.weight"].dtype == np.float16


def test_fused_split_is_saved_and_replayed_by_save_map(tmp_path) -> None:
    rng = np.random.default_rng(8)
    src = vit_source(rng)
    pth = save_pth(tmp_path / "a.pth", src)
    convert(pth, str(tmp_path / "b.ckpt"), like_path=save_ckpt(tmp_path / "like.ckpt", hf_target(rng)),
            save_map=str(tmp_path / "saved.yaml"))
    convert(pth, str(tmp_path / "c.ckpt"), map_path=str(tmp_path / "saved.yaml"))
    check_qkv(read(tmp_path / "c.ckpt"), src)


def test_ambiguous_fused_source_is_not_split_and_says_so(tmp_path) -> None:
    """A qkv without a block index, and two target blocks that both fit: nothing is split, a note names both."""
    rng = np.random.default_rng(9)
    src = {"attn.qkv.weight": rand(rng, 3 * C, C), "attn.qkv.bias": rand(rng, 3 * C)}
    target = {k: v for k, v in hf_target(rng, range(2)).items() if "output" not in k}
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"),
                     like_path=save_ckpt(tmp_path / "like.ckpt", target))
    assert not result.written and not result.splits and not (tmp_path / "b.ckpt").exists()
    assert any(n.startswith("not split: fused qkv attn.qkv fits 2 target blocks (encoder.layer.0.attention."
                            "attention, encoder.layer.1.attention.attention)") for n in result.notes), result.notes
    assert {e.status for e in result.entries} == {"unexpected", "missing"}


def test_two_fused_sources_for_one_target_block_are_not_split(tmp_path) -> None:
    rng = np.random.default_rng(10)
    src = {"a.qkv.weight": rand(rng, 3 * C, C), "b.qkv.weight": rand(rng, 3 * C, C)}
    target = {f"attn.{p}.weight": rand(rng, C, C) for p in ("q", "k", "v")}
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"),
                     like_path=save_ckpt(tmp_path / "like.ckpt", target))
    assert not result.written and not result.splits
    assert any("a.qkv, b.qkv all fit target block attn" in n for n in result.notes), result.notes


@pytest.mark.parametrize("case", ["wrong_rows", "missing_bias", "duplicate_part", "not_fused_name"])
def test_fused_detection_needs_shapes_leaves_and_names_to_agree(case) -> None:
    """detect() on shapes alone: each case breaks one condition and nothing is split (the control case splits)."""
    sources = {"blocks.0.attn.qkv.weight": (3 * C, C), "blocks.0.attn.qkv.bias": (3 * C,)}
    targets = {f"layer.0.attn.{p}.{leaf}": (C, C) if leaf == "weight" else (C,)
               for p in ("query", "key", "value") for leaf in ("weight", "bias")}
    assert len(detect(sources, targets)[0]) == 2  # control: weight and bias split
    if case == "wrong_rows":
        targets["layer.0.attn.key.weight"] = (C + 1, C)
    elif case == "missing_bias":
        del targets["layer.0.attn.value.bias"]
    elif case == "duplicate_part":
        targets |= {"layer.0.attn.q_proj.weight": (C, C), "layer.0.attn.q_proj.bias": (C,)}
    else:
        sources = {n.replace("qkv", "proj"): s for n, s in sources.items()}
    assert detect(sources, targets) == ([], [])


def test_target_keeping_a_fused_tensor_is_matched_not_split(tmp_path) -> None:
    """The target has a fused qkv of the same layout under another path: structural matching places it whole."""
    rng = np.random.default_rng(11)
    src = {"blocks.0.attn.qkv.weight": rand(rng, 3 * C, C)}
    target = {"layers.0.mixer.qkv.weight": rand(rng, 3 * C, C),
              **{f"layers.0.other.{p}.weight": rand(rng, C, C) for p in ("q", "k", "v")}}
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"),
                     like_path=save_ckpt(tmp_path / "like.ckpt", target), allow_incomplete=True)
    assert not result.splits
    np.testing.assert_array_equal(read(tmp_path / "b.ckpt")["layers.0.mixer.qkv.weight"],
                                  src["blocks.0.attn.qkv.weight"])


def test_lone_leftovers_pair_only_on_a_unique_shape_and_a_shared_word(tmp_path) -> None:
    """cls_token / pos_embed -> embeddings.cls_token / position_embeddings; a same-shaped pair without a shared word
    (`scale` vs `offset`) and two leftovers of one shape stay unpaired."""
    rng = np.random.default_rng(12)
    src = {"cls_token": rand(rng, 1, 1, C), "pos_embed": rand(rng, 1, 5, C), "scale": rand(rng, 7),
           "a_gain": rand(rng, 3), "b_gain": rand(rng, 3)}
    target = {"embeddings.cls_token": rand(rng, 1, 1, C), "embeddings.position_embeddings": rand(rng, 1, 5, C),
              "offset": rand(rng, 7), "x.gain": rand(rng, 3)}
    result = convert(save_pth(tmp_path / "a.pth", src), str(tmp_path / "b.ckpt"),
                     like_path=save_ckpt(tmp_path / "like.ckpt", target), allow_incomplete=True)
    status = {e.target or e.sources[0]: e.status for e in result.entries}
    assert status["embeddings.cls_token"] == status["embeddings.position_embeddings"] == "structural"
    assert status["offset"] == status["x.gain"] == "missing"
    out = read(tmp_path / "b.ckpt")
    np.testing.assert_array_equal(out["embeddings.position_embeddings"], src["pos_embed"])
    np.testing.assert_array_equal(out["embeddings.cls_token"], src["cls_token"])


def test_unknown_literal_source_names_the_closest(tmp_path) -> None:
    (tmp_path / "m.yaml").write_text("transforms:\n  - {op: split, source: blocks.0.attn.qvk.weight, axis: 0, "
                                     "targets: [a, b, c]}\n")
    with pytest.raises(AlignerError, match="unknown source.*closest: blocks.0.attn.qkv.weight"):
        convert(save_pth(tmp_path / "a.pth", vit_source(np.random.default_rng(13))), str(tmp_path / "b.ckpt"),
                map_path=str(tmp_path / "m.yaml"))
