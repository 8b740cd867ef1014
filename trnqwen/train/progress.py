"""A supervised run's progress: each step's and validation's values, as the launcher learns them.

The ranks' metrics stream (:mod:`trnqwen.contract.metrics_stream`, ``<run dir>/metrics.jsonl``,
written by global rank 0 of every backend) is the source: one record per step and validation
with every value by name, a method's included (``<method>/<name>``), so the status line and run.json
show what a record holds without knowing any method.  Only the records appended during this launch
count (a resumed run's stream holds its earlier segments too).

Where the ranks write no stream (a build of the ranks without a writer; the file never appears),
rank 0's step and validation lines are read instead (:mod:`trnqwen.contract.stepline`: the core values
only).  The first stream record switches a run to the stream for good: what the lines gave until
then is replaced by the records (which hold the same steps).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Optional

from trnqwen.contract.metrics_stream import Record, StreamReader
from trnqwen.train.launch_result import LaunchResult
from trnqwen.train.status import StatusLine

FIRST_RECORD_WAIT_S = 2.0  # the most the first step line waits for its stream record


class Progress:
    """Fills ``result.steps`` / ``result.validations`` / the step times and feeds the status line.

    ``result`` is the launcher's ``LaunchResult``; ``status`` a ``StatusLine`` or None; ``on_step``
    sees each step's values.  :meth:`poll` (the supervision loop, and every step-like console line)
    reads new stream records; :meth:`line` takes one console line (used while no record came).
    """

    def __init__(self, result: LaunchResult, *, status: Optional[StatusLine] = None, on_step: Optional[Callable[[dict], None]] = None,
                 metrics_path: Optional[Path] = None, start: float, wall_start: Optional[float] = None) -> None:
        self.result, self.status, self.on_step = result, status, on_step
        self.start = start  # time.monotonic() at launch: step_times count from it
        self.wall_start = time.time() if wall_start is None else wall_start
        self.reader: Optional[StreamReader] = None
        if metrics_path is not None:
            self.reader = StreamReader(metrics_path)
            try:  # an earlier segment's records (a resumed run) are not this launch's
                self.reader.offset = Path(metrics_path).stat().st_size
            except OSError:
                pass
        self.from_stream = False
        self._waited = False
        self._lock = threading.Lock()

    # -- the stream ---------------------------------------------------------------------------------

    def poll(self) -> None:
        if self.reader is None:
            return
        with self._lock:
            records = self.reader.poll()
            if records and not self.from_stream:
                self.from_stream = True
                self._forget_lines()
            for record in records:
                self._record(record)

    def _forget_lines(self) -> None:
        r = self.result
        r.steps.clear()
        r.step_times.clear()
        r.validations.clear()
        r.time_to_first_step_s = None

    def _record(self, record: Record) -> None:
        values = {"step": record.step, **record.values}
        if record.kind == "step":
            seen = record.time - self.wall_start if record.time else time.monotonic() - self.start
            self._step(values, max(0.0, seen))
        elif record.kind == "validation":
            self._validation(values)

    # -- the console's lines (no stream) ----------------------------------------------------------

    def line(self, line: str) -> None:
        """One console line (colour codes kept): a step or validation line counts until the stream
        has a record."""
        if "step:" not in line:
            return
        self.poll()
        if not self.from_stream and self.reader is not None and not self._waited:
            # rank 0 writes a step's record just after printing its line (the record carries what
            # torchtitan's log computes), so a loaded host can show the line first: wait for the
            # first record a little, once, rather than show step 1 from the line and again from
            # the stream.  A run whose ranks write no stream pays this once.
            self._waited = True
            deadline = time.monotonic() + FIRST_RECORD_WAIT_S
            while not self.from_stream and time.monotonic() < deadline:
                time.sleep(0.02)
                self.poll()
        if self.from_stream:
            return
        from trnqwen.contract.stepline import parse_step_line, parse_validation_line

        with self._lock:
            if "validate step:" in line:
                validation = parse_validation_line(line)
                if validation is not None:
                    self._validation(validation)
                return
            metrics = parse_step_line(line)
            if metrics is not None:
                self._step(metrics, time.monotonic() - self.start)

    # -- both -----------------------------------------------------------------------------------------

    def _step(self, values: dict, seen_s: float) -> None:
        r = self.result
        if r.time_to_first_step_s is None:
            r.time_to_first_step_s = seen_s
        r.step_times.append(seen_s)
        r.steps.append(values)
        if self.status is not None:
            self.status.update(values, at=self.start + seen_s)  # when it was logged: the seconds per step
        if self.on_step is not None:
            self.on_step(values)

    def _validation(self, values: dict) -> None:
        self.result.validations.append(values)
        if self.status is not None:
            self.status.update_validation(values)
