"""``trnqwen eval --tasks``: real lm-evaluation-harness evaluations, offline, base and tuned side by side.

The built-in task's questions are answered by three tiny models: the base, one fine-tuned on the
task's right answers (its score must rise) and one fine-tuned on wrong answers on purpose (its
score must fall, and ``--fail-below`` must stop with exit 1).  The scores are the harness's own
``acc``, checked against a computation of the same thing here (the highest log-likelihood choice).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import replace_weights, run_subprocess
from trnqwen.errors import UsageError

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
LIMIT = 20


# --- the logic around the harness ------------------------------------------------------------------


def test_task_lists_and_gates_are_read_as_written():
    from trnqwen.evaluate.harness import parse_fail_below, split_tasks

    assert split_tasks(["a,b", " c ", "a"]) == ["a", "b", "c"]
    assert parse_fail_below(["a=-0.02", "c=0"], ["a", "c"]) == {"a": -0.02, "c": 0.0}
    for bad in ("a", "a=x", "=1", "a=nan"):
        with pytest.raises(UsageError, match="TASK=DELTA"):
            parse_fail_below([bad], ["a"])
    with pytest.raises(UsageError, match="not one of --tasks"):
        parse_fail_below(["b=-0.1"], ["a"])


def test_the_bundled_task_file_is_what_its_recipe_writes():
    from trnqwen.data import harness_recipe

    text = harness_recipe.task_path().read_text(encoding="utf-8")
    assert text == harness_recipe.render()
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == harness_recipe.N_QUESTIONS
    assert all(len(r["choices"]) == 4 and len(set(r["choices"])) == 4 for r in rows)
    assert len({r["gold"] for r in rows}) > 1  # the right answer is not always in one place


def test_tasks_are_checked_before_any_model_loads(tmp_path, monkeypatch):
    from trnqwen.evaluate.harness import BUILTIN_TASK, resolve_tasks

    builtin, gen = resolve_tasks([BUILTIN_TASK, "trnqwen_calculator_gen"])
    assert Path(builtin.config["dataset_kwargs"]["data_files"]["test"]).is_file()
    assert builtin.config["output_type"] == "multiple_choice" and gen.config["output_type"] == "generate_until"
    task_file = tmp_path / "mine.yaml"
    task_file.write_text("task: my_local_task\ndataset_path: json\ndoc_to_text: !function utils.text\n")
    (mine,) = resolve_tasks([str(task_file)])
    assert mine.name == "my_local_task" and mine.yaml == task_file
    with pytest.raises(UsageError, match="no such task file"):
        resolve_tasks([str(tmp_path / "missing.yaml")])
    with pytest.raises(UsageError, match="not a harness task or group"):
        resolve_tasks(["no_such_task_anywhere"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match="task arc_easy downloads its data .* offline"):
        resolve_tasks([BUILTIN_TASK, "arc_easy"])
    assert [t.name for t in resolve_tasks([BUILTIN_TASK])] == [BUILTIN_TASK]  # local data runs offline


def test_flags_of_the_other_evaluation_are_refused_with_tasks(cli):
    result = cli("eval", "--tasks", "trnqwen_calculator", "--generate", "2")
    assert result.code == 2 and "--generate belong to the held-out evaluation" in result.err
    result = cli("eval", "--fail-below", "trnqwen_calculator=-0.1")
    assert result.code == 2 and "--limit and --fail-below apply to --tasks" in result.err


# --- real evaluations --------------------------------------------------------------------------------


def _tuned(base: Path, dest: Path, *, right: bool) -> Path:
    """The base fine-tuned in-process on the task's first LIMIT questions, answered rightly or wrongly."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trnqwen.data.harness_recipe import records

    shutil.copytree(base, dest)
    tokenizer = AutoTokenizer.from_pretrained(dest)
    texts = []
    for r in records()[:LIMIT]:
        answer = r["choices"][r["gold"]] if right else r["choices"][(r["gold"] + 1) % len(r["choices"])]
        texts.append(tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": answer}], tokenize=False))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(80):
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return replace_weights(model, dest)


def _own_accuracy(folder: Path) -> float:
    """The same score computed here: the choice with the highest summed log-likelihood after the prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trnqwen.data.harness_recipe import records

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    right = 0
    for r in records()[:LIMIT]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=False,
                                               add_generation_prompt=True)
        context = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        scores = []
        for choice in r["choices"]:
            whole = tokenizer(prompt + choice, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logps = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(logps[i - 1, whole[i]].item() for i in range(len(context), len(whole))))
        right += int(max(range(len(scores)), key=scores.__getitem__) == r["gold"])
    return right / LIMIT


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    root = tmp_path_factory.mktemp("harness")
    base = write_tiny_qwen3(root / "base" / "tiny-qwen3")
    return {"base": base, "good": _tuned(base, root / "good", right=True), "bad": _tuned(base, root / "bad", right=False)}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three models through the harness; minutes on a loaded 2-core machine
def test_base_and_two_tunes_side_by_side_and_the_gate(models, tmp_path):
    """One command, three models: the one that learned the answers scores higher than the base (and the
    harness's scores are the highest-likelihood choice, computed here independently); the one made
    worse on purpose breaches --fail-below: exit 1, after the results are printed."""
    r = run_subprocess("eval", str(models["good"]), str(models["bad"]), "--base-dir", str(models["base"]),
                       "--tasks", "trnqwen_calculator,trnqwen_calculator_gen", "--limit", str(LIMIT),
                       "--fail-below", "trnqwen_calculator=-0.05", "--device", "cpu", "--json",
                       cwd=tmp_path, env=OFFLINE, timeout=1700)
    assert r.code == 1, r.text[-3000:]
    report = json.loads(r.out)
    assert not report["ok"] and report["chat_template"]
    assert report["tasks"] == ["trnqwen_calculator", "trnqwen_calculator_gen"]
    base, good, bad = report["results"]
    assert base["is_base"] and not good["is_base"] and not bad["is_base"]
    scores = {x["label"]: x["scores"]["trnqwen_calculator"] for x in report["results"]}
    assert all(s["metric"] == "acc" and s["samples"] == LIMIT and s["stderr"] is not None for s in scores.values())
    for result, name in ((base, "base"), (good, "good"), (bad, "bad")):
        assert scores[result["label"]]["value"] == pytest.approx(_own_accuracy(models[name])), name
    assert good["delta_vs_base"]["trnqwen_calculator"] >= 0.2, report  # it learned these answers
    assert bad["delta_vs_base"]["trnqwen_calculator"] < -0.05, report  # it learned wrong ones
    # greedy answers, compared whole (the tiny model writes none exactly yet: 0.0 for all three, measured)
    gen = {x["label"]: x["scores"]["trnqwen_calculator_gen"] for x in report["results"]}
    assert all(g["metric"] == "exact_match,stripped" and g["samples"] == LIMIT and 0 <= g["value"] <= 1 for g in gen.values()), gen
    (failure,) = report["gate_failures"]
    assert failure.startswith(bad["label"] + " trnqwen_calculator") and "allowed -0.0500" in failure
    assert "--fail-below:" in r.err and bad["label"] in r.err


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_table_is_printed_before_the_gate_stops(models, tmp_path):
    r = run_subprocess("eval", str(models["bad"]), "--base-dir", str(models["base"]), "--tasks", "trnqwen_calculator",
                       "--limit", "8", "--fail-below", "trnqwen_calculator=0.5", "--device", "cpu",
                       cwd=tmp_path, env=OFFLINE, timeout=1100)
    assert r.code == 1, r.text[-3000:]
    assert "lm-evaluation-harness (chat template, limit 8)" in r.out and "trnqwen_calculator" in r.out
    assert "--fail-below:" in r.err and "allowed +0.5000" in r.err


def test_the_export_card_gains_the_benchmarks_and_keeps_its_held_out_table(tmp_path):
    """eval --tasks' record goes beside eval.json (never over it); the card is rewritten with both tables."""
    from trnqwen.ckpt.model_folder import CARD, card_info, write_model_card
    from trnqwen.evaluate.harness import HarnessReport, HarnessResult, TaskScore, record
    from trnqwen.evaluate.report import EVAL_RECORD
    from trnqwen.evaluate.targets import RunInfo
    from trnqwen.rundir import RunRecord

    run_dir, export = tmp_path / "run", tmp_path / "export"
    run_dir.mkdir()
    export.mkdir()
    held_out = {"dataset": "chats.jsonl", "results": [
        {"checkpoint": "base", "tokens": 100, "loss": 2.5, "perplexity": 12.18, "delta_vs_base": None},
        {"checkpoint": "step-12", "tokens": 100, "loss": 2.1, "perplexity": 8.17, "delta_vs_base": -0.4}]}
    (run_dir / EVAL_RECORD).write_text(json.dumps(held_out))
    run = RunInfo(run_dir, RunRecord(run_id="r1", run_dir=str(run_dir), config={"model": "Qwen/Qwen3-0.6B"},
                                     assets_dir=str(tmp_path), steps=12))
    write_model_card(export, card_info(run.record, held_out["results"], "chats.jsonl"))
    report = HarnessReport(tasks=["trnqwen_calculator"], limit=20.0, chat_template=True, results=[
        HarnessResult("base", True, {"trnqwen_calculator": TaskScore("trnqwen_calculator", "acc", 0.25, 0.1, 20)}),
        HarnessResult("step-12", False, {"trnqwen_calculator": TaskScore("trnqwen_calculator", "acc", 0.7, 0.1, 20)})])
    saved = record(run, report, folder=export)
    assert json.loads(saved.read_text())["results"][1]["delta_vs_base"]["trnqwen_calculator"] == pytest.approx(0.45)
    assert json.loads((run_dir / EVAL_RECORD).read_text()) == held_out  # the run's own numbers untouched
    card = (export / CARD).read_text()
    assert "## Benchmarks (lm-evaluation-harness, `trnqwen eval --tasks`, limit 20)" in card
    assert "| trnqwen_calculator | acc | 0.2500 | 0.7000 | +0.4500 |" in card
    assert "Held-out evaluation" in card and "| step-12 | 100 |" in card  # the held-out table kept


# --- train --eval-tasks ------------------------------------------------------------------------------


def test_train_checks_its_eval_tasks_before_the_run(cli, tmp_path, tiny_assets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "cpu", "--finetune"]
    r = cli(*base, "--eval-fail-below", "trnqwen_calculator=-0.1")
    assert r.code == 2 and "--eval-fail-below gates --eval-tasks" in r.err
    r = cli(*base, "--eval-tasks", "no_such_task_anywhere")
    assert r.code == 2 and "not a harness task or group" in r.err
    r = cli(*base, "--eval-tasks", "trnqwen_calculator", "--eval-fail-below", "other=-0.1")
    assert r.code == 2 and "not one of --tasks" in r.err
    r = cli(*base, "--eval-tasks", "trnqwen_calculator", "--launcher", "slurm")
    assert r.code == 2 and "the nodes' jobs do not evaluate" in r.err
    assert not (tmp_path / ".trnqwen" / "runs").exists()  # no run was started


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_train_eval_tasks_scores_the_export_and_its_base_after_the_run(tmp_path):
    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.rundir import last_run_dir

    assets = write_tiny_qwen3(tmp_path / "assets" / "tiny-qwen3")
    r = run_subprocess("train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--device", "cpu",
                       "--finetune", "--nproc-per-node", "1", "--steps", "2", "--seq-len", "64",
                       "--eval-tasks", "trnqwen_calculator", "--eval-fail-below", "trnqwen_calculator=-1", "--json",
                       cwd=tmp_path, env=OFFLINE, timeout=1700)
    assert r.code == 0, r.text[-3000:]
    out = json.loads(r.out)
    bench = out["benchmarks"]
    assert [x["is_base"] for x in bench["results"]] == [True, False]
    assert all(x["scores"]["trnqwen_calculator"]["samples"] == 40 for x in bench["results"])
    run_dir = last_run_dir(tmp_path / ".trnqwen" / "runs")
    saved = json.loads((run_dir / "eval-harness.json").read_text())
    assert saved["results"] == bench["results"]
