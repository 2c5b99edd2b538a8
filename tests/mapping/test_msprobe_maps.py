"""msprobe's own mapping files beside an msprobe dump are read as compare's --map (issue 28): `layer_mapping.yaml`
(`msprobe compare -lm`: {LayerClass: {MindSpore child: PyTorch child}}, `TopLayer` for the model's own children) and
`data_mapping.yaml` (`-dm`: {MindSpore data name: PyTorch data name}), in msprobe's documented format (its compare
docs, 11.accuracy_compare_MindSpore.md sections 4.5 and 4.6). The MindSpore side is the real msprobe fixture
tests/data/msprobe/ms_L0_tensor with its modules renamed the way a port names them differently (`attn` ->
`attention`, and inside the Attention layer `out` -> `proj`), against aligner's dump of the torch twin."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aligner.mapping import load_msprobe_maps
from tests.dumping.read.test_foreign import DATA, _result, _torch_dump
from tests.support.cli import assert_one_line_error, run_align

LAYER_MAP = "TopLayer:\n  attention: attn\nAttention:\n  proj: out\n"


def _renamed_ms_dump(parent: Path) -> Path:
    """The msprobe MindSpore fixture with `attn` named `attention` and its `out` named `proj` (call names in
    dump.json and construct.json; the tensor files keep their names, which dump.json's data_name gives)."""
    out = parent / "ms_dump"
    shutil.copytree(DATA / "ms_L0_tensor" / "step0" / "rank0", out)

    def rename(name: Any) -> Any:
        if not isinstance(name, str):
            return name
        return name.replace("Cell.attn.out.", "Cell.attn.proj.").replace("Cell.attn.", "Cell.attention.")

    for file in ("dump.json", "construct.json"):
        data = json.loads((out / file).read_text())
        if file == "dump.json":
            data["data"] = {rename(k): v for k, v in data["data"].items()}
        else:
            data = {rename(k): rename(v) for k, v in data.items()}
        (out / file).write_text(json.dumps(data))
    return out


def _by_name(result: dict[str, Any]) -> int:
    return result["counts"]["name"]


def test_layer_mapping_beside_the_dump_pairs_renamed_layers(tmp_path: Path) -> None:
    """Without the file the renamed attention block's records pair by content at best, and fewer by name; with
    msprobe's layer_mapping.yaml beside the dump folder every record pairs by name as with the unrenamed fixture,
    nothing diverges, and the JSON and the summary name the file and what it gave."""
    ms_dump = _renamed_ms_dump(tmp_path / "ms")
    pt_dump = _torch_dump(tmp_path, "block")
    _, plain = _result(DATA / "ms_L0_tensor", pt_dump)
    _, without = _result(ms_dump, pt_dump)
    assert _by_name(without) < _by_name(plain)
    (tmp_path / "ms" / "layer_mapping.yaml").write_text(LAYER_MAP)
    code, result = _result(ms_dump, pt_dump)
    assert code == 0, result["summary"]
    assert _by_name(result) == _by_name(plain) and result["findings"] == []
    [used] = result["msprobe_maps"]
    assert used["path"].endswith("layer_mapping.yaml") and used["modules"] == 7  # attention + its 6 children
    assert "Names mapped by msprobe's" in result["summary"] and "layer_mapping.yaml" in result["summary"]


def test_data_mapping_in_the_dump_folder_renames_modules_and_parameters(tmp_path: Path) -> None:
    """data_mapping.yaml inside the dump folder: one module entry renames the block and everything under it, one
    renames `proj`; a parameter-gradient entry renames that parameter; an API entry is counted as not used."""
    ms_dump = _renamed_ms_dump(tmp_path / "ms")
    pt_dump = _torch_dump(tmp_path, "block")
    _, plain = _result(DATA / "ms_L0_tensor", pt_dump)
    (ms_dump / "data_mapping.yaml").write_text(
        "Cell.attention.Attention.forward.0.output.0: Module.attn.Attention.forward.0.output.0\n"
        "Cell.attention.proj.Dense.forward.0.input.0: Module.attn.out.Linear.forward.0.input.0\n"
        "Cell.attention.proj.Dense.parameters_grad.weight: Module.attn.out.Linear.parameters_grad.weight\n"
        "Functional.matmul.0.forward.input.0: Torch.matmul.0.forward.input.0\n")
    code, result = _result(ms_dump, pt_dump)
    assert code == 0, result["summary"]
    assert _by_name(result) == _by_name(plain) and result["findings"] == []
    assert [(m["modules"], m["params"], m["unused"]) for m in result["msprobe_maps"]] == [(2, 1, 1)]


def test_an_explicit_map_wins_and_a_malformed_file_is_one_line(tmp_path: Path) -> None:
    """--map given: the file beside the dump is not read. A layer_mapping.yaml that is not msprobe's format: one
    error line naming it, exit 2."""
    ms_dump = _renamed_ms_dump(tmp_path / "ms")
    pt_dump = _torch_dump(tmp_path, "block")
    (tmp_path / "ms" / "layer_mapping.yaml").write_text("TopLayer: [attention, attn]\n")
    assert_one_line_error(run_align("compare", ms_dump, pt_dump), "not an msprobe layer_mapping.yaml")
    (tmp_path / "empty.yaml").write_text("rename: {}\n")
    proc = run_align("compare", ms_dump, pt_dump, "--map", tmp_path / "empty.yaml", "--json", "-")
    assert json.loads(proc.stdout)["msprobe_maps"] == []


def test_layer_rules_follow_msprobe_longest_child_first_per_class(tmp_path: Path) -> None:
    """The layer mapping walk on its own: rules keyed by the class of the module they sit in (the old top-level key
    `Cell` as `TopLayer`), a child spanning two levels, and the longest rule first, as msprobe's convert_scope."""
    path = tmp_path / "layer_mapping.yaml"
    path.write_text("Cell:\n  network.body: model\n  network: net\nBlock:\n  mixer: attn\n")
    classes = {"network": "Wrapper", "network.body": "Body", "network.body.0": "Block",
               "network.body.0.mixer": "Attention", "network.head": "Dense", "other.mixer": "X"}
    umap, [read] = load_msprobe_maps([path], classes)
    assert umap.modules == {"network": "net", "network.body": "model", "network.body.0": "model.0",
                            "network.body.0.mixer": "model.0.attn", "network.head": "net.head"}
    assert read.modules == 5 and umap.rename_path("network.body.0.mixer.q.weight") == "model.0.attn.q.weight"


@pytest.mark.parametrize("text", ["- a\n- b\n", "Cell.a.A.forward.0.output.0: [x]\n"])
def test_malformed_data_mapping_names_the_file(tmp_path: Path, text: str) -> None:
    from aligner.core.errors import AlignerError

    path = tmp_path / "data_mapping.yaml"
    path.write_text(text)
    with pytest.raises(AlignerError, match="data_mapping.yaml: not an msprobe data_mapping.yaml"):
        load_msprobe_maps([path], {})
