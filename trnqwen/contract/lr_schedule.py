"""The learning-rate curve every backend trains with: torchtitan 0.3.0's formula, in one place.

torchtitan's own scheduler follows it in the torchtitan ranks; the hf-trainer ranks build their
``LambdaLR`` from :func:`lr_factor` (:mod:`trnqwen.runtime.hf_trainer`), and the launcher's
:class:`trnqwen.train.schedule.Schedule` reports the LR of any step with it, so every step trains
at the same LR on every backend.
"""

from __future__ import annotations

import math
from typing import Optional


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, decay_type: str, decay_ratio: Optional[float], min_lr_factor: float
) -> float:
    """The LR multiplier after ``step`` scheduler steps (0 = the first training step).

    torchtitan 0.3.0's schedule exactly: linear warm-up from 1/warmup, a stable phase (one
    "virtual" step, so the LR never reaches 0 at the last step), then ``decay_type`` down to
    ``min_lr_factor`` over the last ``decay_ratio`` of the steps (all of them when None).
    ``decay_ratio=0`` keeps the LR constant after warm-up.
    """
    warmup_steps = min(int(warmup_steps), total_steps)
    if decay_ratio is not None:
        decay_steps = min(round(total_steps * decay_ratio), total_steps - warmup_steps)
    else:
        decay_steps = total_steps - warmup_steps
    stable_steps = total_steps + 1 - warmup_steps - decay_steps
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step < warmup_steps + stable_steps:
        return 1.0
    progress = (step + 1 - warmup_steps - stable_steps) / decay_steps
    if decay_type == "linear":
        factor = 1 - progress
    elif decay_type == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay_type == "sqrt":
        factor = 1 - math.sqrt(progress)
    else:
        raise ValueError(f"unknown decay type {decay_type!r}")
    return min_lr_factor + (1 - min_lr_factor) * factor
