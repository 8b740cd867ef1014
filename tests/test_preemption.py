"""Preemption signals and folder ownership with real processes (issue 24).

Real `trnqwen train` (real torchrun, 2 CPU ranks, the tiny Qwen3, seq 128) and real signals:
SIGUSR1 to trnqwen, to torchrun's process group, before the first step; two runs on one
checkpoint folder; two `--resume` of one run at once; a resume whose checkpoints are gone.
(The SLURM path, `scancel --signal=USR1` with a real requeue, is in tests/test_slurm.py.)

The tiny model trains a step in ~0.1 s, so the runs that are signalled "after step 3" take
tests/doubles/slow_steps on their PYTHONPATH: each rank sleeps before torchtitan's per-step save
call; trnqwen's signal handling is production code.  Losses are compared with an uninterrupted
run of the same settings to 1e-5 (they are printed to 5 decimals: equal prints).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, TRNQWEN, run_subprocess

pytestmark = pytest.mark.slow

STEPS = 10
TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--seq-len", "128", "--finetune",
        "--backend", "native", "--nproc-per-node", "2", "--steps", str(STEPS)]
ENV = {"HF_HUB_OFFLINE": "1"}
SLOW_STEPS = {"SLOW_STEPS_SLEEP_S": "0.6"}


def _env(extra: dict | None = None, *, slow: bool = False) -> dict:
    env = dict(os.environ, **ENV)
    path = [str(REPO_ROOT), env.get("PYTHONPATH", "")]
    if slow:
        path.insert(0, str(REPO_ROOT / "tests" / "doubles" / "slow_steps"))
        env.update(SLOW_STEPS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("preempt")
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, env=ENV, timeout=300)
    assert fetched.code == 0, fetched.text
    return work


def _runs(work: Path) -> Path:
    return work / ".trnqwen" / "runs"


def _last(work: Path) -> Path:
    return _runs(work) / (_runs(work) / "LAST").read_text().strip()


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _losses(run_dir: Path) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line

    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    steps = [m for m in map(parse_step_line, text.splitlines()) if m]
    seen: dict[int, float] = {}
    for m in steps:
        assert m["step"] not in seen, f"step {m['step']} logged twice in {log}"
        seen[m["step"]] = m["loss"]
    return seen


@pytest.fixture(scope="module")
def baseline(work) -> dict[int, float]:
    """The uninterrupted run every resumed run must equal."""
    r = run_subprocess("train", *TINY, "--checkpoint-dir", "base", cwd=work, env=ENV, timeout=600)
    assert r.code == 0, r.text[-3000:]
    losses = _losses(_last(work))
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def _start(work: Path, *args: str, env: dict | None = None, slow: bool = True) -> subprocess.Popen:
    return subprocess.Popen([*TRNQWEN, "train", *args], cwd=work, env=_env(env, slow=slow),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _new_run_dir(work: Path, before: set[str], proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [p for p in _runs(work).glob("*/run.json") if p.parent.name not in before] if _runs(work).is_dir() else []
        if new:
            return new[0].parent
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    raise AssertionError("no run dir appeared")


def _wait(proc: subprocess.Popen, predicate, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("condition not reached in time")


def _existing(work: Path) -> set[str]:
    return {p.name for p in _runs(work).iterdir()} if _runs(work).is_dir() else set()


def _assert_preempted_then_resumes_exactly(work: Path, run_dir: Path, folder: str, code: int, out: str,
                                           baseline: dict[int, float], signal_name: str = "SIGUSR1") -> None:
    assert code == 138, out[-3000:]
    assert "Traceback" not in out and f"trnqwen train --resume {run_dir.name}" in out
    record = _record(run_dir)
    stopped = record["extra"]["interrupted_at_step"]
    assert (record["status"], record["ended_by"], record["exit_code"]) == ("interrupted", signal_name, 138)
    assert 3 <= stopped < STEPS
    # the step boundary: the last step logged is the step saved, complete (DCP metadata written last)
    assert max(_losses(run_dir)) == stopped
    assert (work / folder / "resume" / f"step-{stopped}" / ".metadata").is_file()
    assert not (work / folder / "hf").exists()
    resumed = run_subprocess("train", "--resume", run_dir.name, cwd=work, env=ENV, timeout=600)
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(abs(losses[s] - baseline[s]) <= 1e-5 for s in losses), (losses, baseline)
    record = _record(run_dir)
    assert record["status"] == "succeeded" and record["extra"]["resumes"][-1]["from_step"] == stopped


def test_sigusr1_to_trnqwen_saves_at_the_step_boundary_exits_138_and_resumes_exactly(work, baseline):
    before = _existing(work)
    proc = _start(work, *TINY, "--checkpoint-dir", "usr1")
    run_dir = _new_run_dir(work, before, proc)
    _wait(proc, lambda: 3 in _losses(run_dir))
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=300)[0]
    _assert_preempted_then_resumes_exactly(work, run_dir, "usr1", proc.returncode, out, baseline)


def test_sigusr1_to_torchruns_process_group_saves_and_exits_138(work, baseline):
    """The launcher never sees the signal: torchrun forwards it (its --signals-to-handle)."""
    before = _existing(work)
    proc = _start(work, *TINY, "--checkpoint-dir", "group")
    run_dir = _new_run_dir(work, before, proc)
    _wait(proc, lambda: 3 in _losses(run_dir))
    torchrun = _record(run_dir)["extra"]["torchrun_pid"]
    assert os.getpgid(torchrun) == torchrun != os.getpgid(proc.pid)  # its own process group
    os.killpg(torchrun, signal.SIGUSR1)
    out = proc.communicate(timeout=300)[0]
    _assert_preempted_then_resumes_exactly(work, run_dir, "group", proc.returncode, out, baseline)


def test_sigusr1_with_show_log_reads_as_a_preemption_not_a_crash(work):
    """--show-log streams rank 0's log; torchrun relays the signal by raising SignalException out of
    its main, a traceback that showed under a correct save and exit 138 (issue 34 item 4). The
    console leaves it out; train.log keeps it."""
    before = _existing(work)
    proc = _start(work, *TINY, "--checkpoint-dir", "shown", "--show-log")
    run_dir = _new_run_dir(work, before, proc)
    _wait(proc, lambda: 3 in _losses(run_dir))
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 138, out[-3000:]
    assert "[trnqwen] preempted: SIGUSR1 at step" in out  # the log was shown
    assert "SignalException" in (run_dir / "train.log").read_text()  # torchrun did raise it
    assert "SignalException" not in out and "Traceback" not in out, out[-3000:]
    assert f"trnqwen train --resume {run_dir.name}" in out


NO_FLOCK = textwrap.dedent(
    """
    # A filesystem without flock (a Lustre mount without -o flock) under $NO_FLOCK_UNDER: the OS
    # call fails there with ENOLCK, as on such a mount, and works everywhere else.
    import errno, fcntl, os

    _real = fcntl.flock

    def _flock(fd, op):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(os.environ["NO_FLOCK_UNDER"]):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return _real(fd, op)

    fcntl.flock = _flock
    """
)


def test_a_checkpoint_folder_without_flock_is_one_line_and_trnqwen_lock_dir_trains_there(work, tmp_path):
    """issue 34 item 5: a raw OSError (exit 70) before; now exit 2 naming TRNQWEN_LOCK_DIR, which runs it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_FLOCK)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)]), "NO_FLOCK_UNDER": str(work / "lustre")}
    args = [*TINY[:-2], "--steps", "2", "--checkpoint-dir", "lustre/ckpt"]
    refused = run_subprocess("train", *args, cwd=work, env=env, timeout=300)
    assert refused.code == 2 and "Traceback" not in refused.text, refused.text[-3000:]
    assert f"Error: checkpoint folder {work / 'lustre' / 'ckpt'} is on a filesystem without file locks" in refused.err
    assert "TRNQWEN_LOCK_DIR" in refused.err
    locks = tmp_path / "locks"
    ran = run_subprocess("train", *args, cwd=work, env={**env, "TRNQWEN_LOCK_DIR": str(locks)}, timeout=600)
    assert ran.code == 0, ran.text[-3000:]
    assert "TRNQWEN_LOCK_DIR" not in ran.err  # a known variable: no "not a config field" warning
    assert (work / "lustre" / "ckpt" / "hf" / "step-2" / "config.json").is_file()
    assert locks.is_dir() and list(locks.iterdir()) == []  # taken there, removed at the clean end
    assert not (work / "lustre" / "ckpt" / ".trnqwen-lock").exists()


def test_sigusr1_before_the_first_step_exits_140(work):
    """Start-up (or a Neuron compilation) interrupted: nothing trained, nothing lost, a distinct code."""
    before = _existing(work)
    proc = _start(work, *TINY, "--checkpoint-dir", "early", slow=False)
    run_dir = _new_run_dir(work, before, proc)
    _wait(proc, lambda: _record(run_dir)["extra"].get("torchrun_pid") is not None)
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 140, out[-3000:]
    assert "before its first step" in out and "Traceback" not in out
    record = _record(run_dir)
    assert (record["status"], record["ended_by"], record["exit_code"]) == ("interrupted", "SIGUSR1", 140)
    assert not _losses(run_dir)
    assert not list((work / "early").glob("*/step-*"))


def test_two_runs_on_one_checkpoint_folder_the_second_is_refused(work):
    before = _existing(work)
    first = _start(work, *TINY, "--checkpoint-dir", "shared")
    first_dir = _new_run_dir(work, before, first)
    _wait(first, lambda: _record(first_dir)["status"] == "running")
    second = run_subprocess("train", *TINY, "--checkpoint-dir", "shared", cwd=work, env=ENV, timeout=120)
    assert second.code == 2, second.text[-3000:]
    errors = [line for line in second.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "is in use by run " + first_dir.name in errors[0], second.err
    assert f"pid {first.pid}" in errors[0]
    assert _existing(work) == before | {first_dir.name}  # the second wrote no run dir
    out = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out[-3000:]
    assert _record(first_dir)["extra"]["exported"] == str(work / "shared" / "hf" / f"step-{STEPS}")
    assert not (work / "shared" / ".trnqwen-lock").exists()  # released at the end


def test_two_resumes_of_one_run_at_once_only_one_runs(work, baseline):
    stopped = run_subprocess("train", *TINY, "--checkpoint-dir", "twice", cwd=work, timeout=600,
                             env={**ENV, "TRNQWEN_FAULT_PREEMPT_AT_STEP": "4"})
    assert stopped.code == 138, stopped.text[-3000:]
    run_dir = _last(work)
    a = _start(work, "--resume", run_dir.name, slow=False)
    b = _start(work, "--resume", run_dir.name, slow=False)
    outs = {p: p.communicate(timeout=600)[0] for p in (a, b)}
    codes = sorted(p.returncode for p in (a, b))
    assert codes == [0, 2], {p.returncode: out[-2000:] for p, out in outs.items()}
    loser = a if a.returncode == 2 else b
    winner = b if loser is a else a
    refusal = [line for line in outs[loser].splitlines() if line.startswith("Error:")]
    assert len(refusal) == 1 and "Traceback" not in outs[loser], outs[loser]
    assert any(words in refusal[0] for words in (  # the lock, or the record the winner already wrote
        f"is in use by run {run_dir.name} (pid {winner.pid}", f"is still running (launcher pid {winner.pid})",
        "was resumed by another trnqwen")), refusal
    losses = _losses(run_dir)  # steps 5.. once each (_losses asserts no step twice)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(abs(losses[s] - baseline[s]) <= 1e-5 for s in losses), (losses, baseline)
    record = _record(run_dir)
    assert record["status"] == "succeeded" and [r["from_step"] for r in record["extra"]["resumes"]] == [4]


def test_resume_refuses_when_the_saved_checkpoints_are_gone(work):
    stopped = run_subprocess("train", *TINY, "--checkpoint-dir", "moved", "--save-every", "2", cwd=work, timeout=600,
                             env={**ENV, "TRNQWEN_FAULT_PREEMPT_AT_STEP": "5"})
    assert stopped.code == 138, stopped.text[-3000:]
    run_dir = _last(work)
    assert sorted(p.name for p in (work / "moved" / "resume").iterdir()) == ["step-2", "step-4", "step-5"]
    shutil.move(work / "moved", work / "moved-elsewhere")
    log_before = (run_dir / "train.log").read_bytes()
    again = run_subprocess("train", "--resume", run_dir.name, cwd=work, env=ENV, timeout=120)
    assert again.code == 2, again.text[-3000:]
    errors = [line for line in again.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(work / "moved" / "resume") in errors[0] and "step 5 is gone" in errors[0], again.err
    assert (run_dir / "train.log").read_bytes() == log_before and _record(run_dir)["status"] == "interrupted"
    assert not (work / "moved").exists()
