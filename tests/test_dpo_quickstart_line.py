"""The quickstart's DPO stage line (issue 34, item 16): a chosen-answer loss that rose is said to
have risen, and why, instead of standing beside an "ok" without a word."""

from __future__ import annotations

import math

import pytest

from trnqwen.methods.dpo import quickstart
from trnqwen.quickstart.types import RunInfo


class Refused(Exception):
    pass


def _judge(chosen_before: float, chosen_after: float) -> str:
    """The stage's real judge on eval's before/after record of a run (the shape eval returns)."""
    info = RunInfo(label="dpo", backend="native", finetune=True, steps=16, nproc_per_node=2, run_dir="/runs/x",
                   step1_loss=math.log(2))
    record = {"before": chosen_before, "after": chosen_after, "line": "",
              "preference": {"accuracy_before": 0.467, "accuracy_after": 0.6, "margin_before": 0.03,
                             "margin_after": 5.69, "pairs": 30}}
    line, numbers = quickstart.judge_run(info, device="cpu", fail=lambda *a, **k: Refused(a),
                                         before_after=lambda run_dir, device: record)
    assert numbers["chosen_loss_after"] == chosen_after
    return line


def test_a_risen_chosen_answer_loss_is_said_and_explained():
    line = _judge(6.069, 6.611)  # the quickstart's own figures (2026-12-04)
    assert line.endswith("chosen-answer loss 6.069 -> 6.611" + quickstart.CHOSEN_LOSS_ROSE), line
    assert "it rose" in line


def test_a_fallen_chosen_answer_loss_needs_no_word():
    line = _judge(6.611, 6.069)
    assert line.endswith("chosen-answer loss 6.611 -> 6.069") and "rose" not in line


def test_accuracy_that_did_not_rise_still_fails_the_stage():
    info = RunInfo(label="dpo", backend="native", finetune=True, steps=16, nproc_per_node=2, run_dir="/runs/x",
                   step1_loss=math.log(2))
    record = {"before": 6.0, "after": 6.1, "line": "",
              "preference": {"accuracy_before": 0.6, "accuracy_after": 0.6, "margin_before": 0.0, "margin_after": 0.0,
                             "pairs": 30}}
    with pytest.raises(Refused):
        quickstart.judge_run(info, device="cpu", fail=lambda *a, **k: Refused(a), before_after=lambda run_dir, device: record)
