"""Test double: a rank's last-step HF export waits until a stop signal has reached trnqwen's handler.

Put this folder on PYTHONPATH (tests/test_faults.py does) and every torchrun worker imports it
at start-up.  torchtitan's ``CheckpointManager._save_last_step`` (the HF export of the last step,
which trnqwen's own ``_save_last_step`` calls after saving the resumable state) prints
``EXPORT_WAITS_FOR_SIGNAL`` and waits until trnqwen's rank-side handler
(trnqwen.runtime.resume_state, installed as in production and left in place) has recorded
SIGTERM/SIGUSR1; then the real export runs.  So "a signal during the final save" happens on
every run instead of a race the save could win, and what runs after it is production code.
Only workers (LOCAL_RANK set) are touched: the launcher and torchrun's agent never import torch.
"""

import os

MARKER = "EXPORT_WAITS_FOR_SIGNAL"

if os.environ.get("LOCAL_RANK") is not None:
    import time

    from torchtitan.components.checkpointer.dcp import CheckpointManager

    _export = CheckpointManager._save_last_step

    def _export_after_signal(self, curr_step):
        from trnqwen.runtime import resume_state

        if os.environ.get("LOCAL_RANK") == "0":
            print(f"{MARKER} step {curr_step}", flush=True)
        deadline = time.monotonic() + 300
        while not resume_state.signal_received() and time.monotonic() < deadline:
            time.sleep(0.05)
        return _export(self, curr_step)

    CheckpointManager._save_last_step = _export_after_signal
