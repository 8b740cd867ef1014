"""Issue 37 end to end, for real: one ``trnqwen train`` (torchrun, torchtitan's native backend on CPU)
on a 3:1 mixture of two datasets in two shapes (one read through a mapping), packed best-fit,
rendered with a chat template of one's own; then ``trnqwen eval`` on the run.

What only a real run shows: the launcher's plan and run.json carry each source's share of the
trained tokens, the ranks train on the mixture's cache, the export's tokenizer carries the
template it trained with, and eval scores the run's own (template-rendered) validation split.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_subprocess
from tests.test_chat_template import SYSTEM_TEMPLATE
from tests.test_data_mixture import mixed_lengths, write_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    from trnqwen.data import chat_recipe
    from trnqwen.fetch.builtin import write_tiny_qwen3

    root = tmp_path_factory.mktemp("data-e2e")
    tiny = write_tiny_qwen3(root / "assets" / "tiny-qwen3")
    chats = [json.loads(line) for line in chat_recipe.chat_path().read_text().splitlines()]
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    write_jsonl(root / "chats.jsonl", [{"conversations": [{"from": speakers[m["role"]], "value": m["content"]}
                                                          for m in r["messages"]]} for r in chats])
    write_jsonl(root / "texts.jsonl", mixed_lengths(300))
    (root / "terse.jinja").write_text(SYSTEM_TEMPLATE)
    (root / "trnqwen.toml").write_text("""
chat_template = "terse.jinja"

[[datasets]]
path = "chats.jsonl"
weight = 3
val_split = 0.05
field_messages = "conversations"
message_property_mappings = { role = "from", content = "value" }
roles = { user = ["human"], assistant = ["gpt"] }

[[datasets]]
path = "texts.jsonl"
weight = 1
type = "prompt-completion"
""")
    env = {"XDG_CACHE_HOME": str(root / "cache")}
    common = ["--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--device", "cpu", "--nproc-per-node", "1",
              "--seq-len", "256"]
    plan = run_subprocess("train", *common, "--steps", "3", "--dry-run", "--json", cwd=root, env=env, timeout=600)
    runs = {}
    for backend in ("hf-trainer", "native"):  # native last: eval's LAST run
        runs[backend] = run_subprocess(
            "train", *common, "--backend", backend, "--steps", "3", "--lr", "1e-3", "--finetune", "--val-every", "3",
            "--checkpoint-dir", f"ckpt-{backend}", "--json", cwd=root, env=env, timeout=900)
    return root, plan, runs, env


def _losses(result) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line

    log = (Path(json.loads(result.out)["run_dir"]) / "train.log").read_text()
    return {m["step"]: m["loss"] for m in map(parse_step_line, log.splitlines()) if m}


def test_best_fit_rows_give_every_backend_the_same_losses(mixture_run):
    """The mixture's best-fit rows, in their seeded order, are one cache: torchtitan's native model and
    transformers' Trainer train on the same batches, and their losses agree to 1e-5 (float32 on a CPU)."""
    _, _, runs, _ = mixture_run
    for backend, r in runs.items():
        assert r.code == 0, f"{backend}:\n{r.text}"
    native, trainer = _losses(runs["native"]), _losses(runs["hf-trainer"])
    assert sorted(native) == sorted(trainer) == [1, 2, 3]
    assert all(abs(trainer[s] - native[s]) / native[s] < 1e-5 for s in native), (native, trainer)


def test_the_plan_and_run_json_give_each_sources_share(mixture_run):
    root, plan, runs, _ = mixture_run
    r = runs["native"]
    assert plan.code == 0, plan.text
    notes = [n for n in json.loads(plan.out)["notes"] if "mixture, share of the trained tokens" in n]
    assert len(notes) == 1 and "chats.jsonl 7" in notes[0] and "texts.jsonl 2" in notes[0]
    assert r.code == 0, r.text
    from trnqwen.rundir import RunRecord

    record = RunRecord.load(Path(json.loads(r.out)["run_dir"]))
    data = record.extra["data"]
    shares = [s["share"] for s in data["sources"]]
    assert abs(shares[0] - 0.75) <= 0.02 and abs(shares[1] - 0.25) <= 0.02, data
    assert data["packing_strategy"] == "best-fit" and data["padding_fraction"] < data["sequential_padding_fraction"]
    assert data["chat_template"] == "terse.jinja"
    assert record.config["datasets"][0]["roles"] == {"user": ["human"], "assistant": ["gpt"]}


def test_the_export_carries_the_template_and_eval_scores_the_runs_split(mixture_run):
    root, _, runs, env = mixture_run
    r = runs["native"]
    assert r.code == 0, r.text
    export = Path(json.loads(r.out)["exported"])
    assert (export / "chat_template.jinja").read_text() == SYSTEM_TEMPLATE
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(export)).apply_chat_template(
        [{"role": "user", "content": "2 plus 2?"}], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    ev = run_subprocess("eval", "--json", "--device", "cpu", "--generate", "1", "--max-new-tokens", "4", cwd=root,
                        env=env, timeout=900)
    assert ev.code == 0, ev.text
    report = json.loads(ev.out)
    assert report["results"] and all(row["tokens"] > 0 for row in report["results"]), report
    assert report["generations"] and report["generations"][0]["answers"]  # prompts from the run's own cache
