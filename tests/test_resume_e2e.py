"""Resume for real: torchrun + torchtitan (or the Trainer) on CPU with the built-in tiny Qwen3.

An interrupted run, resumed, logs the same losses as the uninterrupted run (within 1e-5
absolute: the 5 printed decimals) because model, optimizer, LR schedule, data position and RNG
are in the checkpoint; with dropout on, the RNG state is what keeps it exact.
Cheap on purpose: seq-len 128, 8 steps (24 where a real signal must land mid-run), the smallest rank counts that show the point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.ckpt_fixtures import tree_hash
from tests.helpers import REPO_ROOT, TRNQWEN, run_subprocess

pytestmark = pytest.mark.slow

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--seq-len", "128", "--finetune"]
ENV = {"HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("resume")
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, env=ENV, timeout=300)
    assert fetched.code == 0, fetched.text
    return work


def _train(work: Path, *args: str, env: dict | None = None, timeout: float = 600):
    return run_subprocess("train", *args, cwd=work, env={**ENV, **(env or {})}, timeout=timeout)


def _runs(work: Path) -> Path:
    return work / ".trnqwen" / "runs"


def _last(work: Path) -> Path:
    return _runs(work) / (_runs(work) / "LAST").read_text().strip()


def _losses(run_dir: Path) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line

    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    steps = [m for m in map(parse_step_line, text.splitlines()) if m]
    return {m["step"]: m["loss"] for m in steps}


def _same(a: float, b: float) -> bool:
    """Equal to the 5th decimal (the step lines print 5): 1e-5 absolute, plus float noise."""
    return abs(a - b) <= 1e-5 + 1e-9


def _baseline(work: Path, backend: str, ranks: int, folder: str, steps: int = 8) -> dict[int, float]:
    r = _train(work, *TINY, "--backend", backend, "--nproc-per-node", str(ranks), "--steps", str(steps), "--checkpoint-dir", folder)
    assert r.code == 0, r.text[-3000:]
    return _losses(_last(work))


def test_native_sigterm_then_resume_is_exact_and_a_second_run_is_refused(work):
    """SIGTERM to the launcher -> ranks save at the next step boundary -> exit 138 -> --resume.
    24 steps: the signal is sent once step 4 is logged, and a CPU step now takes ~0.2 s, so 8 steps
    could all finish between the poll and the signal (the run then ended 0, not 138)."""
    steps = 24
    expected = _baseline(work, "native", 2, "native-base", steps=steps)
    baseline_run = _last(work).name
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **ENV)
    args = [*TINY, "--backend", "native", "--nproc-per-node", "2", "--steps", str(steps), "--checkpoint-dir", "native"]
    proc = subprocess.Popen([*TRNQWEN, "train", *args], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        run_dir = _last(work) if (_runs(work) / "LAST").is_file() else None
        if run_dir is not None and run_dir.name != baseline_run and 4 in _losses(run_dir):
            break
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 138, out[-3000:]
    assert "trnqwen train --resume" in out and "Traceback" not in out
    record = json.loads((run_dir / "run.json").read_text())
    stopped = record["extra"]["interrupted_at_step"]
    assert record["status"] == "interrupted" and record["ended_by"] == "SIGTERM" and 4 <= stopped < steps
    assert record["extra"]["resume_command"] == f"trnqwen train --resume {run_dir.name}"
    assert (work / "native" / "resume" / f"step-{stopped}" / ".metadata").is_file()
    assert not (work / "native" / "hf").exists()  # no export of an unfinished run

    # The same command again: refused with the three choices, nothing written.
    before = (tree_hash(work / "native"), sorted(p.name for p in _runs(work).iterdir()))
    again = _train(work, *args)
    assert again.code == 2 and "--resume" in again.text and "--overwrite" in again.text and "Traceback" not in again.text
    assert (tree_hash(work / "native"), sorted(p.name for p in _runs(work).iterdir())) == before

    resumed = _train(work, "--resume", run_dir.name)
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(run_dir)  # one log: steps continue, none repeated
    assert sorted(losses) == list(range(1, steps + 1))
    assert all(_same(losses[s], expected[s]) for s in range(1, steps + 1)), (losses, expected)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["extra"]["resumes"][0]["from_step"] == stopped
    assert Path(record["extra"]["exported"]) == work / "native" / "hf" / f"step-{steps}"
    finished = _train(work, "--resume", run_dir.name)
    assert finished.code == 2 and f"already completed all {steps} steps" in finished.text

    # inspect-logs reads it as one run, resumed from step N at the line run.json names.
    report = run_subprocess("inspect-logs", str(run_dir), "--json", cwd=work, env=ENV)
    assert report.code == 0, report.text[-3000:]
    doc = json.loads(report.out)
    assert doc["resumes"] == [{"from_step": stopped, "line": record["extra"]["resumes"][0]["line"]}]
    assert [s["step"] for s in doc["steps"]] == list(range(1, steps + 1))
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]


def test_hf_v5_two_ranks_preempted_after_step_4_resumes_exactly(work):
    expected = _baseline(work, "hf-v5", 2, "v5-base")
    args = [*TINY, "--backend", "hf-v5", "--nproc-per-node", "2", "--steps", "8", "--checkpoint-dir", "v5"]
    stopped = _train(work, *args, env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "4"})
    assert stopped.code == 138, stopped.text[-3000:]
    run_dir = _last(work)
    assert json.loads((run_dir / "run.json").read_text())["extra"]["interrupted_at_step"] == 4
    resumed = _train(work, "--resume")
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, 9))
    assert all(_same(losses[s], expected[s]) for s in range(5, 9)), (losses, expected)


def test_hf_trainer_resumes_through_the_trainers_own_checkpoint(work):
    expected = _baseline(work, "hf-trainer", 1, "hft-base")
    args = [*TINY, "--backend", "hf-trainer", "--nproc-per-node", "1", "--steps", "8", "--checkpoint-dir", "hft"]
    stopped = _train(work, *args, env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "4"})
    assert stopped.code == 138, stopped.text[-3000:]
    assert (work / "hft" / "resume" / "checkpoint-4" / "trainer_state.json").is_file()
    resumed = _train(work, "--resume")
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(_last(work))
    assert sorted(losses) == list(range(1, 9))
    assert all(_same(losses[s], expected[s]) for s in range(5, 9)), (losses, expected)


def test_hf_trainer_two_ranks_sharded_at_load_resume_exactly_then_continue_on_one_rank(work):
    """DistributedConfig shards the model at load, where transformers alone cannot checkpoint the
    optimizer: trnqwen's DCP checkpoint (runtime/hf_trainer_checkpoint.py) makes it resumable."""
    expected = _baseline(work, "hf-trainer", 2, "hft2-base")
    base_dir = _last(work)
    assert "strategy distributed-config" in (base_dir / "train.log").read_text(errors="replace")
    args = [*TINY, "--backend", "hf-trainer", "--nproc-per-node", "2", "--steps", "8", "--checkpoint-dir", "hft2"]
    stopped = _train(work, *args, env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "4"})
    assert stopped.code == 138, stopped.text[-3000:]
    point = work / "hft2" / "resume" / "checkpoint-4"
    assert (point / "trainer_state.json").is_file() and (point / "dcp" / ".metadata").is_file()
    assert sorted(p.name for p in point.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    resumed = _train(work, "--resume")
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(_last(work))
    assert sorted(losses) == list(range(1, 9))
    assert all(_same(losses[s], expected[s]) for s in range(5, 9)), (losses, expected)

    # The finished 2-rank baseline, extended by 2 steps on 1 rank: DCP reshards, one warning says so.
    extended = _train(work, "--resume", base_dir.name, "--steps", "10", "--nproc-per-node", "1")
    assert extended.code == 0, extended.text[-3000:]
    log = (base_dir / "train.log").read_text(errors="replace")
    assert log.count("[trnqwen] world size changed: checkpoint-8 was saved by 2 rank(s), resuming on 1") == 1
    assert sorted(_losses(base_dir)) == list(range(1, 11))
    assert (work / "hft2-base" / "hf" / "step-10" / "model.safetensors.index.json").is_file()


def test_a_two_rank_checkpoint_resumes_on_one_rank(work):
    """A node lost: model and optimizer reshard through DCP; the data position gets one warning."""
    args = [*TINY, "--backend", "native", "--nproc-per-node", "2", "--steps", "6", "--checkpoint-dir", "ws"]
    stopped = _train(work, *args, env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "3"})
    assert stopped.code == 138, stopped.text[-3000:]
    resumed = _train(work, "--resume", "--nproc-per-node", "1")
    assert resumed.code == 0, resumed.text[-3000:]
    run_dir = _last(work)
    log = (run_dir / "train.log").read_text(errors="replace")
    assert log.count("[trnqwen] world size changed: step 3 was saved by 2 rank(s), resuming on 1") == 1
    assert sorted(_losses(run_dir)) == [1, 2, 3, 4, 5, 6]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["extra"]["world_size"] == 1 and record["extra"]["resumes"][0]["changes"] == {"nproc_per_node": 1}
    assert (work / "ws" / "hf" / "step-6" / "model.safetensors.index.json").is_file()


def test_native_lora_with_dropout_resumes_exactly(work):
    """Dropout draws from each rank's RNG on every step: only a checkpoint that restores the RNG
    (trnqwen_rng.rank_<r>) gives the uninterrupted run's losses after the resume."""
    lora = ["--lora", "--lora-dropout", "0.1", "--lr", "1e-2"]
    base = _train(work, *TINY, *lora, "--backend", "native", "--nproc-per-node", "2", "--steps", "8",
                  "--checkpoint-dir", "drop-base")
    assert base.code == 0, base.text[-3000:]
    expected = _losses(_last(work))
    args = [*TINY, *lora, "--backend", "native", "--nproc-per-node", "2", "--steps", "8", "--checkpoint-dir", "drop"]
    stopped = _train(work, *args, env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "4"})
    assert stopped.code == 138, stopped.text[-3000:]
    run_dir = _last(work)
    assert ", dropout 0.1," in (run_dir / "train.log").read_text(errors="replace")  # the ranks' [LoRA] line
    resumed = _train(work, "--resume")
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, 9))
    assert all(_same(losses[s], expected[s]) for s in range(1, 9)), (losses, expected)
