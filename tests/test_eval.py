"""``trnqwen eval`` on the built-in tiny Qwen3 (real transformers, real files, CPU).

A recorded run is laid out as ``trnqwen train --finetune`` leaves it (run.json, LAST, the export
in torchtitan's step-N layout completed into a model folder, the tokenized dataset cache with a
validation split), with the "fine-tuned" weights made by nudging the base weights, so these tests
need no torchrun; tests/test_eval_e2e.py trains for real.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from tests.ckpt_fixtures import tree_hash
from tests.eval_fixtures import chat_records, write_chat_cache
from tests.helpers import assert_clean_error


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("eval-tiny") / "tiny-qwen3")


@pytest.fixture(scope="module")
def cache(tiny, tmp_path_factory) -> Path:
    return write_chat_cache(tmp_path_factory.mktemp("eval-cache"), tiny, chat_records()[:160], val=40)


def write_tuned(tiny: Path, step_dir: Path, *, dtype: str = "float32", scale: float = 0.02) -> Path:
    """The base weights nudged by deterministic noise, saved as torchtitan saves an export."""
    import torch
    from safetensors.torch import load_file, save_file

    from trnqwen.fetch.builtin import WEIGHTS_FILE

    state = load_file(str(tiny / WEIGHTS_FILE))
    gen = torch.Generator().manual_seed(7)
    tuned = {k: (v + scale * torch.randn(v.shape, generator=gen) * v.std()).to(getattr(torch, dtype)).contiguous() for k, v in state.items()}
    step_dir.mkdir(parents=True)
    save_file(tuned, str(step_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    shutil.copy(tiny / "model.safetensors.index.json", step_dir / "model.safetensors.index.json")
    (step_dir / "sharded").mkdir()
    return step_dir


def record_run(work: Path, tiny: Path, export: Path, cache: Path | None, run_id: str = "20261130-120000-native") -> Path:
    from trnqwen.rundir import RunRecord

    runs = work / ".trnqwen" / "runs"
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    extra = {"exported": str(export)}
    if cache is not None:
        extra["dataset_cache"] = str(cache)
    RunRecord(
        run_id=run_id, run_dir=str(run_dir), status="succeeded", config={"seq_len": 128, "model": "builtin:tiny-qwen3"},
        checkpoint_dir=str(export.parent), assets_dir=str(tiny), backend="native", steps=3, extra=extra,
    ).save()
    (runs / "LAST").write_text(run_id + "\n")
    return run_dir


@pytest.fixture
def run_work(tiny, cache, tmp_path, monkeypatch):
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    export = write_tuned(tiny, tmp_path / "checkpoint_tiny_qwen3_ft" / "step-3")
    complete_export(export, tiny, CardInfo(base_model="tiny-qwen3", backend="native", steps=3))
    run_dir = record_run(tmp_path, tiny, export, cache)
    monkeypatch.chdir(tmp_path)
    return tmp_path, run_dir, export


# --- the numbers ---------------------------------------------------------------------------------


def test_packed_loss_equals_each_conversation_scored_alone(tiny, cache):
    """Block-causal packing and the shifted labels: scoring packed rows gives exactly the
    token-weighted loss of every conversation run through the model on its own."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from trnqwen.evaluate import model as m
    from trnqwen.evaluate.data import documents, from_cache
    from trnqwen.evaluate.targets import EvalTarget

    data = from_cache(cache, "val", name="val")
    target = EvalTarget(label="base", folder=tiny, config_dir=tiny, is_base=True)
    model = m.load_model(target, "cpu")
    packed = m.score(model, data, batch_size=3)  # 3 does not divide the row count: a filler batch
    assert packed.tokens == data.trained_tokens > 0

    total, count = 0.0, 0
    with torch.inference_mode():
        for row in range(len(data)):
            ids, labels = np.asarray(data.input_ids[row]), np.asarray(data.labels[row])
            for start, end in documents(data.positions[row]):
                keep = labels[start:end] != -100
                if not keep.any():
                    continue
                logits = model(input_ids=torch.tensor(ids[start:end])[None].long()).logits[0].float()
                target_ids = torch.tensor(labels[start:end]).long()
                total += float(F.cross_entropy(logits[torch.tensor(keep)], target_ids[torch.tensor(keep)], reduction="sum"))
                count += int(keep.sum())
    assert count == packed.tokens
    assert packed.loss == pytest.approx(total / count, rel=1e-5)
    # the mask matters: with a KV cache transformers ignores the documents (plain causal mask),
    # and packed documents then see each other
    with torch.inference_mode():
        ids, _, positions = m._batch(data, 0, 1)
        causal = model(input_ids=ids, position_ids=positions, use_cache=True).logits
        blocked = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert not torch.allclose(causal, blocked)


def test_held_out_conversations_cut_at_the_last_answer(tiny, cache):
    from transformers import AutoTokenizer

    from trnqwen.evaluate.data import from_cache, held_out_conversations

    tok = AutoTokenizer.from_pretrained(str(tiny))
    data = from_cache(cache, "val", name="val")
    conversations = held_out_conversations(data, 3)
    assert len(conversations) == 3
    expected = chat_records()[120:123]  # the first three validation records, in order
    for conv, record in zip(conversations, expected):
        prompt = tok.apply_chat_template(record["messages"][:-1], tokenize=False, add_generation_prompt=True)
        assert tok.decode(conv.prompt_ids) == prompt
        assert tok.decode(conv.reference_ids) == record["messages"][-1]["content"] + "<|im_end|>"


def test_eval_json_base_then_tuned_with_deterministic_answers(run_work, cli):
    work, run_dir, export = run_work
    first = cli("eval", "--json", "--generate", "2", "--max-new-tokens", "8", "--device", "cpu")
    assert first.code == 0, first.text
    doc = json.loads(first.out)
    assert set(doc) == {"dataset", "results", "generations"}
    base, tuned = doc["results"]
    assert set(base) == {"checkpoint", "tokens", "loss", "perplexity", "delta_vs_base"}
    assert base["checkpoint"] == "base" and base["delta_vs_base"] is None
    assert tuned["checkpoint"] == f"{run_dir.name}/step-3"
    assert base["tokens"] == tuned["tokens"] > 0
    assert tuned["delta_vs_base"] == pytest.approx(tuned["loss"] - base["loss"], abs=2e-6)
    assert base["perplexity"] == pytest.approx(math.exp(base["loss"]), rel=1e-4)
    assert len(doc["generations"]) == 2
    gen = doc["generations"][0]
    assert set(gen) == {"prompt", "conversation", "reference", "answers"} and set(gen["answers"]) == {"base", tuned["checkpoint"]}
    messages = chat_records()[120]["messages"]
    assert gen["prompt"] == [m for m in messages if m["role"] == "user"][-1]["content"]
    assert gen["conversation"] == messages[:-1]  # the system prompt too: what the models were given
    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["results"] == doc["results"]

    again = cli("eval", str(run_dir), "--json", "--generate", "2", "--max-new-tokens", "8", "--device", "cpu")
    assert again.code == 0, again.text
    assert json.loads(again.out) == doc  # a run dir works as CHECKPOINT; greedy answers repeat exactly


def test_run_id_export_path_and_no_base(run_work, cli, cache):
    work, run_dir, export = run_work
    by_id = cli("eval", run_dir.name, "--no-base", "--json")
    assert by_id.code == 0, by_id.text
    assert [r["checkpoint"] for r in json.loads(by_id.out)["results"]] == [f"{run_dir.name}/step-3"]
    by_path = cli("eval", str(export), "--dataset", str(cache), "--json")
    assert by_path.code == 0, by_path.text
    doc = json.loads(by_path.out)
    assert [r["checkpoint"] for r in doc["results"]] == ["base", str(export)]  # the run that wrote it names the base
    assert doc["dataset"] == str(cache)


def test_table_shows_the_change_against_base(run_work, cli):
    res = cli("eval", "--device", "cpu")
    assert res.code == 0, res.text
    assert "perplexity" in res.out and "vs base" in res.out and "base" in res.out
    assert "validation loss" in res.err


def test_generate_prompts_with_the_whole_conversation_and_shows_it(tiny, tmp_path, capsys):
    """issue 28 #25: the answer is generated from every turn up to the last user message, through
    the chat template (system prompt, earlier turns), the output shows those turns, and an empty
    answer reads "(empty)"."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate.data import from_cache, held_out_conversations
    from trnqwen.evaluate.report import EvalReport, Generation, render
    from trnqwen.evaluate.run import prompt_turns

    talk = {"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "2 plus 2?"},
                         {"role": "assistant", "content": "Quatre."}, {"role": "user", "content": "And times 3?"},
                         {"role": "assistant", "content": "Douze."}]}
    cache = write_chat_cache(tmp_path / "c", tiny, chat_records()[:20] + [talk], val=1, key="multi-turn")
    conversation = held_out_conversations(from_cache(cache, "val", name="t"), 1)[0]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    expected = tokenizer.apply_chat_template(talk["messages"][:-1], add_generation_prompt=True, tokenize=True)
    assert conversation.prompt_ids == list(expected.get("input_ids", expected) if hasattr(expected, "get") else expected)
    prompt, turns = prompt_turns(tokenizer, conversation.prompt_ids)
    assert prompt == "And times 3?" and turns == talk["messages"][:-1]
    render(EvalReport(dataset="t", generations=[Generation(prompt, "Douze.", {"base": "", "tuned": "Douze."}, turns)]))
    out = capsys.readouterr().out
    assert "system: Answer in French." in out and "assistant: Quatre." in out and "prompt: And times 3?" in out
    assert "base: (empty)" in out and "tuned: Douze." in out


# --- bad input: one line, exit 2, nothing written ------------------------------------------------


def _tree(work: Path) -> str:
    return tree_hash(work)


def test_missing_checkpoint_and_unknown_run_id(run_work, cli):
    work, run_dir, _ = run_work
    before = _tree(work)
    assert_clean_error(cli("eval", "./no/such/ckpt"), code=2, contains="no such checkpoint")
    assert_clean_error(cli("eval", "20990101-000000-native"), code=2, contains="no run 20990101-000000-native")
    assert _tree(work) == before and not (run_dir / "eval.json").exists()


def test_seq_len_without_dataset_is_refused(run_work, cli):
    """issue 28 #12: `eval --seq-len 64` scored the run's split at its own length and said nothing."""
    work, run_dir, _ = run_work
    before = _tree(work)
    assert_clean_error(cli("eval", "--seq-len", "64"), code=2, contains="--seq-len 64 applies only with --dataset")
    assert _tree(work) == before


def test_architecture_mismatch_with_base(run_work, cli):
    work, run_dir, export = run_work
    config = json.loads((export / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (export / "config.json").write_text(json.dumps(config))
    before = _tree(work)
    assert_clean_error(cli("eval"), code=2, contains="not the base model's architecture")
    assert _tree(work) == before


def test_dataset_with_no_trained_tokens(run_work, cli, tiny, tmp_path):
    import numpy as np

    from trnqwen.dataset.cache import SplitArrays, write_cache

    ids = np.full((2, 128), 5, dtype=np.int32)
    untrained = SplitArrays(ids, np.full_like(ids, -100), np.tile(np.arange(128, dtype=np.int32), (2, 1)), 2, 0)
    empty = write_cache(tmp_path / "untrained", "k", {"train": untrained}, seq_len=128, packing=True, pad_id=0, eos_id=None)
    work, run_dir, _ = run_work
    before = _tree(work)
    assert_clean_error(cli("eval", "--dataset", str(empty)), code=2, contains="no trained tokens")
    assert _tree(work) == before


def test_generate_without_chat_template(run_work, cli):
    work, run_dir, export = run_work
    config = json.loads((export / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (export / "tokenizer_config.json").write_text(json.dumps(config))
    run = json.loads((run_dir / "run.json").read_text())
    assets = Path(run["assets_dir"])
    plain = work / "plain-assets"
    shutil.copytree(assets, plain)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    run["assets_dir"] = str(plain)
    (run_dir / "run.json").write_text(json.dumps(run))
    before = _tree(work)
    assert_clean_error(cli("eval", "--generate", "1"), code=2, contains="no chat template")
    assert _tree(work) == before


# --- the export is a whole model folder ------------------------------------------------------------


def test_export_loads_with_plain_from_pretrained_and_generates(tiny, tmp_path):
    """Nothing but transformers on the path: no trnqwen, no assets beside it."""
    import subprocess
    import sys

    from huggingface_hub import ModelCard

    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    export = write_tuned(tiny, tmp_path / "ckpt" / "step-5", dtype="bfloat16")
    (export / "sharded" / "piece.safetensors").write_bytes(b"x")
    written = complete_export(
        export, tiny,
        CardInfo(base_model="Qwen/Qwen3-4B-Instruct-2507", backend="hf-v5", steps=5, dataset="mychat.jsonl",
                 final_loss=1.5, validation_loss=1.75, validation_step=4, run_id="r1"),
    )
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"} <= set(written)
    # torchtitan's per-rank pieces are kept, beside the model folder instead of inside it
    assert not (export / "sharded").exists() and (export.parent / "step-5.sharded" / "piece.safetensors").is_file()
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"  # as saved, not the base's float32
    card = ModelCard.load(export / "README.md")
    assert card.data.base_model == "Qwen/Qwen3-4B-Instruct-2507" and "trnqwen" in card.data.tags
    for fact in ("mychat.jsonl", "hf-v5", "1.5000", "| validation loss | 1.7500 (after step 4) |", "| steps | 5 |"):
        assert fact in card.text
    script = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "x = t.apply_chat_template([{'role': 'user', 'content': 'Which river is Ashford on?'}], add_generation_prompt=True,"
        " return_tensors='pt', return_dict=True)\n"
        "out = m.generate(**x, max_new_tokens=4, do_sample=False)\n"
        "print(m.dtype, out.shape[1] - x['input_ids'].shape[1])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(export)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch.bfloat16", "4"]


def test_a_users_own_files_are_kept_and_verify_ckpt_passes(tiny, tmp_path, cli):
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    export = write_tuned(tiny, tmp_path / "ckpt" / "step-2")
    (export / "README.md").write_text("my own card\n")
    complete_export(export, tiny, CardInfo(base_model="tiny-qwen3", backend="native"))
    assert (export / "README.md").read_text() == "my own card\n"
    res = cli("verify-ckpt", str(tmp_path / "ckpt"), "--json")  # config.json now sits beside the weights
    assert res.code == 0, res.text
    assert json.loads(res.out)["ok"]


# --- --dataset goes through the training pipeline: the same rows training reads ------------------


def test_dataset_file_is_scored_on_exactly_the_rows_training_reads(run_work, cli, tiny, tmp_path):
    """`eval --dataset FILE` tokenizes with trnqwen.dataset's pipeline under the run's settings, so
    it lands on the very cache a `train --dataset FILE` run reads (same key), and each document's
    tokens and masks match an independent apply_chat_template rendering."""
    from types import SimpleNamespace

    import numpy as np
    from transformers import AutoTokenizer

    from tests.eval_fixtures import render
    from trnqwen.dataset.prepare import prepare_dataset
    from trnqwen.evaluate.data import documents, eval_data
    from trnqwen.evaluate.targets import resolve_target

    work, run_dir, export = run_work
    records = chat_records()[:30]
    data_file = tmp_path / "held_out.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    target = resolve_target(str(export), work / ".trnqwen" / "runs")
    scored = eval_data(str(data_file), [target], seq_len=128)
    training = prepare_dataset(SimpleNamespace(dataset=str(data_file), seq_len=128), tiny)  # what the launcher calls
    assert scored.source == training.cache_dir
    split = training.split("train")
    assert np.array_equal(scored.labels, split.labels) and np.array_equal(scored.input_ids, split.input_ids)

    tok = AutoTokenizer.from_pretrained(str(tiny))
    expected = set()
    for record in records:
        ids, trained = render(tok, record["messages"])
        labels = [ids[t + 1] if t + 1 < len(ids) and trained[t + 1] else -100 for t in range(len(ids))]
        expected.add((tuple(ids), tuple(labels)))
    found = set()
    for row in range(len(scored)):
        for start, end in documents(scored.positions[row]):
            ids = tuple(int(x) for x in scored.input_ids[row][start:end])
            if any(int(x) != -100 for x in scored.labels[row][start:end]):
                found.add((ids, tuple(int(x) for x in scored.labels[row][start:end])))
    assert found == expected

    res = cli("eval", str(export), "--dataset", str(data_file), "--seq-len", "128", "--json")
    assert res.code == 0, res.text
    assert {r["tokens"] for r in json.loads(res.out)["results"]} == {scored.trained_tokens}


def test_other_data_never_rewrites_the_runs_record_or_card(run_work, cli, tmp_path):
    """issue 28 #26: `eval --dataset FILE` overwrote eval.json and the card's held-out table (8 training
    records published as held-out numbers).  Only the run's own split writes them; other data is
    saved under its own name."""
    work, run_dir, export = run_work
    own = cli("eval", "--json", "--device", "cpu")
    assert own.code == 0, own.text
    record, card = (run_dir / "eval.json").read_bytes(), (export / "README.md").read_bytes()
    assert b"Held-out evaluation" in card
    data_file = tmp_path / "trained_on.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in chat_records()[:8]))
    other = cli("eval", "--dataset", str(data_file), "--seq-len", "128", "--json", "--device", "cpu")
    assert other.code == 0, other.text
    assert (run_dir / "eval.json").read_bytes() == record and (export / "README.md").read_bytes() == card
    [kept] = run_dir.glob("eval-trained_on.jsonl-*.json")  # its own name: eval-<data>-<hash6>.json
    saved = json.loads(kept.read_text())
    assert saved["dataset"] == str(data_file) and saved["results"] == json.loads(other.out)["results"]


# --- in the lifecycle ------------------------------------------------------------------------------


def test_finetune_line_and_card_carry_validation_before_and_after(run_work):
    """What `train --finetune` prints last (eval in a child process), and the export's card."""
    from huggingface_hub import ModelCard

    from trnqwen.evaluate.lifecycle import validation_before_after

    work, run_dir, export = run_work
    got = validation_before_after(run_dir, device="cpu")
    assert got is not None, "the run has a validation split"
    saved = json.loads((run_dir / "eval.json").read_text())["results"]
    assert (got["before"], got["after"]) == (saved[0]["loss"], saved[1]["loss"])
    assert got["line"].startswith(f"validation loss before {saved[0]['loss']:.4f} -> after {saved[1]['loss']:.4f}")
    card = ModelCard.load(export / "README.md")
    assert "Held-out evaluation" in card.text and f"{saved[1]['loss']:.4f}" in card.text
    assert card.data.tags and "trnqwen" in card.data.tags


def test_no_validation_split_no_line(tiny, tmp_path):
    from trnqwen.evaluate.lifecycle import validation_before_after

    export = write_tuned(tiny, tmp_path / "ck" / "step-1")
    run_dir = record_run(tmp_path, tiny, export, cache=None)
    assert validation_before_after(run_dir) is None
    assert not (run_dir / "eval.json").exists()


# --- Neuron's rules, on a real model (the static cache runs on CPU too) ----------------------------


def test_neuron_paths_keep_one_shape_and_give_the_same_numbers(tiny, cache):
    """On Neuron: full-head scoring (fixed shapes), generate() with inputs on the CPU, one
    [batch, prompt_len] shape per call and cache_implementation="static"; same results as CPU's."""
    from transformers import AutoTokenizer

    from trnqwen.evaluate import model as m
    from trnqwen.evaluate.data import from_cache, held_out_conversations
    from trnqwen.evaluate.targets import EvalTarget

    assert m.device_map_for("neuron") == "neuron" and m.device_map_for("cpu") is None
    data = from_cache(cache, "val", name="val")
    model = m.load_model(EvalTarget(label="base", folder=tiny, config_dir=tiny, is_base=True), "cpu")
    fixed = m.score(model, data, batch_size=3, static_shapes=True)
    picked = m.score(model, data, batch_size=3)
    assert fixed.tokens == picked.tokens and fixed.loss == pytest.approx(picked.loss, rel=1e-6)

    tok = AutoTokenizer.from_pretrained(str(tiny))
    conversations = held_out_conversations(data, 3)
    prompt_len = m.prompt_length(conversations)
    calls = []
    real_generate = model.generate

    def recording(**kwargs):
        calls.append(kwargs)
        return real_generate(**kwargs)

    model.generate = recording
    common = dict(pad_id=tok.pad_token_id, eos_ids=m.eos_ids_of(model, tok), prompt_len=prompt_len, max_new_tokens=6, batch_size=2)
    on_neuron = m.answer(model, conversations, device_type="neuron", **common)
    assert len(calls) == 2  # 3 conversations in batches of 2: the last one filled up, not shorter
    for call in calls:
        assert call["cache_implementation"] == "static"
        assert call["input_ids"].device.type == "cpu" and tuple(call["input_ids"].shape) == (2, prompt_len)
    calls.clear()
    assert m.answer(model, conversations, device_type="cpu", **common) == on_neuron
    assert "cache_implementation" not in calls[0]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed (the dev extra has it: pip install -e '.[dev]')")
def test_eval_results_join_the_runs_wandb_run(run_work, cli, monkeypatch):
    """A run trained with --wandb: eval resumes the same W&B run (offline here) and logs to it."""
    work, run_dir, _ = run_work
    record = json.loads((run_dir / "run.json").read_text())
    record["config"]["wandb"] = True
    (run_dir / "run.json").write_text(json.dumps(record))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    res = cli("eval", "--no-base", "--json", "--device", "cpu")
    assert res.code == 0, res.text
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_dir.name}")
    assert list(offline.glob("*.wandb"))


def test_each_model_is_gone_before_the_next_loads(run_work, monkeypatch):
    """Base and tuned never sit in memory together: the previous model is collected first."""
    import weakref

    from trnqwen.evaluate import model as m
    from trnqwen.evaluate.run import execute, plan_eval

    work, run_dir, _ = run_work
    loaded: list[weakref.ref] = []
    real_load = m.load_model

    def load_and_track(*args, **kwargs):
        assert all(ref() is None for ref in loaded), "a previous model is still alive"
        model = real_load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(m, "load_model", load_and_track)
    report = execute(plan_eval([], runs_dir=work / ".trnqwen" / "runs", device="cpu", generate=1, max_new_tokens=2))
    assert len(loaded) == 2 and all(ref() is None for ref in loaded)
    assert [r.checkpoint for r in report.results][0] == "base"


def test_a_read_only_run_dir_still_gets_its_results_printed(run_work, cli):
    from tests.helpers import mounted_tmpfs

    work, run_dir, export = run_work
    ro = work / "ro-runs"
    shutil.copytree(work / ".trnqwen" / "runs", ro / "copy")
    with mounted_tmpfs(work / "ro-mount", "size=8m") as mount:
        shutil.copytree(ro / "copy", mount / "runs")
        import subprocess

        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        res = cli("eval", str(mount / "runs" / run_dir.name), "--json", "--no-base")
    assert res.code == 0, res.text
    assert json.loads(res.out)["results"][0]["tokens"] > 0
    assert "could not record the results" in res.err


def test_nki_moe_export_describes_the_cut_model(tmp_path):
    """nki-moe trains Qwen3-30B-A3B cut to --moe-layers/--num-experts/--top-k: so is its config.json."""
    from safetensors.numpy import save_file
    import numpy as np

    from trnqwen.ckpt.model_folder import complete_run_export
    from trnqwen.rundir import RunRecord

    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_moe", "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "dtype": "bfloat16"}))
    export = tmp_path / "ck" / "step-1"
    export.mkdir(parents=True)
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(export / "model-00001-of-00001.safetensors"))
    record = RunRecord(run_id="r", run_dir=str(tmp_path), assets_dir=str(assets), backend="nki-moe",
                       config={"backend": "nki-moe", "model": "Qwen/Qwen3-30B-A3B", "moe_layers": 4, "num_experts": 64, "top_k": 4})
    complete_run_export(record, export)
    config = json.loads((export / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_experts"], config["num_experts_per_tok"], config["dtype"]) == (4, 64, 4, "float32")


def test_two_nodes_completing_one_shared_export_do_not_collide(tiny, tmp_path):
    """On a shared filesystem every node of a multi-node run sees the export; completing it twice
    at once must not trip over one temp file (CI saw `.tokenizer_config.json.tmp` vanish)."""
    import threading

    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    errors: list[BaseException] = []
    for attempt in range(12):
        export = write_tuned(tiny, tmp_path / f"ckpt{attempt}" / "step-2")
        (export / "sharded" / "__0_0.distcp").write_bytes(b"rank 0's piece")  # torchtitan's per-rank pieces
        if attempt % 2:  # a stale copy beside it from an earlier export of this step: replaced once
            (export.parent / "step-2.sharded").mkdir()
            (export.parent / "step-2.sharded" / "stale").write_text("old")
        barrier = threading.Barrier(2)

        def finish() -> None:
            barrier.wait()
            try:
                complete_export(export, tiny, CardInfo(base_model="tiny-qwen3", backend="native"))
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=finish) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not [p.name for p in export.iterdir() if p.name.endswith(".tmp")]
        assert (export / "tokenizer_config.json").read_bytes() == (tiny / "tokenizer_config.json").read_bytes()
        # sharded/ moved out exactly once, whole: nothing left inside the model folder (no claimed
        # .sharded.<pid> folder either), the pieces beside it, the stale copy gone
        assert not [p.name for p in export.iterdir() if "sharded" in p.name], sorted(p.name for p in export.iterdir())
        moved = export.parent / "step-2.sharded"
        assert sorted(p.name for p in moved.iterdir()) == ["__0_0.distcp"], (attempt, sorted(moved.iterdir()))
        assert (moved / "__0_0.distcp").read_bytes() == b"rank 0's piece"
        assert sorted(p.name for p in export.parent.iterdir()) == ["step-2", "step-2.sharded"]
    assert not errors, errors


def test_a_rebuilt_validation_split_that_differs_from_the_recorded_one_is_refused(tiny, tmp_path, cli, monkeypatch):
    """Issue 24: the run's token cache is gone and its dataset file changed since training. The
    split rebuilt from the new file is not the one the run held out (it may hold trained records):
    eval refuses instead of silently scoring it, unless --dataset is given explicitly."""
    from types import SimpleNamespace

    from trnqwen.ckpt.model_folder import CardInfo, complete_export
    from trnqwen.dataset.prepare import prepare_dataset
    from trnqwen.rundir import RunRecord

    data = tmp_path / "chat.jsonl"
    records = chat_records()[:80]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {"model": "builtin:tiny-qwen3", "seq_len": 128, "dataset": str(data), "val_split": 0.25}
    trained_on = prepare_dataset(SimpleNamespace(**config, data_cache_dir=str(tmp_path / "cache")), tiny).cache_dir
    export = write_tuned(tiny, tmp_path / "checkpoint_tiny_qwen3_ft" / "step-3")
    complete_export(export, tiny, CardInfo(base_model="tiny-qwen3", backend="native", steps=3))
    run_dir = record_run(tmp_path, tiny, export, trained_on)
    record = RunRecord.load(run_dir)
    record.config.update(config, data_cache_dir=str(tmp_path / "cache"))
    record.save()
    monkeypatch.chdir(tmp_path)

    same = cli("eval", "--json", "--no-base")  # the recorded cache, rebuilt identically: scored
    assert same.code == 0, same.text
    shutil.rmtree(trained_on)
    again = cli("eval", "--json", "--no-base")  # gone, but the same data rebuilds the same key
    assert again.code == 0, again.text
    assert json.loads(again.out)["results"] == json.loads(same.out)["results"]

    shutil.rmtree(trained_on)
    data.write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))  # the file changed since
    eval_json = run_dir / "eval.json"
    before = eval_json.read_bytes()
    changed = cli("eval", "--no-base")
    assert_clean_error(changed, code=2, contains="the run's validation data changed since training")
    assert trained_on.name in changed.err and f"--dataset {data}" in changed.err
    assert eval_json.read_bytes() == before  # not overwritten
    explicit = cli("eval", "--no-base", "--dataset", str(data), "--json")
    assert explicit.code == 0, explicit.text


def test_a_grpo_run_is_scored_on_held_out_prompts_with_its_rewards(run_work, cli, tiny):
    """A GRPO run's data is prompts: without held-out prompts eval says how to get some; with
    ``--dataset`` prompts each model answers them and the run's reward scores the answers (its own
    file beside the run, never its eval.json)."""
    from trnqwen.config import RunConfig
    from trnqwen.data.sums_recipe import HELDOUT_NAME, sums_path
    from trnqwen.methods.grpo import prompt_cache

    work, run_dir, _export = run_work
    mine, heldout = work / "prompts.jsonl", work / "heldout.jsonl"
    mine.write_text(sums_path().read_text())
    heldout.write_text(sums_path(HELDOUT_NAME).read_text())
    cfg = RunConfig(method="grpo", model="builtin:tiny-qwen3", seq_len=64, max_completion_length=16, dataset=str(mine),
                    reward=["trnqwen.methods.grpo.task:number"])
    prompts = prompt_cache.prepare(cfg, tiny, cache_root=work / "prompt-cache")
    run = json.loads((run_dir / "run.json").read_text())
    run["config"].update(cfg.model_dump(mode="json"))
    run["extra"]["dataset_cache"] = str(prompts.cache_dir)
    (run_dir / "run.json").write_text(json.dumps(run))
    assert_clean_error(cli("eval"), code=2, contains="has no validation split")
    got = cli("eval", "--dataset", str(heldout), "--generate", "2", "--json")  # 2 answers side by side (default 3)
    assert got.code == 0, got.text
    doc = json.loads(got.out)
    assert doc["method"] == "grpo" and doc["rewards"] == ["trnqwen.methods.grpo.task:number"], doc
    base, tuned = doc["results"]
    assert base["prompts"] == tuned["prompts"] == 16 and base["loss"] is None and base["reward_vs_base"] is None
    assert math.isfinite(tuned["mean_reward"]) and tuned["reward_vs_base"] is not None and "pass_at_1" in tuned
    assert len(doc["generations"]) == 2 and set(doc["generations"][0]["answers"]) == {"base", tuned["checkpoint"]}
    assert doc["generations"][0]["reference"] == "30"
    assert not (run_dir / "eval.json").exists() and list(run_dir.glob("eval-heldout*.json"))
