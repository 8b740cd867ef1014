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
              "--seq-len", "256", "--backend", "native"]
    plan = run_subprocess("train", *common, "--steps", "3", "--dry-run", "--json", cwd=root, env=env, timeout=600)
    r = run_subprocess("train", *common, "--steps", "3", "--lr", "1e-3", "--finetune", "--val-every", "3", "--json",
                       cwd=root, env=env, timeout=900)
    return root, plan, r, env


def test_the_plan_and_run_json_give_each_sources_share(mixture_run):
    root, plan, r, _ = mixture_run
    assert plan.code == 0, plan.text
    notes = [n for n in json.loads(plan.out)["notes"] if "mixture, share of the trained tokens" in n]
    assert len(notes) == 1 and "chats.jsonl 7" in notes[0] and "texts.jsonl 2" in notes[0]
    assert r.code == 0, r.text
    from trnqwen.rundir import RunRecord, last_run_dir

    record = RunRecord.load(last_run_dir(root / ".trnqwen" / "runs"))
    data = record.extra["data"]
    shares = [s["share"] for s in data["sources"]]
    assert abs(shares[0] - 0.75) <= 0.02 and abs(shares[1] - 0.25) <= 0.02, data
    assert data["packing_strategy"] == "best-fit" and data["padding_fraction"] < data["sequential_padding_fraction"]
    assert data["chat_template"] == "terse.jinja"
    assert record.config["datasets"][0]["roles"] == {"user": ["human"], "assistant": ["gpt"]}


def test_the_export_carries_the_template_and_eval_scores_the_runs_split(mixture_run):
    root, _, r, env = mixture_run
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
