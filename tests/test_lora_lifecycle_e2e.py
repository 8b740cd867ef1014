"""The LoRA lifecycle for real on CPU: a 3-step native LoRA fine-tune of the tiny Qwen3 on the
bundled chat set with 2 ranks (torchrun, torchtitan), then, through the CLI with no arguments,
verify-ckpt (the adapter against its base, loaded by peft), eval (base vs base + adapter) and
inspect-logs (the [LoRA] line judged against config.json's shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_subprocess

pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    from trnqwen.fetch.builtin import chat_path

    work = tmp_path_factory.mktemp("lora_e2e")
    env = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(work / "cache")}
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, env=env, timeout=300)
    assert fetched.code == 0, fetched.text
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "2", "--backend", "native",
        "--steps", str(STEPS), "--seq-len", "256", "--lr", "1e-2", "--finetune", "--lora", "--lora-rank", "8",
        "--dataset", str(chat_path()), "--val-split", "0.1", "--val-every", str(STEPS),
        cwd=work, env=env, timeout=900,
    )
    assert run.code == 0, run.text[-4000:]
    run_dir = next(p for p in (work / ".trnqwen" / "runs").iterdir() if (p / "run.json").is_file())
    return work, env, run, run_dir


def test_train_ends_with_the_before_after_line(lora_run):
    _, _, run, _ = lora_run
    line = next(ln for ln in run.err.splitlines() if ln.startswith("validation loss before"))
    before, after = (float(x) for x in line.split("before ")[1].split(" (")[0].split(" -> after "))
    assert after != before  # the adapter moved the held-out loss
    status = [ln for ln in run.err.splitlines() if ln.startswith("step ")]  # the last step says what comes next
    assert status[-1].endswith("]  exporting the LoRA adapter (PEFT) ...") and "s/step]" in status[-2], status
    assert any(ln.startswith("closing eval: ") for ln in run.err.splitlines()), run.err[-2000:]


def test_verify_ckpt_checks_the_adapter_against_its_base(lora_run):
    work, env, _, run_dir = lora_run
    res = run_subprocess("verify-ckpt", "--json", cwd=work, env=env, timeout=300)
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    export = json.loads((run_dir / "run.json").read_text())["extra"]["exported"]
    assert doc["kind"] == "adapter" and doc["ok"] and doc["checkpoint"] == export and doc["step"] == STEPS
    assert doc["base_source"] == "the run record's assets" and doc["base"].endswith("assets/hf/tiny-qwen3")
    assert doc["modules"] == 4 * 7 and doc["adapter_config"]["r"] == 8
    assert doc["untrained"] is False and doc["nonfinite"] == {}
    assert doc["round_trip"]["missing_adapter_keys"] == [] and doc["round_trip"]["unexpected_keys"] == []
    assert doc["round_trip"]["loaded"] == 2 * 4 * 7
    # the checkpoint folder's hf/ layout root resolves to the same adapter
    hf = run_subprocess("verify-ckpt", str(Path(export).parent), "--json", cwd=work, env=env, timeout=300)
    assert hf.code == 0 and json.loads(hf.out)["checkpoint"] == export, hf.text


def test_eval_compares_base_and_base_plus_adapter(lora_run):
    work, env, _, run_dir = lora_run
    res = run_subprocess("eval", "--json", "--generate", "1", "--max-new-tokens", "8", cwd=work, env=env, timeout=600)
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    base, tuned = doc["results"]
    assert base["checkpoint"] == "base" and tuned["checkpoint"] == f"{run_dir.name}/step-{STEPS} (LoRA adapter)"
    assert tuned["loss"] != base["loss"] and base["tokens"] == tuned["tokens"] > 0
    assert set(doc["generations"][0]["answers"]) == {"base", tuned["checkpoint"]}


def test_inspect_logs_reads_the_lora_line(lora_run):
    work, env, _, run_dir = lora_run
    res = run_subprocess("inspect-logs", str(run_dir), "--json", cwd=work, env=env, timeout=300)
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    lora = doc["lora"]
    assert lora["ranks"] == [0, 1]  # rank 1's line from its own torchrun log (train.log is rank 0's)
    assert lora["logged"] and lora["rank"] == 8 and lora["adapters"] == 4 * 7 == lora["initialised"]
    assert lora["trainable"] == lora["expected_trainable"] > 0 and lora["trainable"] < lora["total"]
    codes = {f["code"]: f["severity"] for f in doc["findings"]}
    assert codes.get("lora") == "info" and not any(c.startswith("lora-") for c in codes)
