"""inspect-logs reads trnqwen's own runs from their metrics stream (trnqwen.logs.stream): every
value by name reaches --json, --csv, the table, the plot and --follow, and a DPO run's --json
from the stream agrees with the one from its text log."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from tests.test_dpo_logs import dpo_values, make_log
from trnqwen.contract.metrics_stream import FILE_NAME, MetricsWriter

CORE = {"grad_norm": 1.5, "memory_gib": 0.94, "memory_pct": 3.98, "tps": 400.0, "tflops": 0.0, "mfu": 0.0, "lr": 1e-3}
LOSSES = (0.69315, 0.61, 0.55, 0.5)


def write_stream(run, *, method="dpo", extra=None, dpo=True):
    """The stream a DPO run of make_log()'s numbers writes (the text prints them rounded: the
    stream holds the same rounded numbers)."""
    w = MetricsWriter(run / FILE_NAME)
    w.write("header", 0, {}, meta={"backend": "test", "method": method})
    for step, loss in enumerate(LOSSES, 1):
        values = {"loss": loss, **CORE}
        if dpo:
            v = dpo_values(step)
            values.update({f"dpo/{k}": float(f"{v[k]:.6f}" if k != "accuracy" else f"{v[k]:.4f}")
                           for k in ("rewards_chosen", "rewards_rejected", "margin", "accuracy")})
        values.update((extra or {}).get(step, {}))
        w.write("step", step, values)
        if step in (2, 4):
            v = dpo_values(step, val=True)
            val = {"loss": float(f"{0.6 - 0.01 * step:.4f}"), "memory_gib": 0.94, "memory_pct": 3.98, "tps": 1103.0}
            if dpo:
                val.update({f"dpo/{k}": float(f"{v[k]:.6f}" if k != "accuracy" else f"{v[k]:.4f}")
                            for k in ("rewards_chosen", "rewards_rejected", "margin", "accuracy")})
                val["dpo/pairs"] = 30.0
            w.write("validation", step, val)
    w.close()


def run_dir(tmp_path, name="run", **kw):
    run = tmp_path / name
    run.mkdir()
    (run / "train.log").write_text(make_log(dpo_lines=kw.pop("dpo_lines", True)))
    write_stream(run, **kw)
    return run


def test_dpo_json_from_the_stream_agrees_with_the_text_log(cli, tmp_path):
    text = tmp_path / "train.log"
    text.write_text(make_log())
    run = run_dir(tmp_path)
    a = cli("inspect-logs", str(text), "--json", "--no-strict")
    b = cli("inspect-logs", str(run), "--json", "--no-strict")
    assert a.code == 0 == b.code, (a.text, b.text)
    doc_a, doc_b = json.loads(a.out), json.loads(b.out)
    assert doc_a["metrics_stream"] is None and doc_b["metrics_stream"].endswith(FILE_NAME)
    assert doc_b["steps"] == doc_a["steps"] and len(doc_b["steps"]) == 4  # every value, and the text log's lines
    assert list(doc_b["steps"][0])[-5:] == ["rewards_chosen", "rewards_rejected", "margin", "accuracy", "line"]
    for va, vb in zip(doc_a["validation"], doc_b["validation"], strict=True):
        assert vb == {k: va[k] for k in vb}, (va, vb)  # every value the stream has (the text adds dpo_loss)
    assert doc_b["dpo"] == doc_a["dpo"]
    for key in ("source", "run_dir"):
        doc_a["summary"].pop(key), doc_b["summary"].pop(key)
    assert doc_b["summary"] == doc_a["summary"]
    assert [f["code"] for f in doc_b["findings"]] == [f["code"] for f in doc_a["findings"]]


def test_an_invented_metric_reaches_json_csv_table_plot_and_follow(cli, tmp_path, monkeypatch):
    extra = {step: {"x/y": 0.5 * step, "sft/tokens_seen": 1000.0 * step} for step in range(1, 5)}
    extra[3]["x/y"] = float("nan")
    run = run_dir(tmp_path, method="sft", dpo=False, dpo_lines=False, extra=extra)
    out = cli("inspect-logs", str(run), "--json", "--no-strict", "--csv", str(tmp_path / "s.csv"),
              "--plot", str(tmp_path / "p.png"))
    assert out.code == 0, out.text
    rows = json.loads(out.out)["steps"]
    assert [r["x/y"] for r in rows] == [0.5, 1.0, None, 2.0] and rows[2]["nonfinite"] == {"x/y": "nan"}
    assert [r["tokens_seen"] for r in rows] == [1000.0, 2000.0, 3000.0, 4000.0]  # the run's own method: its short name
    table = list(csv.DictReader(io.StringIO((tmp_path / "s.csv").read_text())))
    assert [r["x/y"] for r in table] == ["0.5", "1.0", "nan", "2.0"] and "val_x/y" in table[0]
    assert (tmp_path / "p.png").stat().st_size > 0
    shown = cli("inspect-logs", str(run), "--no-strict")
    assert "x/y 2" in shown.out and "tokens_seen 4000" in shown.out, shown.out

    from trnqwen.logs import plot
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.sources import resolve_input

    fig = plot.build_figure(inspect_input(resolve_input(str(run))).log)
    labels = {t.get_text() for ax in fig.get_axes() if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert {"x/y", "tokens_seen"} <= labels, labels

    from trnqwen.logs.core import follow

    seen = []
    follow(resolve_input(str(run)), on_step=seen.append, poll_s=0.01, idle_timeout_s=0.05)
    assert [s["x/y"] for s in seen if not (isinstance(s["x/y"], float) and math.isnan(s["x/y"]))] == [0.5, 1.0, 2.0]
    followed = cli("inspect-logs", str(run), "--follow", "--idle-timeout", "1", "--no-strict")
    assert "x/y 0.5" in followed.err and "tokens_seen 1000" in followed.err, followed.err


def test_a_run_without_a_stream_reads_its_text_log(cli, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(make_log(dpo_lines=False))
    doc = json.loads(cli("inspect-logs", str(run), "--json", "--no-strict").out)
    assert doc["metrics_stream"] is None and [r["loss"] for r in doc["steps"]] == list(LOSSES)


@pytest.mark.parametrize("cut", [0, 25])
def test_a_stream_cut_mid_record_is_read_to_its_last_whole_record(tmp_path, cut):
    from trnqwen.logs.core import inspect_input
    from trnqwen.logs.sources import resolve_input

    run = run_dir(tmp_path)
    data = (run / FILE_NAME).read_bytes()
    (run / FILE_NAME).write_bytes(data + b'{"v": 1, "kind": "step", "step": 9'[: cut or None])
    log = inspect_input(resolve_input(str(run))).log
    assert list(log.steps) == [1, 2, 3, 4] and log.steps[4]["loss"] == 0.5
