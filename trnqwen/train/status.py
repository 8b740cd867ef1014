"""The launcher's live status line:
``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  [0:42<1:10, 10.0 s/step]``.

The bracket reads as tqdm's: time elapsed since the launch < time left, the seconds a step takes
(the mean over the last steps seen, never the first step's start-up and compilation), and the time
left is those seconds times the steps still to go.  After the last step the line says what the
ranks do until they exit (``exporting HF safetensors ...``): no 30 s of a line that looks stuck.

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
from trnqwen.output import number

# the line's own labels and the core values' names: a value whose short name is one of these is
# shown by its full name
_TAKEN = ("step", "val", "tok/s", "elapsed", *STEP_CORE)
_UNDECLARED = Metric("", "", status=True)  # a value no method declares (a hook's own): shown


_RATE_WINDOW = 20  # the steps the seconds per step are averaged over: recent enough to follow a change


def clock(seconds: float) -> str:
    """``0:42``, ``12:05``, ``1:02:03``."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def seconds_per_step(seen: list[tuple[int, float]]) -> Optional[float]:
    """The mean time a step took between the first and the last of ``seen`` ((step, time it was
    logged) in order); None until two steps were seen (the first one's time is the start-up's)."""
    if len(seen) < 2:
        return None
    (s0, t0), (s1, t1) = seen[0], seen[-1]
    if s1 <= s0 or t1 < t0:
        return None
    return (t1 - t0) / (s1 - s0)


def format_rate(s_per_step: Optional[float]) -> str:
    """``2.10 s/step`` (``? s/step`` not yet known)."""
    if s_per_step is None:
        return "? s/step"
    v = s_per_step
    return f"{v:,.0f} s/step" if v >= 100 else f"{v:.1f} s/step" if v >= 10 else f"{v:.2f} s/step" if v >= 0.01 else f"{v:.1e} s/step"


def progress_bracket(elapsed: float, step: int, total: Optional[int], s_per_step: Optional[float]) -> str:
    """tqdm's ``[elapsed<remaining, rate]``: ``[0:42<1:10, 2.10 s/step]``; ``?`` for what is not
    known yet; no ``<remaining`` without a step count."""
    if total:
        left = "?" if s_per_step is None else clock(max(0, total - step) * s_per_step)
        return f"[{clock(elapsed)}<{left}, {format_rate(s_per_step)}]"
    return f"[{clock(elapsed)}, {format_rate(s_per_step)}]"


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
    """``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  [0:42<1:10, 10.0 s/step]`` on stderr.

    On a terminal it redraws one line (cut to the terminal's width); elsewhere (CI, pipes) it prints
    a line per new step.  ``closing``: what the ranks do after the last step (``exporting HF
    safetensors``), shown from the last step on.
    """

    def __init__(self, stream: Optional[TextIO] = None, total_steps: Optional[int] = None, enabled: bool = True,
                 mfu: bool = True, closing: Optional[str] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.total = total_steps
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.last: Optional[dict] = None
        self.last_validation: Optional[dict] = None
        self.mfu = mfu  # False on CPU: there is no peak to measure against (torchtitan's MFU is 0.00%)
        self.phase = "starting ranks"
        self.closing = closing
        self._seen: list[tuple[int, float]] = []  # (step, when it was logged): the last _RATE_WINDOW + 1
        self._drawn = False
        self._lock = threading.Lock()

    def text(self) -> str:
        elapsed = time.monotonic() - self.start
        if self.last is None:
            return f"{self.phase}  elapsed {clock(elapsed)}"
        m = self.last
        step = f"{m['step']}/{self.total}" if self.total else str(m["step"])
        parts = [f"step {step}", f"loss {number(m.get('loss'), '.4f')}"]
        parts += [f"{label} {shown}" for label, shown in extra_values(m)]
        if self.last_validation is not None:
            at = self.last_validation.get("step")  # often an earlier step than this line's: say which
            notes = [f"step {at}"] if at is not None else []
            notes += [f"{label} {shown}" for label, shown in extra_values(self.last_validation, VALIDATION_CORE)]
            parts.append(f"val {number(self.last_validation.get('loss'), '.4f')}" + (f" ({', '.join(notes)})" if notes else ""))
        parts.append(f"tok/s {number(m.get('tps'), ',.0f')}")
        parts.append(f"mfu {number(m.get('mfu'), '.2f')}%" if self.mfu and m.get("mfu") is not None else "mfu -")
        parts.append(progress_bracket(elapsed, m["step"], self.total, seconds_per_step(self._seen)))
        if self.closing and self.total and m["step"] >= self.total:
            parts.append(f"{self.closing} ...")
        return "  ".join(parts)

    def update(self, metrics: dict, at: Optional[float] = None) -> None:
        """A step's values (``{"step", "loss", ..., "<method>/<name>": ...}``); ``at``: when the
        step was logged (``time.monotonic()``'s clock; default: now)."""
        with self._lock:
            self.last = metrics
            step = metrics.get("step")
            if isinstance(step, int):
                if self._seen and step <= self._seen[-1][0]:
                    self._seen.clear()  # a step seen again: the rate starts over
                self._seen.append((step, time.monotonic() if at is None else at))
                del self._seen[: -(_RATE_WINDOW + 1)]
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
