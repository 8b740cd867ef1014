"""SLURM launcher: the sbatch script (units, `bash -n`), and a REAL job on a single-host SLURM
cluster started by the ``slurm_cluster`` fixture: it trains the tiny model on CPU and
``trnqwen inspect-logs`` / ``verify-ckpt`` read what it left."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import assert_verified_export, run_subprocess
from tests.slurm_cluster import TERMINAL_STATES, job_state, slurm_cluster, wait_for_job  # noqa: F401  (slurm_cluster: the session fixture)
from trnqwen.config import RunConfig
from trnqwen.errors import CheckFailed, UsageError
from trnqwen.contract.checkpoint_layout import export_dir
from trnqwen.train import slurm


def _job(tmp_path, **cfg_kwargs):
    cfg = RunConfig(**{"nnodes": 4, "partition": "trn2", "time_limit": "4:00:00", **cfg_kwargs})
    return slurm.job_from_config(
        cfg, run_id="r1", run_dir=tmp_path / "runs" / "r1", workdir=tmp_path, trnqwen=["/venv/bin/python", "-m", "trnqwen"], environ={}
    )


def test_script_has_the_sbatch_header_and_one_trnqwen_per_node(tmp_path):
    text = slurm.sbatch_script(_job(tmp_path))
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=4" in header and "#SBATCH --ntasks-per-node=1" in header
    assert "#SBATCH --exclusive" in header and "#SBATCH --partition=trn2" in header and "#SBATCH --time=4:00:00" in header
    assert f"#SBATCH --output={tmp_path}/runs/r1/slurm-%j.out" in header
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    assert 'export TRNQWEN_RDZV_ENDPOINT="${head_addr}:29400"' in text
    assert f"--output={tmp_path}/runs/r1/slurm-%j-node%n.out" in text
    assert "srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1" in text
    assert "  /venv/bin/python -m trnqwen train --resume auto || rc=$?" in text.splitlines()
    assert "#SBATCH --signal=USR1@120" in header and "#SBATCH --requeue" in header  # grace 90 s + 30 s to exit
    assert "export TRNQWEN_NNODES=4" in text and "export TRNQWEN_RDZV_ID=r1" in text
    assert f"export TRNQWEN_RUNS_DIR={tmp_path}/runs" in text
    # Trainium by default: the EFA variables Neuron's multi-node launchers export.
    assert "export FI_PROVIDER=efa" in text and "export FI_EFA_USE_DEVICE_RDMA=1" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_cpu_script_has_no_efa_and_the_endpoint_port_is_kept(tmp_path):
    job = _job(tmp_path, device="cpu", rdzv_endpoint="ignored-host:31234", partition=None, time_limit=None)
    text = slurm.sbatch_script(job)
    assert "FI_PROVIDER" not in text and "--partition" not in text and "--time" not in text
    assert '"${head_addr}:31234"' in text


def test_values_are_quoted_for_the_shell(tmp_path):
    job = _job(tmp_path, dataset="/data/my set;rm -rf ~/x.jsonl", device="cpu")
    text = slurm.sbatch_script(job)
    out = subprocess.run(["bash", "-c", "\n".join(l for l in text.splitlines() if l.startswith("export TRNQWEN_DATASET")) + '\nprintf %s "$TRNQWEN_DATASET"'],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == "/data/my set;rm -rf ~/x.jsonl"


@pytest.mark.parametrize("kwargs, words", [(dict(partition="a b"), "partition"), (dict(time_limit="4h"), "time limit")])
def test_bad_partition_or_time_is_a_usage_error(tmp_path, kwargs, words):
    with pytest.raises(UsageError) as exc:
        slurm.sbatch_script(_job(tmp_path, **kwargs))
    assert words in exc.value.message


@pytest.mark.parametrize(
    "stdout, job_id", [("1234\n", "1234"), ("77;cluster-a\n", "77"), ("Submitted batch job 991\n", "991"), ("12_3\n", "12")]
)
def test_parse_job_id(stdout, job_id):
    assert slurm.parse_job_id(stdout) == job_id


def test_parse_job_id_refuses_garbage():
    with pytest.raises(CheckFailed):
        slurm.parse_job_id("sbatch: error: Batch job submission failed")


def test_dry_run_prints_the_script_and_submits_nothing(cli, in_tmp):
    r = cli("train", "--launcher", "slurm", "--nodes", "2", "--partition", "trn2", "--time", "1:00:00", "--dry-run")
    assert r.code == 0, r.text
    assert "#SBATCH --nodes=2" in r.out and "srun --nodes=2" in r.out
    assert not (in_tmp / ".trnqwen").exists()
    r = cli("train", "--launcher", "slurm", "--nodes", "2", "--dry-run", "--json")
    info = json.loads(r.out)
    assert info["job_id"] is None and info["dry_run"] and "#SBATCH" in info["script_text"]


def test_no_sbatch_is_an_environment_error(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", str(in_tmp))  # no sbatch here
    r = cli("train", "--launcher", "slurm", "--nodes", "2")
    assert r.code == 3 and "sbatch is not on PATH" in r.err and "--dry-run" in r.err
    assert not (in_tmp / ".trnqwen").exists()


# --- the real cluster --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_slurm_job_trains_the_tiny_model(slurm_cluster, tmp_path, monkeypatch):  # noqa: F811
    from trnqwen.fetch.builtin import write_tiny_qwen3

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    work = tmp_path / "work"
    write_tiny_qwen3(work / "assets" / "hf" / "tiny-qwen3")
    nodes = len(slurm_cluster.nodes)
    started = time.monotonic()
    r = run_subprocess(
        "train", "--launcher", "slurm", "--nodes", str(nodes), "--partition", slurm_cluster.partition, "--time", "10",
        "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
        "--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1",
        "--steps", "2", "--seq-len", "128", "--finetune", "--json",
        cwd=work, timeout=60,
    )  # fmt: skip
    assert r.code == 0, r.text
    info = json.loads(r.out)
    job_id = info["job_id"]
    assert re.fullmatch(r"\d+", job_id)
    state = wait_for_job(job_id, timeout_s=420)
    run_dir = Path(info["run_dir"])
    node_logs = [Path(p) for p in info["node_logs"]]
    debug = "\n".join(
        f"==> {p} <==\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(run_dir.glob("slurm-*.out"))
    ) + "\n" + slurm_cluster.logs()
    if state is None:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=10)
    assert state == "COMPLETED", f"job {job_id} ended {state}\n{debug}"
    wall = time.monotonic() - started
    print(f"\nSLURM job {job_id}: {nodes} node(s), submit to COMPLETED {wall:.1f} s")
    assert all(p.is_file() for p in node_logs), debug
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["log_path"] == str(node_logs[0])
    assert json.loads((run_dir / "slurm.json").read_text())["job_id"] == job_id
    # Every node ran its own torchrun against the same rendezvous.
    for log in node_logs:
        text = log.read_text()
        assert "step:" in text, text[-2000:]
    # The job's logs through the normal commands: LAST points at the SLURM run.
    logs = run_subprocess("inspect-logs", "--json", cwd=work, timeout=120)
    assert logs.code == 0, logs.text
    report = json.loads(logs.out)
    assert report["source"] == str(node_logs[0])
    assert [s["step"] for s in report["steps"]] == [1, 2]
    ckpt = run_subprocess("verify-ckpt", "--json", cwd=work, timeout=300)
    assert ckpt.code == 0, ckpt.text
    export = export_dir(work / "checkpoint_tiny_qwen3_f7b2a8_ft", 2)  # hf/step-2 (its .sharded pieces beside it)
    assert_verified_export(json.loads(ckpt.out), export, step=2)


def _fake_slurm(bin_dir, srun_rc: int):
    """srun exiting like a preempted (138) or failed node; scontrol recording what it was asked."""
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/bash\necho \"srun $*\" >> {bin_dir}/calls\nexit {srun_rc}\n")
    (bin_dir / "scontrol").write_text(
        f"#!/bin/bash\necho \"scontrol $*\" >> {bin_dir}/calls\n"
        'if [ "$1 $2" = "show hostnames" ]; then echo node1; fi\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)


@pytest.mark.parametrize("srun_rc, expect_rc, requeued", [(138, 0, True), (140, 0, True), (143, 143, False), (1, 1, False), (0, 0, False)])
def test_a_preempted_job_requeues_itself(tmp_path, srun_rc, expect_rc, requeued):
    """Exit 138 (saved a checkpoint after SIGUSR1) or 140 (signalled before the first step: nothing
    trained) -> scontrol requeue; anything else is passed on."""
    text = slurm.sbatch_script(_job(tmp_path, device="cpu"))
    bin_dir = tmp_path / "bin"
    _fake_slurm(bin_dir, srun_rc)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "4"}
    proc = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True)
    calls = (bin_dir / "calls").read_text()
    assert proc.returncode == expect_rc, proc.stderr
    assert ("scontrol requeue 77" in calls) is requeued
    assert "train --resume auto" in calls  # the requeued job runs the same line and resumes by itself


def _losses(log: Path) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line

    text = log.read_text(errors="replace") if log.is_file() else ""
    return {m["step"]: m["loss"] for m in map(parse_step_line, text.splitlines()) if m}


def _job_fields(job_id: str) -> dict[str, str]:
    proc = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True, timeout=20)
    return dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok)


@pytest.mark.slow
def test_real_slurm_scancel_usr1_saves_exits_138_and_the_requeued_job_continues_exactly(slurm_cluster, tmp_path, monkeypatch):  # noqa: F811
    """`scancel --signal=USR1` delivers what the script's `#SBATCH --signal=USR1@N` delivers (to the
    job step's processes, not the batch shell): the ranks save at the step boundary, trnqwen exits
    138, the script requeues the job, and the requeued job (`--resume auto`) continues the run to
    the losses of an uninterrupted run."""
    from tests.helpers import REPO_ROOT
    from trnqwen.fetch.builtin import write_tiny_qwen3

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    work = tmp_path / "work"
    write_tiny_qwen3(work / "assets" / "hf" / "tiny-qwen3")
    flags = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "2", "--backend", "native",
             "--steps", "8", "--seq-len", "128", "--finetune"]
    base = run_subprocess("train", *flags, "--checkpoint-dir", "base", cwd=work, timeout=600)
    assert base.code == 0, base.text[-3000:]
    (base_dir,) = [p.parent for p in (work / ".trnqwen" / "runs").glob("*/run.json")]
    expected = _losses(base_dir / "train.log")
    # the job's ranks pace their steps (tests/doubles/slow_steps) so the signal lands mid-run
    slow = str(REPO_ROOT / "tests" / "doubles" / "slow_steps")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([slow, str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SLOW_STEPS_SLEEP_S", "0.6")
    r = run_subprocess(
        "train", "--launcher", "slurm", "--nodes", "1", "--partition", slurm_cluster.partition, "--time", "20",
        "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", *flags, "--grace-seconds", "60", "--json",
        cwd=work, timeout=60,
    )  # fmt: skip
    assert r.code == 0, r.text
    info = json.loads(r.out)
    job_id, run_dir = info["job_id"], Path(info["run_dir"])
    log = run_dir / "train.log"  # one node: the run's own log
    try:
        deadline = time.monotonic() + 400
        while 3 not in _losses(log) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 3 in _losses(log), slurm_cluster.logs()
        sent = slurm_cluster.run("scancel", "--signal=USR1", job_id)
        assert sent.returncode == 0, sent.stderr
        # the script's requeue: the job goes back to PENDING with one restart
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_job_fields(job_id).get("Restarts") == "1"
                                                   and _job_fields(job_id).get("JobState") == "PENDING"):
            time.sleep(0.3)
        fields = _job_fields(job_id)
        assert fields.get("Restarts") == "1", (fields, slurm_cluster.logs())
        # SLURM holds a requeued job for a while before it may start again; start it now, but not
        # within the second of the requeue: slurmctld kills a job started in the second its old
        # credential was revoked ("Killing non-startable batch JobId=N: Job credential revoked")
        time.sleep(2.5)
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        state = wait_for_job(job_id, timeout_s=420)
    finally:
        if job_state(job_id) not in (None, *TERMINAL_STATES):
            subprocess.run(["scancel", job_id], capture_output=True, timeout=10)
    debug = log.read_text(errors="replace")[-4000:] + "\n" + slurm_cluster.logs()
    assert state == "COMPLETED", f"job {job_id} ended {state}\n{debug}"
    text = log.read_text(errors="replace")
    record = json.loads((run_dir / "run.json").read_text())
    (resume,) = record["extra"]["resumes"]
    stopped = resume["from_step"]
    assert f"[trnqwen] preempted: SIGUSR1 at step {stopped}; saved a resumable checkpoint of step {stopped}" in text, debug
    assert resume["previous"]["exit_code"] == 138 and resume["previous"]["ended_by"] == "SIGUSR1"
    assert 3 <= stopped < 8 and resume["checkpoint"].endswith(f"resume/step-{stopped}")
    assert record["status"] == "succeeded"
    losses = _losses(log)
    assert sorted(losses) == list(range(1, 9))
    assert all(abs(losses[s] - expected[s]) <= 1e-5 for s in losses), (losses, expected)
