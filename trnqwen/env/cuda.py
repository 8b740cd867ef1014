"""CUDA GPUs as ``nvidia-smi`` (or ``/proc/driver/nvidia``) lists them; torch is never imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trnqwen.env.context import ProbeContext, as_int


@dataclass
class CudaFacts:
    count: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)
    source: Optional[str] = None
    error: Optional[str] = None




def cuda_facts(ctx: ProbeContext) -> CudaFacts:
    f = CudaFacts()
    exe = ctx.which("nvidia-smi")
    if exe:
        code, out, err = ctx.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
        if code == 0:
            for line in out.strip().splitlines():
                parts = [p.strip() for p in line.split(",")]
                if not parts or not parts[0]:
                    continue
                mib = as_int(parts[1]) if len(parts) > 1 else None
                f.gpus.append({"name": parts[0], "memory_bytes": mib * 1024 * 1024 if mib else None})
            f.count, f.source = len(f.gpus), "nvidia-smi"
            return f
        tail = (err or out).strip().splitlines()
        f.error = tail[-1] if tail else f"nvidia-smi exit {code}"
    gpus = ctx.path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        f.count = len([p for p in gpus.iterdir() if p.is_dir()])
        f.source = "/proc/driver/nvidia/gpus"
    return f


