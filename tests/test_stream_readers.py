"""The launcher reads the ranks' metrics stream: the live status line, run.json's summary and the
steps it counts come from the records (every value by name, a method's too), with no list of
method names anywhere; a run whose ranks write no stream is read from rank 0's step lines.

The ranks here are stand-ins (a Python script that writes the stream with the contract's writer
and prints torchtitan's lines); the hf-trainer ranks' own writer is checked for real in
tests/test_hf_trainer.py and tests/test_stream_e2e.py.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap

from trnqwen.contract.metrics_stream import FILE_NAME, PATH_ENV, MetricsWriter, read_stream
from trnqwen.train import launcher
from trnqwen.train.status import StatusLine, extra_values, format_value

DPO = {"dpo/rewards_chosen": 0.0123, "dpo/rewards_rejected": -0.0229, "dpo/margin": 0.352, "dpo/accuracy": 1.0}


def _step(step: int, loss: float, **extra) -> dict:
    return {"step": step, "loss": loss, "grad_norm": 1.5, "memory_gib": 0.94, "memory_pct": 3.98, "tps": 1234,
            "tflops": 0.01, "mfu": None, "lr": 1e-3, **extra}


# --- the status line ----------------------------------------------------------------------------


def test_status_line_shows_the_values_a_method_marks_for_it_by_their_label():
    out = io.StringIO()
    line = StatusLine(stream=out, total_steps=3, mfu=False)
    line.update(_step(1, 0.69315, **DPO))
    line.update_validation({"step": 1, "loss": 0.6, "memory_gib": 1.0, "memory_pct": 2.0, "tps": 99,
                            "dpo/rewards_chosen": 0.1, "dpo/margin": 0.5, "dpo/accuracy": 0.75})
    line.update(_step(2, 0.61, **DPO))
    first, second = out.getvalue().splitlines()
    # DPO marks margin and accuracy (label "acc", 2 decimals); its rewards stay in run.json and inspect-logs
    assert first.startswith("step 1/3  loss 0.6932  margin 0.352  acc 1.00  tok/s 1,234  mfu -  [0:0"), first
    assert second.startswith("step 2/3  loss 0.6100  margin 0.352  acc 1.00  val 0.6000 (step 1, margin 0.500, "
                             "acc 0.75)  tok/s 1,234"), second
    assert "rewards" not in out.getvalue()


def test_status_line_shows_only_the_status_marked_values_of_every_method():
    from trnqwen.methods import registry

    for method in registry.methods():
        values = {m.name: 0.5 for m in method.metrics}
        text = StatusLine(stream=io.StringIO(), total_steps=2)
        text.update(_step(1, 1.0, **values))
        shown = text.text()
        for m in method.metrics:
            assert (f"  {m.label} {format(0.5, m.fmt)}  " in shown) == m.status, (method.name, m.name, shown)
    orpo = StatusLine(stream=io.StringIO(), total_steps=2)
    orpo.update(_step(1, 2.0, **{"orpo/nll": 1.9, "orpo/log_odds_ratio": -0.7, "orpo/log_odds": 0.1,
                                 "orpo/rewards_chosen": -0.2, "orpo/rewards_rejected": -0.3, "orpo/margin": 0.1,
                                 "orpo/accuracy": 1.0}))
    assert orpo.text().startswith("step 1/2  loss 2.0000  nll 1.9000  margin 0.1000  acc 1.00  tok/s"), orpo.text()


def test_a_new_metric_reaches_the_status_line_with_no_code_change():
    line = StatusLine(stream=io.StringIO(), total_steps=5)
    line.update(_step(4, 2.5, **{"x/novel": 7.0}))
    assert "loss 2.5000  novel 7.000  tok/s" in line.text()


def test_a_short_name_that_is_taken_is_shown_whole():
    shown = extra_values({"step": 1, "loss": 1.0, "a/loss": 2.0, "a/m": 3.0, "b/m": 4.0, "c/tps": 5.0, "z/q": 6.0})
    assert shown == [("a/loss", "2.000"), ("a/m", "3.000"), ("b/m", "4.000"), ("c/tps", "5.000"), ("q", "6.000")]
    assert [format_value(v) for v in (None, 0.0, 1.0, 0.352, -0.0229, 2.5e-5, 12345.6, float("nan"))] == \
        ["-", "0.000", "1.000", "0.352", "-0.023", "2.50e-05", "12,346", "nan"]


def test_a_long_line_is_cut_to_the_terminal_on_a_tty(monkeypatch):
    from tests.test_launcher import _FakeTTY

    monkeypatch.setenv("COLUMNS", "60")
    term = _FakeTTY(True)
    line = StatusLine(stream=term, total_steps=3)
    line.update(_step(1, 0.69, **DPO))
    drawn = term.parts[-1]
    assert drawn.startswith("\r\x1b[2Kstep 1/3  loss 0.6900") and len(drawn) - len("\r\x1b[2K") == 59


# --- run.json's summary -------------------------------------------------------------------------


def test_summary_records_every_value_of_the_last_step_and_validation_by_name():
    result = launcher.LaunchResult(exit_code=0, ended_by="completed")
    result.steps = [_step(1, 0.7, **DPO), _step(2, 0.6, **DPO, **{"x/novel": 7.0})]
    result.validations = [{"step": 2, "loss": 0.65, "memory_gib": 1.0, "memory_pct": 2.0, "tps": 9, "x/novel": 8.0}]
    summary = result.summary()
    assert summary["last_step"] == _step(2, 0.6, **DPO, **{"x/novel": 7.0})
    assert summary["last_validation"]["x/novel"] == 8.0 and summary["steps_logged"] == 2
    assert "dpo" not in summary  # a method's values are the record's, by name: no key of their own
    json.dumps(summary)


# --- supervise: stand-in ranks ------------------------------------------------------------------


RANKS = textwrap.dedent('''
    """Global rank 0 of a run: each step's record in the stream, then its (different) step line."""
    import os, sys
    from trnqwen.contract.metrics_stream import MetricsWriter
    from trnqwen.contract.stepline import format_step_line

    assert os.environ["TRNQWEN_METRICS_PATH"] == sys.argv[1], os.environ.get("TRNQWEN_METRICS_PATH")
    writer = MetricsWriter.from_env()
    writer.write("header", 0, {}, meta={"backend": "stand-in"})
    for step in (1, 2, 3):
        values = {"loss": 0.5 + step / 1000, "grad_norm": 1.5, "memory_gib": 0.9, "memory_pct": 3.0, "tps": 100.0,
                  "tflops": 0.0, "mfu": None, "lr": 1e-3, "dpo/margin": 0.1 * step, "dpo/accuracy": 0.5,
                  "x/novel": 7.0 + step}
        writer.write("step", step, values)
        # the line says 9.9: the status line and run.json must show the record's loss
        print(format_step_line(step, 9.9, 1.5, 0.9, 3.0, 100, 0.0, None, lr=1e-3), flush=True)
        if step == 3:
            writer.write("validation", 3, {"loss": 0.45, "memory_gib": 0.9, "memory_pct": 3.0, "tps": 50.0,
                                           "x/novel": 11.0})
            print("validate step:  3  loss:  9.9000  memory:  0.90GiB(3.00%)  tps: 50", flush=True)
''')


def _supervise(tmp_path, script: str, metrics_path, status=None):
    ranks = tmp_path / "ranks.py"
    ranks.write_text(script)
    return launcher.supervise([sys.executable, str(ranks), str(metrics_path)], env={}, log_path=tmp_path / "train.log",
                              status=status, handle_signals=False, metrics_path=metrics_path)


def test_supervise_names_the_stream_and_reads_it_not_the_lines(tmp_path):
    out = io.StringIO()
    path = tmp_path / FILE_NAME
    line = StatusLine(stream=out, total_steps=3, mfu=False)
    result = _supervise(tmp_path, RANKS, path, status=line)
    assert result.exit_code == 0, (tmp_path / "train.log").read_text()
    assert [s["step"] for s in result.steps] == [1, 2, 3] and len(result.step_times) == 3
    last = result.summary()["last_step"]
    assert last["loss"] == 0.503 and last["x/novel"] == 10.0 and abs(last["dpo/margin"] - 0.3) < 1e-12
    assert result.summary()["last_validation"] == {"step": 3, "loss": 0.45, "memory_gib": 0.9, "memory_pct": 3.0,
                                                   "tps": 50.0, "x/novel": 11.0}
    status = out.getvalue().splitlines()
    assert len(status) == 3, status
    assert status[2].startswith("step 3/3  loss 0.5030  margin 0.300  acc 0.50  novel 10.000  tok/s 100")
    assert "novel 10.000  val 0.4500 (step 3, novel 11.000)  tok/s 100" in line.text()  # drawn on a terminal
    assert "9.9" not in out.getvalue()
    assert result.time_to_first_step_s is not None and result.time_to_first_step_s >= 0
    assert "step:  3  loss:  9.90000" in (tmp_path / "train.log").read_text()  # the text log stays


def test_a_resumed_run_counts_only_the_records_of_its_own_launch(tmp_path):
    path = tmp_path / FILE_NAME
    before = MetricsWriter(path)
    for step in (1, 2, 3, 4):  # the first segment's records (and a step the new one redoes)
        before.write("step", step, {"loss": 5.0})
    before.close()
    result = _supervise(tmp_path, RANKS, path)
    assert [s["step"] for s in result.steps] == [1, 2, 3] and result.steps[0]["loss"] == 0.501
    assert [r.step for r in read_stream(path) if r.kind == "step"] == [1, 2, 3, 4, 1, 2, 3]


def test_ranks_without_a_stream_are_read_from_their_step_lines(tmp_path):
    script = textwrap.dedent('''
        from trnqwen.contract.stepline import format_step_line
        for step in (1, 2):
            print(format_step_line(step, 7.25 - step, 1.5, 0.9, 3.0, 100, 0.0, None, lr=1e-3), flush=True)
        print("validate step:  2  loss:  5.5000  memory:  0.90GiB(3.00%)  tps: 50", flush=True)
    ''')
    out = io.StringIO()
    path = tmp_path / FILE_NAME
    result = _supervise(tmp_path, script, path, status=StatusLine(stream=out, total_steps=2))
    assert result.exit_code == 0 and not path.exists()
    assert [(s["step"], s["loss"]) for s in result.steps] == [(1, 6.25), (2, 5.25)]
    assert result.summary()["last_validation"]["loss"] == 5.5
    assert out.getvalue().splitlines()[1].startswith("step 2/2  loss 5.2500  tok/s 100")


def test_supervise_without_a_path_gives_the_ranks_none(tmp_path):
    script = f"import os; assert {PATH_ENV!r} not in os.environ\n"
    ranks = tmp_path / "ranks.py"
    ranks.write_text(script)
    result = launcher.supervise([sys.executable, str(ranks)], env={}, log_path=tmp_path / "train.log",
                                handle_signals=False)
    assert result.exit_code == 0, (tmp_path / "train.log").read_text()
