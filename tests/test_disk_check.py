"""Preflight compares the checkpoints' size with the free disk (issue 34 item 19).

A run on a disk too small for its checkpoints used to train until its first save and then fail.
Now the estimate (resume points x --keep-last, the export; trnqwen/train/disk.py) is checked
before any rank starts, on a real small tmpfs; ``--no-disk-check`` runs anyway, with a warning.
The slow test holds the estimate to what a real run writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error, mounted_tmpfs, run_subprocess

TINY = ["--model", "builtin:tiny-qwen3", "--backend", "native", "--device", "cpu", "--nproc-per-node", "1",
        "--seq-len", "128", "--finetune"]


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_training(cli, in_tmp, tiny_assets):
    # 10 steps saved every 2, all kept: 5 resume points of ~13 MiB + an 8 MiB export, on 56 MiB
    with mounted_tmpfs(in_tmp / "small", "size=56m") as disk:
        args = [*TINY, "--assets", str(tiny_assets), "--steps", "10", "--save-every", "2", "--keep-last", "0",
                "--checkpoint-dir", str(disk / "ck")]
        plan = json.loads(cli("train", *args, "--dry-run", "--json").out)
        found = [f for f in plan["preflight"]["findings"] if f["check"] == "disk"]
        assert [f["severity"] for f in found] == ["error"] and not plan["preflight"]["ok"]
        assert "5 resume point(s)" in found[0]["message"] and "56.0 MiB free" in found[0]["message"]
        assert "--no-disk-check" in found[0]["hint"]
        disk_doc = plan["preflight"]["disk"]
        assert disk_doc["resume_points"] == 5 and disk_doc["total"] > 56 * 2**20
        r = cli("train", *args)
        assert_clean_error(r, code=3, contains="the checkpoints need about")
        assert not (disk / "ck").exists() and not (in_tmp / ".trnqwen").exists()  # nothing started
        # fewer resume points fit: the same run keeping 2 (3 on disk while the newest is written)
        fits = json.loads(cli("train", *args[:-4], "--keep-last", "2", "--checkpoint-dir", str(disk / "ck"),
                              "--dry-run", "--json").out)
        assert fits["preflight"]["ok"] and fits["preflight"]["disk"]["resume_points"] == 3
        # the documented override: a warning, and the run may start
        forced = json.loads(cli("train", *args, "--no-disk-check", "--dry-run", "--json").out)
        assert forced["preflight"]["ok"]
        assert [f["severity"] for f in forced["preflight"]["findings"] if f["check"] == "disk"] == ["warning"]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_the_estimate_is_what_a_real_run_writes(tmp_path, tiny_assets):
    """A real run keeping every resume point: the estimate within 15% of the folder's bytes."""
    ck = tmp_path / "ck"
    args = [*TINY, "--assets", str(tiny_assets), "--steps", "2", "--save-every", "1", "--keep-last", "0",
            "--checkpoint-dir", str(ck)]
    plan = json.loads(run_subprocess("train", *args, "--dry-run", "--json", cwd=tmp_path).out)
    estimate = plan["preflight"]["disk"]
    r = run_subprocess("train", *args, "--json", cwd=tmp_path, timeout=600)
    assert r.code == 0, r.text
    points = sorted((ck / "resume").iterdir())
    assert len(points) == estimate["resume_points"] - 0 == 2
    actual = {"resume_point": _folder_bytes(points[-1]), "export": _folder_bytes(ck / "hf")}
    for key, value in actual.items():
        assert abs(estimate[key] - value) <= 0.15 * value, (key, estimate[key], value)


def test_a_resumed_runs_own_checkpoints_count_as_room(tmp_path):
    """Resume points already in the folder are among those kept (or deleted): a resume on a nearly
    full disk is not refused for the room its own checkpoints take."""
    from trnqwen.config import RunConfig
    from trnqwen.fetch.builtin import tiny_qwen3_config
    from trnqwen.train.job import TrainJob
    from trnqwen.train.memory import count_params
    from trnqwen.train.preflight import PreflightReport, check_disk
    from trnqwen.train.schedule import Schedule
    from trnqwen.titan_compat import dims_from_hf_config

    hf_config = tiny_qwen3_config()
    cfg = RunConfig(model="builtin:tiny-qwen3", backend="native", finetune=True, keep_last=2, steps=10)
    with mounted_tmpfs(tmp_path / "disk", "size=56m") as disk:
        job = TrainJob(backend="native", entry_module="x", checkpoint_dir=disk / "ck",
                       num_params=count_params(dims_from_hf_config(hf_config)),
                       schedule=Schedule(steps=10, explain="", lr=1e-5, lr_source="set", warmup_steps=2, lr_schedule="cosine",
                                         min_lr_ratio=0.0, weight_decay=0.1, max_grad_norm=1.0,
                                         activation_checkpointing=None, save_every=2))
        (disk / "ck" / "resume" / "step-4").mkdir(parents=True)
        (disk / "ck" / "resume" / "step-4" / "__0_0.distcp").write_bytes(b"\0" * (20 << 20))
        report = PreflightReport()
        check_disk(report, cfg, job, hf_config, disk)
        (finding,) = [f for f in report.findings if f.check == "disk"]
        assert finding.severity == "plan" and "20.0 MiB of this folder's own checkpoints" in finding.message
        (disk / "ck" / "resume" / "step-4" / "__0_0.distcp").rename(disk / "other")  # not the run's: no room
        report = PreflightReport()
        check_disk(report, cfg, job, hf_config, disk)
        assert [f.severity for f in report.findings if f.check == "disk"] == ["error"]
