"""Pairs of loss logs, one per branch of `align losses`' diagnosis and per warning (tests/render/test_losses.py).

Plain text only, and nothing from aligner but the parser's line limit: the same cases ran on the code before the
sentences moved to render/ (aligner at 33d0fb1) to write tests/data/losses/render_golden.json.
"""
from __future__ import annotations

from pathlib import Path

from aligner.pipelines.losses.parse import MAX_LINE


def _losses(*values: str) -> str:
    return "".join(f"loss {v}\n" for v in values)


def _steps(*pairs: tuple[int, float]) -> str:
    return "".join(f"step {s} loss {v}\n" for s, v in pairs)


# case -> (file name -> text, arguments with {name} for a file's path)
LOGS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "agree": ({"a": _losses("2.5", "2.25"), "b": _losses("2.5", "2.25")}, ()),
    "agree_lengths": ({"a": _losses("2.5", "2.25"), "b": _losses("2.5", "2.25", "2")}, ()),
    "forward_above_noise": ({"a": _losses("1.00000000", "1.00000000"), "b": _losses("1.00009000", "1.00000000")}, ()),
    "forward_differs": ({"a": _losses("1.0", "1.0"), "b": _losses("1.1", "1.0")}, ()),
    "forward_nan_note": ({"a": _losses("1.0", "1.0", "1.0"), "b": _losses("1.1", "1.0", "nan")}, ()),
    "forward_nan_both": ({"a": _losses("nan", "1.0"), "b": _losses("1.0", "nan")}, ()),
    "update": ({"a": _losses("1.00000000", "1.00000000"), "b": _losses("1.00000000", "1.1")}, ()),
    "update_tolerance": ({"a": _losses("1.00000000", "1.00000000"), "b": _losses("1.00009000", "1.00011000")},
                         ("--noise", "1e-3")),
    "update_or_hidden": ({"a": _losses("1.2345678", "1.1234567"), "b": _losses("1.235", "1.2")}, ()),
    "update_zero_tolerance": ({"a": _losses("1.0", "1.0"), "b": _losses("1.0", "1.00000012")},
                              ("--rtol", "0", "--atol", "0")),
    "undecided_every_step": ({"a": _losses("1.2345678", "1.1234567"), "b": _losses("1.235", "1.123")}, ()),
    "undecided_some_steps": ({"a": _losses("1.2345678", "1.1234567", "100.5"),
                              "b": _losses("1.235", "1.123", "100.5")}, ()),
    "undecided_inf_rounding": ({"a": _losses("1e308", "1"), "b": _losses("-1e308", "1")}, ()),
    "unstable_same_step": ({"a": _losses("2", "5", "nan"), "b": _losses("2", "5", "nan")}, ()),
    "unstable_beyond": ({"a": _losses("2", "5", "inf"), "b": _losses("2", "5")}, ()),
    "later_nonfinite": ({"a": _losses("2", "1.5", "1.2", "1.1"), "b": _losses("2", "1.5", "nan", "nan")}, ()),
    "later_epoch_start": ({"a.log": "epoch: 1 step: 1, loss is 2\nepoch: 1 step: 2, loss is 1.5\n"
                                    "epoch: 2 step: 1, loss is 1.2\n",
                           "b.csv": "step,loss\n1,2\n2,1.5\n3,1.3125\n"}, ()),
    "later_jump": ({"a": _losses("2.5", "2.25", "2.125", "2"), "b": _losses("2.5", "2.25", "2.25", "2")},
                   ("--show", "1")),
    "later_drift": ({"a": _losses("2.5", "2.25", "2"), "b": _losses("2.5", "2.25", "2.1")}, ("--show", "0")),
    "later_logs_start_late": ({"a": _steps((10, 2), (20, 1), (30, 0.5)), "b": _steps((10, 2), (20, 1.1))}, ()),
    "later_first_common_step": ({"a": _steps((10, 2), (20, 1)), "b": _steps((10, 2.5), (20, 1.1))}, ()),
    "later_from_step_2": ({"a": _steps((2, 2), (3, 1)), "b": _steps((2, 2.5), (3, 1.1))}, ()),
    "repeat_measured": ({"a": _losses("2.0", "1.5"), "b": _losses("2.0001", "1.5"), "a2": _losses("2.0001", "1.5")},
                        ("--repeat-a", "{a2}")),
    "repeat_identical": ({"a": _losses("2.0", "1.5"), "b": _losses("2.0", "1.5"), "a2": _losses("2.0", "1.5"),
                          "b2": _losses("2.0", "1.5")}, ("--repeat-b", "{b2}", "--repeat-a", "{a2}")),
    "given_noise": ({"a": _losses("2.0", "1.5"), "b": _losses("2.0001", "1.5")}, ("--noise", "1e-5")),
    "long_lines": ({"a": "x" * (MAX_LINE + 1) + "\n" + _losses("2.0", "1.5") + "y" * (MAX_LINE + 5) + "\n",
                    "b": _losses("2.0", "1.5")}, ()),
    "coarse_both": ({"a": _losses("1.23", "1.12"), "b": _losses("1.235", "1.123")}, ()),
}


def write_case(folder: Path, case: str) -> tuple[str, ...]:
    """The case's logs in `folder` (made if need be); `align losses` arguments naming them (RUN_A and RUN_B are the
    first two files)."""
    files, extra = LOGS[case]
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in files.items():
        paths[name.split(".")[0]] = folder / name
        (folder / name).write_text(text, encoding="utf-8")
    a, b = (str(p) for p in list(paths.values())[:2])
    return (a, b, *(arg.format(**paths) for arg in extra))
