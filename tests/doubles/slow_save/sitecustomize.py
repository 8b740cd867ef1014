"""Test double: a rank's last-step save blocks until SIGTERM has arrived, then dies of it.

Put this folder on PYTHONPATH (tests/test_faults.py does) and every torchrun worker imports it
at start-up.  torchtitan's ``CheckpointManager._save_last_step`` (the HF export of the last step)
then prints ``EXPORT_WAITS_FOR_SIGTERM`` and waits; when the SIGTERM that trnqwen forwards arrives,
the rank dies of it inside the save, so "SIGTERM during the save" is what happens on every run
instead of a race the save could win.  Only workers (LOCAL_RANK set) are touched: the launcher
and torchrun's agent never import torch.
"""

import os

MARKER = "EXPORT_WAITS_FOR_SIGTERM"

if os.environ.get("LOCAL_RANK") is not None:
    import signal
    import time

    from torchtitan.components.checkpointer.dcp import CheckpointManager

    def _save_after_sigterm(self, curr_step):
        arrived = []
        signal.signal(signal.SIGTERM, lambda *_: arrived.append(True))
        if os.environ.get("LOCAL_RANK") == "0":
            print(f"{MARKER} step {curr_step}", flush=True)
        while not arrived:
            time.sleep(0.05)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # die of it here, inside the save
        time.sleep(60)

    CheckpointManager._save_last_step = _save_after_sigterm
