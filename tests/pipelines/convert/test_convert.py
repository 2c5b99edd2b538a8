"""align convert / align inspect end to end: bit-exact round trips, safe loading, and every bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

from aligner.io import open_checkpoint
from tests.support.cli import assert_one_line_error

DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]


def _all_dtypes_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    state = {}
    for dt in DTYPES:
        base = torch.randn(4, 5, generator=gen) * 50
        state[f"t.{str(dt).split('.')[1]}"] = base.to(dt) if dt != torch.bool else base > 0
    state["special.float32"] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45])
    state["scalar.int64"] = torch.tensor(7)
    return state


def _bits(t: torch.Tensor) -> bytes:
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("middle", ["ckpt", "safetensors"])
def test_round_trip_is_bit_exact_for_every_dtype(tmp_path, align, middle):
    state = _all_dtypes_state()
    torch.save(state, tmp_path / "a.pth")
    first = align("convert", tmp_path / "a.pth", "-o", tmp_path / f"a.{middle}")
    assert first.returncode == 0, first.stderr
    back = align("convert", tmp_path / f"a.{middle}", "-o", tmp_path / "b.pth", "--to", "pytorch")
    assert back.returncode == 0, back.stderr
    loaded = torch.load(tmp_path / "b.pth", weights_only=True)
    assert list(loaded) == list(state)
    for name, tensor in state.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert _bits(loaded[name]) == _bits(tensor), name


def test_mindspore_reads_our_ckpt_and_we_read_mindspores(tmp_path, align):
    import mindspore as ms

    state = _all_dtypes_state()
    torch.save(state, tmp_path / "a.pth")
    assert align("convert", tmp_path / "a.pth", "-o", tmp_path / "a.ckpt").returncode == 0
    params = ms.load_checkpoint(str(tmp_path / "a.ckpt"))
    assert set(params) == set(state)
    for name, tensor in state.items():
        got = params[name]
        if tensor.dtype == torch.bfloat16:
            assert str(got.dtype) == "BFloat16"
            np.testing.assert_array_equal(got.float().asnumpy(), tensor.float().numpy())
        else:
            np.testing.assert_array_equal(got.asnumpy(), tensor.numpy())
    # a checkpoint written by MindSpore itself, large enough to be split into chunks by our reader's rules
    big = np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32)
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(big)}, {"name": "s", "data": ms.Tensor(np.int64(3))}],
                       str(tmp_path / "m.ckpt"))
    with open_checkpoint(str(tmp_path / "m.ckpt")) as src:
        np.testing.assert_array_equal(src.get("w"), big)
        assert src.info("s").shape == () and int(src.get("s")) == 3


def test_safetensors_library_reads_our_files(tmp_path, align):
    from safetensors.torch import load_file

    state = _all_dtypes_state()
    torch.save(state, tmp_path / "a.pth")
    assert align("convert", tmp_path / "a.pth", "-o", tmp_path / "a.safetensors").returncode == 0
    loaded = load_file(str(tmp_path / "a.safetensors"))
    assert all(_bits(loaded[k]) == _bits(v) for k, v in state.items())


def test_nested_state_dict_is_found_and_reported(tmp_path, align):
    torch.save({"epoch": 3, "model": {"fc.weight": torch.ones(2, 3)}}, tmp_path / "n.pth")
    proc = align("inspect", tmp_path / "n.pth", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["summary"]["notes"] == ["state_dict nested under 'model'"]
    assert out["tensors"][0]["name"] == "fc.weight" and out["tensors"][0]["shape"] == [2, 3]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickled_code_is_refused_unless_trusted(tmp_path, align):
    torch.save({"w": torch.ones(2), "x": Evil()}, tmp_path / "evil.pth")
    proc = align("inspect", tmp_path / "evil.pth")
    assert_one_line_error(proc, "--trust-pickle", "(it imports posix.system)")  # the refused global, whole
    assert align("inspect", tmp_path / "evil.pth", "--trust-pickle").returncode == 0


def test_inspect_stats_counts_nan_and_inf(tmp_path, align):
    np.save(tmp_path / "x.npy", np.array([1.0, np.nan, np.inf, -2.0], np.float32))
    out = json.loads(align("inspect", tmp_path / "x.npy", "--stats", "--json", "-").stdout)
    row = out["tensors"][0]
    assert (row["nan"], row["inf"], row["min"], row["max"]) == (1, 1, -2.0, 1.0)


def test_inspect_bfloat16_safetensors(tmp_path, align):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)}, str(tmp_path / "b.safetensors"))
    out = json.loads(align("inspect", tmp_path / "b.safetensors", "--stats", "--json", "-").stdout)
    assert out["tensors"][0]["dtype"] == "bfloat16" and out["tensors"][0]["max"] == 5.0


def test_help_and_inspect_do_not_import_frameworks(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3, np.float32))
    code = ("import sys; from aligner.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'mindspore') if m in sys.modules))")
    for args in (["--help"], ["inspect", str(tmp_path / "x.npy")], ["convert", "--help"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert "LOADED []" in proc.stdout, (args, proc.stdout[-300:], proc.stderr[-300:])


def _model_pth(path):
    torch.manual_seed(0)
    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict(), path)


def test_existing_output_is_refused_without_force(tmp_path, align):
    _model_pth(tmp_path / "m.pth")
    (tmp_path / "out.ckpt").write_bytes(b"keep me")
    assert_one_line_error(align("convert", tmp_path / "m.pth", "-o", tmp_path / "out.ckpt"), "already exists")
    assert (tmp_path / "out.ckpt").read_bytes() == b"keep me"
    assert align("convert", tmp_path / "m.pth", "-o", tmp_path / "out.ckpt", "--force").returncode == 0
    assert (tmp_path / "out.ckpt").read_bytes() != b"keep me"


@pytest.mark.parametrize("case,needle", [
    ("missing", "no such file"),
    ("unknown_format", "unknown checkpoint format"),
    ("truncated_pth", "truncated or corrupted"),
    ("truncated_ckpt", "not a readable MindSpore checkpoint"),
    ("truncated_safetensors", "truncated"),
    ("garbage_ckpt", "not a readable MindSpore checkpoint"),
    ("unwritable", "not writable"),
    ("no_such_dir", "does not exist"),
    ("bad_output_format", "unknown checkpoint format"),
    ("map_syntax", "YAML syntax error at line"),
    ("map_unknown_section", "unknown section"),
    ("map_unknown_target", "not in"),
    ("map_bad_op", "needs op"),
])
def test_bad_input_is_one_line_and_leaves_no_output(tmp_path, align, case, needle):
    _model_pth(tmp_path / "m.pth")
    src, out, extra = tmp_path / "m.pth", tmp_path / "out.ckpt", []
    if case == "missing":
        src = tmp_path / "nope.pth"
    elif case == "unknown_format":
        src = tmp_path / "m.weird"
        src.write_bytes(b"hello world, not a checkpoint")
    elif case.startswith("truncated"):
        ext = case.split("_")[1]
        full = tmp_path / f"full.{ext}"
        if ext == "pth":
            full = tmp_path / "m.pth"
        else:
            assert align("convert", tmp_path / "m.pth", "-o", full).returncode == 0
        src = tmp_path / f"cut.{ext}"
        data = full.read_bytes()
        src.write_bytes(data[: len(data) // 2])
        out = tmp_path / ("out.pth" if ext != "pth" else "out.ckpt")
    elif case == "garbage_ckpt":
        src = tmp_path / "g.ckpt"
        src.write_bytes(b"\x0a\xff\xff\xff\xff\x0f garbage")
        out = tmp_path / "out.pth"
    elif case == "unwritable":
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "out.ckpt"
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
    elif case == "no_such_dir":
        out = tmp_path / "nodir" / "out.ckpt"
    elif case == "bad_output_format":
        out = tmp_path / "out.xyz"
    else:
        mp = tmp_path / "map.yaml"
        mp.write_text({"map_syntax": "rename:\n  a: [b\n  c: d\n",
                       "map_unknown_section": "renames:\n  a: b\n",
                       "map_unknown_target": "rename:\n  0.weight: nowhere.weight\n",
                       "map_bad_op": "transforms:\n  - {op: explode, source: 0.weight}\n"}[case])
        extra = ["--map", mp]
        if case == "map_unknown_target":
            assert align("convert", tmp_path / "m.pth", "-o", tmp_path / "like.ckpt").returncode == 0
            extra += ["--like", tmp_path / "like.ckpt"]
    before = set(os.listdir(out.parent)) if out.parent.exists() else None
    proc = align("convert", src, "-o", out, *extra)
    assert_one_line_error(proc, needle)
    assert not out.exists()
    if before is not None:
        assert set(os.listdir(out.parent)) == before  # no temp file left behind


def test_unfilled_target_exits_1_and_writes_nothing(tmp_path, align):
    _model_pth(tmp_path / "m.pth")
    torch.save({"0.weight": torch.zeros(4, 3), "0.bias": torch.zeros(4), "extra.weight": torch.zeros(9, 9)},
               tmp_path / "like.pth")
    proc = align("convert", tmp_path / "m.pth", "-o", tmp_path / "o.pth", "--like", tmp_path / "like.pth")
    assert proc.returncode == 1 and "missing" in proc.stdout and "extra.weight" in proc.stdout
    assert not (tmp_path / "o.pth").exists()
    ok = align("convert", tmp_path / "m.pth", "-o", tmp_path / "o.pth", "--like", tmp_path / "like.pth",
               "--allow-incomplete")
    assert ok.returncode == 0 and set(torch.load(tmp_path / "o.pth")) == {"0.weight", "0.bias"}


def test_bfloat16_source_converts_with_ml_dtypes(tmp_path, align):
    torch.save({"emb.weight": torch.randn(3, 2).to(torch.bfloat16)}, tmp_path / "b.pth")
    assert align("convert", tmp_path / "b.pth", "-o", tmp_path / "b.ckpt").returncode == 0
    with open_checkpoint(str(tmp_path / "b.ckpt")) as src:
        assert src.names == ["emb.embedding_table"]
        assert src.get("emb.embedding_table").dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("args,needle", [(["convert"], "Missing argument"), (["convert", "x", "--bogus"], "--bogus"),
                                         (["nope"], "No such command")])
def test_usage_errors_are_one_line(align, args, needle):
    assert_one_line_error(align(*args), needle)


def test_summary_names_missing_unexpected_and_mismatched_keys(tmp_path, align):
    _model_pth(tmp_path / "m.pth")  # 0 = Linear(3, 4), 1 = BatchNorm1d(4)
    torch.save({"0.weight": torch.zeros(4, 3), "0.bias": torch.zeros(5), "1.weight": torch.zeros(4),
                "1.bias": torch.zeros(4), "1.running_mean": torch.zeros(4), "1.running_var": torch.zeros(4),
                "extra.weight": torch.zeros(9, 9)}, tmp_path / "like.pth")
    out = tmp_path / "plan.json"
    proc = align("convert", tmp_path / "m.pth", "-o", tmp_path / "o.pth", "--like", tmp_path / "like.pth",
                 "--json", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "missing (1: target keys no source fills): extra.weight" in proc.stdout
    assert "mismatched shapes (1" in proc.stdout and "0.bias" in proc.stdout
    assert "nothing written" in proc.stderr and not (tmp_path / "o.pth").exists()
    result = json.loads(out.read_text())
    assert not result["written"] and result["tensors_written"] == 0
    assert [r["name"] for r in result["missing"]] == ["extra.weight"]
    assert [r["name"] for r in result["shape_mismatch"]] == ["0.bias"]
    assert result["counts"]["missing"] == 1 and result["entries"]


def test_summary_lists_dropped_and_created_on_purpose_abbreviated(tmp_path, align):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.BatchNorm1d(2) for _ in range(7)])
    torch.save(net.state_dict(), tmp_path / "bn.pth")
    proc = align("convert", tmp_path / "bn.pth", "-o", tmp_path / "bn.ckpt", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # only JSON on stdout with '-'
    assert [r["name"] for r in result["dropped"]] == [f"{i}.num_batches_tracked" for i in range(7)]
    assert result["written"] and result["tensors_written"] == 28 and result["guesses"] == []
    text = align("convert", tmp_path / "bn.pth", "-o", tmp_path / "bn2.ckpt")
    assert "dropped on purpose (7: no twin in the target framework, tied, or a user drop): 0.num_batches_tracked" \
        in text.stdout
    assert "and 2 more (-v: all)" in text.stdout
    back = align("convert", tmp_path / "bn.ckpt", "-o", tmp_path / "back.pth", "-v")
    assert back.returncode == 0 and "created (7" in back.stdout and "6.num_batches_tracked" in back.stdout


def test_guessed_layer_types_are_named_without_like(tmp_path, align):
    """A lone 2-D weight is a bias-free Linear or an Embedding: the plan says which it guessed and how to be sure."""
    torch.save({"tok.weight": torch.randn(10, 4), "emb.weight": torch.randn(10, 4), "fc.weight": torch.randn(3, 4),
                "fc.bias": torch.randn(3)}, tmp_path / "m.pth")
    proc = align("convert", tmp_path / "m.pth", "-o", tmp_path / "m.ckpt")
    assert proc.returncode == 0, proc.stderr
    assert "warning: tok: layer type guessed" in proc.stdout and "read as Linear without bias" in proc.stdout
    assert "embedding_table" in proc.stdout and "--like" in proc.stdout
    assert "warning: emb: layer type guessed" in proc.stdout and "warning: fc:" not in proc.stdout
    result = json.loads(align("convert", tmp_path / "m.pth", "-o", tmp_path / "m2.ckpt", "--json", "-").stdout)
    assert {g["module"] for g in result["guesses"]} == {"tok", "emb"}
    guessed = {e["sources"][0] for e in result["entries"] if e["guessed"]}
    assert guessed == {"tok.weight", "emb.weight"}
    # a target checkpoint settles it: no guess, and the Embedding lands in embedding_table
    import mindspore as ms

    ms.save_checkpoint([{"name": "tok.embedding_table", "data": ms.Tensor(np.zeros((10, 4), np.float32))},
                        {"name": "emb.embedding_table", "data": ms.Tensor(np.zeros((10, 4), np.float32))},
                        {"name": "fc.weight", "data": ms.Tensor(np.zeros((3, 4), np.float32))},
                        {"name": "fc.bias", "data": ms.Tensor(np.zeros(3, np.float32))}], str(tmp_path / "t.ckpt"))
    like = align("convert", tmp_path / "m.pth", "-o", tmp_path / "m3.ckpt", "--like", tmp_path / "t.ckpt",
                 "--json", "-")
    assert like.returncode == 0, like.stdout + like.stderr
    assert json.loads(like.stdout)["guesses"] == []
    with open_checkpoint(str(tmp_path / "m3.ckpt")) as src:
        assert set(src.names) == {"tok.embedding_table", "emb.embedding_table", "fc.weight", "fc.bias"}


def test_convert_json_refuses_existing_file_and_trust_pickle_aliases(tmp_path, align):
    _model_pth(tmp_path / "m.pth")
    (tmp_path / "r.json").write_text("{}")
    proc = align("convert", tmp_path / "m.pth", "-o", tmp_path / "o.ckpt", "--json", tmp_path / "r.json")
    assert_one_line_error(proc, "already exists")
    assert not (tmp_path / "o.ckpt").exists()
    torch.save({"w": torch.ones(2), "x": Evil()}, tmp_path / "evil.pth")
    assert_one_line_error(align("convert", tmp_path / "evil.pth", "-o", tmp_path / "e.ckpt"), "--trust-pickle")
    for flag in ("--trust-pickle", "--allow-pickle"):
        assert align("convert", tmp_path / "evil.pth", "-o", tmp_path / f"e{flag}.ckpt", flag).returncode == 0


def test_library_convert_returns_a_result(tmp_path):
    from aligner.mapping.plan import EntryStatus
    from aligner.pipelines.convert.checkpoint import ConvertResult, convert

    _model_pth(tmp_path / "m.pth")
    result = convert(str(tmp_path / "m.pth"), str(tmp_path / "m.ckpt"))
    assert isinstance(result, ConvertResult) and result and result.exit_code == 0
    assert [e.sources[0] for e in result.with_status(EntryStatus.DROPPED)] == ["1.num_batches_tracked"]
    assert json.loads(json.dumps(result.to_dict()))["dropped"][0]["name"] == "1.num_batches_tracked"
