"""`align repro` on third-party layer classes (issue 28): the ConvNeXt zoo pair (timm vs mindcv, mindcv's tanh GELUs
kept) and hand-made subclasses. timm's `LayerNorm`/`LayerNorm2d` and mindcv's `ConvNextLayerNorm` subclass the
framework LayerNorm (the channels-first ones with a transpose), timm's `GELU` is a plain `nn.Module`: each is built
as a standard layer only where that reproduces its own recorded output, and the repro says so. With factories, the
layer is built the same way (repro.py imports no factory); a layer no standard one reproduces is refused, with what
was measured. Every repro.py runs in a fresh interpreter with aligner blocked (tests/pipelines/repro/test_repro.py's
`run_repros`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.pipelines.repro import Build, repro
from aligner.pipelines.repro.script import Layout
from tests.pipelines.repro.test_repro import _dump, run_repros
from tests.support.cli import align_in_process, assert_one_line_error

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: E402, F401  (before timm)

pytest.importorskip("timm")
pytest.importorskip("mindcv")

FACTORIES = '''
from tests.zoo import torch_compat  # noqa: F401  (before timm)
from tests.zoo import convnext


def make_torch():
    return convnext.build(exact_gelu=False).torch_model


def make_ms():
    return convnext.build(exact_gelu=False).ms_model
'''

# module on the torch side -> its mindcv twin, what its repro.py exits with (0 agree, 1 differ), and each side's
# layout: the stem's norms are channels-first (both transpose around their LayerNorm), the blocks' channels-last
MODULES = {"stem.1": ("feature.0.1", 0, Layout.CHANNELS_LAST, Layout.CHANNELS_LAST),
           "stages.0.blocks.0.norm": ("feature.1.0.norm", 0, Layout.AS_RECORDED, Layout.AS_RECORDED),
           "stages.0.blocks.0.mlp.act": ("feature.1.0.act", 1, Layout.AS_RECORDED, None)}


@pytest.fixture(scope="module")
def convnext_dumps(tmp_path_factory):
    """(work dir, torch dump, MindSpore dump, factories file): the zoo pair converted (mindcv's tanh GELUs kept),
    both sides dumped with params=True."""
    from tests.zoo import convnext

    ms.set_context(mode=ms.PYNATIVE_MODE)
    work = tmp_path_factory.mktemp("repro_convnext")
    pair = convnext.build(exact_gelu=False)
    pair.make_equal(work / "convert")
    x = pair.torch_inputs["x"]
    pt_dir = _dump(pair.torch_model, work / "pt", (x,), params=True)
    ms_dir = _dump(pair.ms_model, work / "ms", (x,), params=True)
    factories = work / "convnext_factories.py"
    factories.write_text(FACTORIES)
    return work, pt_dir, ms_dir, factories


def test_third_party_layers_are_built_as_measured_stand_ins(convnext_dumps):
    """timm LayerNorm2d vs mindcv ConvNextLayerNorm(norm_axis=1) (the stem), timm LayerNorm vs ConvNextLayerNorm
    (a block), timm GELU vs MindSpore GELU: all written without factories (the old code refused each), the stand-in
    and layout of each side as measured, and repro.py's verdicts those of the layers: norms agree, the tanh GELU
    differs."""
    work, pt_dir, ms_dir, _ = convnext_dumps
    results = {}
    for module, (twin, _, pt_layout, ms_layout) in MODULES.items():
        result = repro(ms_dir, pt_dir, module, work / module)
        results[module] = result
        assert result.modules == {"pytorch": module, "mindspore": twin}
        assert set(result.built.values()) == {Build.ATTRIBUTES} and result.needs == {}
        assert result.stand_ins["pytorch"].layout is pt_layout
        assert (result.stand_ins["mindspore"].layout if ms_layout else None) is ms_layout
        for stand_in in result.stand_ins.values():  # the acceptance bound itself: the repro tolerance
            assert stand_in.max_abs_err <= result.tolerance.atol
        saved = json.loads(json.dumps(result.to_dict()))  # the result contract: its stand-ins read back whole
        assert type(result).from_dict(saved) == result
    assert results["stem.1"].stand_ins["pytorch"].spelling == "torch.nn.LayerNorm"
    assert results["stem.1"].stand_ins["mindspore"].spelling == "mindspore.nn.LayerNorm"
    assert results["stem.1"].stand_ins["mindspore"].left_out == ("norm_axis",)
    assert results["stages.0.blocks.0.mlp.act"].stand_ins["pytorch"].spelling == "torch.nn.GELU"
    readme = (work / "stem.1" / "README.md").read_text()
    assert "built as torch.nn.LayerNorm with the channel transpose" in readme
    assert "no place for: norm_axis" in readme and "needs numpy, torch and mindspore only" in readme
    script = (work / "stem.1" / "repro.py").read_text()
    assert script.count("np.moveaxis(a, 1, -1)") == 2 and "import timm" not in script
    codes = run_repros(*(r.directory for r in results.values()), cwd=work)
    assert {m: codes[m] for m in MODULES} == {m: want for m, (_, want, _, _) in MODULES.items()}, codes["_stdout"]


def test_factories_are_not_needed_for_a_layer_a_standard_one_reproduces(convnext_dumps, capsys):
    """With --factory-a/-b the stem's norms are still built from their recorded attributes (the live classes' own
    bases, torch.nn.LayerNorm and mindspore.nn.LayerNorm): repro.py names no factory, no path and no timm, and the
    CLI says it needs numpy, torch and mindspore only (the old code built both whole models through the factories)."""
    work, pt_dir, ms_dir, factories = convnext_dumps
    out = work / "stem_factories"
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "stem.1", "-o", out,
                            "--factory-a", f"{factories}:make_ms", "--factory-b", f"{factories}:make_torch")
    assert proc.returncode == 0, proc.stderr
    assert "needs numpy, torch and mindspore only" in proc.stdout
    assert "as torch.nn.LayerNorm (channels moved last)" in proc.stdout
    script = (out / "repro.py").read_text()
    assert str(factories) not in script and "make_torch" not in script and "import timm" not in script
    assert "NEEDS" not in script and "Needs only numpy, torch and mindspore" in script
    assert json.loads((out / "repro.json").read_text())["modules"] == {"pytorch": "stem.1", "mindspore": "feature.0.1"}
    assert run_repros(out, cwd=work)["stem_factories"] == 0


class QuickGELU(torch.nn.Module):
    """x * sigmoid(1.702 x): named like a GELU, not one (CLIP's)."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ScaledLayerNorm(torch.nn.LayerNorm):
    """A LayerNorm subclass whose forward does more than its base: no standard layer reproduces it."""

    def forward(self, x):
        return 2.0 * super().forward(x)


class PlainGELU(torch.nn.GELU):
    """A plain subclass: its base reproduces it."""


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = QuickGELU()
        self.norm = ScaledLayerNorm(6)
        self.act2 = PlainGELU()

    def forward(self, x):
        return self.act2(self.norm(self.act(x)))


class MsNet(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.act = ms.nn.GELU(approximate=False)
        self.norm = ms.nn.LayerNorm((6,), epsilon=1e-5)
        self.act2 = ms.nn.GELU(approximate=False)

    def construct(self, x):
        return self.act2(self.norm(self.act(x)))


@pytest.fixture(scope="module")
def impostor_dumps(tmp_path_factory):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    work = tmp_path_factory.mktemp("repro_impostors")
    x = np.random.default_rng(0).standard_normal((2, 3, 6)).astype(np.float32)
    msn = MsNet()
    msn.set_train(False)
    return work, _dump(Net().eval(), work / "pt", (x,), params=True), _dump(msn, work / "ms", (x,), params=True)


@pytest.mark.parametrize("module, needles", [
    ("act", ("QuickGELU", "torch.nn.GELU", "does not reproduce its recorded output", "max abs error", "--factory-b")),
    ("norm", ("ScaledLayerNorm", "torch.nn.LayerNorm", "does not reproduce", "channels moved last", "--factory-b")),
])
def test_a_stand_in_that_does_not_reproduce_is_refused(impostor_dumps, capsys, module, needles):
    """QuickGELU and a LayerNorm subclass that doubles its output: the standard layers their names suggest run on
    their recorded inputs and differ from their recorded outputs, so no repro is written: one line with what was
    measured (the old code refused them too, but as 'not a torch.nn layer', without measuring)."""
    work, pt_dir, ms_dir = impostor_dumps
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", module, "-o", work / f"out_{module}")
    assert_one_line_error(proc, *needles)
    assert not (work / f"out_{module}").exists()


def test_plain_subclass_is_its_base_when_measured(impostor_dumps, tmp_path):
    """A plain torch.nn.GELU subclass is built as torch.nn.GELU (both sides exact: exit 0); with its input record
    dropped from the torch dump (the MindSpore side the reference) its stand-in cannot be measured, so it is not
    used."""
    work, pt_dir, ms_dir = impostor_dumps
    result = repro(ms_dir, pt_dir, "act2", tmp_path / "act2")
    assert result.stand_ins["pytorch"].spelling == "torch.nn.GELU" and "mindspore" not in result.stand_ins
    assert run_repros(result.directory, cwd=tmp_path)["act2"] == 0
    pt_lost = tmp_path / "pt_lost"
    shutil.copytree(pt_dir, pt_lost)
    lines = (pt_lost / "manifest.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if not ('"module":"act2"' in ln and '"io":"input"' in ln)]
    assert len(kept) == len(lines) - 1
    (pt_lost / "manifest.jsonl").write_text("\n".join(kept) + "\n")
    with pytest.raises(AlignerError, match="torch.nn.GELU.*holds none of its inputs.*--factory-a"):
        repro(pt_lost, ms_dir, "act2", tmp_path / "out", ref="mindspore")


def test_readme_names_the_factory_a_layer_still_needs(convnext_dumps):
    """A block (timm ConvNeXtBlock) is no standard layer: its factory builds it, and README.md and repro.py say what
    that needs (the factory, timm) instead of 'numpy, torch and mindspore only'."""
    from tests.zoo import convnext

    work, _, _, factories = convnext_dumps
    pair = convnext.build(exact_gelu=False)
    pair.make_equal(work / "convert_blocks")
    x = pair.torch_inputs["x"]
    pt_dir = _dump(pair.torch_model, work / "pt_blocks", (x,), params=True, leaves_only=False,
                   include=r"^stages\.0\.blocks\.0")
    ms_dir = _dump(pair.ms_model, work / "ms_blocks", (x,), params=True, leaves_only=False, include=r"^feature\.1\.0")
    with pytest.raises(AlignerError, match="--factory-a.*--factory-b"):
        repro(ms_dir, pt_dir, "stages.0.blocks.0", work / "block_refused")
    result = repro(ms_dir, pt_dir, "stages.0.blocks.0", work / "block", factory_a=f"{factories}:make_ms",
                   factory_b=f"{factories}:make_torch")
    assert result.built == {"pytorch": Build.FACTORY, "mindspore": Build.FACTORY}
    assert result.needs == {"pytorch": ("timm",), "mindspore": ("mindcv",)}
    readme = (work / "block" / "README.md").read_text()
    assert "only" not in readme.split("needs ")[-1]
    assert f"factory '{factories}:make_torch'" in readme and "with timm" in readme and "with mindcv" in readme
    script = (work / "block" / "repro.py").read_text()
    assert "NEEDS = {'pytorch': (" in script and "['timm']" in script and "Needs only" not in script
    assert Path(result.directory / "repro.py").is_file()
