"""Run a :class:`~trnqwen.serve.plan.ServePlan`: start the engine, wait until it answers, stop it cleanly.

* The child runs in its own session, so a Ctrl-C reaches trnqwen alone, which forwards it
  (SIGINT or SIGTERM, as received) and waits for the child to exit (SIGKILL after ``grace_s``):
  no server outlives the command, and the exit code is 130/143 (:mod:`trnqwen.errors`).  A
  trnqwen killed outright (SIGKILL) takes the child with it too (PR_SET_PDEATHSIG on Linux).
* Until the endpoint answers, the child's output is kept (its last lines); ``GET /v1/models``
  (then ``/health``) is polled every half second.  A child that exits, or a ``ready_timeout``
  that passes first, is one error carrying those last lines.  Once ready, the child's lines
  are passed through to ``log`` (the request log).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

from trnqwen.errors import EXIT_SIGINT, EXIT_SIGTERM, EnvironmentProblem, TrnqwenError
from trnqwen.serve.plan import ServePlan

TAIL_LINES = 20
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServerDied(TrnqwenError):
    """The server exited (or never answered) before it was ready; ``problems`` holds its last lines."""


def endpoint_answers(url: str, timeout: float = 2.0) -> bool:
    for path in ("/v1/models", "/health"):
        try:
            with urllib.request.urlopen(url + path, timeout=timeout) as resp:  # noqa: S310 - loopback/our own server
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return False


def port_in_use(host: str, port: int) -> bool:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host if host not in ("0.0.0.0", "") else "127.0.0.1", int(port))) == 0


def run_server(plan: ServePlan, *, ready_timeout: float = 600.0, grace_s: float = 15.0,
               on_ready: Optional[Callable[[ServePlan, float], None]] = None,
               log: Optional[Callable[[str], None]] = None, handle_signals: bool = True) -> int:
    """Start ``plan``'s server and serve until it exits or a stop signal comes; the exit code
    (the child's own, or 130/143 when stopped by SIGINT/SIGTERM)."""
    if port_in_use(plan.host, plan.port):
        raise EnvironmentProblem(f"port {plan.port} on {plan.host} is already in use", hint="pass another --port")
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    ready = threading.Event()
    env = {**os.environ, **plan.env, "PYTHONUNBUFFERED": "1"}
    try:
        try:
            proc = subprocess.Popen(plan.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", bufsize=1, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot start {plan.argv[0]}: {exc.strerror or exc}", hint="is the engine installed?") from None

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                if ready.is_set() and log is not None:
                    log(line)

        reader = threading.Thread(target=pump, name="serve-output", daemon=True)
        reader.start()
        started = time.monotonic()
        try:
            while not ready.is_set():
                if received:
                    return _stop(proc, received[0], grace_s)
                if proc.poll() is not None:
                    reader.join(timeout=2)
                    raise _died(plan, f"the {plan.engine} server exited with code {proc.returncode} before it answered", tail)
                if endpoint_answers(plan.url, timeout=1.0):
                    ready.set()
                    if on_ready is not None:
                        on_ready(plan, time.monotonic() - started)
                    break
                if time.monotonic() - started > ready_timeout:
                    _stop(proc, signal.SIGTERM, grace_s)
                    raise _died(plan, f"the {plan.engine} server did not answer on {plan.url} within {ready_timeout:.0f}s", tail)
                _sleep_unless(received, 0.5)
            while proc.poll() is None:
                if received:
                    return _stop(proc, received[0], grace_s)
                _sleep_unless(received, 0.25)
            reader.join(timeout=2)
            if proc.returncode != 0:
                raise _died(plan, f"the {plan.engine} server exited with code {proc.returncode}", tail)
            return 0
        except KeyboardInterrupt:  # no handler installed (not the main thread)
            return _stop(proc, signal.SIGINT, grace_s)
        finally:
            if proc.poll() is None:
                _stop(proc, signal.SIGKILL, 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def prepare(plan: ServePlan, *, runs_dir: "os.PathLike[str] | str",
            on_merge: Optional[Callable[[ServePlan], None]] = None) -> None:
    """What must exist before the engine starts: the engine itself (exit 3 without it) and, for an
    adapter on transformers, the merged folder (``trnqwen merge``'s, at ``plan.served``)."""
    from pathlib import Path

    from trnqwen.serve.plan import check_installed

    check_installed(plan)
    if plan.merge_needed and plan.adapter is not None:
        from trnqwen.ckpt.merge import merge

        if on_merge is not None:
            on_merge(plan)
        merge(plan.adapter, runs_dir=Path(runs_dir), base=plan.base, out=plan.served)
        plan.merge_needed = False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when trnqwen itself dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so a killed ``trnqwen serve`` leaves no server holding the port."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _sleep_unless(received: list[int], seconds: float) -> None:
    end = time.monotonic() + seconds
    while not received and time.monotonic() < end:
        time.sleep(0.05)


def _stop(proc: subprocess.Popen, sig: int, grace_s: float) -> int:
    """Forward ``sig`` to the child's process group, reap it (SIGKILL after ``grace_s``)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return EXIT_SIGINT if sig == signal.SIGINT else EXIT_SIGTERM


def _died(plan: ServePlan, message: str, tail: collections.deque[str]) -> ServerDied:
    lines = [line for line in tail if line.strip()]
    exc = ServerDied(message + (": its last lines follow" if lines else " (it printed nothing)"),
                     hint=f"the command was: {plan.command_line()}")
    if lines:
        exc.problems = [exc.message, *(f"{plan.engine}| {line}" for line in lines[-TAIL_LINES:])]
    return exc


__all__ = ["ServerDied", "endpoint_answers", "port_in_use", "prepare", "run_server"]
