"""The launcher's live status line: ``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  elapsed 0:42``.

Fed by :func:`trnqwen.train.launcher.supervise` from the tee'd rank-0 stream (step lines through
:mod:`trnqwen.contract.stepline`, a DPO run's ``[DPO]`` lines through :mod:`trnqwen.logs.dpo`, which
add ``acc 0.75  margin 0.120`` after the loss).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO


def _fmt_num(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


class StatusLine:
    """``step 3/10  loss 7.12  tok/s 1,234  mfu 1.2%  elapsed 0:42`` on stderr.

    On a terminal it redraws one line; elsewhere (CI, pipes) it prints a line per new step.  With
    ``dpo`` (a DPO run: a ``[DPO]`` line follows each step line) that line waits for the step's
    ``[DPO]`` values, or for the next step line or the end when none comes.
    """

    def __init__(self, stream: Optional[TextIO] = None, total_steps: Optional[int] = None, enabled: bool = True,
                 dpo: bool = False, mfu: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.total = total_steps
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.last: Optional[dict] = None
        self.last_validation: Optional[dict] = None
        self.dpo = dpo
        self.mfu = mfu  # False on CPU: there is no peak to measure against (torchtitan's MFU is 0.00%)
        self.last_dpo: Optional[dict] = None  # the last [DPO] step values
        self._pending = False  # a step line not printed yet (not a terminal, waiting for its [DPO] line)
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
        if self.last_dpo is not None:
            parts.append(f"acc {_fmt_num(self.last_dpo.get('accuracy'), '.2f')}  margin {_fmt_num(self.last_dpo.get('margin'), '.3f')}")
        if self.last_validation is not None:
            at = self.last_validation.get("step")  # often an earlier step than this line's: say which
            notes = [f"step {at}"] if at is not None else []
            if self.last_validation.get("accuracy") is not None:
                notes.append(f"acc {_fmt_num(self.last_validation.get('accuracy'), '.2f')}")
            parts.append(f"val {_fmt_num(self.last_validation.get('loss'), '.4f')}" + (f" ({', '.join(notes)})" if notes else ""))
        parts.append(f"tok/s {_fmt_num(m.get('tps'), ',.0f')}")
        parts.append(f"mfu {_fmt_num(m.get('mfu'), '.2f')}%" if self.mfu and m.get("mfu") is not None else "mfu -")
        parts.append(f"elapsed {clock}")
        return "  ".join(parts)

    def update(self, metrics: dict) -> None:
        with self._lock:
            if self._pending:  # the step before never got its [DPO] line
                self._write_line()
            self.last = metrics
            if not self.enabled:
                return
            if self.tty:
                self._draw()
            elif self.dpo:
                self._pending = True
            else:
                self._write_line()

    def update_dpo(self, values: dict, *, validation: bool = False) -> None:
        """A ``[DPO]`` line's values (``{"step", "accuracy", "margin", ...}``): the step's shown as
        ``acc A  margin M`` (a pending line printed), a validation's as ``val X (acc A)``."""
        with self._lock:
            if validation:
                if self.last_validation is not None and self.last_validation.get("step") == values.get("step"):
                    self.last_validation = {**self.last_validation, **{k: v for k, v in values.items() if k != "loss"}}
                else:
                    self.last_validation = dict(values)
            else:
                self.last_dpo = values
            if not self.enabled or self.last is None:
                return
            if self.tty:
                self._draw()
            elif self._pending and not validation:
                self._write_line()

    def _write_line(self) -> None:
        self._pending = False
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
            if self._pending:
                self._write_line()
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
        self.stream.write("\r\x1b[2K" + self.text())
        self.stream.flush()
        self._drawn = True
