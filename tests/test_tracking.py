"""--tensorboard / --wandb: the trainers' own writers switched on, no tracking dependency required."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error


def test_titan_lines_and_trainer_report_to():
    from types import SimpleNamespace

    from trnqwen.train import tracking

    both = SimpleNamespace(tensorboard=True, wandb=True)
    assert tracking.titan_lines(both) == [
        "config.metrics.enable_tensorboard = True", "config.metrics.save_tb_folder = 'tb'", "config.metrics.enable_wandb = True",
    ]
    assert tracking.report_to(both) == ["tensorboard", "wandb"]
    assert tracking.titan_lines(SimpleNamespace()) == [] and tracking.report_to(SimpleNamespace()) == []
    env = tracking.rank_env(both, Path("/runs/r1"))
    assert env["TENSORBOARD_LOGGING_DIR"] == "/runs/r1/tb" and env["WANDB_RUN_NAME"] == "r1"


def test_hf_trainer_spec_carries_report_to_through_its_argv():
    from trnqwen.contract.hf_trainer_spec import HFTrainerSpec, spec_from_argv, spec_to_argv

    spec = HFTrainerSpec(assets_dir="/a", report_to="tensorboard,wandb")
    assert spec_from_argv(spec_to_argv(spec)).report_to == "tensorboard,wandb"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed (the dev extra has it: pip install -e '.[dev]')")
def test_wandb_problem_reads_login_state_not_the_key(monkeypatch, tmp_path):
    from trnqwen.train.tracking import wandb_problem

    monkeypatch.setenv("HOME", str(tmp_path))
    assert "not logged in" in wandb_problem({})
    assert wandb_problem({"WANDB_MODE": "offline"}) is None
    assert wandb_problem({"WANDB_API_KEY": "x" * 40}) is None
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_problem({}) is None


def test_train_wandb_without_login_stops_before_anything_starts(cli, in_tmp, monkeypatch):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    if importlib.util.find_spec("wandb") is not None:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        monkeypatch.delenv("WANDB_MODE", raising=False)
    write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    res = cli("train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--steps", "1", "--seq-len", "64", "--wandb")
    assert_clean_error(res, code=3, contains="--wandb")
    assert not (in_tmp / ".trnqwen").exists()


def test_generated_config_module_turns_tensorboard_on(in_tmp, cli):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    out = in_tmp / "cfg_tb.py"
    res = cli("train", "--model", "builtin:tiny-qwen3", "--backend", "native", "--device", "cpu", "--seq-len", "64",
              "--tensorboard", "--export-config", str(out))
    assert res.code == 0, res.text
    assert "config.metrics.enable_tensorboard = True" in out.read_text()
