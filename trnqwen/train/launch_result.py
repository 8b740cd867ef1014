"""How a supervised torchrun ended: filled by the launcher (exit, signals) and by the metrics
stream's follower (:mod:`trnqwen.train.progress`: steps, validations, step times), read by the run
record and the stop classification."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class LaunchResult:
    """How a supervised torchrun ended."""

    exit_code: int
    ended_by: str  # "completed" | "SIGINT" | "SIGTERM" | "rank failure" | "launch error"
    error: Optional[str] = None
    error_hint: Optional[str] = None  # a usage error the ranks found (exit 2): what to do
    torchrun_returncode: Optional[int] = None
    wall_s: float = 0.0
    time_to_first_step_s: Optional[float] = None
    step_times: list[float] = field(default_factory=list)  # seconds since start, per step
    # {"step", "loss", ..., "<method>/<name>": ...} per step / validation: every value of the stream's
    # record (trnqwen.train.progress), or the core values of rank 0's line where there is no stream
    steps: list[dict] = field(default_factory=list)
    validations: list[dict] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)  # survivors the sweep had to SIGKILL
    log_recovered: bool = False  # the log was deleted mid-run and written back from the open file

    @property
    def last_step(self) -> Optional[dict]:
        return self.steps[-1] if self.steps else None

    @property
    def seconds_per_step(self) -> Optional[float]:
        """Median time between step lines after the first (which includes compilation)."""
        if len(self.step_times) < 2:
            return None
        deltas = sorted(b - a for a, b in zip(self.step_times, self.step_times[1:]))
        mid = len(deltas) // 2
        return deltas[mid] if len(deltas) % 2 else (deltas[mid - 1] + deltas[mid]) / 2

    def summary(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "ended_by": self.ended_by,
            "error": self.error,
            "torchrun_returncode": self.torchrun_returncode,
            "wall_s": round(self.wall_s, 3),
            "time_to_first_step_s": None if self.time_to_first_step_s is None else round(self.time_to_first_step_s, 3),
            "seconds_per_step": None if self.seconds_per_step is None else round(self.seconds_per_step, 3),
            "steps_logged": len(self.steps),
            "last_step": self.last_step,
            "last_validation": self.validations[-1] if self.validations else None,
        }
