"""Stop requests for the runs this process supervises now.

Each supervised run polls its own list of received signals (``launcher.run``).  Only the main
thread can catch a signal; when runs go side by side in threads (the quickstart's lanes), the main
thread hands a Ctrl-C on with :func:`request_stop`, and each run stops as if it had received it:
forwarded to torchrun, and recorded as how the run ended.
"""

from __future__ import annotations

import signal
import threading

_active: list[list[int]] = []
_lock = threading.Lock()


def register(received: list[int]) -> None:
    with _lock:
        _active.append(received)


def unregister(received: list[int]) -> None:
    with _lock:
        _active[:] = [r for r in _active if r is not received]


def request_stop(sig: int = signal.SIGINT) -> int:
    """Ask every supervised run to stop as if it had received ``sig``; returns how many were asked."""
    with _lock:
        for received in _active:
            received.append(sig)
        return len(_active)
