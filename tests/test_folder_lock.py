"""One owner per checkpoint folder (trnqwen.train.folder_lock) with real processes: a live holder
refuses everyone else by name, a SIGKILLed holder's lock is taken over with a note, a clean end
leaves nothing; and the small pure pieces of the preemption path (torchrun's signal list, the
signal torchrun logs, the exit codes the sbatch script requeues on)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trnqwen.errors import UsageError
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.train import folder_lock, launcher, stops

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trnqwen.train import folder_lock

    lock = folder_lock.acquire(Path(sys.argv[1]), run_id=sys.argv[2])
    print("HELD", flush=True)
    time.sleep(600)
    """
)


def _holder(folder: Path, run_id: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), run_id], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def test_a_live_holder_refuses_a_second_owner_naming_its_run_and_pid(tmp_path):
    folder = tmp_path / "ckpt"
    proc = _holder(folder, "run-one")
    try:
        assert folder_lock.holder_of(folder)["pid"] == proc.pid
        with pytest.raises(UsageError) as exc:
            folder_lock.acquire(folder, run_id="run-two")
        msg = exc.value.message
        assert msg == f"checkpoint folder {folder} is in use by run run-one (pid {proc.pid} on {socket.gethostname()})"
        assert "--resume run-one" in exc.value.hint and exc.value.exit_code == 2
        # the lock file is trnqwen's own: a new run's check does not call it foreign
        assert checkpoints.scan(folder).foreign == []
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holders_lock_is_taken_over_with_a_note(tmp_path):
    folder = tmp_path / "ckpt"
    proc = _holder(folder, "run-killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert folder_lock.holder_of(folder) is None  # the kernel released it with the process
    with folder_lock.acquire(folder, run_id="run-next") as lock:
        assert lock.took_over["run_id"] == "run-killed" and lock.took_over["pid"] == proc.pid
        note = lock.takeover_note()
        assert f"run run-killed (pid {proc.pid}" in note and "no longer running" in note
        assert folder_lock.holder_of(folder)["run_id"] == "run-next"
    assert not (folder / checkpoints.LOCK_NAME).exists()  # a clean end leaves nothing
    with folder_lock.acquire(folder, run_id="run-after") as lock:
        assert lock.took_over is None


def test_only_one_of_many_simultaneous_claims_wins(tmp_path):
    folder = tmp_path / "ckpt"
    code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from trnqwen.errors import UsageError
        from trnqwen.train import folder_lock

        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
        try:
            lock = folder_lock.acquire(Path(sys.argv[1]), run_id="r")
        except UsageError:
            print("REFUSED", flush=True)
            sys.exit(2)
        print("WON", flush=True)
        time.sleep(2)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    at = str(time.time() + 1.5)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(folder), at], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["REFUSED", "REFUSED", "REFUSED", "WON"], outs


def test_torchrun_is_told_to_forward_sigusr1():
    assert launcher.torchrun_signals() == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert launcher.torchrun_signals("SIGHUP") == "SIGHUP,SIGTERM,SIGINT,SIGUSR1"  # the user's list, plus ours


def test_the_signal_torchrun_logs_is_read_by_name_or_number(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("x\nW1201 api.py:753] Received 10 death signal, shutting down workers\n")
    assert stops.torchrun_signal(log) == "SIGUSR1"
    log.write_text("W api.py:753] Received Signals.SIGTERM death signal, shutting down workers\n")
    assert stops.torchrun_signal(log) == "SIGTERM"
    assert stops.torchrun_signal(log, offset=log.stat().st_size) is None


def test_a_multi_node_run_takes_the_folder_once_on_node_0(tmp_path):
    """Node 0 owns the checkpoint folder for the whole job: only it locks; node 1 never contends."""
    from trnqwen.config import RunConfig
    from trnqwen.fetch.builtin import write_tiny_qwen3
    from trnqwen.train import ownership
    from trnqwen.train.run import plan_train

    assets = write_tiny_qwen3(tmp_path / "assets" / "hf" / "tiny-qwen3")

    def plan(node_rank: int, rdzv_id: str = "job-1"):
        cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=assets, device="cpu", nnodes=2, node_rank=node_rank,
                        rdzv_endpoint="127.0.0.1:29400", rdzv_id=rdzv_id, seq_len=128, finetune=True,
                        checkpoint_dir=tmp_path / "ckpt", runs_dir=tmp_path / "runs")
        return plan_train(cfg, dry_run=True, cwd=tmp_path)

    node1 = plan(1)
    assert not node1.owns_checkpoints and ownership.claim(node1) is None
    assert not (tmp_path / "ckpt").exists()
    lock = ownership.claim(plan(0))
    try:
        assert folder_lock.holder_of(tmp_path / "ckpt")["run_id"] == "job-1"
        assert ownership.claim(plan(1)) is None  # its own node 1 is not refused
        with pytest.raises(UsageError, match="is in use by run job-1"):
            ownership.claim(plan(0, rdzv_id="job-2"))  # another job's node 0 is
    finally:
        lock.release()


def test_inspect_logs_calls_torchrun_stopped_by_sigusr1_an_interruption(tmp_path):
    """torchrun relays SIGUSR1 by raising SignalException (signal 10): not a crash of the launcher."""
    from tests.helpers import run_subprocess

    log = tmp_path / "train.log"
    log.write_text(
        "W1201 16:07:01.000000 123 torch/distributed/elastic/agent/server/api.py:753] Received 10 death signal, shutting down workers\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 950, in main\n'
        "    run(args)\n"
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 123 got signal: 10\n"
    )
    r = run_subprocess("inspect-logs", str(log), "--json", cwd=tmp_path)
    findings = json.loads(r.out)["findings"]
    assert not [f for f in findings if f["code"] == "crash"], findings
    assert [f for f in findings if f["code"] == "interrupted" and "SIGUSR1" in f["message"]], findings


def _flock_failing_under(monkeypatch, root: Path, err: int) -> None:
    """A filesystem without flock at ``root`` (a Lustre/FSx mount without the flock option): the
    OS call fails there with ``err`` and works everywhere else."""
    import fcntl

    real = fcntl.flock

    def flock(fd, op):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
            raise OSError(err, os.strerror(err))
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.mark.parametrize("err", ["ENOLCK", "EOPNOTSUPP"])
def test_a_filesystem_without_flock_is_one_line_naming_the_lock_dir_setting(tmp_path, monkeypatch, err):
    import errno

    monkeypatch.delenv(folder_lock.LOCK_DIR_ENV, raising=False)
    folder = tmp_path / "lustre" / "ckpt"
    _flock_failing_under(monkeypatch, tmp_path / "lustre", getattr(errno, err))
    with pytest.raises(UsageError) as exc:
        folder_lock.acquire(folder, run_id="r")
    assert exc.value.exit_code == 2
    assert f"{folder} is on a filesystem without file locks" in exc.value.message
    assert os.strerror(getattr(errno, err)) in exc.value.message
    assert "TRNQWEN_LOCK_DIR" in exc.value.hint and "\n" not in exc.value.message
    assert list(folder.iterdir()) == []  # the refusal leaves no lock file behind


def test_trnqwen_lock_dir_keeps_the_lock_on_a_local_disk_keyed_by_the_resolved_folder(tmp_path, monkeypatch):
    """The checkpoint folder cannot lock; TRNQWEN_LOCK_DIR on a local disk can: a real holder in
    another process refuses a second owner that names the same folder by another path."""
    import errno

    folder = tmp_path / "lustre" / "ckpt"
    locks = tmp_path / "local" / "locks"
    monkeypatch.setenv(folder_lock.LOCK_DIR_ENV, str(locks))
    _flock_failing_under(monkeypatch, tmp_path / "lustre", errno.ENOLCK)
    proc = _holder(folder, "run-one")  # inherits TRNQWEN_LOCK_DIR
    try:
        (tmp_path / "alias").symlink_to(tmp_path / "lustre")
        with pytest.raises(UsageError, match="is in use by run run-one"):
            folder_lock.acquire(tmp_path / "alias" / "ckpt", run_id="run-two")
        assert folder_lock.holder_of(folder)["pid"] == proc.pid
        assert not (folder / checkpoints.LOCK_NAME).exists()  # nothing written into the folder
        (lock_file,) = locks.iterdir()
        assert lock_file.name.endswith("-ckpt.lock") and json.loads(lock_file.read_text())["folder"] == str(folder)
    finally:
        proc.kill()
        proc.wait()
    with folder_lock.acquire(folder, run_id="run-next") as lock:
        assert lock.took_over["run_id"] == "run-one" and lock.path.parent == locks
    assert list(locks.iterdir()) == []  # a clean end leaves nothing there either


def test_shown_log_holds_back_torchruns_preemption_traceback_unless_the_run_failed():
    """The lines torchrun prints when it relays SIGUSR1 (as in a real run's train.log): hidden when
    the run ended as an expected stop, shown when it did not; any other traceback always shows."""
    from trnqwen.train.shown_log import ShownLog

    relay = [
        "W1204 13:40:01.000000 123 torch/distributed/elastic/agent/server/api.py:719] Received 10 death signal, shutting down workers\n",
        "Traceback (most recent call last):\n",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 950, in main\n',
        "    run(args)\n",
        "    ~~~^^^^^^\n",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 84, in _terminate_process_handler\n',
        "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)\n",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 123 got signal: 10\n",
    ]
    crash = ["Traceback (most recent call last):\n", '  File "x.py", line 1, in <module>\n', "ValueError: bad shard\n"]
    for expected, want_traceback in ((True, False), (False, True)):
        shown: list[str] = []
        log = ShownLog(shown.append)
        for line in ["[rank0]: step:  3  loss: 5.1\n", *relay, *crash, "after\n"]:
            log(line)
        log.finish(expected_stop=expected)
        assert shown[:2] == ["[rank0]: step:  3  loss: 5.1\n", relay[0]]
        assert ("SignalException: Process 123 got signal: 10\n" in "".join(shown)) is want_traceback
        assert "".join(shown).count("Traceback") == (2 if want_traceback else 1)  # the crash always shows
        assert "ValueError: bad shard\n" in shown
        assert shown[-1] == ("after\n" if expected else relay[-1])  # held back until the run's end
