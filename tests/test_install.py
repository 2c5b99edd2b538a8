"""aligner as users get it: a built wheel installed outside the checkout, and outputs that follow the user's umask."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.compare_fixtures import write_dump

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("aligner", "mappings", "setup.py", "pyproject.toml", "README.md")


def _torch_checkpoint(path: Path) -> Path:
    """A small real torch model's state_dict (Conv2d, BatchNorm2d, Linear, Embedding)."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4, 2))
    torch.save(net.state_dict(), path)
    return path


def _dumps(tmp: Path) -> tuple[Path, Path]:
    """Two small dump directories whose second record differs."""
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    a = write_dump(tmp / "dump_a", "mindspore", [{"module": "l0", "array": x}, {"module": "l1", "array": x * 2}])
    b = write_dump(tmp / "dump_b", "pytorch", [{"module": "l0", "array": x}, {"module": "l1", "array": x * 3}])
    return a, b


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project built as a wheel from a copy of its sources, installed with --no-deps into a target directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy, so that building writes nothing into the checkout
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, src / name)
    for built in src.glob("aligner/**/*.so"):
        built.unlink()
    dist, target = tmp / "dist", tmp / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", dist, src], check=True, timeout=600,
                   capture_output=True)
    wheel = next(dist.glob("aligner-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True, timeout=300,
                   capture_output=True)
    return target


def _run_installed(target: Path, cwd: Path, *args: object) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONWARNINGS="ignore", GLOG_v="3")
    return subprocess.run([str(target / "bin" / "align"), *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_wheel_ships_the_rules_and_runs_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    found = subprocess.run([sys.executable, "-c", "import aligner, aligner.mappings; print(aligner.__file__)"],
                           cwd=work, env=dict(os.environ, PYTHONPATH=str(installed)), capture_output=True,
                           text=True, check=True).stdout.strip()
    assert Path(found).is_relative_to(installed), found  # the wheel's copy, not the checkout's
    shipped = {p.name for p in (installed / "aligner" / "mappings").glob("*.yaml")}
    assert shipped == {p.name for p in (Path(__file__).resolve().parents[1] / "mappings").glob("*.yaml")}, shipped

    _torch_checkpoint(work / "model.pth")
    proc = _run_installed(installed, work, "convert", "model.pth", "-o", "model.ckpt")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import mindspore as ms

    names = set(ms.load_checkpoint(str(work / "model.ckpt")))
    assert {"1.gamma", "1.beta", "1.moving_mean", "1.moving_variance", "3.weight"} <= names  # BatchNorm renamed

    a, b = _dumps(work)
    proc = _run_installed(installed, work, "compare", a.name, b.name, "--json", "result.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((work / "result.json").read_text())
    assert result["findings"][0]["module"] == "l1"
    # the health rules (mappings/check_rules.yaml) load from the wheel too
    proc = _run_installed(installed, work, "check", a.name, "--json", "health.json")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert json.loads((work / "health.json").read_text())["checked"], proc.stdout


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_follow_the_umask(tmp_path, umask, expected):
    _torch_checkpoint(tmp_path / "model.pth")
    a, b = _dumps(tmp_path)
    script = ("import os, sys; os.umask(int(sys.argv[1], 8)); from aligner.cli import main; "
              "main(sys.argv[2:])")
    outputs = {"convert": ["convert", "model.pth", "-o", "model.ckpt", "--save-map", "map.yaml"],
               "compare": ["compare", a.name, b.name, "--json", "r.json", "--csv", "r.csv", "--html", "r.html"]}
    env = dict(os.environ, PYTHONWARNINGS="ignore", GLOG_v="3")
    for args in outputs.values():
        subprocess.run([sys.executable, "-c", script, oct(umask), *args], cwd=tmp_path, env=env, timeout=300,
                       capture_output=True)
    for name in ("model.ckpt", "map.yaml", "r.json", "r.csv", "r.html"):
        assert (tmp_path / name).exists(), name
        assert _mode(tmp_path / name) == expected, (name, oct(_mode(tmp_path / name)))
