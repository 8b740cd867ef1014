"""inspect-logs and the train console after issue 28 items 11, 28 and 29: a run still starting,
compressed logs, not-a-log inputs, --follow that gives up or streams validation, output-path
errors, noise on CPU (MFU without a peak, the compilation band, a throughput drop, the host-memory
line, colours in train.log) and what an interruption leaves (the Ctrl-C hint, a resume that is not
a restart, the plot's marks, title and legends).

Logs are written with torchtitan 0.3.0's own format strings (tests/test_inspect_logs.py's builders).
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.test_inspect_logs import line, make_run, run_log, step_msg

CPU_PEAK = line("Peak flops undefined for: CPU (x86_64), fallback to A100", level="WARNING")


def _codes(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


# --- item 11: a starting run, compressed logs, not a log, --follow giving up, output paths ----------


@pytest.mark.parametrize("text", ["", line("Starting job: Qwen3 fine-tune") + line("Building qwen3 debugmodel")])
def test_a_run_still_starting_is_said_to_be_starting(cli, in_tmp, text):
    """run.json says running and no step is logged yet: not an error (exit 0), the run is starting."""
    runs = in_tmp / ".trnqwen" / "runs"
    d = make_run(runs, "starting", text, status="running", steps=5)
    res = cli("inspect-logs", str(d))
    assert res.code == 0, res.err
    assert "still starting" in res.out + res.err and "no-steps" not in res.out
    doc = json.loads(cli("inspect-logs", str(d), "--json").out)
    assert "starting" in _codes(doc) and "no-steps" not in _codes(doc)
    if not text:  # before torchrun starts there is no train.log at all
        (d / "train.log").unlink()
        res = cli("inspect-logs", str(d))
        assert res.code == 0 and "still starting (no log line yet" in res.out, res.err
        (d / "train.log").write_text(text)
    # the same log when the run has ended is an error, as before
    rec = json.loads((d / "run.json").read_text())
    rec["status"] = "failed"
    (d / "run.json").write_text(json.dumps(rec))
    assert cli("inspect-logs", str(d)).code in (1, 2)


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_compressed_logs_are_read(cli, tmp_path, suffix, opener):
    text = run_log([7.0, 6.5, 6.0], total=3)
    plain = tmp_path / "train.log"
    plain.write_text(text)
    packed = tmp_path / f"train.log{suffix}"
    with opener(packed, "wb") as fh:
        fh.write(text.encode())
    a = json.loads(cli("inspect-logs", str(plain), "--json").out)
    res = cli("inspect-logs", str(packed), "--json")
    assert res.code == 0, res.err
    b = json.loads(res.out)
    assert [s["loss"] for s in b["steps"]] == [s["loss"] for s in a["steps"]] == [7.0, 6.5, 6.0]
    assert _codes(b) == _codes(a)
    res = cli("inspect-logs", str(packed), "--follow")
    assert res.code == 2 and "does not grow" in res.err


def test_a_cut_off_or_corrupt_gzip_is_a_usage_error(cli, tmp_path):
    data = gzip.compress(run_log([7.0, 6.5] * 200).encode())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) // 2])
    res = cli("inspect-logs", str(cut))
    assert res.code == 2 and "cut-off gzip" in res.err and "Traceback" not in res.err
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(data[:10] + b"\x00" * 64 + data[74:])
    res = cli("inspect-logs", str(bad))
    assert res.code == 2 and "Traceback" not in res.err


def test_follow_that_gives_up_says_so_and_exits_non_zero(cli, tmp_path):
    p = tmp_path / "t.log"
    p.write_text(run_log([3.0, 2.0], completed=False))
    res = cli("inspect-logs", str(p), "--follow", "--idle-timeout", "1")
    assert res.code == 1, (res.out, res.err)
    assert "stopped following" in res.err and "no new log line for" in res.out
    assert cli("inspect-logs", str(p), "--follow", "--idle-timeout", "1", "--no-strict").code == 0


def test_output_path_errors_name_the_path_not_a_temp_file(cli, tmp_path, in_tmp):
    log = tmp_path / "x.log"
    log.write_text(run_log([3.0, 2.0, 1.5]))
    (tmp_path / "afile").write_text("hi")
    for flag, name in (("--csv", "steps.csv"), ("--plot", "p.png")):
        res = cli("inspect-logs", str(log), flag, str(tmp_path / "afile" / "sub" / name))
        assert res.code == 2 and "afile is a file, not a folder" in res.err and "File exists" not in res.err, res.err
        long_name = "a" * 250 + Path(name).suffix  # fits the file system; its temp file's name does not
        res = cli("inspect-logs", str(log), flag, long_name)
        assert res.code == 2 and "too long" in res.err, res.err
        assert f".{'a' * 250}" not in res.err and f".{'a' * 20}" not in res.err  # no temp name
    assert not list(tmp_path.glob(".a*")) and not list(in_tmp.glob(".a*"))


# --- item 28: noise on CPU ----------------------------------------------------------------------------


def test_mfu_without_a_peak_is_a_dash(cli, tmp_path):
    """torchtitan has no CPU peak and falls back to an A100's: 0.00% means nothing; show '-'."""
    p = tmp_path / "cpu.log"
    p.write_text(CPU_PEAK + run_log([7.0, 6.5, 6.0], mfu=0.0, total=3))
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    assert doc["summary"]["mean_mfu_after_step1"] is None
    assert doc["summary"]["mfu_unknown"] == "no peak FLOPS known for CPU (x86_64)"
    table = cli("inspect-logs", str(p)).out
    assert " 0.00%" not in table and "- (no peak FLOPS known for CPU (x86_64))" in table
    followed = cli("inspect-logs", str(p), "--follow", "--idle-timeout", "1")
    assert "mfu -" in followed.err and "mfu 0.00%" not in followed.err
    # a device with a peak keeps its MFU
    q = tmp_path / "gpu.log"
    q.write_text(run_log([7.0, 6.5, 6.0], mfu=41.5, total=3))
    assert json.loads(cli("inspect-logs", str(q), "--json").out)["summary"]["mean_mfu_after_step1"] == 41.5


def test_status_line_shows_no_mfu_on_cpu():
    import io

    from trnqwen.train.status import StatusLine

    metrics = {"step": 2, "loss": 7.1, "tps": 219, "mfu": 0.0}
    cpu = StatusLine(stream=io.StringIO(), total_steps=6, mfu=False)
    cpu.update(metrics)
    assert "mfu -" in cpu.text() and "0.00%" not in cpu.text()
    dev = StatusLine(stream=io.StringIO(), total_steps=6)
    dev.update(dict(metrics, mfu=41.5))
    assert "mfu 41.50%" in dev.text()


def test_throughput_drop_on_cpu_is_not_a_warning(tmp_path, cli):
    tps = [20, 400, 410, 405, 150, 140, 150, 145, 150, 148, 150]
    text = run_log([7.0 - i / 10 for i in range(len(tps))], tps=tps, total=len(tps))
    p = tmp_path / "dev.log"
    p.write_text(text)
    dev = json.loads(cli("inspect-logs", str(p), "--json").out)
    assert [f["severity"] for f in dev["findings"] if f["code"] == "throughput-collapse"] == ["warning"]
    p.write_text(CPU_PEAK + text)
    cpu = json.loads(cli("inspect-logs", str(p), "--json").out)
    found = [f for f in cpu["findings"] if f["code"] == "throughput-collapse"]
    assert [f["severity"] for f in found] == ["info"] and "host's load" in found[0]["message"]


@pytest.fixture
def figures(monkeypatch):
    """The figures --plot writes (captured on their way to the real file)."""
    from trnqwen.logs import plot

    seen = []
    real = plot.save_figure_atomic

    def keep(fig, path, *args, **kw):
        seen.append(_facts(fig))
        return real(fig, path, *args, **kw)

    monkeypatch.setattr(plot, "save_figure_atomic", keep)
    return seen


def _facts(fig) -> dict:
    """What a test checks of a figure, read before it is closed: legend texts, the title, and
    whether a legend covers any throughput point."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = fig.get_axes()
    labels = [t.get_text() for ax in axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    legends = [ax.get_legend().get_window_extent(renderer) for ax in axes if ax.get_legend()]
    tps_ax = next(ax for ax in axes if ax.get_ylabel().startswith("tokens"))
    covered = []
    for ln in tps_ax.get_lines():
        if not ln.get_label().startswith("tokens"):
            continue
        for x, y in tps_ax.transData.transform(ln.get_xydata()):
            if any(box.contains(x, y) for box in legends):
                covered.append((x, y))
    return {"labels": labels, "title": fig._suptitle.get_text() if fig._suptitle else "", "covered": covered}


def test_plot_marks_step_1_as_compilation_only_when_something_compiled(cli, tmp_path, figures):
    p = tmp_path / "x.log"
    p.write_text(CPU_PEAK + run_log([7.0, 6.5, 6.0], mfu=0.0, total=3))
    assert cli("inspect-logs", str(p), "--plot", str(tmp_path / "a.png")).code == 0
    assert not any("compilation" in t for t in figures[-1]["labels"])
    assert not any("MFU" in t for t in figures[-1]["labels"])  # no peak: no MFU curve at 0
    p.write_text(line("Compiling each TransformerBlock with torch.compile") + run_log([7.0, 6.5, 6.0], total=3))
    assert cli("inspect-logs", str(p), "--plot", str(tmp_path / "b.png")).code == 0
    assert "step 1 (compilation)" in figures[-1]["labels"]


def test_host_memory_line_is_short_on_a_real_start(cli, in_tmp, monkeypatch):
    """Every train printed the 250-character breakdown; now one short line (--dry-run keeps it)."""
    from trnqwen.errors import TrnqwenError
    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.train import run as train_run

    tiny = write_tiny_qwen3(in_tmp / "tiny")

    def stop_here(plan, **kw):  # the launch is not what this test is about
        raise TrnqwenError("stopped before launching", exit_code=1)

    monkeypatch.setattr(train_run, "execute", stop_here)
    args = ["train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--device", "cpu", "--nproc-per-node", "2",
            "--steps", "2", "--seq-len", "128", "--finetune", "--backend", "native"]
    res = cli(*args)
    assert "stopped before launching" in res.err, res.err
    lines = [x for x in res.err.splitlines() if "host memory" in x or "estimated host" in x]
    assert len(lines) == 1 and len(lines[0]) < 120 and "at load" not in lines[0], lines
    dry = cli(*args, "--dry-run")
    assert "at load" in dry.out + dry.err  # the breakdown is still there


# --- item 29: after an interruption ---------------------------------------------------------------


def test_ctrl_c_hint_says_resume_continues(tmp_path):
    from trnqwen.errors import EXIT_SIGINT, TrnqwenError
    from trnqwen.rundir import RunRecord
    from trnqwen.train.launcher import LaunchResult
    from trnqwen.train.run import TrainOutcome

    plan = SimpleNamespace(run_id="20261201-100000-native", log_path=tmp_path / "train.log")
    outcome = TrainOutcome(plan=plan, result=LaunchResult(exit_code=EXIT_SIGINT, ended_by="SIGINT", steps=[{"step": 1}]),
                           record=RunRecord(run_id=plan.run_id, run_dir=str(tmp_path)))
    with pytest.raises(TrnqwenError) as err:
        outcome.raise_for_status()
    assert err.value.exit_code == 130
    assert "trnqwen train --resume 20261201-100000-native" in err.value.hint and str(plan.log_path) in err.value.hint


def _resumed_log(*, replay: bool = True, later_restart: bool = False) -> str:
    """Attempt 1 logs steps 1-4 (its last checkpoint: step 2) and is stopped; the resume from
    step 2 logs steps 3-6 (3 and 4 again: the counter goes back at the resume)."""
    out = [line("Training starts at step 1")]
    out += [line(step_msg(i, 8.0 - i / 10)) for i in range(1, 5)]
    out.append("[trnqwen] resumed run r1 from step 2 (/c/resume/step-2)\n")
    out.append(line("Training starts at step 3"))
    for i in range(3 if replay else 5, 7):
        out.append(line(step_msg(i, 7.0 - i / 10)))
        if later_restart and i == 5:
            out.append(line(step_msg(4, 6.9)))
    out.append(line("Training completed"))
    return "".join(out)


def test_a_normal_resume_is_not_a_restart(cli, tmp_path):
    p = tmp_path / "train.log"
    p.write_text(_resumed_log())
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    assert "resumed" in _codes(doc) and "restarted" not in _codes(doc)
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4, 5, 6]
    assert doc["steps"][2]["loss"] == pytest.approx(6.7)  # the resumed run's step 3
    # a counter that goes back later in the resumed run is still a restart
    p.write_text(_resumed_log(later_restart=True))
    doc = json.loads(cli("inspect-logs", str(p), "--json").out)
    assert "restarted" in _codes(doc)


def test_follow_streams_validation(cli, tmp_path):
    out = [line("Training starts at step 1")]
    for i in range(1, 5):
        out.append(line(step_msg(i, 7.0 - i / 10)))
        if i % 2 == 0:
            out.append(line(f"validate step: {i:2}  loss: {6.5 - i / 10:7.4f}  memory:  0.91GiB(3.85%)  tps: 1,234"))
    out.append(line("Training completed"))
    p = tmp_path / "v.log"
    p.write_text("".join(out))
    res = cli("inspect-logs", str(p), "--follow", "--idle-timeout", "5")
    assert res.code == 0, res.err
    shown = [x for x in res.err.splitlines() if x.startswith(("step", "validation"))]
    kinds = ["v" if x.startswith("validation") else "s" for x in shown]
    assert kinds == ["s", "s", "v", "s", "s", "v"], shown
    assert "validation after step 2  loss 6.30000" in res.err


def test_plot_marks_preemption_and_resume_titles_the_run_and_hides_no_point(cli, in_tmp, figures):
    text = "".join([
        line("Training starts at step 1"),
        *[line(step_msg(i, 8.0 - i / 10, tps=1000)) for i in (1, 2)],
        line("[trnqwen] preempted: SIGTERM at step 2; saved a resumable checkpoint of step 2 to /c/resume/step-2"),
        "[trnqwen] resumed run r1 from step 2 (/c/resume/step-2)\n",
        line("Training starts at step 3"),
        # throughput falls to the bottom right corner, where the legend used to sit
        *[line(step_msg(i, 8.0 - i / 10, tps=1000 - 120 * (i - 2))) for i in range(3, 10)],
        line("Training completed"),
    ])
    runs = in_tmp / "a-very-long-folder-name-" / ("x" * 60) / ".trnqwen" / "runs"
    d = make_run(runs, "20261201-120000-native-sft", text, steps=9)
    res = cli("inspect-logs", str(d), "--plot", str(in_tmp / "loss.png"), "--no-strict")
    assert res.code == 0, res.err
    facts = figures[-1]
    assert "preempted (SIGTERM) at step 2" in facts["labels"] and "resumed from step 2" in facts["labels"]
    assert facts["title"] == "20261201-120000-native-sft: builtin:tiny-qwen3"  # the run, then what it trained
    assert facts["covered"] == []
    p = in_tmp / ("y" * 80) / "train.log"
    p.parent.mkdir()
    p.write_text(text)
    assert cli("inspect-logs", str(p), "--plot", str(in_tmp / "b.png"), "--no-strict").code == 0
    assert figures[-1]["title"] == "train.log"


def test_train_log_has_no_colour_codes_and_a_terminal_keeps_them(tmp_path):
    """The launcher's tee writes train.log without ANSI codes (grep works); an echo to a terminal
    keeps torchtitan's colours, an echo to a pipe does not."""
    import sys

    from tests.test_launcher import _FakeTTY
    from trnqwen.train import launcher
    from trnqwen.train.status import StatusLine

    coloured = "[rank0]:[titan] 2026-12-01 10:00:00,000 - root - INFO - " + step_msg(1, 7.25) + "  lr: 1e-05"
    child = [sys.executable, "-c", f"print({coloured!r}); print('plain line')"]
    for tty in (True, False):
        log = tmp_path / f"train-{tty}.log"
        term = _FakeTTY(tty)
        echoed: list[str] = []
        status = StatusLine(stream=term, total_steps=1)
        result = launcher.supervise(child, env={}, log_path=log, status=status, echo=echoed.append, handle_signals=False)
        assert result.exit_code == 0 and result.steps[0]["loss"] == 7.25 and result.steps[0]["lr"] == 1e-05
        text = log.read_text()
        assert "\x1b" not in text and "step:  1  loss:  7.25000" in text and "plain line" in text
        assert ("\x1b[" in "".join(echoed)) is tty
