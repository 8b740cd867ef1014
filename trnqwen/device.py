"""Which device a run gets, decided without ever initializing the Neuron runtime here.

The launcher must never claim NeuronCores in its own process (ranks would then fail with
"NeuronCore(s) not available"), so detection reads ``neuron-ls --json-output`` and sysfs,
never ``torch.neuron``.  ``trnqwen.envprobe`` builds the full check-env report on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DeviceInfo:
    type: str  # "neuron" | "cuda" | "cpu"
    count: int  # ranks one node can run: logical NeuronCores, GPUs, or 1 on CPU
    lnc: Optional[int] = None  # logical NeuronCore config (neuron only)
    memory_bytes_per_rank: Optional[int] = None  # HBM per logical core / GPU memory; None on CPU
    instance_type: Optional[str] = None
    peak_flops_per_rank: Optional[float] = None  # bf16 peak, for MFU


def detect_device(requested: str = "auto") -> DeviceInfo:
    """Resolve ``auto`` (neuron, else cuda, else cpu) and count what is there.

    Implemented in :mod:`trnqwen.envprobe`; kept here as the stable entry point for the launcher.
    """
    from trnqwen.envprobe import detect_device as _detect

    return _detect(requested)
