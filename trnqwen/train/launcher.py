"""The torchrun launcher: the command as data, the ranks' environment, and a supervised run.

Three layers, each usable on its own:

* :func:`build_torchrun_argv` -- a pure function from (config, job, topology) to the argv list.
  ``--dry-run`` prints it, ``command.sh`` replays it, tests check it field by field.
* :func:`rank_env` -- the environment variables trnqwen sets for the ranks (job env, the
  config module's folder on ``PYTHONPATH``, the persistent Neuron compile cache).
* :func:`supervise` -- starts torchrun in its own session, tees its output into ``train.log`` (colour codes removed),
  names the run's metrics stream for the ranks and follows it (:mod:`trnqwen.train.progress`) for a
  live status line and run.json's summary, forwards Ctrl-C/SIGTERM to every rank, escalates to SIGKILL after a
  bounded grace period, sweeps any survivor, and reports how the run ended with the root-cause
  line of a failure instead of torchrun's wall of noise.

Nothing here imports torch: the launcher process must never initialize a device runtime
(on Trainium that would claim NeuronCores the ranks need).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TextIO

from trnqwen.contract.metrics_stream import PATH_ENV as METRICS_PATH_ENV
from trnqwen.contract.rank_errors import find_usage_error
from trnqwen.errors import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, redact, redact_argv
from trnqwen.train import stop_requests
from trnqwen.train.multinode import rendezvous_argv
from trnqwen.train.launch_result import LaunchResult
from trnqwen.train.progress import Progress
from trnqwen.train.status import StatusLine
from trnqwen.train.rootcause import failure_cause

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.job import TrainJob
    from trnqwen.contract.topology import Topology

TORCHRUN_MODULE = "torch.distributed.run"
DEFAULT_NEFF_CACHE = Path(".trnqwen") / "neff-cache"
NEFF_CACHE_VAR = "TORCH_NEURONX_NEFF_CACHE_DIR"
RANK_LOGS_DIR = "ranks"
DEFAULT_GRACE_S = 20.0
# Signals the launcher forwards: Ctrl-C stops at once; SIGTERM / SIGUSR1 (preemption notices)
# make the ranks save a resumable checkpoint at their next step boundary first.
PREEMPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
TORCHRUN_SIGNALS_VAR = "PET_SIGNALS_TO_HANDLE"  # torchrun's --signals-to-handle
TORCHRUN_DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def torchrun_signals(user_value: Optional[str] = None) -> str:
    """torchrun's ``--signals-to-handle``: its defaults (or the user's list) plus SIGUSR1."""
    names = [n.strip() for n in (user_value or ",".join(TORCHRUN_DEFAULT_SIGNALS)).split(",") if n.strip()]
    for needed in ("SIGTERM", "SIGINT", "SIGUSR1"):
        if needed not in names:
            names.append(needed)
    return ",".join(names)


# --- the command --------------------------------------------------------------------------


def build_torchrun_argv(
    cfg: RunConfig,
    job: TrainJob,
    topology: Topology,
    *,
    python: Optional[str] = None,
    extra_args: Sequence[str] = (),
    log_dir: Optional[Path] = None,
) -> list[str]:
    """The torchrun command for ``job`` as a list of strings (nothing is run).

    Shape (the recipe's launch line, with torchrun run by the same interpreter)::

        python -m torch.distributed.run --nproc_per_node N --rdzv_backend c10d
            --rdzv_endpoint localhost:0 --local-ranks-filter 0 --role rank --tee 3
            [--log-dir RUN/ranks] -m <job.entry_module> <job.entry_args...>
            [raw torchtitan flags given after `--`]

    The topology and rendezvous flags come from :func:`trnqwen.train.multinode.rendezvous_argv`
    (multi-node adds ``--nnodes``, ``--node-rank``, ``--rdzv_id``, the shared endpoint and
    ``--max-restarts``); the recipe's ``entry_args`` already carry any ``--override.imports``.
    """
    argv: list[str] = [python or sys.executable, "-m", TORCHRUN_MODULE]
    argv += rendezvous_argv(cfg, topology.nproc_per_node)
    # Output: rank 0 on the console, every rank tee'd to files.
    argv += ["--local-ranks-filter", "0", "--role", "rank", "--tee", "3"]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir)]
    # What each rank runs.
    argv += ["-m", job.entry_module, *[str(a) for a in job.entry_args]]
    argv += [str(a) for a in extra_args]
    return argv


def rank_env(cfg: RunConfig, job: TrainJob, device: DeviceInfo, run_dir: Optional[Path], environ: Optional[dict] = None) -> dict[str, str]:
    """The variables trnqwen sets for the ranks (merged over the caller's environment).

    * ``job.env`` from the recipe (device selection and the like);
    * the run dir (where the generated config module lives) prepended to ``PYTHONPATH``;
    * on Neuron, ``TORCH_NEURONX_NEFF_CACHE_DIR`` in a persistent per-project folder
      (``cfg.compile_cache_dir``, default ``.trnqwen/neff-cache``) unless the user set one,
      so a rerun of the same shapes skips compilation.
    """
    base = os.environ if environ is None else environ
    env: dict[str, str] = {k: str(v) for k, v in (job.env or {}).items()}
    if run_dir is not None and job.config_module:
        parts = [str(Path(run_dir).resolve())]
        for existing in (env.get("PYTHONPATH"), base.get("PYTHONPATH")):
            if existing:
                parts.append(existing)
        env["PYTHONPATH"] = os.pathsep.join(parts)
    if device.type == "neuron" and NEFF_CACHE_VAR not in base and NEFF_CACHE_VAR not in env:
        cache = Path(cfg.compile_cache_dir or DEFAULT_NEFF_CACHE).expanduser()
        env[NEFF_CACHE_VAR] = str(cache.resolve())
    return env


def shell_command(argv: Sequence[str], env: Optional[dict[str, str]] = None) -> str:
    """One copy-pasteable line: ``VAR=value ... python -m torch.distributed.run ...``."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    cmd = shlex.join(redact_argv(argv))
    return redact(f"{prefix} {cmd}" if prefix else cmd)


def command_script(argv: Sequence[str], env: dict[str, str], cwd: Path) -> str:
    """``command.sh``: re-runs exactly this torchrun command from the same folder."""
    lines = ["#!/usr/bin/env bash", "# Written by trnqwen train: the exact torchrun command of this run.", "set -euo pipefail"]
    lines.append(f"cd {shlex.quote(str(cwd))}")
    for k, v in env.items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append("exec " + " \\\n  ".join(_argv_chunks(redact_argv(argv))))
    return redact("\n".join(lines) + "\n")


def _argv_chunks(argv: Sequence[str]) -> list[str]:
    """Group ``--flag value`` pairs so command.sh reads one option per line."""
    chunks: list[str] = []
    for arg in argv:
        quoted = shlex.quote(str(arg))
        if chunks and not str(arg).startswith("-") and chunks[-1].startswith("-") and " " not in chunks[-1]:
            chunks[-1] += " " + quoted
        else:
            chunks.append(quoted)
    return chunks


# --- supervision --------------------------------------------------------------------------


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: if trnqwen itself dies (even SIGKILL), torchrun gets SIGTERM and stops its ranks."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class _Tracker:
    """Every process torchrun starts, remembered so none can outlive the run.

    Ranks run in their own sessions (torchrun starts them with ``start_new_session``), so a
    signal to torchrun's process group does not reach them and they are re-parented to init
    if torchrun dies: we remember them (pid + start time, so a reused pid is never hit).
    """

    def __init__(self, root_pid: int):
        import psutil

        self._psutil = psutil
        self.root_pid = root_pid
        self.known: dict[int, float] = {}

    def refresh(self) -> None:
        """Add every live descendant of torchrun (and of ranks already seen) to ``known``.

        One pass over the process table (pid -> ppid), however many ranks there are.
        """
        psutil = self._psutil
        kids: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info.get("ppid")
            if ppid:
                kids.setdefault(ppid, []).append(proc.pid)
        # Ranks re-parented to init after torchrun died are still found below their own pids.
        stack = [self.root_pid, *(pid for pid in self.known if self._get(pid) is not None)]
        seen: set[int] = set()
        while stack:
            for child in kids.get(stack.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        for pid in seen - self.known.keys():
            try:
                self.known[pid] = psutil.Process(pid).create_time()
            except psutil.Error:
                pass

    def _get(self, pid: int):
        try:
            proc = self._psutil.Process(pid)
            if abs(proc.create_time() - self.known[pid]) > 0.01 or proc.status() == self._psutil.STATUS_ZOMBIE:
                return None
            return proc
        except self._psutil.Error:
            return None

    def alive(self) -> list[int]:
        return [pid for pid in self.known if self._get(pid) is not None]

    def signal_all(self, sig: int) -> list[int]:
        hit = []
        for pid in self.alive():
            try:
                os.kill(pid, sig)
                hit.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        return hit


def supervise(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Optional[Path] = None,
    log_path: Path,
    rank_log_dir: Optional[Path] = None,
    status: Optional[StatusLine] = None,
    grace_s: float = DEFAULT_GRACE_S,
    echo: Optional[Callable[[str], None]] = None,
    on_step: Optional[Callable[[dict], None]] = None,
    on_start: Optional[Callable[[int], None]] = None,
    handle_signals: bool = True,
    metrics_path: Optional[Path] = None,
) -> LaunchResult:
    """Run ``argv`` (torchrun) to the end and report how it ended.

    ``env`` is merged over ``os.environ``.  The whole output goes to ``log_path`` as printed;
    ``echo`` (if given) sees every line too.  SIGINT/SIGTERM received here are forwarded to
    torchrun and every rank; after ``grace_s`` survivors get SIGKILL; a second Ctrl-C kills at
    once.  Exit code: 0 done, 1 failed, 130 SIGINT, 143 SIGTERM/SIGUSR1 (the caller turns a
    preemption the ranks saved into 138, one before the first step into 140: trnqwen.train.stops).

    ``metrics_path`` (``<run dir>/metrics.jsonl``) goes to the ranks as ``TRNQWEN_METRICS_PATH``:
    global rank 0 appends the run's metrics stream there, and the status line, ``on_step`` and the
    result's steps and validations come from its records (rank 0's console lines where the ranks
    write none).
    """
    full_env = dict(os.environ)
    full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # The ranks get the whole grace period (a preempted rank saves at its next step boundary);
    # torchrun's SIGTERM->SIGKILL escalation for them comes first, ours for torchrun after it.
    full_env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(1, int(grace_s))))
    # SIGUSR1 (SLURM's --signal, spot notices) reaches the ranks through torchrun too: torchrun
    # forwards only the signals of its --signals-to-handle flag, read from PET_SIGNALS_TO_HANDLE
    # (it overwrites TORCHELASTIC_SIGNALS_TO_HANDLE itself, so that variable does nothing).
    full_env[TORCHRUN_SIGNALS_VAR] = torchrun_signals(full_env.get(TORCHRUN_SIGNALS_VAR))
    if metrics_path is not None:
        full_env[METRICS_PATH_ENV] = str(Path(metrics_path).absolute())
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    result = LaunchResult(exit_code=EXIT_FAILED, ended_by="launch error")
    progress = Progress(result, status=status, on_step=on_step, metrics_path=metrics_path, start=start)
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)  # a second signal of any kind means "stop now"

    # The handlers go in BEFORE torchrun starts and come out only after the sweep: a Ctrl-C at any
    # moment in between (even while ranks spawn, or run.json is written) is a stop request
    # handled below, never a KeyboardInterrupt that skips the forwarding and the record.
    previous: dict[int, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in PREEMPT_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
    stop_requests.register(received)
    try:
        return _run_supervised(
            argv, full_env=full_env, cwd=cwd, log_path=log_path, rank_log_dir=rank_log_dir, status=status,
            grace_s=grace_s, echo=echo, progress=progress, on_start=on_start, start=start, result=result,
            received=received,
        )
    finally:
        stop_requests.unregister(received)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_supervised(
    argv: Sequence[str],
    *,
    full_env: dict[str, str],
    cwd: Optional[Path],
    log_path: Path,
    rank_log_dir: Optional[Path],
    status: Optional[StatusLine],
    grace_s: float,
    echo: Optional[Callable[[str], None]],
    progress: Progress,
    on_start: Optional[Callable[[int], None]],
    start: float,
    result: LaunchResult,
    received: list[int],
) -> LaunchResult:
    """:func:`supervise` with its signal handlers in place: start, watch, stop, sweep, report."""
    if received:  # stopped before torchrun started: start nothing
        return _ended_by_signal(result, received[0], start)
    try:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal if sys.platform.startswith("linux") else None,
        )
    except OSError as exc:
        result.error = f"could not start torchrun: {exc}"
        return result
    tracker = _Tracker(proc.pid)
    tail: list[str] = []
    lines_seen: list[str] = []  # bounded: early lines (tracebacks come first) + a tail
    max_kept = 5000

    from trnqwen.contract.stepline import strip_ansi

    # train.log holds plain text (grep-able); the colours reach the console only when it is a terminal
    color_echo = echo is not None and bool(getattr(status.stream if status is not None else sys.stderr, "isatty", lambda: False)())

    def reader() -> None:
        assert proc.stdout is not None
        with open(log_path, "a+", encoding="utf-8", errors="replace") as log:
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                plain = strip_ansi(line)
                log.write(plain)
                log.flush()
                if len(lines_seen) < max_kept:
                    lines_seen.append(line)
                else:
                    tail.append(line)
                    if len(tail) > max_kept:
                        del tail[: len(tail) - max_kept]
                if echo is not None:
                    echo(line if color_echo else plain)
                progress.line(line)
            if not Path(log_path).exists():  # deleted mid-run (the run dir removed): write it back
                result.log_recovered = _recover_log(log, Path(log_path))

    thread = threading.Thread(target=reader, name="trnqwen-log-reader", daemon=True)

    def forward(sig: int, *, ranks_too: bool) -> None:
        """To torchrun's process group; with ``ranks_too`` also to every process it started."""
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if ranks_too:
            tracker.refresh()
            tracker.signal_all(sig)

    forwarded = False
    kill_at: Optional[float] = None
    try:
        thread.start()
        if on_start is not None:
            on_start(proc.pid)
        next_refresh = 0.0
        while proc.poll() is None:
            if time.monotonic() >= next_refresh:
                tracker.refresh()
                next_refresh = time.monotonic() + 1.0
            if received and not forwarded:
                # torchrun forwards the signal to each rank's session and waits for them.
                forwarded = True
                tracker.refresh()  # who is there right now, for the sweep after
                forward(received[0], ranks_too=False)
                kill_at = time.monotonic() + grace_s + max(5.0, grace_s * 0.2)
                if status is not None:
                    status.set_phase(f"stopping ({signal.Signals(received[0]).name})")
                    status.tick()
            if kill_at is not None and (time.monotonic() >= kill_at or len(received) > 1):
                forward(signal.SIGKILL, ranks_too=True)
                kill_at = None
            progress.poll()
            if status is not None:
                status.tick()
            try:
                proc.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:  # signal handlers not installed (not main thread) and Ctrl-C
        received.append(signal.SIGINT)
        forward(signal.SIGINT, ranks_too=False)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            forward(signal.SIGKILL, ranks_too=True)
            proc.wait()
    finally:
        # No orphans: ranks live in their own sessions, so sweep what we saw.
        survivors = tracker.alive()
        if survivors:
            deadline = time.monotonic() + (min(grace_s, 5.0) if not received else 0.5)
            while survivors and time.monotonic() < deadline:
                time.sleep(0.1)
                survivors = tracker.alive()
            result.killed_pids = tracker.signal_all(signal.SIGKILL)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        if thread.ident is not None:  # started
            thread.join(timeout=10)
        progress.poll()  # the records written after the last look
        if status is not None:
            status.clear()

    result.torchrun_returncode = proc.returncode
    result.wall_s = time.monotonic() - start
    if received:
        _ended_by_signal(result, received[0], start)
    elif proc.returncode == 0:
        result.ended_by = "completed"
        result.exit_code = 0
    else:
        result.ended_by = "rank failure"
        result.exit_code = EXIT_FAILED
        result.error = failure_cause(lines_seen + tail, rank_log_dir)
        usage = find_usage_error(lines_seen + tail)  # a user's mistake the ranks found (a reward function)
        if usage is not None:
            result.exit_code = EXIT_USAGE
            result.error, result.error_hint = usage
        if result.error is None:
            rc = proc.returncode
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals() else f"exit code {rc}"
            result.error = f"torchrun ended with {how} and no error message from the ranks"
        result.error = redact(result.error)
    return result


def _recover_log(log: TextIO, log_path: Path) -> bool:
    """Copy what the still-open, deleted log holds back to ``log_path`` (the whole log, this
    launch's and earlier ones')."""
    import shutil

    try:
        log.flush()
        log.seek(0)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as out:
            shutil.copyfileobj(log, out)
        return True
    except OSError:
        return False


def _ended_by_signal(result: LaunchResult, sig: int, start: float) -> LaunchResult:
    result.ended_by = signal.Signals(sig).name
    result.exit_code = EXIT_SIGINT if sig == signal.SIGINT else EXIT_SIGTERM
    result.wall_s = time.monotonic() - start
    return result
