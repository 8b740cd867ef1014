"""The launcher's live status line: ``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  elapsed 0:42``.

Fed by :func:`trnqwen.train.launcher.supervise` with each step's and validation's values: the
records of the run's metrics stream (:mod:`trnqwen.contract.metrics_stream`), or rank 0's step and
validation lines where the ranks write no stream.  After the loss come the values a method marks
for the status line (``Metric(status=True)`` in its declaration, :mod:`trnqwen.methods.registry`),
by their label and format (``margin 0.352  acc 1.00``); a value a method declares without the mark
is left to run.json, inspect-logs and the trackers; a value no method declares (a hook's own) is
shown by the part of its name after the last ``/`` (the whole name where that part is taken: a
core value's name, a label of the line, another value's).  A validation's own values go in its
parentheses.  No method is named here.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
import time
from typing import Optional, TextIO

from trnqwen.contract.metrics_stream import STEP_CORE, VALIDATION_CORE
from trnqwen.methods import registry
from trnqwen.methods.base import Metric

# the line's own labels and the core values' names: a value whose short name is one of these is
# shown by its full name
_TAKEN = ("step", "val", "tok/s", "elapsed", *STEP_CORE)
_UNDECLARED = Metric("", "", status=True)  # a value no method declares (a hook's own): shown


def _fmt_num(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_value(value: Optional[float]) -> str:
    """A method's value, readable at any scale: ``0.352``, ``1.000``, ``12,346``, ``2.50e-05``."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if value != 0 and abs(value) < 0.001:
        return f"{value:.2e}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3f}"


def _declared() -> dict[str, Metric]:
    """Every metric a method declares, by its metrics-stream name."""
    return {m.name: m for method in registry.methods() for m in method.metrics}


def extra_values(values: dict, core: tuple[str, ...] = STEP_CORE) -> list[tuple[str, str]]:
    """(label, shown value) of the values of a record the status line shows after the loss, in the
    record's order: a method's status-marked ones and the undeclared ones (module doc)."""
    declared = _declared()
    names = [k for k in values if k != "step" and k not in core and declared.get(k, _UNDECLARED).status]
    labels = [declared[name].label if name in declared else name.rsplit("/", 1)[-1] for name in names]
    return [(label if labels.count(label) == 1 and label not in _TAKEN else name, _shown(values[name], declared.get(name)))
            for name, label in zip(names, labels)]


def _shown(value: Optional[float], metric: Optional[Metric]) -> str:
    if metric is None or value is None or not math.isfinite(value):
        return format_value(value)
    return format(value, metric.fmt)


class StatusLine:
    """``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  elapsed 0:42`` on stderr.

    On a terminal it redraws one line (cut to the terminal's width); elsewhere (CI, pipes) it prints
    a line per new step.
    """

    def __init__(self, stream: Optional[TextIO] = None, total_steps: Optional[int] = None, enabled: bool = True,
                 mfu: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.total = total_steps
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.last: Optional[dict] = None
        self.last_validation: Optional[dict] = None
        self.mfu = mfu  # False on CPU: there is no peak to measure against (torchtitan's MFU is 0.00%)
        self.phase = "starting ranks"
        self._drawn = False
        self._lock = threading.Lock()

    def text(self) -> str:
        elapsed = int(time.monotonic() - self.start)
        clock = f"{elapsed // 3600}:{elapsed % 3600 // 60:02d}:{elapsed % 60:02d}" if elapsed >= 3600 else f"{elapsed // 60}:{elapsed % 60:02d}"
        if self.last is None:
            return f"{self.phase}  elapsed {clock}"
        m = self.last
        step = f"{m['step']}/{self.total}" if self.total else str(m["step"])
        parts = [f"step {step}", f"loss {_fmt_num(m.get('loss'), '.4f')}"]
        parts += [f"{label} {shown}" for label, shown in extra_values(m)]
        if self.last_validation is not None:
            at = self.last_validation.get("step")  # often an earlier step than this line's: say which
            notes = [f"step {at}"] if at is not None else []
            notes += [f"{label} {shown}" for label, shown in extra_values(self.last_validation, VALIDATION_CORE)]
            parts.append(f"val {_fmt_num(self.last_validation.get('loss'), '.4f')}" + (f" ({', '.join(notes)})" if notes else ""))
        parts.append(f"tok/s {_fmt_num(m.get('tps'), ',.0f')}")
        parts.append(f"mfu {_fmt_num(m.get('mfu'), '.2f')}%" if self.mfu and m.get("mfu") is not None else "mfu -")
        parts.append(f"elapsed {clock}")
        return "  ".join(parts)

    def update(self, metrics: dict) -> None:
        """A step's values (``{"step", "loss", ..., "<method>/<name>": ...}``)."""
        with self._lock:
            self.last = metrics
            if not self.enabled:
                return
            if self.tty:
                self._draw()
            else:
                self._write_line()

    def _write_line(self) -> None:
        if self.enabled and self.last is not None:
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def update_validation(self, metrics: dict) -> None:
        """A validation result: shown as ``val X`` from now on (redrawn on a terminal)."""
        with self._lock:
            self.last_validation = metrics
            if self.enabled and self.tty and self.last is not None:
                self._draw()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def tick(self) -> None:
        """Refresh the elapsed time (terminal only)."""
        with self._lock:
            if self.enabled and self.tty:
                self._draw()

    def clear(self) -> None:
        with self._lock:
            if self.enabled and self.tty and self._drawn:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()
                self._drawn = False

    def print_above(self, text: str) -> None:
        """A log line printed without breaking the status line."""
        with self._lock:
            if self.enabled and self.tty and self._drawn:
                self.stream.write("\r\x1b[2K")
            self.stream.write(text.rstrip("\n") + "\n")
            if self.enabled and self.tty:
                self._draw()
            self.stream.flush()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((120, 24)).columns  # a wrapped line could not be redrawn
        self.stream.write("\r\x1b[2K" + self.text()[: max(20, width - 1)])
        self.stream.flush()
        self._drawn = True
