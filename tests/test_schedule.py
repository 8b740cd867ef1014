"""Issue 23: epochs, LR schedule, optimizer settings and LR defaults, resolved once for every backend.

Fast tests: the config core (flags, env, trnqwen.toml, mutual exclusion), the shared LR formula
against torchtitan 0.3.0's own scheduler, the real ``train --dry-run --json`` plan on the bundled
chat set and the tiny model (steps from epochs, LR and its source, the schedule, the generated
torchtitan config and hf-trainer flags), preflight's guard rails, the LR column of step lines and
``--resume`` refusing a changed setting.  The per-step LR of real runs is in tests/test_chat_training.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import run_cli
from trnqwen.config import resolve_config
from trnqwen.errors import ConfigError
from trnqwen.contract.lr_schedule import lr_factor
from trnqwen.train.schedule import resolve_schedule


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("assets") / "tiny-qwen3")


@pytest.fixture(scope="module")
def chat_file() -> Path:
    from trnqwen.data import chat_recipe

    return chat_recipe.chat_path()


def _dry(tmp_path: Path, assets: Path, *args: str, expect: int = 0) -> dict:
    r = run_cli(
        "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--device", "cpu", "--seq-len", "256",
        "--dry-run", "--json", *args,
    )
    assert r.code == expect, r.text
    return json.loads(r.out)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("TRNQWEN_STEPS", "TRNQWEN_LR", "TRNQWEN_EPOCHS"):
        monkeypatch.delenv(name, raising=False)


# --- the config core ---------------------------------------------------------------------------


def test_new_settings_come_from_file_env_and_flags(tmp_path):
    (tmp_path / "trnqwen.toml").write_text(
        'lr_schedule = "linear"\nwarmup = 0.03\nmin_lr_ratio = 0.1\nweight_decay = 0.0\nepochs = 3\n'
    )
    env = {"TRNQWEN_MAX_GRAD_NORM": "0.5", "TRNQWEN_ACTIVATION_CHECKPOINTING": "full", "TRNQWEN_SAVE_EVERY": "epoch"}
    r = resolve_config({"val_every": "epoch", "warmup": 20.0}, environ=env, cwd=tmp_path)
    c = r.config
    assert (c.lr_schedule, c.min_lr_ratio, c.weight_decay, c.epochs) == ("linear", 0.1, 0.0, 3.0)
    assert (c.max_grad_norm, c.activation_checkpointing, c.save_every, c.val_every) == (0.5, "full", "epoch", "epoch")
    assert c.warmup == 20 and isinstance(c.warmup, int)  # the flag wins over the file's fraction
    assert r.sources["warmup"] == "flag --warmup" and r.sources["max_grad_norm"] == "env TRNQWEN_MAX_GRAD_NORM"
    assert r.sources["lr_schedule"].startswith("file ")


@pytest.mark.parametrize("values, needle", [
    ({"steps": 5, "epochs": 2}, "steps (flag --steps) and epochs (flag --epochs) are both set"),
    ({"lr_schedule": "exponential"}, "lr_schedule"),
    ({"warmup": 2.5}, "whole number of steps"),
    ({"activation_checkpointing": "some"}, "activation_checkpointing"),
    ({"val_every": "weekly"}, "val_every"),
    ({"epochs": 0}, "epochs"),
])
def test_bad_values_are_config_errors(tmp_path, values, needle):
    with pytest.raises(ConfigError) as info:
        resolve_config(values, environ={}, cwd=tmp_path)
    assert needle in str(info.value) + " ".join(info.value.problems if hasattr(info.value, "problems") else [])


# --- the LR formula: the one torchtitan 0.3.0 uses -----------------------------------------------


@pytest.mark.parametrize("warmup, total, decay_type, decay_ratio, min_lr", [
    (3, 12, "cosine", None, 0.1), (2, 10, "linear", None, 0.0), (0, 7, "cosine", None, 0.0),
    (4, 12, "linear", 0.0, 0.0), (20, 12, "cosine", None, 0.0), (1, 30, "linear", 0.8, 0.05),
])
def test_lr_factor_is_torchtitans(warmup, total, decay_type, decay_ratio, min_lr):
    import torch
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-3)
    cfg = LRSchedulersContainer.Config(warmup_steps=warmup, decay_type=decay_type, decay_ratio=decay_ratio, min_lr_factor=min_lr)
    titan = cfg.build(optimizers=[opt], training_steps=total)
    for step in range(total):
        ours = 1e-3 * lr_factor(step, warmup_steps=warmup, total_steps=total, decay_type=decay_type,
                                decay_ratio=decay_ratio, min_lr_factor=min_lr)
        assert math.isclose(ours, opt.param_groups[0]["lr"], rel_tol=1e-12, abs_tol=0), (step, ours)
        opt.step()
        titan.step()


def test_schedule_counts_steps_from_epochs(tmp_path):
    cfg = resolve_config({"epochs": 2, "dataset": "x.jsonl"}, environ={}, cwd=tmp_path).config
    s = resolve_schedule(cfg, sequences=6592, global_batch=32)
    assert s.steps == 412 and s.explain == "412 steps = 2 epochs of 6,592 sequences at global batch 32"
    half = resolve_schedule(cfg.model_copy(update={"epochs": 0.5}), sequences=6592, global_batch=32)
    assert half.steps == 103  # ceil(6592 / 32) = 206 steps an epoch
    assert resolve_schedule(cfg.model_copy(update={"epochs": 2.3}), sequences=100, global_batch=1).steps == 230
    frac = resolve_schedule(cfg.model_copy(update={"warmup": 0.03}), sequences=6592, global_batch=32)
    assert frac.warmup_steps == math.ceil(0.03 * 412)
    every = resolve_schedule(cfg.model_copy(update={"val_every": "epoch", "save_every": "epoch"}), sequences=6592, global_batch=32)
    assert (every.val_every, every.save_every) == (206, 206)


# --- the plan: train --finetune --dataset D --dry-run --json ---------------------------------------


def test_finetune_with_a_dataset_trains_one_epoch_at_the_fine_tune_rate(tmp_path, tiny_assets, chat_file):
    plan = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file))
    s = plan["schedule"]
    assert s["sequences"] > 1 and s["global_batch"] == 1 and s["steps"] == s["sequences"]  # one epoch
    assert s["explain"] == f"{s['steps']:,} steps = 1 epoch of {s['sequences']:,} sequences at global batch 1 (default: one epoch of --dataset)"
    assert (s["lr"], s["lr_source"]) == (1e-5, "default for a full fine-tune")
    assert (s["lr_schedule"], s["warmup_steps"], s["weight_decay"], s["max_grad_norm"]) == ("cosine", 2, 0.1, 1.0)
    assert plan["config"]["steps"] == s["steps"] and plan["config"]["lr"] == 1e-5  # what run.json records
    assert plan["sources"]["lr"] == "default for a full fine-tune" and plan["sources"]["steps"] == s["explain"]
    text = plan["config_module_text"]
    assert f"config.training.steps = {s['steps']}" in text
    assert "config.optimizer = default_adamw(lr=1e-05, weight_decay=0.1)" in text
    assert "config.lr_scheduler.decay_type = 'cosine'" in text and "config.lr_scheduler.decay_ratio = None" in text


ERASE_WARNING = "can erase what the model knew"  # preflight's warning on a high full fine-tune rate


def test_lora_defaults_to_its_own_rate_without_the_full_fine_tune_warning(tmp_path, published_assets, chat_file):
    plan = _dry(tmp_path, published_assets, "--finetune", "--lora", "--dataset", str(chat_file))
    s = plan["schedule"]
    assert (s["lr"], s["lr_source"]) == (1e-4, "default for LoRA")
    assert "config.optimizer = default_adamw(lr=0.0001, weight_decay=0.1)" in plan["config_module_text"]
    assert not any(ERASE_WARNING in w for w in _findings(plan, "warning"))  # 1e-4 is LoRA's usual rate
    # the same rate on a full fine-tune of the same weights is warned about: the check above can fail
    full = _dry(tmp_path, published_assets, "--finetune", "--lr", "1e-4", "--dataset", str(chat_file))
    assert any(ERASE_WARNING in w for w in _findings(full, "warning")), full["preflight"]


def test_epochs_count_the_steps_on_every_backend(tmp_path, tiny_assets, chat_file):
    native = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--epochs", "2",
                  "--backend", "native", "--nproc-per-node", "2")
    s = native["schedule"]
    assert s["global_batch"] == 2 and s["steps"] == 2 * math.ceil(s["sequences"] / 2)
    assert s["explain"].startswith(f"{s['steps']:,} steps = 2 epochs of {s['sequences']:,} sequences at global batch 2")
    hf = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--epochs", "2", "--backend", "hf-trainer",
              "--nproc-per-node", "2", "--lr-schedule", "linear", "--warmup", "3", "--min-lr-ratio", "0.1",
              "--weight-decay", "0.01", "--max-grad-norm", "0.5", "--activation-checkpointing", "full")
    cmd = hf["command"]

    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert flag("--steps") == str(s["steps"]) and flag("--lr") == "1e-05" and flag("--warmup-steps") == "3"
    assert (flag("--lr-schedule"), flag("--min-lr-ratio"), flag("--weight-decay"), flag("--max-grad-norm")) == (
        "linear", "0.1", "0.01", "0.5")
    assert "--gradient-checkpointing" in cmd


def test_pretraining_keeps_torchtitans_rate_and_ten_steps_without_a_dataset(tmp_path, tiny_assets):
    plan = _dry(tmp_path, tiny_assets)
    s = plan["schedule"]
    assert (s["steps"], s["explain"]) == (10, "10 steps (default without a dataset)")
    assert (s["lr"], s["lr_source"]) == (8e-4, "default for pre-training from random init (torchtitan's)")
    recipe = _dry(tmp_path, tiny_assets, "--finetune")  # the recipe reproduction: 10 steps, the fine-tune rate
    assert recipe["schedule"]["steps"] == 10 and recipe["schedule"]["lr"] == 1e-5


def test_set_values_win_and_are_named(tmp_path, tiny_assets, chat_file):
    plan = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--steps", "7", "--lr", "3e-5",
                "--activation-checkpointing", "none", "--lr-schedule", "constant")
    s = plan["schedule"]
    assert s["steps"] == 7 and s["explain"].startswith("7 steps (--steps); one epoch is")
    assert (s["lr"], s["lr_source"]) == (3e-5, "--lr")
    text = plan["config_module_text"]
    assert "config.activation_checkpoint = None" in text and "config.lr_scheduler.decay_ratio = 0.0" in text


# --- preflight guard rails ------------------------------------------------------------------------


def _findings(plan: dict, severity: str) -> list[str]:
    return [f["message"] for f in plan["preflight"]["findings"] if f["severity"] == severity and f["check"] == "schedule"]


@pytest.fixture(scope="module")
def published_assets(tiny_assets, tmp_path_factory) -> Path:
    """The tiny snapshot without its model card: weights that do not say they are random (as a
    published model's), so a high LR has something to erase."""
    import shutil

    folder = shutil.copytree(tiny_assets, tmp_path_factory.mktemp("published") / "tiny-qwen3")
    (folder / "README.md").unlink()
    return folder


def test_full_fine_tune_at_a_pre_training_rate_warns(tmp_path, published_assets, tiny_assets, chat_file):
    plan = _dry(tmp_path, published_assets, "--finetune", "--dataset", str(chat_file), "--steps", "4", "--lr", "2e-4")
    (warning,) = _findings(plan, "warning")
    assert "lr 0.0002" in warning and "this run's default is 1e-05 (default for a full fine-tune)" in warning
    assert not _findings(_dry(tmp_path, published_assets, "--finetune", "--steps", "4"), "warning")
    # the random-weight tiny model (its card says so) has nothing to erase: no warning
    assert not _findings(_dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--steps", "4",
                              "--lr", "2e-4"), "warning")


def test_a_preference_run_at_a_high_rate_is_told_its_own_methods_default(tmp_path, published_assets):
    plan = _dry(tmp_path, published_assets, "--finetune", "--method", "dpo", "--steps", "4", "--lr", "2e-4",
                "--backend", "native")
    (warning,) = _findings(plan, "warning")
    assert "this run's default is 1e-06 (default for DPO (TRL's))" in warning and "full fine-tune's" not in warning
    assert "1e-5" not in warning


def test_more_warmup_than_steps_is_an_error(tmp_path, tiny_assets):
    plan = _dry(tmp_path, tiny_assets, "--steps", "4", "--warmup", "5", expect=1)
    assert any("--warmup 5 is more warm-up steps than the run's 4" in m for m in _findings(plan, "error"))
    assert not _findings(_dry(tmp_path, tiny_assets, "--steps", "1"), "error")  # the default 2 follows the steps


def test_fewer_sequences_than_a_global_batch_is_an_error(tmp_path, tiny_assets, chat_file):
    plan = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--global-batch-size", "4096", expect=1)
    seqs = plan["schedule"]["sequences"]
    assert any(f"{seqs:,} training sequence(s), fewer than one global batch of 4096" in m for m in _findings(plan, "error"))


def test_epochs_giving_zero_steps_is_an_error(tmp_path, tiny_assets, chat_file):
    plan = _dry(tmp_path, tiny_assets, "--finetune", "--dataset", str(chat_file), "--epochs", "0.001", expect=1)
    assert any("--epochs 0.001 gives 0 steps" in m for m in _findings(plan, "error"))


def test_epoch_cadence_needs_a_dataset(tmp_path, tiny_assets):
    plan = _dry(tmp_path, tiny_assets, "--save-every", "epoch", expect=1)
    assert any("--save-every epoch needs a --dataset" in m for m in _findings(plan, "error"))


# --- the LR in step lines -------------------------------------------------------------------------


def test_lr_column_round_trips_through_the_parsers():
    from tests.test_inspect_logs import line, step_msg
    from trnqwen.contract.stepline import format_step_line, lr_text, parse_step_line
    from trnqwen.runtime.lr_log import _AppendLR
    import logging

    hf = format_step_line(3, 2.5, 0.5, 1.0, 10.0, 1000, 1.0, None, lr=6.666666666666667e-05)
    assert hf.endswith("mfu: N/A  lr: 6.666666667e-05")
    assert parse_step_line("[rank0]:" + hf)["lr"] == pytest.approx(6.666666667e-05, rel=1e-12)
    # torchtitan's coloured line, as the ranks' filter rewrites it
    record = logging.LogRecord("root", logging.INFO, __file__, 1, step_msg(3, 2.5), (), None)
    _AppendLR(lr_text(1e-5)).filter(record)
    parsed = parse_step_line(line(record.getMessage()))
    assert parsed["lr"] == 1e-5 and parsed["loss"] == 2.5 and parsed["mfu"] == 5.0
    assert parse_step_line(line(step_msg(3, 2.5)))["lr"] is None  # older logs: no column


def test_inspect_logs_json_and_plot_carry_the_lr(tmp_path):
    from tests.test_inspect_logs import line, step_msg
    from trnqwen.contract.stepline import lr_text

    lrs = [5e-06, 1e-05, 7.5e-06, 2.5e-06]
    log = tmp_path / "train.log"
    log.write_text("".join(line(step_msg(i, 3.0 - i / 10) + lr_text(lr)) for i, lr in enumerate(lrs, 1))
                   + line("Training completed"))
    r = run_cli("inspect-logs", str(log), "--json", "--plot", str(tmp_path / "p.png"))
    assert r.code in (0, 1), r.text
    doc = json.loads(r.out)
    assert [s["lr"] for s in doc["steps"]] == lrs
    assert doc["summary"]["peak_lr"] == 1e-5 and doc["summary"]["last_lr"] == lrs[-1]
    assert (tmp_path / "p.png").stat().st_size > 0


# --- resume ---------------------------------------------------------------------------------------


def test_resume_refuses_a_changed_schedule_setting(tmp_path):
    from trnqwen.rundir import RunRecord
    from trnqwen.train.resume import prepare

    runs = tmp_path / ".trnqwen" / "runs"
    recorded = resolve_config({"epochs": 2, "lr_schedule": "linear", "warmup": 0.03}, environ={}, cwd=tmp_path).config
    config = recorded.model_copy(update={"steps": 412, "lr": 8e-4}).model_dump(mode="json")  # as run.json holds it
    (runs / "r1").mkdir(parents=True)
    RunRecord(run_id="r1", run_dir=str(runs / "r1"), status="failed", config=config, steps=412).save()
    for flag, value in (("lr_schedule", "cosine"), ("warmup", 5), ("epochs", 3.0), ("weight_decay", 0.0),
                        ("max_grad_norm", 2.0), ("min_lr_ratio", 0.5), ("activation_checkpointing", "full"), ("lr", 1e-5)):
        new = resolve_config({flag: value}, environ={}, cwd=tmp_path)
        with pytest.raises(Exception) as info:
            prepare("r1", new)
        assert f"--resume: {flag} would change" in str(info.value), (flag, str(info.value))


def test_run_json_round_trips_every_new_setting_and_old_records_still_load(tmp_path):
    from trnqwen.config import RunConfig
    from trnqwen.train.resume import recorded_config

    given = {"epochs": 1.5, "lr_schedule": "constant", "warmup": 0.05, "min_lr_ratio": 0.2, "weight_decay": 0.01,
             "max_grad_norm": 0.3, "activation_checkpointing": "selective", "val_every": "epoch", "save_every": 7}
    cfg = resolve_config(given, environ={}, cwd=tmp_path).config.model_copy(update={"steps": 30, "lr": 1e-5})
    back = RunConfig(**recorded_config(json.loads(json.dumps(cfg.model_dump(mode="json")))))
    assert back == cfg and all(getattr(back, k) == v for k, v in given.items())
    old = {k: v for k, v in cfg.model_dump(mode="json").items() if k != "warmup"} | {"warmup_steps": 4}
    assert RunConfig(**recorded_config(old)).warmup == 4  # a run recorded before --warmup replaced warmup_steps
