"""`align repro`: a standalone directory rebuilding one module of two dumps in both frameworks, run for real.

Hand-made twins (a torch model and its MindSpore port with copied weights, defined in a generated file so factories
can import them) cover the layers built from recorded attributes; a timm/mindcv ViT pair with one bug from the
localization catalogue covers a real model, and its attention (a timm class) the factories. Every repro.py runs in a
fresh interpreter (`python -I`, another cwd) with `aligner` blocked on sys.meta_path.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.dumping.read.source import read_source
from tests.support.cli import align_in_process, assert_one_line_error

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

TWINS = '''
import numpy as np
import mindspore as ms
import torch
from mindspore import nn as mnn


class Scale(torch.nn.Module):
    """A layer of the user's own: no torch.nn class to build it from."""

    def __init__(self, channels):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return x * self.gain[None, :, None, None]


class MsScale(mnn.Cell):
    def __init__(self, channels):
        super().__init__()
        self.gain = ms.Parameter(ms.Tensor(np.ones(channels, np.float32)), name="gain")

    def construct(self, x):
        return x * self.gain[None, :, None, None]


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.act = torch.nn.GELU()
        self.pool = torch.nn.MaxPool2d(2, 2)
        self.act2 = torch.nn.GELU()
        self.scale = Scale(4)
        self.fc = torch.nn.Linear(64, 6)
        self.ln = torch.nn.LayerNorm(6)
        self.emb = torch.nn.Embedding(10, 6)
        self.attn = torch.nn.MultiheadAttention(6, 2, batch_first=True)

    def forward(self, x, ids):
        y = self.scale(self.act2(self.pool(self.act(self.bn(self.conv(x))))))
        e = self.emb(ids)
        return self.ln(self.fc(y.flatten(1))) + self.attn(e, e, e, need_weights=False)[0].sum(1)


class MsNet(mnn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = mnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = mnn.BatchNorm2d(4)
        self.act = mnn.GELU()                      # MindSpore's default: tanh approximation (torch: exact erf)
        self.pool = mnn.MaxPool2d(kernel_size=2, stride=2)
        self.act2 = mnn.GELU(approximate=False)
        self.scale = MsScale(4)
        self.fc = mnn.Dense(64, 6)
        self.ln = mnn.LayerNorm((6,), epsilon=1e-5)
        self.emb = mnn.Embedding(10, 6)
        self.attn = mnn.MultiheadAttention(6, 2, batch_first=True)

    def construct(self, x, ids):
        y = self.scale(self.act2(self.pool(self.act(self.bn(self.conv(x))))))
        e = self.emb(ids)
        return self.ln(self.fc(y.flatten(1))) + self.attn(e, e, e, need_weights=False)[0].sum(1)


def make_torch():
    return TorchNet().eval()


def make_ms():
    net = MsNet()
    net.set_train(False)
    return net
'''

RENAMES = {"bn.weight": "bn.gamma", "bn.bias": "bn.beta", "bn.running_mean": "bn.moving_mean",
           "bn.running_var": "bn.moving_variance", "ln.weight": "ln.gamma", "ln.bias": "ln.beta",
           "emb.weight": "emb.embedding_table"}

# What `python DIR/repro.py` runs under: no aligner anywhere (the venv has it installed editable)
BLOCKER = textwrap.dedent('''
    import runpy, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "aligner" or name.startswith("aligner."):
                raise ImportError("repro.py must not import " + name)
    sys.meta_path.insert(0, Block())
    codes = {}
    for script in sys.argv[1:]:
        try:
            runpy.run_path(script, run_name="__main__")
            codes[script] = 0
        except SystemExit as exc:
            codes[script] = exc.code
    print("CODES=" + repr(codes))
''')


def run_repros(*dirs: Path, cwd: Path) -> dict[str, int]:
    """Run each DIR/repro.py in one fresh isolated interpreter (-I: no cwd, no PYTHONPATH) with aligner blocked."""
    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-I", "-c", BLOCKER, *(str(d / "repro.py") for d in dirs)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CODES=")), None)
    assert line is not None, proc.stdout + proc.stderr
    codes = eval(line[len("CODES="):])
    return {Path(k).parent.name: v for k, v in codes.items()} | {"_stdout": proc.stdout}  # type: ignore[dict-item]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("repro_twins", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["repro_twins"] = module
    spec.loader.exec_module(module)
    return module


def _dump(model, directory: Path, arrays, **options) -> Path:
    import aligner

    if isinstance(model, torch.nn.Module):
        with aligner.dump(model, directory, **options), torch.no_grad():
            model(*(torch.from_numpy(a) for a in arrays))
    else:
        with aligner.dump(model, directory, **options):
            model(*(ms.Tensor(a) for a in arrays))
    return directory


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """(work dir, twins file, torch dump, MindSpore dump), both dumped with params=True."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    work = tmp_path_factory.mktemp("repro")
    source = work / "twins.py"
    source.write_text(TWINS)
    mod = _load(source)
    torch.manual_seed(0)
    pt, msn = mod.make_torch(), mod.make_ms()
    with torch.no_grad():  # BatchNorm statistics and scale gains that are not identities
        pt.bn.running_mean.uniform_(-0.5, 0.5)
        pt.bn.running_var.uniform_(0.5, 2.0)
        pt.bn.weight.uniform_(0.5, 1.5)
        pt.scale.gain.uniform_(0.5, 1.5)
    state = {n: p.detach().numpy() for n, p in pt.state_dict().items() if "num_batches" not in n}
    params = {RENAMES.get(n, n): ms.Parameter(ms.Tensor(v), name=RENAMES.get(n, n)) for n, v in state.items()}
    not_loaded, unused = ms.load_param_into_net(msn, params, strict_load=True)
    assert not not_loaded and not unused
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((2, 3, 8, 8)).astype(np.float32), np.array([[1, 2], [3, 4]], np.int64))
    dumps = (_dump(pt, work / "pt", inputs, params=True), _dump(msn, work / "ms", inputs, params=True))
    return work, source, dumps[0], dumps[1], mod, pt, msn, inputs


LAYERS = {"conv": 0, "bn": 0, "act": 1, "pool": 0, "act2": 0, "fc": 0, "ln": 0, "emb": 0, "attn": 0}


@pytest.fixture(scope="module")
def layer_repros(twins):
    """Every hand-made layer's repro written from attributes (argument order MS PT: the reference is PyTorch), and
    the custom `scale` layer's through both factories; all run in one fresh interpreter."""
    from aligner.pipelines.repro import repro

    work, source, pt_dir, ms_dir, *_ = twins
    (work / "out").mkdir()
    results = {name: repro(ms_dir, pt_dir, name, work / "out" / name) for name in LAYERS}
    results["scale"] = repro(ms_dir, pt_dir, "scale", work / "out" / "scale", factory_a=f"{source}:make_ms",
                             factory_b=f"{source}:make_torch")
    codes = run_repros(*(r.directory for r in results.values()), cwd=work)
    return results, codes


def test_layers_built_from_attributes_reproduce(layer_repros):
    from aligner.pipelines.repro import Build

    results, codes = layer_repros
    assert {name: codes[name] for name in LAYERS} == LAYERS, codes["_stdout"]
    for name, result in results.items():
        if name == "scale":
            continue
        assert set(result.built.values()) == {Build.ATTRIBUTES}, name
        assert result.reference == "pytorch"
    assert results["act"].diverged and not results["conv"].diverged
    assert "Greatest absolute difference" in codes["_stdout"] and "Mismatched elements" in codes["_stdout"]


def test_directory_holds_only_the_layer(layer_repros):
    results, _ = layer_repros
    conv = results["conv"].directory
    files = sorted(str(p.relative_to(conv)) for p in conv.rglob("*") if p.is_file())
    assert files == ["README.md", "inputs/0.npy", "mindspore/outputs/0.npy", "mindspore/params/bias.npy",
                     "mindspore/params/weight.npy", "repro.json", "repro.py", "torch/outputs/0.npy",
                     "torch/params/bias.npy", "torch/params/weight.npy"]
    assert results["conv"].size_bytes == sum((conv / f).stat().st_size for f in files)
    assert results["conv"].size_bytes < 20_000
    bn = results["bn"].directory
    assert sorted(p.name for p in (bn / "mindspore" / "params").iterdir()) == \
        ["beta.npy", "gamma.npy", "moving_mean.npy", "moving_variance.npy"]
    assert {p.name for p in (bn / "torch" / "params").iterdir()} >= {"running_mean.npy", "num_batches_tracked.npy"}
    script = (results["act2"].directory / "repro.py").read_text()
    assert "mindspore.nn.GELU()" in script and "layer.approximate = 'none'" in script  # bool in, 'none' kept
    assert "import aligner" not in script and "from aligner" not in script
    ids = np.load(results["emb"].directory / "inputs" / "0.npy")
    assert ids.dtype == np.int64


def test_factory_builds_a_custom_layer(twins, layer_repros, capsys):
    from aligner.pipelines.repro import Build

    work, source, pt_dir, ms_dir, *_ = twins
    results, codes = layer_repros
    assert codes["scale"] == 0, codes["_stdout"]
    assert set(results["scale"].built.values()) == {Build.FACTORY}
    script = (results["scale"].directory / "repro.py").read_text()
    assert "layer = model.get_submodule('scale')" in script
    assert "layer = dict(model.cells_and_names())['scale']" in script
    out = work / "out_scale"
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "scale", "-o", out)
    assert_one_line_error(proc, "--factory-a", "--factory-b", "repro_twins.Scale")
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "scale", "-o", out,
                            "--factory-a", f"{source}:make_ms", "--factory-b", f"{source}:make_torch")
    assert proc.returncode == 0, proc.stderr
    assert "built from its factory" in proc.stdout and "KiB" in proc.stdout
    # a factory of the wrong framework, and one whose model lacks the module: one line each
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "scale", "-o", work / "out_bad",
                            "--factory-a", f"{source}:make_torch", "--factory-b", f"{source}:make_torch")
    assert_one_line_error(proc, "--factory-a", "mindspore")
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "scale", "-o", work / "out_bad",
                            "--factory-a", f"{source}:nope", "--factory-b", f"{source}:make_torch")
    assert_one_line_error(proc, "nope")
    assert not (work / "out_bad").exists()


def test_ref_mindspore_feeds_its_inputs(twins):
    from aligner.pipelines.repro import repro

    work, _, pt_dir, ms_dir, *_ = twins
    result = repro(pt_dir, ms_dir, "fc", work / "out_ref_ms", ref="mindspore")
    assert result.reference == "mindspore"
    recorded = np.load(result.directory / "inputs" / "0.npy")
    src = read_source(ms_dir)
    fc_in = next(it for it in src.items if it.record.module == "fc" and it.record.io == "input")
    assert np.array_equal(recorded, np.load(fc_in.path))


def test_cli_prints_and_refuses_to_overwrite(twins, capsys):
    work, _, pt_dir, ms_dir, *_ = twins
    out = work / "out_cli"
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "ln", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}/" in proc.stdout and "python" in proc.stdout
    marker = json.loads((out / "repro.json").read_text())
    assert marker["modules"] == {"pytorch": "ln", "mindspore": "ln"}
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "fc", "-o", out)
    assert_one_line_error(proc, "not empty", "--force")
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "fc", "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "repro.json").read_text())["modules"]["pytorch"] == "fc"
    assert not list(work.glob(".out_cli*"))  # no temp or old directory left beside it
    (out / "notes.txt").write_text("mine")  # something repro did not write: never deleted
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "ln", "-o", out, "--force")
    assert_one_line_error(proc, "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"
    other = work / "user_dir"
    other.mkdir()
    (other / "data.bin").write_bytes(b"x")
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "ln", "-o", other, "--force")
    assert_one_line_error(proc, "did not write")
    assert (other / "data.bin").read_bytes() == b"x"
    empty = work / "empty_dir"
    empty.mkdir()
    assert align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "ln", "-o", empty).returncode == 0


@pytest.fixture(scope="module")
def poor_dumps(twins):
    """Dumps of the hand-made torch model lacking what repro needs."""
    work, _, pt_dir, ms_dir, mod, pt, msn, inputs = twins
    return {"no_inputs": _dump(pt, work / "pt_no_inputs", inputs, params=True, inputs=False),
            "no_params": _dump(pt, work / "pt_no_params", inputs),
            "stats": _dump(pt, work / "pt_stats", inputs, params=True, stats_only=True),
            "ms_no_params": _dump(msn, work / "ms_no_params", inputs)}


@pytest.mark.parametrize("case, module, needles", [
    ("unknown", "lnn", ("no module 'lnn'", "nearest: ln")),
    ("no_inputs", "fc", ("inputs", "aligner.dump(")),
    ("no_params", "fc", ("params=True",)),
    ("ms_no_params", "fc", ("params=True",)),
    ("stats", "fc", ("statistics-only", "aligner.dump(")),
    ("bad_ref", "fc", ("--ref",)),
    ("same_framework", "fc", ("one PyTorch and one MindSpore",)),
    ("bad_tolerance", "fc", ("--atol",)),
])
def test_bad_inputs_are_one_line(twins, poor_dumps, capsys, case, module, needles):
    work, _, pt_dir, ms_dir, *_ = twins
    a, b, extra = ms_dir, pt_dir, []
    if case in ("no_inputs", "no_params", "stats"):
        b = poor_dumps[case]
    elif case == "ms_no_params":
        a = poor_dumps[case]
    elif case == "bad_ref":
        extra = ["--ref", "left"]
    elif case == "same_framework":
        a = poor_dumps["no_params"]
    elif case == "bad_tolerance":
        extra = ["--rtol", "1e-3"]
    out = work / f"out_{case}"
    proc = align_in_process(capsys, "repro", a, b, "--module", module, "-o", out, *extra)
    assert_one_line_error(proc, *needles)
    assert not out.exists()


def test_parameter_free_layer_needs_no_params(twins, poor_dumps):
    """Two dumps made without params=True: the GELUs (no parameters) are packed and still differ (MindSpore's tanh
    approximation against torch's erf); a layer with parameters is still refused, naming params=True."""
    from aligner.pipelines.repro import repro

    work = twins[0]
    act = repro(poor_dumps["ms_no_params"], poor_dumps["no_params"], "act", work / "out_act_no_params")
    assert not (act.directory / "torch" / "params").exists() and not (act.directory / "mindspore" / "params").exists()
    assert "load_state_dict" not in (act.directory / "repro.py").read_text()
    codes = run_repros(act.directory, cwd=work)
    assert codes["out_act_no_params"] == 1, codes["_stdout"]
    with pytest.raises(AlignerError, match=r"holds no parameter values.*weight.*params=True"):
        repro(poor_dumps["ms_no_params"], poor_dumps["no_params"], "fc", work / "out_fc_no_params")


def test_help_lists_repro(capsys):
    proc = align_in_process(capsys, "--help")
    assert "repro" in proc.stdout
    proc = align_in_process(capsys, "repro", "--help")
    assert "--factory-a" in proc.stdout and "--module" in proc.stdout


# ---- a real model: timm ViT vs mindcv ViT, one bug from the localization catalogue --------------------------------
ZOO_FACTORIES = '''
from functools import partial

from tests.zoo import torch_compat  # noqa: F401  (before timm)
from tests.zoo.vit import CFG, IMG


def make_torch():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=IMG, **CFG).eval()


def make_ms():
    from mindcv.models.vit import VisionTransformer
    from mindspore import nn
    net = VisionTransformer(image_size=IMG, **CFG, act_layer=partial(nn.GELU, approximate=False),
                            norm_layer=partial(nn.LayerNorm, epsilon=1e-6))
    net.set_train(False)
    return net
'''


@pytest.fixture(scope="module")
def vit_dumps(tmp_path_factory):
    """The vit zoo pair converted, the torch side dumped clean, the MindSpore side with `vit-gelu-tanh` injected
    (blocks.0.mlp.act approximate='tanh'); leaves_only=False so that blocks.0.attn is recorded too."""
    from tests.zoo import torch_compat  # noqa: F401  (before timm)

    for name in ("timm", "mindcv"):
        pytest.importorskip(name)
    from tests.zoo import localization

    ms.set_context(mode=ms.PYNATIVE_MODE)
    work = tmp_path_factory.mktemp("repro_vit")
    run = localization.build_pair("vit", work, {"params": True, "leaves_only": False})
    bug = next(b for b in localization.CATALOGUE if b.id == "vit-gelu-tanh")
    pt_dir = run.dump_torch(work / "pt")
    undo = bug.inject(run.pair)
    try:
        ms_dir = run.dump_ms(work / "ms")
    finally:
        undo()
    factories = work / "vit_factories.py"
    factories.write_text(ZOO_FACTORIES)
    return work, pt_dir, ms_dir, factories, bug


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_zoo_bug_repro_is_small_and_fails(vit_dumps, capsys):
    from aligner.pipelines.repro import repro

    work, pt_dir, ms_dir, factories, bug = vit_dumps
    act = repro(ms_dir, pt_dir, bug.expected, work / "repro_act")
    assert act.diverged and act.modules == {"pytorch": "blocks.0.mlp.act", "mindspore": "blocks.0.mlp.act"}
    fc1 = repro(ms_dir, pt_dir, "blocks.0.mlp.fc1", work / "repro_fc1")  # upstream of the bug: clean
    proc = align_in_process(capsys, "repro", ms_dir, pt_dir, "--module", "blocks.0.attn", "-o", work / "nope")
    assert_one_line_error(proc, "--factory-a", "Attention")
    attn = repro(ms_dir, pt_dir, "blocks.0.attn", work / "repro_attn",
                 factory_a=f"{factories}:make_ms", factory_b=f"{factories}:make_torch")
    dump_size = _dir_size(pt_dir) + _dir_size(ms_dir)
    print(f"dumps {dump_size} bytes; repro act {act.size_bytes}, fc1 {fc1.size_bytes}, attn {attn.size_bytes}")
    for result in (act, fc1, attn):
        assert result.size_bytes == _dir_size(result.directory)
        assert result.size_bytes < dump_size / 4
    assert act.size_bytes < dump_size / 10  # one activation's input and outputs, no weights
    codes = run_repros(fc1.directory, attn.directory, cwd=work)
    assert (codes["repro_fc1"], codes["repro_attn"]) == (0, 0), codes["_stdout"]
    # the real way: `python -I DIR/repro.py` from another directory (no aligner on the path)
    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-I", str(act.directory / "repro.py")], capture_output=True, text=True,
                          cwd=work, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Greatest absolute difference" in proc.stdout and "up to 1e-05 allowed" in proc.stdout
