"""Loss-log readers for each input form, the comparison's edge cases, and `align losses` on bad input."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from aligner.core.errors import AlignerError
from aligner.core.tolerance import Tolerance
from aligner.pipelines.losses import StepStatus, Verdict, compare_curves
from aligner.pipelines.losses.parse import compile_pattern, read_losses
from aligner.render.losses import report_text as text
from tests.support.cli import align_in_process
from tests.support.cli import assert_one_line_error as check_error


def write(tmp_path: Path, name: str, text: str) -> Path:
    """A log file in the test's directory."""
    path = tmp_path / name
    path.write_text(text)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """`align losses ARGS` through the suite's in-process harness: exit code, stdout, stderr."""
    proc = align_in_process(capsys, "losses", *args)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(result: tuple[int, str, str], *fragments: str) -> None:
    """The suite's user-error check, plus: nothing on stdout, and the `align: error:` prefix."""
    code, out, err = result
    check_error(subprocess.CompletedProcess([], code, out, err), *fragments)
    assert out == "" and err.startswith("align: error: "), err


# --- readers -------------------------------------------------------------------------------------------------

def test_loss_monitor_steps_restart_per_epoch(tmp_path):
    curve = read_losses(write(tmp_path, "ms.log", (
        "[WARNING] ME(123) something\n"
        "epoch: 1 step: 1, loss is 2.302585\n"
        "epoch: 1 step: 2, loss is 2.1\n"
        "epoch time: 12.3 ms, per step time: 6.1 ms\n"
        "epoch: 2 step: 1, loss is [1.9]\n"
        "epoch: 2 step: 2, loss is 1.85\n")))
    assert curve.format == "text" and curve.pattern_name.startswith("MindSpore LossMonitor")
    assert curve.steps == (1, 2, 3, 4)
    assert curve.losses == (2.302585, 2.1, 1.9, 1.85)
    assert curve.epoch_starts == frozenset({3})
    assert curve.resolution == pytest.approx(1e-6)


@pytest.mark.parametrize("text, steps, losses", [
    ("step: 3, loss: 0.123\nstep: 4, loss: 0.12\n", (3, 4), (0.123, 0.12)),
    ("step 0 | loss 0.5 | lr 0.1\nstep 1 | loss 0.25 | lr 0.1\n", (1, 2), (0.5, 0.25)),  # 0-based: shifted
    ("Epoch [1/2] Step [5/9] train_loss=1e-3\nEpoch [2/2] Step [6/9] train_loss=1.5E-04\n", (5, 6), (1e-3, 1.5e-4)),
    ("loss = 0.123\nval stuff\nloss = 0.1\nloss = nan\n", (1, 2, 3), (0.123, 0.1, math.nan)),
    ("Loss is inf\n", (1,), (math.inf,)),
])
def test_text_forms(tmp_path, text, steps, losses):
    curve = read_losses(write(tmp_path, "train.log", text))
    assert curve.steps == steps
    assert curve.losses == pytest.approx(losses, nan_ok=True)


def test_epoch_with_global_step_counter_is_not_offset(tmp_path):
    curve = read_losses(write(tmp_path, "t.log",
                              "epoch 1 step 1 loss 3\nepoch 1 step 2 loss 2\nepoch 2 step 3 loss 1\n"))
    assert curve.steps == (1, 2, 3) and curve.epoch_starts == frozenset({3})


def test_custom_pattern_with_and_without_step(tmp_path):
    path = write(tmp_path, "t.log", "it=7 L=0.5\nit=9 L=0.4\n")
    assert read_losses(path, r"it=(?P<step>\d+) L=(?P<loss>\S+)").steps == (7, 9)
    curve = read_losses(path, r"L=(?P<loss>\S+)")
    assert (curve.steps, curve.losses, curve.pattern) == ((1, 2), (0.5, 0.4), r"L=(?P<loss>\S+)")


def test_csv_with_header_in_any_case(tmp_path):
    curve = read_losses(write(tmp_path, "m.csv",
                              "\ufeffEpoch,Step,Loss,lr\n1,1,0.50,0.1\n1,2,0.40,0.1\n2,1,0.30,0.1\n"))
    assert (curve.format, curve.steps, curve.losses) == ("csv", (1, 2, 3), (0.5, 0.4, 0.3))
    assert curve.resolution == pytest.approx(0.01)  # "0.50" is written to 2 decimals


def test_json_records_columns_and_log_history(tmp_path):
    records = read_losses(write(tmp_path, "r.json", json.dumps([{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}])))
    columns = read_losses(write(tmp_path, "c.json", json.dumps({"step": [1, 2], "loss": [0.5, 0.4]})))
    history = read_losses(write(tmp_path, "trainer_state.json", json.dumps({"best": None, "log_history": [
        {"step": 10, "loss": 0.5}, {"step": 10, "eval_loss": 0.9}, {"step": 20, "loss": 0.4}]})))
    assert records.losses == columns.losses == history.losses == (0.5, 0.4)
    assert records.steps == columns.steps == (1, 2) and history.steps == (10, 20)


def test_jsonl_skips_records_without_loss_and_keeps_nan(tmp_path):
    curve = read_losses(write(tmp_path, "m.jsonl",
                              '{"step": 1, "loss": 0.5}\n\n{"eval_loss": 3}\n{"step": 2, "loss": NaN}\n'))
    assert curve.format == "jsonl" and curve.steps == (1, 2) and math.isnan(curve.losses[1])


@pytest.mark.parametrize("name, text, fmt", [
    ("train.log", '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n', "jsonl"),
    ("train.txt", '[{"step": 1, "loss": 0.5}]', "json"),
    ("train.out", "{ not json: step 1 loss 0.5\n", "text"),
])
def test_format_is_sniffed_from_content(tmp_path, name, text, fmt):
    assert read_losses(write(tmp_path, name, text)).format == fmt


@pytest.mark.parametrize("name, text, pattern, fragments", [
    ("e.log", "  \n", None, ["is empty"]),
    ("n.log", "nothing here\n", None, ["no losses found", "MindSpore LossMonitor", "--pattern"]),
    ("n.log", "loss 1\n", r"x(?P<loss>\d)", ["no line matches --pattern"]),
    ("b.log", "step 5 loss 1\nstep 3 loss 1\n", None, ["line 2", "step 3 comes after step 5"]),
    ("b.log", "epoch 2 step 1 loss 1\nepoch 1 step 2 loss 1\n", None, ["epoch 1 comes after epoch 2"]),
    ("b.log", "epoch 1 step 1 loss 1\nepoch 2 step 0 loss 1\n", None, ["line 2", "would repeat global step 1"]),
    ("m.log", "it 1 L 0.5\nL 0.4\n", r"(?:it (?P<step>\d+) )?L (?P<loss>\S+)", ["line 2", "without a step"]),
    ("x.log", "loss: 0.5\n", r"loss: (?P<loss>\S+)()", []),  # sanity: a valid pattern reads
    ("v.csv", "step,loss\n1,abc\n", None, ["row 2", "'abc' is not a number"]),
    ("s.csv", "step,loss\n1.5,0.1\n", None, ["row 2", "step '1.5' is not a non-negative whole number"]),
    ("k.csv", "step,value\n1,0.1\n", None, ["no field named loss", "fields found: step, value"]),
    ("j.jsonl", '{"loss": 1}\nnot json\n', None, ["line 2", "not valid JSON"]),
    ("j.jsonl", '{"loss": 1}\n[1]\n', None, ["line 2", "expected a JSON object"]),
    ("j.json", '{"loss": 1', None, ["not valid JSON"]),
    ("j.json", '"text"', None, ["expected a JSON list of records"]),
    ("p.csv", "step,loss\n1,0.1\n", r"(?P<loss>x)", ["--pattern applies to text logs", "CSV"]),
])
def test_reader_errors(tmp_path, name, text, pattern, fragments):
    path = write(tmp_path, name, text)
    if not fragments:
        assert read_losses(path, pattern).losses == (0.5,)
        return
    with pytest.raises(AlignerError) as error:
        read_losses(path, pattern)
    for fragment in fragments:
        assert fragment in str(error.value)


@pytest.mark.parametrize("pattern, fragment", [("(", "invalid regular expression"),
                                               (r"(?P<step>\d+)", "no named group")])
def test_compile_pattern_errors(pattern, fragment):
    with pytest.raises(AlignerError, match=fragment):
        compile_pattern(pattern)


# --- comparison edge cases -------------------------------------------------------------------------------------

def curves(tmp_path: Path, a: str, b: str, tolerance: Tolerance | None = None, noise: float | None = None):
    """Compare two 'loss X' logs: the LossReport, twice so the old (comparison, diagnosis) unpacking reads."""
    report = compare_curves(read_losses(write(tmp_path, "a.log", a)), read_losses(write(tmp_path, "b.log", b)),
                            tolerance, noise=noise)
    return report, report


def test_tolerance_is_symmetric_and_relative(tmp_path):
    # noise 1e-3: the noise bound (4e-3) is far above these differences, so the tolerance alone decides
    c, d = curves(tmp_path, "loss 1.00000000\nloss 1.00000000\n", "loss 1.00009000\nloss 1.00011000\n",
                  noise=1e-3)
    assert [row.close for row in c.steps] == [True, False] and c.first_part == 2 and d.verdict == Verdict.UPDATE
    assert c.steps[1].rel_diff == pytest.approx(1.1e-4 / 1.00011)
    assert c.steps[1].status == StepStatus.DIFFERS and "beyond the tolerance" in text(d).summary


def test_difference_above_the_float32_noise_is_real_even_within_the_tolerance(tmp_path):
    # 9e-5 at step 1: inside rtol=1e-4, but ~190x the estimated float32 noise of 4*eps32*1 = 4.8e-7
    c, d = curves(tmp_path, "loss 1.00000000\nloss 1.00000000\n", "loss 1.00009000\nloss 1.00000000\n")
    assert (c.first_part, d.verdict, d.exit_code, bool(d)) == (1, Verdict.FORWARD, 1, False)
    assert c.steps[0].status == StepStatus.ABOVE_NOISE and c.steps[1].status == StepStatus.OK
    assert "x the estimated float32 noise of 4.77e-07: likely a real difference, although within the tolerance" \
        in text(d).summary


def test_tolerance_tighter_than_the_noise_still_decides(tmp_path):
    c, d = curves(tmp_path, "loss 1.0\nloss 1.0\n", "loss 1.0\nloss 1.00000012\n", Tolerance(0.0, 0.0, True))
    assert (c.first_part, c.steps[1].status, d.verdict) == (2, StepStatus.DIFFERS, Verdict.UPDATE)


def test_coarse_print_cannot_decide_and_warns(tmp_path):
    c, d = curves(tmp_path, "loss 1.2345678\nloss 1.1234567\n", "loss 1.235\nloss 1.123\n")
    assert (d.verdict, d.exit_code, d.first_part) == (Verdict.UNDECIDED, 1, None)
    assert c.b.resolution == pytest.approx(1e-3)
    assert [row.status for row in c.steps] == [StepStatus.UNRESOLVED] * 2
    assert text(d).summary.startswith("Cannot decide: A prints losses rounded to 1e-07 and B prints losses rounded "
                                      "to 0.001, so differences below 0.0005 are invisible, while a real difference "
                                      "can be as small as 2.36e-06")
    assert text(d).warnings == ("B prints losses rounded to 0.001: differences below 0.0005 cannot be seen "
                                "(the bounds are widened by that); log more digits",)


def test_coarse_print_still_shows_a_large_difference(tmp_path):
    c, d = curves(tmp_path, "loss 1.2345678\nloss 1.1234567\n", "loss 1.236\nloss 1.123\n")
    assert (d.verdict, c.steps[0].status) == (Verdict.FORWARD, StepStatus.DIFFERS)


def test_exact_float32_values_do_not_look_rounded(tmp_path):
    c, d = curves(tmp_path, "loss 2.5\nloss 1.26095449924469\n", "loss 2.5\nloss 1.2609545\n")
    assert (c.a.resolution, c.b.resolution, d.warnings, d.verdict) == (0.0, pytest.approx(1e-7), (), Verdict.AGREE)


def test_nan_on_one_side_is_reported_and_diagnosed(tmp_path):
    c, d = curves(tmp_path, "loss 2\nloss 1.5\nloss 1.2\nloss 1.1\n", "loss 2\nloss 1.5\nloss nan\nloss nan\n")
    assert (c.first_nan_a, c.first_nan_b, c.first_part, d.verdict, d.exit_code) == (None, 3, 3, Verdict.LATER, 1)
    assert "B's loss is first NaN/inf at step 3, A's loss stays finite" in text(d).summary
    assert "becomes NaN/inf at step 3" in text(d).advice
    assert text(d).next_command == "align compare dumps_ms/ dumps_pt/"


def test_nan_at_the_same_step_on_both_sides_is_unstable_training(tmp_path):
    c, d = curves(tmp_path, "loss 2\nloss 5\nloss nan\n", "loss 2\nloss 5\nloss nan\n")
    assert (c.first_part, c.first_nan_a, c.first_nan_b, d.verdict, d.exit_code) == (None, 3, 3, Verdict.UNSTABLE, 1)
    assert "at the same step" in text(d).advice and text(d).next_command == "align compare dumps_ms/ dumps_pt/"


def test_nan_beyond_the_shorter_log(tmp_path):
    c, d = curves(tmp_path, "loss 2\nloss 5\nloss inf\n", "loss 2\nloss 5\n")
    assert (c.first_part, c.first_nan_a, c.first_nan_b, d.verdict, d.exit_code) == (None, 3, None, Verdict.UNSTABLE, 1)
    assert "beyond the other log's last step (2)" in text(d).advice


def test_logs_that_start_late_cannot_get_the_step_1_2_test(tmp_path):
    comparison = compare_curves(read_losses(write(tmp_path, "a.log",
                                                  "step 10 loss 2\nstep 20 loss 1\nstep 30 loss 0.5\n")),
                                read_losses(write(tmp_path, "b.log", "step 10 loss 2\nstep 20 loss 1.1\n")))
    d = comparison
    assert (comparison.first_part, d.verdict) == (20, Verdict.LATER)
    assert text(d).summary.startswith("Step 10 agrees; the curves part at step 20")
    assert "The logs start at step 10" in text(d).advice
    assert text(d).next_command == "align diff step10_ms.ckpt step10_pt.pth"
    assert "compared only the 2 common steps" in text(d).warnings[0]


def test_divergence_at_an_epoch_start_points_at_the_data_order(tmp_path):
    a = write(tmp_path, "a.log",
              "epoch: 1 step: 1, loss is 2\nepoch: 1 step: 2, loss is 1.5\nepoch: 2 step: 1, loss is 1.2\n")
    b = write(tmp_path, "b.csv", "step,loss\n1,2\n2,1.5\n3,1.3125\n")
    d = compare_curves(read_losses(a), read_losses(b))
    assert d.verdict == Verdict.LATER and "Step 3 starts a new epoch" in text(d).advice


# --- the command on bad input --------------------------------------------------------------------------------

@pytest.fixture()
def logs(tmp_path: Path) -> tuple[Path, Path]:
    """Two agreeing logs in different formats."""
    return (write(tmp_path, "a.log", "epoch: 1 step: 1, loss is 2.5\nepoch: 1 step: 2, loss is 2.25\n"),
            write(tmp_path, "b.jsonl", '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n'))


def test_agreeing_logs_exit_0(capsys, logs):
    code, out, err = run(capsys, *logs)
    assert (code, err) == (0, "") and "The curves agree on all 2 common steps" in out


def test_different_lengths_warn_and_compare_the_common_steps(capsys, logs, tmp_path):
    longer = write(tmp_path, "long.log", "step 1 loss 2.5\nstep 2 loss 2.25\nstep 3 loss 2\n")
    code, _, err = run(capsys, logs[0], longer)
    assert code == 0 and err == ("align: warning: A has 2 losses (steps 1-2), B has 3 (steps 1-3): "
                                 "compared only the 2 common steps\n")


def test_no_common_steps(capsys, logs, tmp_path):
    late = write(tmp_path, "late.log", "step 7 loss 1\n")
    assert_one_line_error(run(capsys, logs[0], late), "no common steps", "steps 1-2", "steps 7")


def test_nan_exits_1_with_the_first_nan_step_of_each_side(capsys, logs, tmp_path):
    nan = write(tmp_path, "nan.log", "step 1 loss 2.5\nstep 2 loss nan\n")
    code, out, _ = run(capsys, logs[0], nan, "--json", "-")
    report = json.loads(out)
    assert (code, report["a"]["first_nan"], report["b"]["first_nan"]) == (1, None, 2)
    assert report["steps"][1]["b"] == "nan" and report["next_command"] == "align diff step1_ms.ckpt step1_pt.pth"


@pytest.mark.parametrize("args, fragments", [
    (["missing.log", "{b}"], ["missing.log: no such file"]),
    (["{dir}", "{b}"], ["is not a file"]),
    (["{a}", "{empty}"], ["is empty"]),
    (["{a}", "{noloss}"], ["no losses found", "tried the default patterns"]),
    (["{a}", "{b}", "--pattern", "("], ["--pattern: invalid regular expression"]),
    (["{a}", "{b}", "--pattern", "loss"], ["--pattern: 'loss' has no named group (?P<loss>...)"]),
    (["{a}", "{b}", "--pattern-a", r"nomatch (?P<loss>\S+)"], ["no line matches --pattern-a"]),
    (["{a}", "{b}", "--pattern-b", r"loss (?P<loss>\S+)"], ["--pattern-b applies to text logs", "JSONL"]),
    (["{b}", "{b}", "--pattern", r"(?P<loss>\S+)"], ["neither RUN_A nor RUN_B is a text log"]),
    (["{a}", "{b}", "--rtol", "x", "--atol", "0"], ["--rtol must be a number, got 'x'"]),
    (["{a}", "{b}", "--rtol", "-1", "--atol", "0"], ["--rtol must be a finite number >= 0, got '-1'"]),
    (["{a}", "{b}", "--rtol", "0", "--atol", "nan"], ["--atol must be a finite number >= 0, got 'nan'"]),
    (["{a}", "{b}", "--rtol", "1e-6"], ["--rtol was given without --atol: give both or neither"]),
    (["{a}", "{b}", "--atol", "1e-6"], ["--atol was given without --rtol: give both or neither"]),
    (["{a}", "{b}", "--rtol", "x*:1", "--atol", "x*:1"], ["per-name values (x*:...) do not apply to losses"]),
    (["{a}", "{b}", "--noise", "-1"], ["--noise must be a finite number >= 0, got '-1'"]),
    (["{a}", "{b}", "--noise", "1e-6", "--repeat-a", "{a}"], ["give --noise or --repeat-a/--repeat-b, not both"]),
    (["{a}", "{b}", "--repeat-a", "{late}"], ["--repeat-a:", "shares no step with"]),
    (["{a}", "{b}", "--repeat-b", "{empty}"], ["is empty"]),
    (["{a}", "{b}", "--json", "{tmp}/r.png", "--plot", "{tmp}/r.png"], ["must name different files"]),
    (["{a}", "{b}", "--json", "{a}"], ["already exists (use --force to overwrite)"]),
    (["{a}", "{b}", "--show", "-1"], ["--show: '-1' must be >= 0"]),
    (["{a}", "{b}", "--show", "2.5"], ["--show: '2.5' is not a whole number"]),
    (["{a}", "{b}", "--json", "-", "--plot", "{a}"], ["already exists (use --force to overwrite)"]),
    (["{a}", "{b}", "--plot", "{tmp}/plot.txt"], ["--plot: cannot write .txt"]),
    (["{a}", "{b}", "--plot", "{tmp}/nodir/plot.png"], ["output directory", "does not exist"]),
    (["{a}", "{noloss}", "--plot", "{tmp}/plot.png", "--json", "{tmp}/r.json"], ["no losses found"]),
    (["{a}", "{b}", "--force", "--plot", "{dir}"], ["is a directory"]),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, logs, tmp_path, args, fragments):
    (tmp_path / "adir").mkdir()
    names = {"a": logs[0], "b": logs[1], "dir": tmp_path / "adir", "tmp": tmp_path,
             "empty": write(tmp_path, "empty.log", ""), "noloss": write(tmp_path, "noloss.log", "hello\n"),
             "late": write(tmp_path, "late.log", "step 7 loss 1\n")}
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(run(capsys, *(arg.format(**names) for arg in args)), *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_force_overwrites_the_plot(capsys, logs, tmp_path):
    plot = write(tmp_path, "curves.svg", "old")
    code, _, _ = run(capsys, *logs, "--plot", plot, "--force")
    assert code == 0 and plot.read_text().lstrip().startswith("<?xml")


def test_table_shows_the_parting_step_beyond_the_first_rows(capsys, tmp_path):
    a = write(tmp_path, "a.log", "step 1 loss 2.5\nstep 2 loss 2.25\nstep 3 loss 2.125\nstep 4 loss 2\n")
    b = write(tmp_path, "b.log", "step 1 loss 2.5\nstep 2 loss 2.25\nstep 3 loss 2.25\nstep 4 loss 2\n")
    code, out, _ = run(capsys, a, b, "--show", "1")
    rows = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit() or line.strip() == "..."]
    assert (code, rows) == (1, ["1", "...", "3"])
    assert "Steps 1-2 agree; the curves part at step 3" in out and "align diff step2_ms.ckpt step2_pt.pth" in out


def test_a_noisy_repeat_widens_the_noise_bound(tmp_path):
    a = read_losses(write(tmp_path, "a.log", "loss 2.0\nloss 1.5\n"))
    b = read_losses(write(tmp_path, "b.log", "loss 2.0001\nloss 1.5\n"))
    assert compare_curves(a, b).verdict == Verdict.FORWARD  # 1e-4 is ~100x the float32 estimate (9.5e-7)
    # a rerun of A that moved by 1e-4 at step 1: sigma 1e-4, bound 4e-4 plus rounding
    repeat = read_losses(write(tmp_path, "a2.log", "loss 2.0001\nloss 1.5\n"))
    report = compare_curves(a, b, repeat_a=repeat)
    assert (report.verdict, report.noise.source) == (Verdict.AGREE, "repeat")
    assert report.steps[1].noise == pytest.approx(1e-4)


def test_an_identical_repeat_measures_nothing_and_says_so(tmp_path):
    a = read_losses(write(tmp_path, "a.log", "loss 2.0\nloss 1.5\n"))
    report = compare_curves(a, a, repeat_b=a)
    assert report.verdict == Verdict.AGREE and report.steps[0].noise == pytest.approx(4 * 2 ** -23 * 2)
    assert len(report.warnings) == 1 and "identical to B on every common step" in text(report).warnings[0]


def test_json_to_a_file_keeps_the_text_report_and_is_strict(capsys, logs, tmp_path):
    nan = write(tmp_path, "nan.log", "step 1 loss 2.5\nstep 2 loss nan\n")
    code, out, _ = run(capsys, logs[0], nan, "--json", tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    report = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert code == 1 and "Step 1 agrees, step 2 differs" in out
    assert (report["verdict"], report["exit_code"], report["steps"][1]["status"]) == ("update", 1, "differs")
    assert report["tolerance"] == {"rtol": 1e-4, "atol": 1e-6, "symmetric": True}
    assert report["noise"]["source"] == "float32" and report["steps"][1]["abs_diff"] == "nan"


@pytest.mark.parametrize("extra, fragment", [
    (["--noise", "abc"], "--noise must be a number"),
    (["--noise", "-1"], "--noise must be a finite number >= 0"),
    (["--noise", "1e-6", "--repeat-a", "REPEAT"], "give --noise or --repeat-a/--repeat-b, not both"),
    (["--repeat-a", "MISSING"], "MISSING"),
])
def test_bad_noise_options_are_one_line_errors(capsys, tmp_path, extra, fragment):
    a = write(tmp_path, "a.log", "step 1 loss 2\nstep 2 loss 1\n")
    b = write(tmp_path, "b.log", "step 1 loss 2\nstep 2 loss 1\n")
    args = [str(a if x == "REPEAT" else tmp_path / "missing.log" if x == "MISSING" else x) for x in extra]
    fragment = str(tmp_path / "missing.log") if fragment == "MISSING" else fragment
    assert_one_line_error(run(capsys, a, b, *args), fragment)
