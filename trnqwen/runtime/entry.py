"""Rank entry point: ``python -m trnqwen.runtime.entry --module M --config F [torchtitan flags]``.

``--trnqwen-device cpu`` (stripped before torchtitan parses argv) installs the CPU shims first:
device selection before any other torchtitan import, sum reductions for FSDP over gloo, the
eager block masks and no final sleep (:mod:`trnqwen.runtime.cpu`); the device is handed to
trnqwen's Trainer (:func:`trnqwen.runtime.trainer.configure`), which adds the dense-mask SDPA
attention override for native models (torchtitan's override registry) or an SDPA
``flex_attention_forward`` for the Transformers backend when it is built.  The preemption signal
handlers are installed here (:mod:`trnqwen.runtime.resume_state`).  Then the entry is a
pass-through to ``torchtitan.train.main``: everything else trnqwen adds in a rank (resume, RNG,
preemption, the LR on the step line, LoRA's checkpoints, a method's hooks, the metrics stream)
comes from the classes the generated config module chooses (:mod:`trnqwen.runtime.trainer`).

It never runs in the launcher process, so touching the Neuron runtime here is fine.
"""

from __future__ import annotations

import sys
from typing import Optional

DEVICE_FLAG = "--trnqwen-device"


def split_own_flags(argv: list[str]) -> tuple[Optional[str], list[str]]:
    """(device or None, argv without trnqwen's own flags)."""
    device = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == DEVICE_FLAG and i + 1 < len(argv):
            device = argv[i + 1]
            i += 2
            continue
        if arg.startswith(DEVICE_FLAG + "="):
            device = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return device, rest


def main(argv: Optional[list[str]] = None) -> None:
    device, rest = split_own_flags(list(sys.argv[1:] if argv is None else argv))
    if device == "cpu":
        from trnqwen.runtime.cpu import (
            install_cpu_device, install_eager_block_masks, install_force_sum_reduction, skip_final_sleep,
        )

        install_cpu_device()  # before any other torchtitan import
        install_force_sum_reduction()
        install_eager_block_masks()
        skip_final_sleep()
    from trnqwen.runtime import resume_state, trainer

    trainer.configure(device=device)  # read by trnqwen's Trainer (the config module names it) when built
    resume_state.install()  # SIGTERM/SIGUSR1: save at the next step boundary
    sys.argv = [sys.argv[0], *rest]
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
