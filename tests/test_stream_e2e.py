"""A DPO run on the hf-trainer backend writes the metrics stream for real (torchrun, 1 CPU rank,
3 steps): every step record carries the method's values as ``dpo/<name>`` (the names the
torchtitan ranks use, from ``runtime/dpo_loss.METRICS``), the validations too; the status line and
run.json's summary show them; TensorBoard has every value of the records."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import run_subprocess

pytestmark = [pytest.mark.slow]

STEPS = 3


@pytest.mark.timeout(1200)
def test_a_dpo_hf_trainer_runs_stream_has_the_dpo_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trnqwen.contract.metrics_stream import STEP_CORE, VALIDATION_CORE, read_stream
    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.contract.stepline import parse_step_line
    from trnqwen.rundir import last_run_dir
    from trnqwen.methods.dpo.loss import METRICS

    assets = write_tiny_qwen3(tmp_path / "tiny")
    env = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--backend", "hf-trainer", "--finetune",
        "--device", "cpu", "--nproc-per-node", "1", "--steps", str(STEPS), "--seq-len", "256", "--method", "dpo",
        "--lr", "1e-3", "--local-batch-size", "2", "--checkpoint-dir", str(tmp_path / "ck"),
        "--data-cache-dir", str(tmp_path / "cache"), "--val-split", "0.1", "--val-every", str(STEPS),
        "--no-export-hf", "--tensorboard", cwd=tmp_path, env=env, timeout=1100)
    assert run.code == 0, run.text[-4000:]
    run_dir = last_run_dir(tmp_path / ".trnqwen" / "runs")
    records = read_stream(run_dir / "metrics.jsonl")
    names = {f"dpo/{name}" for name in METRICS}
    steps = [r for r in records if r.kind == "step"]
    assert [r.step for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        assert set(r.values) == set(STEP_CORE) | names, r.values
    assert abs(steps[0].values["loss"] - math.log(2)) < 1e-4 and steps[0].values["dpo/margin"] == 0
    lines = {m["step"]: m["loss"] for m in map(parse_step_line, (run_dir / "train.log").read_text().splitlines()) if m}
    assert lines == {r.step: round(r.values["loss"], 5) for r in steps}
    validations = [r for r in records if r.kind == "validation"]
    assert [r.step for r in validations] == [1, STEPS]  # torchtitan validates at step 1 too
    assert all(set(r.values) == set(VALIDATION_CORE) | names for r in validations), validations

    summary = json.loads((run_dir / "run.json").read_text())["extra"]["summary"]
    assert summary["last_step"] == {"step": STEPS, **steps[-1].values}
    assert summary["last_validation"] == {"step": STEPS, **validations[-1].values}
    status = [ln for ln in run.err.splitlines() if ln.startswith("step ")]
    assert len(status) == STEPS and all("  margin " in ln and "  acc " in ln for ln in status), run.err
    assert not any("rewards" in ln for ln in status), run.err  # DPO marks margin and accuracy for the line

    tags = set()
    for events in (run_dir / "tb").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
    wanted = {f"train/{k}" for r in steps for k, v in r.values.items() if v is not None}
    assert wanted <= tags, sorted(wanted - tags)
