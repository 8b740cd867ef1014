"""inspect-logs and the run record read a DPO run's ``[DPO]`` lines (trnqwen.methods.dpo.log_lines): per-step
rewards, margin and accuracy in the table, --json, --csv and --plot, validation records, the
reference line; the judge checks the step-1 loss against the loss a policy equal to its reference
has (ln 2 for sigmoid, (1/(2 beta))^2 for ipo).  A run without DPO lines reads exactly as before."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import pytest

from trnqwen.methods.dpo import log_lines as dpo
from trnqwen.logs.judge import judge
from trnqwen.logs.report import steps_json
from trnqwen.logs.engine import parse
from trnqwen.logs.report import json_text, render, write_csv
from trnqwen.logs.sources import RunContext
from trnqwen.contract.stepline import STEP_FIELDS, format_step_line, parse_validation_line

LN2 = math.log(2.0)


def titan(msg: str, rank: int = 0) -> str:
    return f"[rank{rank}]:[titan] 2026-12-01 18:37:43,702 - root - INFO - {msg}"


def validate_line(step: int, loss: float) -> str:
    """torchtitan's validator line (colours off)."""
    return f"validate step: {step:2}  loss: {loss:7.4f}  memory:  0.94GiB(3.98%)  tps: 1,103"


def dpo_values(step: int, *, val: bool = False) -> dict:
    return {"rewards_chosen": 0.01 * step, "rewards_rejected": -0.02 * step, "margin": 0.03 * step,
            "accuracy": 0.25 * (step % 5), "pairs": 30 if val else 8, **({"loss": 0.6 - 0.01 * step} if val else {})}


def make_log(*, losses=(0.69315, 0.61, 0.55, 0.5), start: int = 1, validate=(2, 4), dpo_lines: bool = True,
             reference: str = "computed", beta=None, loss_type=None, ranks: int = 2) -> str:
    """A 2-rank DPO run's log as the ranks print it: only rank 0 logs the [DPO] lines."""
    out = [titan(f"Training starts at step {start}", r) for r in range(ranks)]
    if dpo_lines and reference:
        settings = {"beta": beta, "loss_type": loss_type} if loss_type else {}
        out.append(titan(dpo.reference_line(reference, "for 6 train, 23 val rows in 6.9 s (key 054c1a8f7a1a, /c/ref)",
                                            **settings)))
    for i, loss in enumerate(losses):
        step = start + i
        for r in range(ranks):
            out.append(titan(format_step_line(step, loss, 1.5, 0.94, 3.98, 400, 0.0, 0.0, lr=1e-3), r))
        if dpo_lines:
            out.append(titan(dpo.format_line(step, dpo_values(step))))
        if step in validate:
            out.append(titan(validate_line(step, 0.6 - 0.01 * step)))
            if dpo_lines:
                out.append(titan(dpo.format_line(step, dpo_values(step, val=True), validate=True)))
    out.append(titan("Training completed"))
    return "\n".join(out) + "\n"


def codes(findings, severity=None) -> set:
    return {f.code for f in findings if severity is None or f.severity == severity}


def finding(findings, code):
    return next(f for f in findings if f.code == code)


# --- parsing ------------------------------------------------------------------------------------


def test_dpo_step_and_validation_lines_are_read():
    log = parse(make_log())
    kept = log.method_lines["dpo"]
    assert sorted(kept.steps) == [1, 2, 3, 4]
    rec = kept.steps[3]
    assert (rec["rewards_chosen"], rec["rewards_rejected"], rec["margin"], rec["accuracy"], rec["pairs"]) == \
        (0.03, -0.06, 0.09, 0.75, 8)
    # one validation per run, torchtitan's loss kept, the [DPO] values (and DPO's own loss) joined to it
    assert [v["step"] for v in log.validations] == [2, 4]
    v = log.validations[1]
    assert v["loss"] == 0.56 and v["tps"] == 1103 and v["dpo_loss"] == pytest.approx(0.56)
    assert (v["margin"], v["accuracy"], v["pairs"]) == (0.12, 1.0, 30)
    assert kept.notes["reference"]["how"] == "computed" and kept.notes["reference"]["beta"] is None


def test_dpo_validate_line_is_not_a_validation_line_of_its_own():
    """It carries ``validate step:`` and ``loss:``: read as torchtitan's line it was a second
    validation with no loss (inspect-logs: "last loss -", run.json: last_validation loss null)."""
    line = dpo.format_line(3, dpo_values(3, val=True), validate=True)
    assert parse_validation_line(line) is None
    assert parse_validation_line(validate_line(3, 0.5))["loss"] == 0.5


def test_a_validation_without_torchtitans_line_is_made_from_the_dpo_line():
    text = "\n".join([titan(format_step_line(1, 0.69315, 1, 1, 1, 1, 0, 0)),
                      titan(dpo.format_line(1, dpo_values(1, val=True), validate=True))]) + "\n"
    (v,) = parse(text).validations
    assert v["step"] == 1 and v["loss"] == pytest.approx(0.59) and v["margin"] == 0.03


def test_reference_line_settings_round_trip():
    log = parse(make_log(reference="reused", beta=0.25, loss_type="ipo"))
    ref = log.method_lines["dpo"].notes["reference"]
    assert (ref["how"], ref["beta"], ref["loss_type"]) == ("reused", 0.25, "ipo")
    assert ref["detail"].startswith("for 6 train") and ref["detail"].endswith("/c/ref)")
    assert dpo.reference_line("reused", "(key k)") == "[DPO] reference log-probs: reused (key k)"


def test_other_ranks_dpo_lines_are_ignored():
    text = make_log() + titan(dpo.format_line(2, {**dpo_values(2), "margin": 9.0}), rank=1) + "\n"
    assert parse(text).method_lines["dpo"].steps[2]["margin"] == pytest.approx(0.06)


def test_a_long_dpo_log_reads_the_same_in_any_chunking():
    """A long log (the [DPO] validate line has "loss:" and "step:"), read in small chunks: the
    result equals reading every line one by one."""
    from trnqwen.logs.engine import LogParser

    data = make_log(losses=[0.69315] + [0.5 + 0.001 * i for i in range(2000)], validate=range(10, 2001, 10)).encode()
    slow = LogParser("x")
    slow.summarize = False  # every line read one by one
    slow.feed(data)
    want = slow.close()
    got = parse(data, "x", chunk_size=4096)
    assert len(want.method_lines["dpo"].steps) == 2001 and len(want.validations) == 200
    assert got.method_lines == want.method_lines and got.validations == want.validations
    assert list(got.steps.rows()) == list(want.steps.rows())


# --- --json, --csv, table, plot ---------------------------------------------------------------


def test_json_steps_and_validations_carry_the_dpo_values():
    log = parse(make_log())
    findings = judge(log, RunContext())
    data = json.loads(json_text(log, RunContext(), findings))
    rows = data["steps"]
    assert list(rows[0]) == [*STEP_FIELDS, *dpo.FIELDS, "line"]
    assert [r["margin"] for r in rows] == [0.03, 0.06, 0.09, 0.12]
    assert [r["accuracy"] for r in rows] == [0.25, 0.5, 0.75, 1.0]
    assert rows[2]["rewards_chosen"] == 0.03 and rows[2]["rewards_rejected"] == -0.06
    assert data["validation"][0]["margin"] == 0.06 and data["validation"][1]["accuracy"] == 1.0
    d = data["dpo"]
    assert d["expected_step1_loss"] == pytest.approx(LN2) and d["reference"]["how"] == "computed"
    assert d["last_step"]["step"] == 4 and d["last_step"]["margin"] == 0.12
    assert d["last_validation"]["step"] == 4 and d["last_validation"]["accuracy"] == 1.0


def test_streamed_json_with_missing_and_nonfinite_dpo_values():
    log = parse(make_log().replace("margin: 0.060000", "margin: nan"))
    del log.method_lines["dpo"].steps[3]
    rows = json.loads(steps_json(log))
    assert rows[1]["margin"] is None and rows[1]["nonfinite"] == {"margin": "nan"}
    assert rows[2]["margin"] is None and "nonfinite" not in rows[2]


def test_csv_has_dpo_columns(tmp_path):
    log = parse(make_log())
    write_csv(log, tmp_path / "s.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "s.csv").read_text())))
    assert [r["margin"] for r in rows] == ["0.03", "0.06", "0.09", "0.12"]
    assert [r["accuracy"] for r in rows] == ["0.25", "0.5", "0.75", "1.0"]
    assert [r["val_accuracy"] for r in rows] == ["", "0.5", "", "1.0"]
    assert [r["val_loss"] for r in rows] == ["", "0.58", "", "0.56"]
    assert rows[0]["line"] == "4"  # the step line's, not the [DPO] line's


def test_table_has_the_dpo_rows():
    from rich.console import Console

    log = parse(make_log(beta=0.1, loss_type="sigmoid"))
    con = Console(file=io.StringIO(), width=250)
    render(log, RunContext(), judge(log, RunContext()), console=con)
    text = con.file.getvalue()
    assert "beta 0.1, sigmoid loss; reference log-probs computed for 6 train" in text
    assert "DPO last step" in text and "step 4: rewards chosen 0.0400 / rejected -0.0800, margin 0.1200, accuracy 1.00" in text
    assert "DPO last validation" in text and "validation                  │ 2 run(s), last loss 0.5600" in text


def _png_size(path):
    import matplotlib.image

    return matplotlib.image.imread(str(path)).shape[:2]


def test_plot_has_a_dpo_panel(tmp_path):
    from trnqwen.logs.plot import write_plot

    write_plot(parse(make_log()), tmp_path / "dpo.png")
    write_plot(parse(make_log(dpo_lines=False)), tmp_path / "sft.png")
    (h_dpo, w_dpo), (h_sft, w_sft) = _png_size(tmp_path / "dpo.png"), _png_size(tmp_path / "sft.png")
    assert w_dpo == w_sft and h_dpo - h_sft == 2 * 110  # one more panel of 2 inches at 110 dpi


HELD_OUT = [{"step": 4, "results": [{"checkpoint": "base", "loss": 7.62}, {"checkpoint": "step-4", "loss": 7.55}]}]


def _loss_axes(fig):
    """(the loss panel, its twin or None): the twin is the axes that shares the panel's place."""
    main = next(ax for ax in fig.get_axes() if ax.get_ylabel() == "loss")
    twins = [ax for ax in fig.get_axes() if ax is not main and ax.get_position().bounds == main.get_position().bounds]
    return main, (twins[0] if twins else None)


def _ys(ax, label_start: str) -> list[float]:
    return [float(y) for ln in ax.get_lines() if ln.get_label().startswith(label_start) for y in ln.get_ydata()]


def test_dpo_loss_keeps_its_scale_beside_held_out_answer_loss():
    """Issue 34 item 17: a DPO loss (0.69 -> 0.5) and trnqwen eval's held-out answer loss (7.6)
    on one axis made the loss a flat line at the bottom; the held-out markers now have a twin axis."""
    import matplotlib.pyplot as plt

    from trnqwen.logs.plot import build_figure

    fig = build_figure(parse(make_log()), evaluations=HELD_OUT)
    main, twin = _loss_axes(fig)
    assert twin is not None and "another scale" in twin.get_ylabel()
    assert sorted(_ys(twin, "held-out")) == [7.55, 7.62] and _ys(main, "held-out") == []
    assert _ys(main, "validation loss") == pytest.approx([0.58, 0.56])  # the DPO validation loss: the same scale
    low, high = main.get_ylim()
    assert high < 1.0 and (0.69315 - 0.5) / (high - low) > 0.7  # the curve fills its panel
    labels = [t.get_text() for t in main.get_legend().get_texts()]
    assert "held-out base" in labels and "loss" in labels  # one legend for both axes
    plt.close(fig)
    # an SFT run's held-out loss is on the scale of its training loss: one axis, as before
    fig = build_figure(parse(make_log(losses=(7.7, 7.4, 7.2, 7.0), validate=(), dpo_lines=False)), evaluations=HELD_OUT)
    main, twin = _loss_axes(fig)
    assert twin is None and sorted(_ys(main, "held-out")) == [7.55, 7.62]
    plt.close(fig)


def test_plot_title_says_model_method_and_dataset(tmp_path):
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.plot import run_plot_title
    from trnqwen.logs.sources import resolve_input
    from trnqwen.rundir import RunRecord

    d = tmp_path / "runs" / "20261204-101500-native-dpo-lora"
    d.mkdir(parents=True)
    (d / "train.log").write_text(make_log())
    config = {"model": "Qwen/Qwen3-4B-Instruct-2507", "method": "dpo", "lora": True, "lora_rank": 8,
              "dataset": str(tmp_path / "data" / "prefs.jsonl"), "steps": 4, "finetune": True}
    RunRecord(run_id=d.name, run_dir=str(d), status="succeeded", config=config, log_path=str(d / "train.log"),
              extra={"base_model": "Qwen/Qwen3-0.6B"}, steps=4).save()
    result = inspect_input(resolve_input(str(d)))
    # the base actually trained (the record's), the method with its adapter, the data file by its name
    assert run_plot_title(result.log, result.ctx) == "20261204-101500-native-dpo-lora: Qwen/Qwen3-0.6B, dpo + LoRA r8, prefs.jsonl"
    RunRecord(run_id=d.name, run_dir=str(d), status="succeeded", log_path=str(d / "train.log"), steps=4,
              config={**config, "method": "sft", "lora": False, "dataset": None, "model": "builtin:tiny-qwen3"}).save()
    (d / "train.log").write_text(make_log(dpo_lines=False))
    result = inspect_input(resolve_input(str(d)))
    assert run_plot_title(result.log, result.ctx) == "20261204-101500-native-dpo-lora: builtin:tiny-qwen3, sft, the model's default corpus"
    # a bare log: its file name, and the method its lines show
    (tmp_path / "dpo.log").write_text(make_log())
    result = inspect_input(resolve_input(str(tmp_path / "dpo.log")))
    assert run_plot_title(result.log, result.ctx) == "dpo.log: dpo"


def test_a_run_without_dpo_lines_reads_as_before(tmp_path):
    from rich.console import Console

    log = parse(make_log(dpo_lines=False))
    assert not log.method_lines
    data = json.loads(json_text(log, RunContext(), judge(log, RunContext())))
    assert list(data["steps"][0]) == [*STEP_FIELDS, "line"] and data["dpo"] is None
    write_csv(log, tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text().splitlines()[0] == ",".join([*STEP_FIELDS, "val_loss", "line"])
    con = Console(file=io.StringIO(), width=250)
    render(log, RunContext(), [], console=con)
    assert "DPO" not in con.file.getvalue()


# --- the judge -----------------------------------------------------------------------------------


def test_step1_at_ln2_passes_and_the_sft_random_init_check_stays_quiet():
    """With vocab 2, ln(vocab) is ln 2: the SFT check would call the weights untrained."""
    ctx = RunContext(vocab_size=2, vocab_source="test", finetune=True)
    sft = judge(parse(make_log(dpo_lines=False)), ctx)
    assert "weights-not-loaded" in codes(sft, "error")
    found = judge(parse(make_log()), RunContext(vocab_size=2, vocab_source="test", finetune=True))
    assert not codes(found, "error") and not codes(found) & {"weights-not-loaded", "weights-loaded", "vocab-unknown"}
    ok = finding(found, "dpo-reference")
    assert ok.severity == "info" and "0.693150 = ln 2 = 0.693147" in ok.message and ok.lines == [3, 4]


def test_step1_away_from_ln2_is_an_error():
    found = judge(parse(make_log(losses=(0.70, 0.6)), ), RunContext(run_config={"method": "dpo", "beta": 0.1, "dpo_loss": "sigmoid"}))
    bad = finding(found, "dpo-reference-mismatch")
    assert bad.severity == "error"
    assert bad.message.startswith("step-1 DPO loss 0.700000, expected ln 2 = 0.693147: the reference log-probs do not "
                                  "belong to these weights")


def test_the_reference_lines_settings_decide_the_expected_loss():
    # ipo, beta 0.1: (1/(2 x 0.1))^2 = 25
    found = judge(parse(make_log(losses=(25.0, 20.0), beta=0.1, loss_type="ipo")))
    assert "dpo-reference" in codes(found, "info") and not codes(found, "error")
    found = judge(parse(make_log(losses=(0.69315, 20.0), beta=0.1, loss_type="ipo")))
    bad = finding(found, "dpo-reference-mismatch")
    assert bad.severity == "error" and "expected (1/(2 beta))^2 = 25.000000 (ipo loss, beta 0.1)" in bad.message


def test_the_run_config_gives_the_settings_when_the_line_does_not():
    found = judge(parse(make_log(losses=(1.0, 0.9))), RunContext(run_config={"method": "dpo", "beta": 0.5, "dpo_loss": "ipo"}))
    assert "dpo-reference" in codes(found, "info") and not codes(found, "error")


def test_unknown_settings_off_ln2_is_only_a_warning():
    bad = finding(judge(parse(make_log(losses=(0.70, 0.6)))), "dpo-reference-mismatch")
    assert bad.severity == "warning" and "sigmoid assumed" in bad.message


def test_only_step_1_is_judged_and_not_on_a_resumed_run():
    # a resumed run's first logged step is not step 1
    found = judge(parse(make_log(losses=(3.0, 2.0), start=5)), RunContext(run_config={"method": "dpo", "beta": 0.1, "dpo_loss": "sigmoid"}))
    assert not codes(found) & {"dpo-reference", "dpo-reference-mismatch"}
    # later steps may be anywhere
    found = judge(parse(make_log(losses=(0.69315, 0.9, 1.1))))
    assert "dpo-reference" in codes(found) and not codes(found, "error")


def test_the_run_config_alone_marks_a_dpo_run():
    """No [DPO] line at all (a backend that prints none): method dpo in run.json still keeps the
    SFT judgement off and checks the step-1 loss."""
    found = judge(parse(make_log(dpo_lines=False, losses=(0.8, 0.7))), RunContext(
        vocab_size=2, vocab_source="test", finetune=True, run_config={"method": "dpo", "beta": 0.1, "dpo_loss": "sigmoid"}))
    assert codes(found, "error") == {"dpo-reference-mismatch"}


# The launcher's status line and run.json's summary read the metrics stream, where a DPO run's
# values are "dpo/<name>" like any method's: tests/test_stream_readers.py.


# --- for real: torchrun, torchtitan native, 2 CPU ranks -----------------------------------------


@pytest.mark.slow
def test_a_real_dpo_run_reads_back_and_an_edited_step1_loss_fails(tmp_path):
    """A 3-step DPO train (validation at step 3, TensorBoard on): inspect-logs --json has the DPO
    fields per step and validation and the judge passes; run.json's summary has ``dpo``; the events
    have ``dpo/margin``.  The same log with its step-1 loss edited to 0.70 fails with the DPO error."""
    from tests.helpers import run_subprocess
    from trnqwen.fetch.builtin import write_tiny_qwen3

    assets = write_tiny_qwen3(tmp_path / "tiny")
    env = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--backend", "native", "--finetune",
        "--device", "cpu", "--nproc-per-node", "2", "--steps", "3", "--seq-len", "256", "--method", "dpo",
        "--lr", "1e-3", "--checkpoint-dir", str(tmp_path / "ck"), "--data-cache-dir", str(tmp_path / "cache"),
        "--val-split", "0.1", "--val-every", "3", "--no-export-hf", "--tensorboard", cwd=tmp_path, env=env, timeout=900)
    assert run.code == 0, run.text[-4000:]
    # the live status line (not a terminal: one line per step, from the step's stream record)
    status = [ln for ln in run.err.splitlines() if ln.startswith("step ")]
    assert len(status) == 3 and all("  acc " in ln and "  margin " in ln for ln in status), run.err
    run_dir = next((tmp_path / ".trnqwen" / "runs").glob("*-native-dpo"))  # the run id says what was trained
    summary = json.loads((run_dir / "run.json").read_text())["extra"]["summary"]
    method_values = {f"dpo/{name}" for name in ("rewards_chosen", "rewards_rejected", "margin", "accuracy")}
    assert summary["last_step"]["step"] == 3 and method_values <= set(summary["last_step"])
    assert summary["last_validation"]["step"] == 3 and summary["last_validation"]["loss"] is not None

    logs = run_subprocess("inspect-logs", str(run_dir), "--json", cwd=tmp_path, env=env, timeout=300)
    assert logs.code == 0, logs.text
    doc = json.loads(logs.out)
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3]
    for s in doc["steps"]:
        assert all(isinstance(s[k], float) for k in dpo.FIELDS), s
    assert doc["steps"][0]["margin"] == 0.0 and doc["steps"][0]["loss"] == pytest.approx(LN2, abs=1e-5)
    last_val = doc["validation"][-1]
    assert last_val["step"] == 3 and all(isinstance(last_val[k], float) for k in (*dpo.FIELDS, "loss", "dpo_loss"))
    assert doc["dpo"]["loss_type"] == "sigmoid" and doc["dpo"]["reference"]["how"] == "computed"
    codes_found = {f["code"]: f for f in doc["findings"]}
    assert codes_found["dpo-reference"]["severity"] == "info" and doc["summary"]["findings"]["error"] == 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in run_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
    assert "dpo/margin" in tags and "dpo/accuracy" in tags, tags

    log = run_dir / "train.log"
    text = log.read_text()
    from trnqwen.contract.stepline import parse_step_line

    step1 = next(ln for ln in text.splitlines() if "[DPO]" not in ln and (parse_step_line(ln) or {}).get("step") == 1)
    edited = re.sub(r"loss:(\s*)[0-9.]+", r"loss:\g<1>0.70000", step1, count=1)
    assert edited != step1
    log.write_text(text.replace(step1, edited))
    # the run's steps are read from its metrics stream: the same edit there (the text alone no longer decides)
    stream = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in stream.read_text().splitlines()]
    for record in records:
        if record["kind"] == "step" and record["step"] == 1:
            record["values"]["loss"] = 0.70
    stream.write_text("".join(json.dumps(record) + "\n" for record in records))
    bad = run_subprocess("inspect-logs", str(run_dir), "--json", cwd=tmp_path, env=env, timeout=300)
    assert bad.code == 1, bad.text
    (err,) = [f for f in json.loads(bad.out)["findings"] if f["severity"] == "error"]
    assert err["code"] == "dpo-reference-mismatch"
    assert err["message"].startswith("step-1 DPO loss 0.700000, expected ln 2 = 0.693147: the reference log-probs do not")
