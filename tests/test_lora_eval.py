"""``trnqwen eval`` on a LoRA run: base against base + adapter (peft), with the same table and JSON
shape as a full fine-tune, the tuned row naming the adapter; and train's before/after line.

The run is laid out as ``trnqwen train --finetune --lora`` leaves it (run.json whose export is a PEFT
adapter folder completed with tokenizer and card, the dataset cache with a validation split); the
adapter is written by trnqwen.contract.peft_adapter.write_adapter, so no torchrun is needed here
(tests/test_lora_e2e.py trains for real).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.eval_fixtures import chat_records, write_chat_cache
from tests.helpers import assert_clean_error
from tests.lora_fixtures import make_adapter, rewrite_tensors


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("lora-eval-tiny") / "tiny-qwen3")


@pytest.fixture(scope="module")
def cache(tiny, tmp_path_factory) -> Path:
    return write_chat_cache(tmp_path_factory.mktemp("lora-eval-cache"), tiny, chat_records()[:120], val=24)


def lora_run(work: Path, tiny: Path, cache: Path, *, trained: bool = True, run_id: str = "20261201-120000-native"):
    """A recorded LoRA run whose export (hf/step-3) is a complete PEFT adapter folder."""
    from trnqwen.ckpt.model_folder import CardInfo, complete_export
    from trnqwen.rundir import RunRecord

    adapter = make_adapter(work / "checkpoint_tiny_qwen3_ft" / "hf" / "step-3", tiny, trained=trained, seed=3)
    complete_export(adapter, tiny, CardInfo(base_model="tiny-qwen3", backend="native", steps=3))
    runs = work / ".trnqwen" / "runs"
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    RunRecord(
        run_id=run_id, run_dir=str(run_dir), status="succeeded",
        config={"seq_len": 128, "model": "builtin:tiny-qwen3", "lora": True, "lora_rank": 8, "backend": "native"},
        checkpoint_dir=str(adapter.parent.parent), assets_dir=str(tiny), backend="native", steps=3,
        extra={"exported": str(adapter), "dataset_cache": str(cache)},
    ).save()
    (runs / "LAST").write_text(run_id + "\n")
    return run_dir, adapter


@pytest.fixture
def run_work(tiny, cache, tmp_path, monkeypatch):
    run_dir, adapter = lora_run(tmp_path, tiny, cache)
    monkeypatch.chdir(tmp_path)
    return tmp_path, run_dir, adapter


def merged_loss(tiny: Path, adapter: Path, cache: Path) -> float:
    """The held-out loss of W + alpha/r B A merged by hand into the base (no peft): what base +
    adapter must score."""
    import torch
    from transformers import AutoModelForCausalLM

    from trnqwen.contract.peft_adapter import read_adapter
    from trnqwen.evaluate.data import from_cache
    from trnqwen.evaluate.model import score

    config, modules = read_adapter(adapter)
    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for path, (a, b) in modules.items():
            params[f"{path}.weight"] += config["lora_alpha"] / config["r"] * (b @ a)
    return score(model.eval(), from_cache(cache, "val", "x"), batch_size=4).loss


def test_eval_base_vs_base_plus_adapter(run_work, cli, tiny, cache):
    work, run_dir, adapter = run_work
    res = cli("eval", "--json", "--generate", "2", "--max-new-tokens", "8", "--device", "cpu")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert set(doc) == {"dataset", "results", "generations"}  # the full fine-tune's shape
    base, tuned = doc["results"]
    assert set(tuned) == {"checkpoint", "tokens", "loss", "perplexity", "delta_vs_base"}
    assert base["checkpoint"] == "base" and tuned["checkpoint"] == f"{run_dir.name}/step-3 (LoRA adapter)"
    assert base["tokens"] == tuned["tokens"] > 0
    assert tuned["loss"] != base["loss"]  # the adapter was applied ...
    assert tuned["loss"] == pytest.approx(merged_loss(tiny, adapter, cache), abs=1e-4)  # ... exactly as W + s B A
    assert tuned["delta_vs_base"] == pytest.approx(tuned["loss"] - base["loss"], abs=2e-6)
    assert len(doc["generations"]) == 2
    assert set(doc["generations"][0]["answers"]) == {"base", tuned["checkpoint"]}
    assert json.loads((run_dir / "eval.json").read_text())["results"] == doc["results"]
    # the adapter's card gains the results and stays a PEFT adapter's card
    from huggingface_hub import ModelCard

    card = ModelCard.load(adapter / "README.md")
    assert card.data.library_name == "peft" and "Held-out evaluation" in card.text
    assert not (adapter / "config.json").exists()


def test_table_names_the_adapter(run_work, cli):
    res = cli("eval", "--device", "cpu")
    assert res.code == 0, res.text
    assert "(LoRA adapter)" in res.out and "base" in res.out and "validation loss" in res.err


def test_untrained_adapter_scores_as_the_base(tiny, cache, tmp_path, monkeypatch, cli):
    lora_run(tmp_path, tiny, cache, trained=False)
    monkeypatch.chdir(tmp_path)
    res = cli("eval", "--json", "--device", "cpu")
    assert res.code == 0, res.text
    base, tuned = json.loads(res.out)["results"]
    assert tuned["loss"] == pytest.approx(base["loss"], abs=1e-6)


def test_adapter_path_without_a_run_takes_adapter_configs_base(tiny, cache, tmp_path, cli):
    adapter = make_adapter(tmp_path / "loose-adapter", tiny)
    res = cli("eval", str(adapter), "--dataset", str(cache), "--json", "--device", "cpu")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert [r["checkpoint"] for r in doc["results"]] == ["base", f"{adapter} (LoRA adapter)"]
    assert doc["results"][0]["loss"] != doc["results"][1]["loss"]


def test_an_adapter_peft_cannot_place_fails(run_work, cli):
    work, run_dir, adapter = run_work

    def edit(t):
        for ab in "AB":
            t[f"base_model.model.model.layers.0.self_attn.qq_proj.lora_{ab}.weight"] = t.pop(
                f"base_model.model.model.layers.0.self_attn.q_proj.lora_{ab}.weight")

    rewrite_tensors(adapter, edit)
    res = cli("eval", "--json", "--device", "cpu")
    assert_clean_error(res, code=1, contains="does not load onto its base")
    assert "verify-ckpt" in res.err and not (run_dir / "eval.json").exists()


def test_finetune_line_for_a_lora_run(run_work):
    """What `train --finetune --lora` prints last (eval in a child process)."""
    from trnqwen.evaluate.lifecycle import validation_before_after

    work, run_dir, adapter = run_work
    got = validation_before_after(run_dir, device="cpu")
    assert got is not None and "error" not in got, got
    saved = json.loads((run_dir / "eval.json").read_text())["results"]
    assert saved[1]["checkpoint"].endswith("(LoRA adapter)")
    assert (got["before"], got["after"]) == (saved[0]["loss"], saved[1]["loss"]) and got["before"] != got["after"]
    assert got["line"].startswith("validation loss before ")


def test_an_adapter_away_from_its_run_and_base_takes_base_dir(tiny, cache, tmp_path, cli, monkeypatch):
    """adapter_config names a base that is not here: the hint names eval's own option, which works."""
    import shutil

    adapter = make_adapter(tmp_path / "moved-adapter", tiny)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Org/some-base"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    base = shutil.copytree(tiny, tmp_path / "bases" / "some-base")
    monkeypatch.chdir(tmp_path)
    lost = cli("eval", str(adapter), "--dataset", str(cache), "--json", "--device", "cpu")
    assert_clean_error(lost, code=2, contains="pass --base-dir DIR")
    res = cli("eval", str(adapter), "--dataset", str(cache), "--json", "--device", "cpu", "--base-dir", str(base))
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert [r["checkpoint"] for r in doc["results"]] == ["base", f"{adapter} (LoRA adapter)"]
    assert doc["results"][0]["loss"] != doc["results"][1]["loss"]
    only = cli("eval", str(adapter), "--dataset", str(cache), "--json", "--device", "cpu", "--base-dir", str(base), "--no-base")
    assert only.code == 0 and [r["checkpoint"] for r in json.loads(only.out)["results"]] == [f"{adapter} (LoRA adapter)"]
    bad = cli("eval", str(adapter), "--dataset", str(cache), "--device", "cpu", "--base-dir", str(tmp_path / "bases"))
    assert_clean_error(bad, code=2, contains="--base-dir")
