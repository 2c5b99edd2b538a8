"""Characterise `aligner.dump` + `align compare` on the zoo pairs (writes tests/zoo/FINDINGS.md; asserts nothing).

    .venv/bin/python -m tests.zoo.characterize [WORKDIR]

Per pair: build, `make_equal` (align convert --like), then dump both sides twice -- forward only (torch under
torch.no_grad) and forward+backward (loss = mean(output**2); MindSpore via value_and_grad inside the dump context) --
and run `align compare ms pt --json` and `align compare pt ms --json` on each.
"""
from __future__ import annotations

import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.zoo import (
    ms_compat,
    torch_compat,  # noqa: F401
)
from tests.zoo.common import run_align

FAMILIES = ["cnn", "vit", "encoder_lm", "decoder_lm", "mha", "upsample"]


def dump_pair(pair, root: Path, backward: bool) -> tuple[Path, Path]:
    import mindspore as ms
    import torch

    import aligner

    pt_dir, ms_dir = root / "pt", root / "ms"
    with aligner.dump(pair.torch_model, pt_dir):
        if backward:
            out = pair.torch_output(pair.torch_model(**pair.torch_tensors()))
            (out.float() ** 2).mean().backward()
        else:
            with torch.no_grad():
                pair.torch_model(**pair.torch_tensors())
    with aligner.dump(pair.ms_model, ms_dir):
        if backward:
            kwargs = pair.ms_tensors()

            def loss_fn(*params):
                out = pair.ms_output(pair.ms_model(**kwargs))
                return (out.astype(ms.float32) ** 2).mean()

            ms.value_and_grad(loss_fn, None, pair.ms_model.trainable_params())()
        else:
            pair.ms_model(**pair.ms_tensors())
    return ms_dir, pt_dir


def compare(a: Path, b: Path, out: Path) -> dict:
    proc = run_align("compare", a, b, "--json", out, "--force", check=False)
    row = {"rc": proc.returncode, "first": "-", "only_a": "?", "only_b": "?", "matched": "?",
           "stderr": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""}
    if out.exists():
        res = json.loads(out.read_text())
        counts = res.get("counts", {})
        row.update(only_a=counts.get("unmatched_a"), only_b=counts.get("unmatched_b"),
                   matched=f"{counts.get('name')} name + {counts.get('content')} content")
        findings = res.get("findings") or []
        if findings:
            f = findings[0]
            row["first"] = (f"{f.get('kind', '')}: {f.get('module') or f.get('record') or ''} "
                            f"{f.get('detail') or f.get('summary') or ''}").strip()
    return row


def characterize(family: str, work: Path) -> list[dict]:
    pair = importlib.import_module(f"tests.zoo.{family}").build(seed=0)
    pair.make_equal(work / family)
    diff = pair.max_abs_diff()
    rows = []
    for backward in (False, True):
        root = work / family / ("fwd_bwd" if backward else "fwd")
        shutil.rmtree(root, ignore_errors=True)
        try:
            ms_dir, pt_dir = dump_pair(pair, root, backward)
        except Exception as exc:
            msg = f"dump failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append({"pair": pair.name, "mode": root.name, "order": "-", "diff": diff, "rc": "-",
                         "first": msg, "only_a": "-", "only_b": "-", "matched": "-", "stderr": ""})
            continue
        for order, (a, b) in (("ms pt", (ms_dir, pt_dir)), ("pt ms", (pt_dir, ms_dir))):
            row = compare(a, b, root / f"compare_{order.replace(' ', '_')}.json")
            row.update(pair=pair.name, mode=root.name, order=order, diff=diff)
            rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    work = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="zoo_char_"))
    ms_compat.install()
    rows = []
    for family in FAMILIES:
        rows += characterize(family, work)
        print(json.dumps(rows[-1], default=str), flush=True)
    (work / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"rows: {work / 'rows.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
