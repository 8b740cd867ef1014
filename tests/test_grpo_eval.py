"""``trnqwen eval`` on a GRPO run, without torchrun (the real run's report: test_grpo_e2e.py).

* the prompt cache holds the held-out prompts as a ``val`` split: the bundled task's own held-out
  file by default, a seeded ``--val-split`` share (never trained), or ``--val-dataset``;
* the report's numbers from the run's reward set: mean reward, pass@1 (a reward that can tell right
  from wrong: the bundled task's right number, ``accuracy``; none: no pass@1), the change against the base;
* a tiny model really answers the held-out prompts greedily (the same answers twice);
* the table, the summary line, the fine-tune's before/after and the model card's section.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("grpo-eval") / "tiny-qwen3")


def _cfg(**kw):
    from trnqwen.config import RunConfig

    base = dict(method="grpo", backend="native", model="builtin:tiny-qwen3", seq_len=64, max_completion_length=16)
    return RunConfig(**{**base, **kw})


def _heldout() -> list[dict]:
    from trnqwen.data.sums_recipe import HELDOUT_NAME, sums_path

    return [json.loads(line) for line in sums_path(HELDOUT_NAME).read_text().splitlines()]


def test_the_bundled_task_holds_out_its_own_prompts(tiny, tmp_path):
    from trnqwen.methods.grpo import prompt_cache

    data = prompt_cache.prepare(_cfg(), tiny, cache_root=tmp_path)
    assert data.train_rows == 48 and data.val_rows == 16
    held = prompt_cache.read_records(data.cache_dir, "val")
    assert [r["columns"]["answer"] for r in held] == [r["answer"] for r in _heldout()]
    assert held[0]["where"].endswith("sums_heldout.jsonl line 1")


def test_val_split_holds_out_a_seeded_share_never_trained_and_val_dataset_names_its_file(tiny, tmp_path):
    from trnqwen.data.sums_recipe import HELDOUT_NAME, sums_path
    from trnqwen.methods.grpo import prompt_cache

    mine = tmp_path / "mine.jsonl"
    mine.write_text(sums_path().read_text())
    cfg = _cfg(dataset=str(mine), reward=["trnqwen.methods.grpo.task:number"], val_split=0.25)
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path / "a")
    train, held = (prompt_cache.read_records(data.cache_dir, s) for s in ("train", "val"))
    assert (len(train), len(held)) == (36, 12)
    assert not {r["where"] for r in train} & {r["where"] for r in held}
    again = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path / "b")
    assert [r["where"] for r in prompt_cache.read_records(again.cache_dir, "val")] == [r["where"] for r in held]
    other = prompt_cache.prepare(_cfg(dataset=str(mine), val_split=0.25, seed=7), tiny, cache_root=tmp_path / "c")
    assert [r["where"] for r in prompt_cache.read_records(other.cache_dir, "val")] != [r["where"] for r in held]
    named = prompt_cache.prepare(_cfg(dataset=str(mine), val_dataset=str(sums_path(HELDOUT_NAME))), tiny,
                                 cache_root=tmp_path / "d")
    assert (named.train_rows, named.val_rows) == (48, 16)
    alone = prompt_cache.prepare(_cfg(dataset=str(mine)), tiny, cache_root=tmp_path / "e")
    assert alone.val_rows == 0  # your prompts, nothing held out: eval asks for --val-split or --dataset


def _answers(texts, records=None):
    from trnqwen.methods.grpo.eval_report import HeldOutAnswers

    records = records or [{"where": f"h line {i + 1}", "prompt": r["prompt"], "columns": {"answer": r["answer"]}}
                          for i, r in enumerate(_heldout()[:len(texts)])]
    return HeldOutAnswers(records=records, texts=list(texts), ids=[[1] * (len(t) or 1) for t in texts],
                          truncated=[False] * len(texts))


SETTINGS = {"rewards": ["trnqwen.methods.grpo.task:number"], "max_completion_length": 16}


def test_mean_reward_and_pass_at_1_come_from_the_runs_rewards():
    from trnqwen.methods.grpo.eval_report import numbers

    answers = [r["answer"] for r in _heldout()[:4]]  # 30, 21, 25, 23
    base = _answers(["Ninety", "famous", "", "x"])
    tuned = _answers([answers[0], "2222", f"it is {answers[2]}", "Ninety"])
    before, after = numbers(base, None, SETTINGS), numbers(tuned, base, SETTINGS)
    assert before["mean_reward"] == 0.0 and before["pass_at_1"] == 0.0 and before["reward_vs_base"] is None
    # right alone 2; wrong digits alone exactly 1 (not right); right with words 1 + 2/6; nothing right 0
    expected = [2.0, 1.0, 1 + 2 / 6, 0.0]
    assert math.isclose(after["mean_reward"], sum(expected) / 4, rel_tol=1e-6)
    assert after["pass_at_1"] == 0.5 and math.isclose(after["reward_vs_base"], after["mean_reward"], rel_tol=1e-6)
    assert after["prompts"] == 4 and math.isclose(after["rewards"]["number"], after["mean_reward"], rel_tol=1e-6)


def test_pass_at_1_needs_a_reward_that_tells_right_from_wrong(tmp_path):
    from trnqwen.methods.grpo.eval_report import numbers
    from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

    (tmp_path / "mine.py").write_text("def brevity(completions, **kw):\n    return [-len(c[0]['content']) / 10 for c in completions]\n")
    got = numbers(_answers(["12", "1234"]), None, {**SETTINGS, "rewards": [f"{tmp_path / 'mine.py'}:brevity"]})
    assert got["pass_at_1"] is None and math.isclose(got["mean_reward"], -0.3, rel_tol=1e-6)
    rewards = RewardSet.build(parse_rewards(["accuracy", "format", "trnqwen.methods.grpo.task:number"]), BuiltinOptions())
    assert rewards.pass_thresholds()[:2] == [1.0, None] and rewards.pass_thresholds()[2] > 1.0


def test_a_tiny_model_answers_the_held_out_prompts_greedily(tiny, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from trnqwen.evaluate.data import from_cache
    from trnqwen.methods.grpo import eval_report, prompt_cache

    cache = prompt_cache.prepare(_cfg(), tiny, cache_root=tmp_path).cache_dir
    data = from_cache(cache, "val", name="held out")
    assert data.method == "grpo" and data.split_name == "val" and len(data) == 16
    data.tokenizer_dir = tiny
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    first = eval_report.score(model, data, batch_size=8)
    again = eval_report.score(model, data, batch_size=5)  # greedy: the batching changes nothing
    assert first.texts == again.texts and len(first) == 16
    assert all(0 < len(ids) <= 16 for ids in first.ids) and first.records[0]["columns"]["answer"] == "30"
    row = eval_report.numbers(first, None, SETTINGS)
    assert row["prompts"] == 16 and math.isfinite(row["mean_reward"]) and 0 < row["completion_length"] <= 16
    shown = eval_report.answers(first, 2)
    assert shown[0][0] == "What is 17 + 13? Answer with the number only." and shown[0][1] == "30"


def test_the_table_summary_before_after_and_card_say_reward_and_pass_at_1():
    from trnqwen.evaluate.report import EvalReport, EvalResult
    from trnqwen.methods.grpo import card, eval_report

    base = {"checkpoint": "base", "prompts": 16, "mean_reward": 0.05, "pass_at_1": 0.0, "reward_vs_base": None}
    tuned = {"checkpoint": "run/step-12", "prompts": 16, "mean_reward": 1.25, "pass_at_1": 0.125, "reward_vs_base": 1.2}
    report = EvalReport(dataset="held out", method="grpo", method_settings=SETTINGS)
    for row in (base, tuned):
        report.results.append(EvalResult(row["checkpoint"], 100, None, None, preference=dict(row)))
    line = report.summary_line()
    assert line == "held-out reward before 0.0500 -> after 1.2500 (+1.2000), pass@1 0.0000 -> 0.1250 on 16 prompts (greedy)"
    as_json = report.to_json()
    assert as_json["method"] == "grpo" and as_json["results"][1]["loss"] is None
    assert as_json["results"][1]["mean_reward"] == 1.25 and as_json["rewards"] == SETTINGS["rewards"]
    _what, headers, rows = eval_report.table(as_json["results"], SETTINGS)
    assert headers[:5] == ["checkpoint", "prompts", "mean reward", "pass@1", "vs base"]
    assert rows[1][:5] == ["run/step-12", "16", "1.2500", "0.1250", "+1.2000"] and rows[0][4] == ""
    kept = eval_report.before_after(as_json["results"][0], as_json["results"][1])
    assert kept["reward_before"] == 0.05 and kept["pass_after"] == 0.125 and kept["line"] == line
    from rich.console import Console

    from trnqwen.logs.report import render_evaluation

    console = Console(record=True, width=200)
    render_evaluation(as_json, console=console)  # inspect-logs' held-out table of the run
    shown = console.export_text()
    assert "mean reward" in shown and "pass@1" in shown and "1.2500" in shown and "perplexity" not in shown, shown
    section = "\n".join(card.card(as_json["results"], "held out", lambda v: None if v is None else f"{v:.4f}"))
    assert "## Held-out prompts (`trnqwen eval` on held out)" in section
    assert "| run/step-12 | 16 | 1.2500 | 0.1250 | +1.2000 |" in section
