"""Which device a run gets, decided without ever initializing the Neuron runtime here.

The launcher must never claim NeuronCores in its own process (ranks would then fail with
"NeuronCore(s) not available"), so detection reads ``neuron-ls --json-output`` and sysfs
(:mod:`trnqwen.env.neuron`) and ``nvidia-smi`` (:mod:`trnqwen.env.cuda`), never
``torch.neuron``.  :mod:`trnqwen.env.probe` builds the full check-env report on top of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trnqwen.env.context import ProbeContext
from trnqwen.env.cuda import CudaFacts, cuda_facts
from trnqwen.env.neuron import NeuronFacts, neuron_absence_fix, neuron_absence_reason, neuron_facts, neuron_peak_flops
from trnqwen.errors import EnvironmentProblem, UsageError


@dataclass
class DeviceInfo:
    type: str  # "neuron" | "cuda" | "cpu"
    count: int  # ranks one node can run: logical NeuronCores, GPUs, or 1 on CPU
    lnc: Optional[int] = None  # logical NeuronCore config (neuron only)
    memory_bytes_per_rank: Optional[int] = None  # HBM per logical core / GPU memory; None on CPU
    instance_type: Optional[str] = None
    peak_flops_per_rank: Optional[float] = None  # bf16 peak, for MFU
    host_memory_bytes: Optional[int] = None  # host RAM the ranks of one node share (cgroup limit if lower)


def device_from_facts(requested: str, nf: NeuronFacts, cf: CudaFacts) -> DeviceInfo:
    if requested not in ("auto", "neuron", "cuda", "cpu"):
        raise UsageError(f"unknown device '{requested}'", hint="use one of: auto, neuron, cuda, cpu")
    if requested in ("auto", "neuron") and nf.logical_cores > 0:
        return DeviceInfo(
            type="neuron",
            count=nf.logical_cores,
            lnc=nf.lnc,
            memory_bytes_per_rank=nf.memory_bytes_per_rank,
            instance_type=nf.instance_type,
            peak_flops_per_rank=neuron_peak_flops(nf.family, nf.lnc),
        )
    if requested == "neuron":
        raise EnvironmentProblem(
            f"--device neuron but no Neuron device found ({neuron_absence_reason(nf)})",
            hint=neuron_absence_fix(nf),
        )
    if requested in ("auto", "cuda") and cf.count > 0:
        mems = [g.get("memory_bytes") for g in cf.gpus if g.get("memory_bytes")]
        return DeviceInfo(type="cuda", count=cf.count, memory_bytes_per_rank=min(mems) if mems else None)
    if requested == "cuda":
        raise EnvironmentProblem(
            "--device cuda but no CUDA GPU found" + (f" ({cf.error})" if cf.error else " (nvidia-smi sees none)"),
            hint="run on a GPU machine with the NVIDIA driver installed, or pass --device cpu",
        )
    return DeviceInfo(type="cpu", count=1)



def detect_device(requested: str = "auto", *, ctx: Optional[ProbeContext] = None) -> DeviceInfo:
    """Resolve ``auto`` (neuron, else cuda, else cpu) and count ranks; no runtime is initialized.

    Raises :class:`EnvironmentProblem` when the requested device is not present.
    """
    ctx = ctx or ProbeContext.from_env()
    requested = (requested or "auto").lower()
    nf = neuron_facts(ctx) if requested in ("auto", "neuron") else NeuronFacts()
    cf = cuda_facts(ctx) if requested in ("auto", "cuda") and nf.logical_cores == 0 else CudaFacts()
    device = device_from_facts(requested, nf, cf)
    device.host_memory_bytes = host_memory_bytes(ctx)
    return device


def host_memory_bytes(ctx: ProbeContext) -> Optional[int]:
    """This machine's RAM for the ranks: MemTotal of ``/proc/meminfo``, or the cgroup (container)
    limit if lower; read under the probe's root, so a fake sysfs without it means "unknown"."""
    meminfo = ctx.read_text("/proc/meminfo") or ""
    total = None
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total = int(parts[1]) * 1024  # kB
    if total is None:
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = ctx.read_text(limit_file) or ""
        if text.isdigit() and 0 < int(text) < total:
            return int(text)
    return total
