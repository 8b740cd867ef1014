"""Real torchtitan training on CPU: torchrun, 2 ranks (FSDP over gloo), the tiny Qwen3.

Three torchrun runs, shared by every test here (session scope):
  pretrain    native, random init, a short run at a high learning rate, exported as HF safetensors
  native_ft   native, fine-tune from the pre-trained export
  hf_ft       hf-v5, fine-tune from the same export
The recipe's sanity check in small: step-1 loss from trained weights is well below the random-init
step-1 loss of the same model; the exports load into AutoModelForCausalLM with only the tied
lm_head.weight missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from trnqwen.config import RunConfig
from trnqwen.env.device import DeviceInfo
from trnqwen.contract.checkpoint_layout import export_dir
from trnqwen.train.recipes import build_job

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
CPU = DeviceInfo(type="cpu", count=1)
NPROC = 2
PRETRAIN_STEPS = 10  # at lr 5e-3 the tiny model goes from ~7.6 to ~5.5 in 10 steps
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.naif]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Run:
    name: str
    rc: int
    log: str
    wall_s: float
    losses: dict[int, float]
    checkpoint_dir: Path
    steps: int


def torchrun(job, run_dir: Path, *, timeout: float = 480) -> tuple[int, str, float]:
    """The recipe's torchrun command for a TrainJob, run for real (the launcher's job, in small)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{job.config_module}.py").write_text(job.config_module_text)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
        "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
        "-m", job.entry_module, *job.entry_args,
    ]
    env = dict(os.environ)
    env.update(job.env)
    env["PYTHONPATH"] = os.pathsep.join([str(run_dir), str(REPO_ROOT), env.get("PYTHONPATH", "")])
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    log = proc.stdout + proc.stderr
    (run_dir / "train.log").write_text(log)
    return proc.returncode, log, wall


def step_losses(log: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in _STEP.finditer(_ANSI.sub("", log))}


def _run(name: str, cfg: RunConfig, root: Path) -> Run:
    run_dir = root / f"run_{name}"
    job = build_job(cfg, CPU, run_dir)
    rc, log, wall = torchrun(job, run_dir)
    print(f"[torchrun] {name}: rc={rc} wall={wall:.1f}s losses={step_losses(log)}")
    return Run(name, rc, log, wall, step_losses(log), job.checkpoint_dir, cfg.steps)


def _trained_assets(tiny: Path, export: Path, dest: Path) -> Path:
    """The tiny snapshot (config, tokenizer) with the pre-trained export as its weights."""
    shutil.copytree(tiny, dest, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    for f in export.iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)
    return dest


@pytest.fixture(scope="session")
def cpu_runs(tmp_path_factory) -> dict[str, Run]:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    root = tmp_path_factory.mktemp("cpu_runs")
    tiny = write_tiny_qwen3(root / "assets" / "tiny-qwen3")
    common = dict(model="builtin:tiny-qwen3", device="cpu", nproc_per_node=NPROC, seq_len=128, local_batch_size=2)
    runs: dict[str, Run] = {}
    runs["pretrain"] = _run(
        "pretrain",
        RunConfig(**common, assets_dir=tiny, backend="native", steps=PRETRAIN_STEPS, lr=5e-3, warmup=2,
                  export_hf=True, checkpoint_dir=root / "ck_pretrain"),
        root,
    )
    assert runs["pretrain"].rc == 0, runs["pretrain"].log[-4000:]
    trained = _trained_assets(tiny, export_dir(root / "ck_pretrain", PRETRAIN_STEPS), root / "assets" / "trained")
    for name, backend in (("native_ft", "native"), ("hf_ft", "hf-v5")):
        runs[name] = _run(
            name,
            RunConfig(**common, assets_dir=trained, backend=backend, steps=3, lr=1e-4, finetune=True,
                      checkpoint_dir=root / f"ck_{name}"),
            root,
        )
    return runs


@pytest.mark.parametrize("name", ["pretrain", "native_ft", "hf_ft"])
def test_runs_train_and_log_finite_losses(cpu_runs, name):
    import math

    run = cpu_runs[name]
    assert run.rc == 0, run.log[-4000:]
    assert sorted(run.losses) == list(range(1, run.steps + 1)), run.log[-4000:]
    assert all(math.isfinite(v) and v > 0 for v in run.losses.values())


def test_pretraining_lowers_the_loss(cpu_runs):
    losses = cpu_runs["pretrain"].losses
    assert losses[max(losses)] < losses[1] - 1.0


@pytest.mark.parametrize("name", ["native_ft", "hf_ft"])
def test_finetune_starts_from_the_trained_weights(cpu_runs, name):
    """The recipe's 6.54 (published weights) vs 12.43 (random init) check, in small."""
    random_init_step1 = cpu_runs["pretrain"].losses[1]
    ft = cpu_runs[name]
    assert "Loading from HF safetensors" in ft.log or "initial_load_path" in ft.log
    assert ft.losses[1] < random_init_step1 - 1.0, (ft.losses, random_init_step1)


@pytest.mark.parametrize("name", ["pretrain", "native_ft", "hf_ft"])
def test_hf_checkpoint_round_trips_into_transformers(cpu_runs, name, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    run = cpu_runs[name]
    step_dir = export_dir(run.checkpoint_dir, run.steps)  # <checkpoint_dir>/hf/step-N
    files = sorted(step_dir.glob("*.safetensors"))
    assert files and (step_dir / "model.safetensors.index.json").is_file(), list(step_dir.iterdir())
    state = {}
    for f in files:
        state.update(load_file(f))
    assert all(torch.isfinite(t.float()).all() for t in state.values())
    config = AutoConfig.from_pretrained(run.checkpoint_dir.parent / "assets" / "tiny-qwen3")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    assert result.missing_keys == ["lm_head.weight"]  # tied to the token embeddings
    assert result.unexpected_keys == []


def test_cpu_attention_override_is_applied_through_torchtitans_registry(cpu_runs):
    log = _ANSI.sub("", cpu_runs["native_ft"].log)
    lines = [l for l in log.splitlines() if "[Override] trnqwen.runtime.cpu_attention.cpu_dense_attention" in l]
    assert len(lines) == 4  # one per layer of the tiny model
    assert "Applied 4 override(s)" in log


def test_every_trnqwen_override_reports_that_it_ran(cpu_runs):
    """[Override] lines (or an installed patch) do not prove a replacement ran; the
    [OverrideCalls] line each of trnqwen's own overrides logs after step 1 does."""
    from trnqwen.contract.override_calls import parse_calls_line

    def calls(run):
        recs = [parse_calls_line(_ANSI.sub("", line)) for line in run.log.splitlines()]
        return {r["name"]: r for r in recs if r}

    native = calls(cpu_runs["native_ft"])["trnqwen.runtime.cpu_attention.cpu_dense_attention"]
    assert native["calls"] > 0 and native["fallbacks"] == 0 and native["modules"] == 4, native
    hf = calls(cpu_runs["hf_ft"])
    attention = hf["trnqwen.runtime.cpu.sdpa_flex_attention_forward"]
    assert attention["calls"] > 0 and attention["fallbacks"] == 0 and attention["modules"] == 4, attention
    rope_fix = hf["trnqwen.runtime.hf_rope"]
    assert rope_fix["calls"] >= 1 and rope_fix["fallbacks"] == 0 and rope_fix["modules"] == 1, rope_fix
