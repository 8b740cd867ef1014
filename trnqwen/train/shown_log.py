"""What ``--show-log`` shows: rank 0's log as it comes, less torchrun's own traceback of a
preemption signal.

torchrun relays a SIGTERM/SIGUSR1 it received by raising ``SignalException`` out of its
``main`` (``torch.distributed.elastic.multiprocessing.api.SignalException: Process N got signal:
10``), so a normal preemption (the ranks saved, exit 138) printed a traceback under the log.
:class:`ShownLog` holds such a traceback back instead of showing it; :meth:`ShownLog.finish`
shows it after all when the run did not end as an expected stop (138, 140 or a finished run),
so nothing that could explain a failure is hidden.  train.log always keeps every line.
Pure Python; no torch.
"""

from __future__ import annotations

import re
from typing import Callable

# torchrun's relay of a preemption signal (SIGTERM 15, SIGUSR1 10), by number or by name
_SIGNAL_EXCEPTION = re.compile(r"SignalException: Process \d+ got signal: (?:10|15|SIGTERM|SIGUSR1)\b")
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")


def _plain(line: str) -> str:
    from trnqwen.contract.stepline import strip_ansi

    return strip_ansi(line).rstrip("\r\n")


class ShownLog:
    """Wraps the ``echo`` of :func:`trnqwen.train.launcher.supervise` (one call per log line)."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self.pending: list[str] = []  # a traceback still being read
        self.held: list[str] = []  # torchrun's preemption traceback(s), not shown (yet)
        self._after_held = False  # a held traceback may continue with a chained one

    def __call__(self, line: str) -> None:
        text = _plain(line)
        if self.pending:
            self.pending.append(line)
            if text.startswith((" ", "\t")) or text.startswith("Traceback") or not text.strip() or text.startswith(_CHAINING):
                return
            block, self.pending = self.pending, []  # ``text`` is the exception line: the end
            if _SIGNAL_EXCEPTION.search(text):
                self.held += block
                self._after_held = True
            else:
                self._show(block)
            return
        if text.startswith("Traceback (most recent call last)"):
            self.pending.append(line)
            return
        if self._after_held and (not text.strip() or text.startswith(_CHAINING)):
            self.held.append(line)  # the blank line / "During handling ..." before a chained one
            return
        self._after_held = False
        self.echo(line)

    def _show(self, lines: list[str]) -> None:
        for line in lines:
            self.echo(line)

    def finish(self, *, expected_stop: bool) -> None:
        """The run has ended: show what is still pending, and the held traceback unless the run
        ended as an expected stop (the preemption it relays is then the whole story)."""
        self._show(self.pending)
        self.pending = []
        if not expected_stop:
            self._show(self.held)
        self.held = []


__all__ = ["ShownLog"]
