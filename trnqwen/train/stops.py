"""How a run that met a stop signal ended, and the exit code that tells a scheduler what to do.

The signal may reach trnqwen (``kill``, a spot notice), torchrun's process group, or every
process of the job at once (SLURM's ``--signal`` / ``scancel --signal``); the ranks act on it
(trnqwen.runtime.resume_state) and the launcher reads what they did from the log:

* ``[trnqwen] preempted: SIGUSR1 at step N`` -> **138**: a resumable checkpoint of step N was
  saved; a requeue or ``--resume`` continues from it.
* SIGTERM / SIGUSR1 before the run's first step (start-up, Neuron compilation) -> **140**:
  nothing was trained, so nothing was lost; a requeue or ``--resume`` starts it again.
* the signal arrived while the last step was being saved and the ranks finished it -> **0**:
  the run is complete (its export is whole).
* anything else keeps 130 (SIGINT) / 143 (SIGTERM, SIGUSR1): the ranks were stopped.

Pure Python (no torch), called by :func:`trnqwen.train.run.execute`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from trnqwen.errors import EXIT_PREEMPTED, EXIT_PREEMPTED_BEFORE_START
from trnqwen.fsutil import first_match
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.train.plan import TrainPlan

if TYPE_CHECKING:
    from trnqwen.rundir import RunRecord
    from trnqwen.train.launch_result import LaunchResult

PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")
_STOP_SIGNALS = ("SIGINT", *PREEMPTION_SIGNALS)
# torchrun's agent, when a signal in its --signals-to-handle reached it (not the launcher)
_TORCHRUN_SIGNAL = re.compile(r"Received (?:Signals\.)?(SIG[A-Z0-9]+|\d+) death signal")  # a name or a number


def torchrun_signal(log_path: Path, offset: int = 0) -> Optional[str]:
    """The signal torchrun says it got (``Received Signals.SIGUSR1 death signal``) after ``offset``."""
    m = first_match(log_path, _TORCHRUN_SIGNAL, b"death signal", offset)
    return _signal_name(m.group(1)) if m else None


def _signal_name(text: str) -> str:
    import signal

    try:
        return signal.Signals(int(text)).name if text.isdigit() else text
    except ValueError:
        return f"signal {text}"


def classify(plan: TrainPlan, result: LaunchResult, record: RunRecord, offset: int, ckpt_root: Optional[Path]) -> None:
    """Set the exit code, status and record fields of a run that met a stop signal (see above)."""
    from trnqwen.train.resume import preempted_step, resume_command

    found = preempted_step(plan.log_path, offset)
    if found is not None:
        step, signal_name = found
        _set(result, record, EXIT_PREEMPTED, signal_name, "interrupted")
        record.extra["interrupted_at_step"] = step
        record.extra["interrupted"] = f"interrupted at step {step} by {signal_name}; a resumable checkpoint was saved"
        record.extra["resume_command"] = resume_command(plan.run_id)
        record.extra["summary"] = result.summary()
        return
    signal_name = result.ended_by if result.ended_by in _STOP_SIGNALS else torchrun_signal(plan.log_path, offset)
    if signal_name is None:
        return
    if signal_name in PREEMPTION_SIGNALS and not result.steps:
        _set(result, record, EXIT_PREEMPTED_BEFORE_START, signal_name, "interrupted")
        record.extra["interrupted"] = f"stopped by {signal_name} before its first step; nothing was trained, nothing was lost"
        record.extra["resume_command"] = resume_command(plan.run_id)
        record.extra["summary"] = result.summary()
        return
    if _finished(plan, result, ckpt_root):
        _set(result, record, 0, "completed", "succeeded")
        step = (result.last_step or {}).get("step")
        record.extra["signal_after_last_step"] = (
            f"{signal_name} arrived while the last step was saved; the ranks finished it so the checkpoint is whole")
        # said on the console at the end of the run (trnqwen.train.run): never absorbed silently
        record.extra["signal_received"] = {
            "signal": signal_name, "during": f"the final save and export of step {step}",
            "done": "finished the save and export so the checkpoint is whole; the run is complete (exit 0), nothing to resume",
        }
        record.extra["summary"] = result.summary()


def _set(result: LaunchResult, record: RunRecord, code: int, ended_by: str, status: str) -> None:
    result.exit_code = record.exit_code = code
    result.ended_by = record.ended_by = ended_by
    result.error = record.error = None
    record.status = status


def _finished(plan: TrainPlan, result: LaunchResult, root: Optional[Path]) -> bool:
    """Every planned step logged by this run, and its last save complete (export or resume point)."""
    total = plan.config.steps
    last = (result.last_step or {}).get("step")
    if root is None or not total or last != total:
        return False
    found = checkpoints.scan(root)
    if plan.config.resolved_export_hf:
        return any(s.step == total and s.complete for s in found.exports)
    return any(s.step == total and s.complete for s in found.resume)

