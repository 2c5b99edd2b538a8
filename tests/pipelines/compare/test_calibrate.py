"""Noise-calibrated tolerances: `aligner.noise_floor` records the reference in float64, `compare(calibrate=...)` /
`align compare --calibrate` sets each record's tolerance to k times the reference's own error against it.

Real frameworks end to end: a bug-free float16 pair (PyTorch vs MindSpore) that fixed tolerances flag passes once
calibrated; a 1e-4 relative error in one float32 layer of a 24-layer model is still named, with how far above the
noise of its layer it is; a float64 dump that cannot calibrate is one line on stderr and exit 2.
"""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import align_in_process, assert_one_line_error, run_align

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

from mindspore import nn as mnn  # noqa: E402

from aligner.core.errors import AlignerError  # noqa: E402
from aligner.dumping import dump  # noqa: E402
from aligner.dumping.noise import noise_floor  # noqa: E402
from aligner.dumping.read.source import open_tensor  # noqa: E402
from aligner.pipelines.compare.result import CompareResult  # noqa: E402
from aligner.pipelines.compare.run import compare  # noqa: E402
from aligner.render.compare import summary, to_json  # noqa: E402
from aligner.render.html import write_html  # noqa: E402

D = 32          # model width
BLOCKS = 6      # transformer-ish float16 stack: LayerNorm -> Linear -> GELU -> Linear, residual
LAYERS = 24     # residual float32 stack: x + GELU(Linear(x))
BUG = 16        # the float32 layer whose weight and bias MindSpore scales by 1 + 1e-4


class TorchBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = (torch.nn.LayerNorm(D), torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                                 torch.nn.Linear(4 * D, D))

    def forward(self, x: Any) -> Any:
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class TorchResidual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = torch.nn.Linear(D, D), torch.nn.GELU()

    def forward(self, x: Any) -> Any:
        return x + self.act(self.fc(x))


class TorchStack(torch.nn.Module):
    def __init__(self, block: type, n: int, head: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([block() for _ in range(n)])
        self.head = torch.nn.Linear(D, 8) if head else None

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return self.head(x) if self.head is not None else x


class MsBlock(mnn.Cell):
    def __init__(self, dtype: Any) -> None:
        super().__init__()
        self.ln, self.fc1 = mnn.LayerNorm((D,), dtype=dtype), mnn.Dense(D, 4 * D, dtype=dtype)
        self.act, self.fc2 = mnn.GELU(approximate=False), mnn.Dense(4 * D, D, dtype=dtype)

    def construct(self, x: Any) -> Any:
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class MsResidual(mnn.Cell):
    def __init__(self, dtype: Any) -> None:
        super().__init__()
        self.fc, self.act = mnn.Dense(D, D, dtype=dtype), mnn.GELU(approximate=False)

    def construct(self, x: Any) -> Any:
        return x + self.act(self.fc(x))


class MsStack(mnn.Cell):
    def __init__(self, block: type, n: int, head: bool, dtype: Any) -> None:
        super().__init__()
        self.layers = mnn.CellList([block(dtype) for _ in range(n)])
        self.head = mnn.Dense(D, 8, dtype=dtype) if head else None

    def construct(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return self.head(x) if self.head is not None else x


def _twins(transformer: bool, half: bool, scale: str | None = None) -> tuple[Any, Any]:
    """A torch model and its MindSpore twin with the same weights (parameters under `scale` times 1 + 1e-4)."""
    torch.manual_seed(0)
    block, ms_block = (TorchBlock, MsBlock) if transformer else (TorchResidual, MsResidual)
    tnet = TorchStack(block, BLOCKS if transformer else LAYERS, transformer)
    tnet = tnet.half() if half else tnet
    mnet = MsStack(ms_block, BLOCKS if transformer else LAYERS, transformer, ms.float16 if half else ms.float32)
    weights = {k: v.detach().numpy() for k, v in tnet.state_dict().items()}
    for p in mnet.get_parameters():
        value = weights[p.name.replace(".gamma", ".weight").replace(".beta", ".bias")]
        if scale is not None and p.name.startswith(scale):
            value = value * value.dtype.type(1 + 1e-4)
        p.set_data(ms.Tensor(value))
    return tnet, mnet


def _dump_pair(root: Path, tnet: Any, mnet: Any, x: np.ndarray, **options: Any) -> None:
    """One forward and backward of each twin into root/pt and root/ms (the loss in float32)."""
    with dump(tnet, root / "pt", **options):
        tnet(torch.from_numpy(x)).float().square().mean().backward()
    with dump(mnet, root / "ms", **options):
        ms.value_and_grad(lambda t: mnet(t).astype(ms.float32).square().mean(), None,
                          mnet.trainable_params())(ms.Tensor(x))
    tnet.zero_grad(set_to_none=True)


def _loss(out: Any) -> Any:
    return out.float().square().mean()


@pytest.fixture(scope="module")
def fp16(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """A bug-free float16 pair, full and statistics-only dumps, and the float64 run of the torch side."""
    root = tmp_path_factory.mktemp("fp16")
    tnet, mnet = _twins(transformer=True, half=True)
    x = np.random.default_rng(0).standard_normal((4, 8, D)).astype(np.float16)
    _dump_pair(root, tnet, mnet, x)
    _dump_pair(root / "stats", tnet, mnet, x, stats_only=True)
    before = {k: v.clone() for k, v in tnet.state_dict().items()}
    noise_floor(tnet, torch.from_numpy(x), root / "f64", loss_fn=_loss)
    noise_floor(tnet, torch.from_numpy(x), root / "stats" / "f64", loss_fn=_loss, stats_only=True)
    return types.SimpleNamespace(root=root, tnet=tnet, mnet=mnet, x=x, before=before)


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24-layer float32 pair whose MindSpore layer BUG computes 1e-4 too much, and the float64 torch run."""
    root = tmp_path_factory.mktemp("deep")
    tnet, mnet = _twins(transformer=False, half=False, scale=f"layers.{BUG}.fc.")
    x = 3 * np.random.default_rng(0).standard_normal((8, D)).astype(np.float32)
    _dump_pair(root, tnet, mnet, x)
    noise_floor(tnet, torch.from_numpy(x), root / "f64", loss_fn=_loss)
    with dump(tnet, root / "f32"):  # the same model recorded in float32: not a float64 dump
        _loss(tnet(torch.from_numpy(x))).backward()
    noise_floor(tnet, torch.from_numpy(-x), root / "other_input")
    return root


def _used(result: CompareResult) -> float:
    """The largest share of its tolerance any element of any compared record uses: max |a - b| / (atol + rtol|b|)."""
    worst = 0.0
    for row in result.rows:
        m = row.metrics
        if m is None or m.method != "elements" or row.pair.a is None or row.pair.b is None:  # a block: statistics
            continue
        a, b = (np.concatenate([c.astype(np.float64) for c in open_tensor(it).chunks(1 << 20)]) if m.numel else
                np.zeros(0) for it in (row.pair.a, row.pair.b))
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b) / (m.atol + m.rtol * np.abs(b)))))
    return worst


def test_float16_pair_flagged_by_fixed_tolerances_passes_calibrated(fp16: types.SimpleNamespace) -> None:
    fixed = compare(str(fp16.root / "ms"), str(fp16.root / "pt"))
    calibrated = compare(str(fp16.root / "ms"), str(fp16.root / "pt"), calibrate=str(fp16.root / "f64"))
    # Fixed float16 tolerances (rtol 1e-3, atol 1e-5) flag the bug-free pair (65 of 138 records): the two
    # frameworks round differently (MindSpore's float16 LayerNorm is ~2.6x further from float64 than torch's), and
    # an element near zero, where only atol applies, carries the rounding of its larger inputs.
    assert fixed.exit_code == 1 and fixed.verdict.findings
    assert _used(fixed) > 10  # measured 101 (an element of layers.3.fc1's output): 10x margin
    assert calibrated.exit_code == 0 and not calibrated.verdict.findings, summary(calibrated)
    # Every record of the reference found its float64 twin (forward, backward and parameter gradients)...
    cal = calibrated.calibration
    # blocks keep statistics only (those that are links hold the tensor of the record they link to)
    blocks = sum(r.metrics is not None and r.pair.ref.record.kind == "block" and r.pair.ref.record.same_as is None
                 for r in calibrated.rows)
    assert cal is not None and cal.missing == {} and cal.from_stats == blocks > 0
    assert len(cal.noise) == sum(r.metrics is not None for r in calibrated.rows) > 100
    # ...the worst element uses 0.63 of its calibrated tolerance (a 1.6x margin: MindSpore's float16 error is at most
    # 2.6x torch's, so |ms - pt| <= 3.6x torch's noise where the tolerance allows 3x its max plus 3x its relative L2
    # error times |pt|)...
    assert _used(calibrated) < 1
    # ...and the tolerances stay those of float16 noise, tight enough for real bugs: float16 rounds to 2^-11 = 4.9e-4
    # relative per operation; the noisiest record (a gradient through 6 blocks) is measured at 1.5e-3 relative L2
    # error, and 1e-2 bounds it with 6x margin (a tanh-GELU or a LayerNorm eps bug costs 1e-2 and more).
    assert max(n.rel_l2 for n in cal.noise.values()) < 1e-2
    assert {n.dtype for n in cal.noise.values()} == {"float16"}
    # each row says how far from the noise it is (not the model's input: exact on both sides and in float64)
    assert all(r.above_noise is not None for r in calibrated.rows if r.metrics and r.metrics.max_abs_err)
    # the user's model was never touched: same dtype, same weights, no hooks left, no gradients
    after = fp16.tnet.state_dict()
    assert all(after[k].dtype == torch.float16 and torch.equal(after[k], v) for k, v in fp16.before.items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in fp16.tnet.modules())
    assert all(p.grad is None for p in fp16.tnet.parameters())


def test_float16_calibration_in_every_report(fp16: types.SimpleNamespace, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = run_align("compare", fp16.root / "ms", fp16.root / "pt", "--calibrate", fp16.root / "f64",
                    "--json", out / "r.json", "--csv", out / "r.csv", "--html", out / "r.html", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "Calibrated against the float64 dump" in text and "x noise" in text and "No divergence" in text
    data = json.loads((out / "r.json").read_text())
    assert data["calibration"]["calibrated"] > 100 and data["calibration"]["not_calibrated"] == 0
    assert data["tolerance"]["calibration"]["k"] == 3.0
    assert all(r["calibrated"] and r["noise_dtype"] == "float16" for r in data["rows"])
    rows = list(csv.DictReader((out / "r.csv").open()))
    assert rows and all(r["above_noise"] for r in rows if float(r["max_abs_err"]))
    assert "calibrated per record, 3x the reference" in (out / "r.html").read_text()
    # a smaller k is stricter: at k = 0.5 the pair's own float16 noise is a divergence again
    strict = align_in_process(capsys, "compare", fp16.root / "ms", fp16.root / "pt", "--calibrate",
                              fp16.root / "f64", "--calibrate-k", "0.5")
    assert strict.returncode == 1, strict.stdout


def test_statistics_only_dumps_calibrate_from_statistics(fp16: types.SimpleNamespace) -> None:
    stats = fp16.root / "stats"
    result = compare(str(stats / "ms"), str(stats / "pt"), calibrate=str(stats / "f64"))
    cal = result.calibration
    assert cal is not None and cal.missing == {} and cal.from_stats == len(cal.noise) > 100
    # min/max/mean/norm of each float16 record differ from float64 by float16 rounding, and the pair's statistics by
    # about as much: inside 3x of it (statistics vary less than elements; fixed tolerances pass this pair's
    # statistics too, so this checks that calibrating from statistics measures every record and flags nothing)
    assert result.exit_code == 0, summary(result)
    assert all(r.metrics is not None and r.metrics.method == "stats" for r in result.rows)
    assert "from statistics only" in summary(result)


def test_injected_error_still_named_above_the_noise(deep: Path) -> None:
    result = compare(str(deep / "ms"), str(deep / "pt"), calibrate=str(deep / "f64"))
    assert result.exit_code == 1
    forward = result.verdict.findings[0]
    assert result.module(forward.origin) == f"layers.{BUG}.fc" and forward.origin == forward.first
    row = result.rows[forward.origin]
    assert row.noise is not None and row.noise.dtype == "float32"
    # The residual stack grows values to ~100 by layer 16, so float32 rounding there (max abs 1.8e-5) is above what
    # atol 1e-5 allows: the calibrated tolerance is in force at the bug (measured atol 5.5e-5), not the default.
    assert row.metrics is not None and row.metrics.atol > 2e-5
    # The bug's error is 1e-4 of the largest output; float32 noise after 16 layers is 1.7e-7 of it (measured;
    # ~1.4 ulp). Bounds: noise <= 16 ulp = 9.5e-7 relative gives >= 100x (6x margin); noise >= 1/6 ulp (the largest
    # rounding of 256 outputs) gives <= 1e4x (16x margin).
    assert forward.above_noise is not None and 100 < forward.above_noise < 1e4
    text = " ".join(summary(result).split())
    figure = re.search(r"(\d+)x above the float32 noise of this layer", text)
    assert figure is not None and int(figure[1]) == round(forward.above_noise), text
    data = to_json(result)
    assert data["findings"][0]["above_noise"] == pytest.approx(forward.above_noise)
    assert data["findings"][0]["noise_dtype"] == "float32"
    page = io.StringIO()
    write_html(result, page)
    assert figure[0] in " ".join(page.getvalue().split())
    # every layer before the bug agrees within its calibrated tolerance: the finding is the bug, not noise
    assert all(r.status.value == "ok" for r in result.rows[:forward.origin] if r.metrics is not None)


def test_noise_floor_refuses_what_it_cannot_record(fp16: types.SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(AlignerError, match="record the PyTorch twin") as info:
        noise_floor(fp16.mnet, ms.Tensor(fp16.x), tmp_path / "ms64")
    assert "\n" not in str(info.value)
    with pytest.raises(AlignerError, match="inputs must be a tensor"):
        noise_floor(fp16.tnet, 3, tmp_path / "bad")
    dropping = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Dropout(0.1))
    with pytest.raises(AlignerError, match="disable_dropout"):
        noise_floor(dropping, torch.zeros(2, D), tmp_path / "drop")
    # keyword inputs (a dict), numpy arrays and non-tensor arguments go through; the copy runs in float64
    seen: list[Any] = []

    class Keyword(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(D, D).half()

        def forward(self, x: Any, *, scale: float) -> Any:
            seen.append(x.dtype)
            return self.fc(x) * scale

    model = Keyword()
    noise_floor(model, {"x": fp16.x[0], "scale": 2.0}, tmp_path / "kw")
    assert seen == [torch.float64] and model.fc.weight.dtype == torch.float16
    lines = (tmp_path / "kw" / "manifest.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    assert {r["dtype"] for r in records if r["kind"] in ("forward", "param_grad")} == {"float64"}


def _bad_cases(fp16: Any, deep: Path, tmp: Path) -> dict[str, tuple[list[Any], str]]:
    ms_, pt = deep / "ms", deep / "pt"
    (tmp / "empty").mkdir(exist_ok=True)
    return {
        "float32 dump": ([ms_, pt, "--calibrate", deep / "f32"], "not a float64 dump"),
        "another model": ([ms_, pt, "--calibrate", fp16.root / "f64"], "another model"),
        "another input": ([ms_, pt, "--calibrate", deep / "other_input"], "another input"),
        "mindspore dump": ([ms_, pt, "--calibrate", ms_], "one of the compared dumps"),
        "other framework": ([ms_, pt, "--calibrate", fp16.root / "ms"], "dumped by mindspore"),
        "plain directory": ([ms_, pt, "--calibrate", tmp / "empty"], "no records"),
        "missing": ([ms_, pt, "--calibrate", tmp / "nope"], "no such directory"),
        "stats-only for full dumps": ([fp16.root / "ms", fp16.root / "pt", "--calibrate",
                                       fp16.root / "stats" / "f64"], "statistics-only"),
        "k zero": ([ms_, pt, "--calibrate", deep / "f64", "--calibrate-k", "0"], "--calibrate-k"),
        "k not a number": ([ms_, pt, "--calibrate", deep / "f64", "--calibrate-k", "x"], "--calibrate-k"),
        "k alone": ([ms_, pt, "--calibrate-k", "3"], "needs --calibrate"),
    }


def test_bad_calibration_input_is_one_line_exit_2(fp16: types.SimpleNamespace, deep: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for name, (args, needle) in _bad_cases(fp16, deep, tmp_path).items():
        res = align_in_process(capsys, "compare", *args, "--json", tmp_path / f"{name}.json")
        assert_one_line_error(res, needle)
        assert not (tmp_path / f"{name}.json").exists(), name  # no report on a refused input


def test_records_without_a_twin_keep_the_default_and_are_counted(deep: Path, tmp_path: Path) -> None:
    partial = tmp_path / "f64"
    shutil.copytree(deep / "f64", partial)
    manifest = partial / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    kept = [line for line in lines if '"module":"layers.23.' not in line.replace(" ", "")]
    manifest.write_text("\n".join(kept) + "\n")
    result = compare(str(deep / "ms"), str(deep / "pt"), calibrate=str(partial))
    cal = result.calibration
    assert cal is not None and cal.missing and len(lines) - len(kept) >= len(cal.missing) > 0
    assert all(result.module(i).startswith("layers.23.") for i in cal.missing)
    assert all(result.rows[i].noise is None and result.rows[i].metrics is not None
               and result.rows[i].metrics.atol == 1e-5 for i in cal.missing)
    assert f"{len(cal.missing)} record(s) not calibrated" in summary(result)
    assert result.module(result.verdict.findings[0].origin) == f"layers.{BUG}.fc"
