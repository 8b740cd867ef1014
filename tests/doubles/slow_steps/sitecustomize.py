"""Test double: every training step of a torchtitan rank takes at least SLOW_STEPS_SLEEP_S seconds.

The tiny CPU model trains a step in about 0.1 s, so a test that sends a real signal "after step
3" would race the end of the run.  Put this folder on PYTHONPATH (tests/test_preemption.py does)
and each rank sleeps in torchtitan's per-step ``CheckpointManager.save`` call before the real
one (trnqwen's own wrapper, installed in production, calls it and then checks for a signal):
losses, checkpoints and trnqwen's signal handling are untouched, only the pace changes.  Only
workers (LOCAL_RANK set) are touched: the launcher and torchrun's agent never import torch.
"""

import os

if os.environ.get("LOCAL_RANK") is not None and os.environ.get("SLOW_STEPS_SLEEP_S"):
    import time

    from torchtitan.components.checkpointer.dcp import CheckpointManager

    _pause = float(os.environ["SLOW_STEPS_SLEEP_S"])
    _save = CheckpointManager.save

    def _slow_save(self, curr_step, last_step=False):
        time.sleep(_pause)
        return _save(self, curr_step, last_step)

    CheckpointManager.save = _slow_save
