"""``--seed``: one setting that reaches everything random in a run (issue 34 item 10).

docs/data.md names a ``--seed`` flag: it is RunConfig's ``seed`` field, and it must reach
torchtitan's ``config.debug.seed``, the token cache's dataloader (each epoch's order), LoRA's
adapter init, the hf-trainer spec's seed, the ``--val-split`` hold-out, the run record, and a
resumed run keeps the recorded one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import dry_plan
from trnqwen.config import RunConfig
from trnqwen.rundir import RunRecord, point_last

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--steps", "2", "--seq-len", "256"]
CHAT = str(Path(__file__).resolve().parents[1] / "trnqwen" / "data" / "tiny_chat" / "calculator.jsonl")


def test_seed_reaches_torchtitan_the_dataloader_lora_and_the_record(cli, in_tmp, tiny_assets):
    plan = dry_plan(cli, *TINY, "--assets", str(tiny_assets), "--backend", "native", "--finetune", "--lora",
                "--dataset", CHAT, "--val-split", "0.1", "--seed", "7")
    text = plan["config_module_text"]
    assert "config.debug.seed = 7" in text
    assert "TokenCacheDataLoader.Config(" in text and "seed=7" in text  # each epoch's row order
    assert '\\"seed\\": 7' in text or '"seed": 7' in text  # the LoRA spec: every A drawn from (seed, module)
    assert plan["config"]["seed"] == 7 and plan["sources"]["seed"] == "flag --seed"  # what run.json records


def test_seed_reaches_the_hf_trainer_spec(cli, in_tmp, tiny_assets):
    plan = dry_plan(cli, *TINY, "--assets", str(tiny_assets), "--backend", "hf-trainer", "--finetune", "--seed", "11")
    argv = plan["command"]
    assert argv[argv.index("--seed") + 1] == "11"


def _val_rows(cli, tiny_assets, seed: str) -> np.ndarray:
    r = cli("data", CHAT, "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--seq-len", "256",
            "--val-split", "0.2", "--seed", seed, "--json")
    assert r.code == 0, r.text
    return np.load(Path(json.loads(r.out)["cache_dir"]) / "val.input_ids.npy")


def test_seed_picks_the_validation_records(cli, in_tmp, tiny_assets):
    one, again, other = (_val_rows(cli, tiny_assets, s) for s in ("1", "1", "2"))
    assert np.array_equal(one, again)
    assert not np.array_equal(one, other)


@pytest.fixture
def recorded_seed(in_tmp, tiny_assets):
    """A preempted tiny native run recorded with seed 7."""
    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="native", device="cpu",
                    nproc_per_node=1, steps=8, seq_len=128, finetune=True, seed=7)
    root = in_tmp / cfg.resolved_checkpoint_dir
    runs = in_tmp / ".trnqwen" / "runs"
    (runs / "r1").mkdir(parents=True)
    RunRecord(run_id="r1", run_dir=str(runs / "r1"), status="interrupted", config=cfg.model_dump(mode="json"),
              checkpoint_dir=str(root), assets_dir=str(tiny_assets), backend="native", steps=8,
              extra={"cwd": str(in_tmp), "interrupted_at_step": 4}).save()
    point_last(runs, "r1")
    step = root / "resume" / "step-4"
    step.mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"x")
    (step / ".metadata").write_bytes(b"m")
    from trnqwen.contract import checkpoint_layout

    checkpoint_layout.write_owner(root, run_id="r1", model="builtin:tiny-qwen3", backend="native")
    return in_tmp


def test_a_resumed_run_keeps_its_seed_and_refuses_another(cli, recorded_seed):
    plan = dry_plan(cli, "--resume")
    assert plan["config"]["seed"] == 7 and "config.debug.seed = 7" in plan["config_module_text"]
    r = cli("train", "--resume", "--seed", "9", "--dry-run")
    assert r.code == 2 and "seed would change" in r.err, r.text
