"""The judge's rules about a DPO run (``Method.judge``), on plain data.

``facts`` (built by the judge, :mod:`trnqwen.logs.judge`, for every method):

* ``first_step``: ``{"step", "loss", "line"}`` of the first logged step, or None;
* ``start_step``: the step the log starts at when it says so (a resumed run), else None;
* ``lines``: what the method's own text lines said (``Method.log_lines``, here
  :mod:`trnqwen.methods.dpo.log_lines`): ``{"steps": {step: {values, "line"}}, "notes": {name:
  {values, "line"}}}`` (DPO's note: ``reference``), empty when the log has none;
* ``validations``: the run's validation records (``{"step", "loss", ..., its own values, "line"}``);
* ``run_config``: the run's config (run.json), or None.

Each finding is ``(severity, code, message, lines)``.  The step-1 check: before its first update
the policy is its reference, so the loss is ln 2 for sigmoid, (1/(2 beta))^2 for ipo (error
``dpo-reference-mismatch`` otherwise: a run that starts elsewhere compared itself with another
model's log-probs).  Only step 1, and only when the log starts there: a resumed run's first step
is not judged.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from trnqwen.methods.dpo.log_lines import STEP1_TOLERANCE, expected_step1, is_run, reference_note, settings


def _finding(severity: str, code: str, message: str, lines: Optional[list] = None) -> tuple:
    return severity, code, message, list(lines or [])


def rules(facts: dict[str, Any]) -> list[tuple]:
    """(severity, code, message, lines): the step-1 loss of a DPO run against its expected value."""
    first = facts.get("first_step")
    if not is_run(facts) or not first:
        return []
    loss = first["loss"]
    if first["step"] != 1 or facts.get("start_step") not in (None, 1) or not isinstance(loss, float) or not math.isfinite(loss):
        return []
    ref = reference_note(facts)
    beta, loss_type, whence = settings(facts)
    expected, written = expected_step1(beta, loss_type)
    lines = [first["line"], *([ref["line"]] if ref else [])]
    if expected is None:
        return [_finding("warning", "dpo-step1-unknown", f"step-1 DPO loss {loss:.6f}: ipo loss without a beta, "
                         "so the expected start (1/(2 beta))^2 is not known", lines)]
    known = whence is not None
    assumed = "" if known else " (sigmoid assumed: neither the log nor a run config gives the loss type)"
    if abs(loss - expected) > STEP1_TOLERANCE * max(1.0, abs(expected)):
        return [_finding("error" if known else "warning", "dpo-reference-mismatch",
                         f"step-1 DPO loss {loss:.6f}, expected {written}{assumed}: the reference log-probs do not "
                         "belong to these weights (a reference from another model or checkpoint, or weights that "
                         "changed before step 1)", lines)]
    how = f"; reference log-probs {ref['how']}" if ref else ""
    return [_finding("info", "dpo-reference", f"step-1 DPO loss {loss:.6f} = {written}{assumed}: the policy started "
                     f"at its reference{how}", lines)]
