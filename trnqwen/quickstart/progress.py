"""The quickstart's progress lines on stderr: a line as each stage starts and ends, and, while
stages run, a line every :data:`HEARTBEAT_S` seconds saying which are still going and how far.

The training stages after the snapshot run two at a time with no live status line of their own,
so without the heartbeat a piped or logged quickstart printed nothing for the whole of a stage
(about 50 s each on 2 cores, minutes under load): a reader could not tell working from hung.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trnqwen.quickstart.types import Stage

HEARTBEAT_S = 30.0  # at most this long without a line while a stage runs
TAIL_BYTES = 64 * 1024  # how much of a run's log is read for its last step


@dataclass
class _Running:
    started: float
    log: Optional[Path] = None
    steps: Optional[int] = None
    live: bool = False  # the stage shows its own status line: no heartbeat for it


def last_step(log: Path) -> Optional[int]:
    """The last step a run's log reports (its tail only), None before the first."""
    from trnqwen.contract.stepline import parse_step_line

    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        found = parse_step_line(line)
        if found:
            return int(found["step"])
    return None


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Stage lines on stderr (rich); the quiet variant prints nothing."""

    def __init__(self, enabled: bool = True, total: int = 0, *, heartbeat_s: float = HEARTBEAT_S):
        self.enabled = enabled
        self.total = total
        self.index = 0
        self.heartbeat_s = heartbeat_s
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._last_line = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _print(self, text: str) -> None:
        from trnqwen import output

        output.console().print(text)
        self._last_line = time.monotonic()

    def start(self, name: str, what: str) -> None:
        """Numbered in the order stages start, so the numbers only climb when lanes run two at a
        time (the documented order's numbers jumped: [4/15] -> [15/15] -> [13/15]); each
        ``done`` line names its stage, since side-by-side stages end in any order."""
        with self._lock:
            self.index += 1
            self._running[name] = _Running(started=time.monotonic())
            if not self.enabled:
                return
            from rich.markup import escape

            self._print(f"[bold cyan][{self.index}/{self.total}] {escape(name)}[/bold cyan]  {escape(what)}")
            if self._thread is None and self.heartbeat_s > 0:
                self._thread = threading.Thread(target=self._beat, name="quickstart-heartbeat", daemon=True)
                self._thread.start()

    def watch(self, name: str, log: Path, *, steps: Optional[int], live: bool) -> None:
        """Stage ``name`` trains: its log tells the heartbeat how far it is (``live``: it shows its own status line)."""
        with self._lock:
            if name in self._running:
                self._running[name].log, self._running[name].steps, self._running[name].live = Path(log), steps, live

    def done(self, stage: Stage, name: Optional[str] = None) -> None:
        """``name``: say which stage ended (stages that run side by side end in any order)."""
        with self._lock:
            self._running.pop(stage.name, None)
            if not self.enabled:
                return
            from rich.markup import escape

            mark = "[yellow]skipped[/yellow]" if stage.skipped else "[green]ok[/green]" if stage.ok else "[red]FAILED[/red]"
            text = escape(stage.skipped or (stage.detail if stage.ok else (stage.error or stage.detail)))
            who = f"{escape(name)}: " if name else ""
            self._print(f"      {mark} {who}{text} [dim]({stage.seconds:.1f}s)[/dim]")

    def note(self, text: str) -> None:
        if self.enabled:
            from rich.markup import escape

            with self._lock:
                self._print(f"      [yellow]{escape(text)}[/yellow]")

    def heartbeat_line(self) -> Optional[str]:
        """``still running: chat fine-tune (step 12/40, 48s), LoRA fine-tune (31s)``; None when
        nothing runs that lacks a status line of its own."""
        now = time.monotonic()
        parts = []
        for name, run in self._running.items():
            if run.live:
                continue
            step = last_step(run.log) if run.log is not None else None
            where = f"step {step}/{run.steps}, " if step is not None and run.steps else ""
            parts.append(f"{name} ({where}{_elapsed(now - run.started)})")
        return "still running: " + ", ".join(parts) if parts else None

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s)):
            with self._lock:
                if time.monotonic() - self._last_line < self.heartbeat_s:
                    continue
                line = self.heartbeat_line()
                if line is None:
                    continue
                from rich.markup import escape

                self._print(f"      [dim]{escape(line)}[/dim]")

    def close(self) -> None:
        """Stop the heartbeat (the quickstart's end, whatever ended it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
