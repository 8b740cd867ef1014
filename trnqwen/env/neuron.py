"""The Neuron stack as sysfs, ``neuron-ls --json-output`` and package tools describe it.

Never imports torch_neuronx here: initializing the Neuron runtime in trnqwen's own process would
hold NeuronCores the torchrun ranks need; :func:`probe_torch_neuronx` imports it in a
short-lived subprocess instead.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from trnqwen.env.context import ProbeContext, as_int
from trnqwen.errors import redact

GiB = 1024**3

# Per-chip facts by instance family (neuron-facts.md); used when neuron-ls does not say.
PHYSICAL_CORES_PER_CHIP = {"trn1": 2, "trn2": 8, "trn3": 8}
HBM_PER_CHIP = {"trn1": 32 * GiB, "trn2": 96 * GiB, "trn3": 144 * GiB}
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}
# bf16 peak of one logical core at LNC=2 on trn2 (the figure torchtitan's Neuron MFU used).
PEAK_BF16_PER_LNC2_CORE = 157e12


@dataclass
class NeuronFacts:
    driver_version: Optional[str] = None
    sysfs_devices: int = 0  # /sys/devices/virtual/neuron_device/neuron<N>
    dev_files: int = 0  # /dev/neuron<N>
    neuron_ls_path: Optional[str] = None
    neuron_ls_error: Optional[str] = None
    chips: int = 0
    physical_cores: int = 0
    logical_cores: int = 0
    lnc: Optional[int] = None
    lnc_source: Optional[str] = None
    memory_bytes_per_chip: Optional[int] = None
    memory_bytes_per_rank: Optional[int] = None
    instance_type: Optional[str] = None
    held_by: list[dict[str, Any]] = field(default_factory=list)  # other processes holding cores

    @property
    def stack_present(self) -> bool:
        """Any sign that this host is meant to run Neuron (a driver, devices or tools)."""
        return bool(self.driver_version or self.sysfs_devices or self.dev_files or self.neuron_ls_path)

    @property
    def family(self) -> Optional[str]:
        return instance_family(self.instance_type)



def instance_family(instance_type: Optional[str]) -> Optional[str]:
    """``trn2.48xlarge`` -> ``trn2``; ``trn1n.32xlarge`` -> ``trn1``."""
    if not instance_type:
        return None
    m = re.match(r"(trn\d)", instance_type.strip().lower())
    return m.group(1) if m else None



def _lnc_from_env_or_file(ctx: ProbeContext) -> tuple[Optional[int], Optional[str]]:
    value = as_int(ctx.env.get("NEURON_LOGICAL_NC_CONFIG"))
    if value in (1, 2):
        return value, "env NEURON_LOGICAL_NC_CONFIG"
    text = ctx.read_text("/opt/aws/neuron/logical_nc_config")
    if text:
        m = re.search(r"(?:NEURON_LOGICAL_NC_CONFIG\s*=\s*)?([12])\b", text)
        if m:
            return int(m.group(1)), "/opt/aws/neuron/logical_nc_config"
    return None, None


def run_neuron_ls(ctx: ProbeContext) -> tuple[Optional[str], Optional[list[dict[str, Any]]], Optional[str]]:
    """(path, chips, error) from ``neuron-ls --json-output``; chips None when it failed."""
    exe = ctx.which("neuron-ls") or (
        str(ctx.path("/opt/aws/neuron/bin/neuron-ls")) if ctx.path("/opt/aws/neuron/bin/neuron-ls").is_file() else None
    )
    if exe is None:
        return None, None, "neuron-ls not found on PATH or in /opt/aws/neuron/bin"
    code, out, err = ctx.run([exe, "--json-output"])
    if code != 0:
        detail = (err or out).strip().splitlines()
        return exe, None, f"neuron-ls --json-output failed (exit {code}): {detail[-1] if detail else 'no output'}"
    try:
        data = json.loads(out)
    except json.JSONDecodeError as exc:
        return exe, None, f"neuron-ls --json-output printed no JSON ({exc.msg})"
    if isinstance(data, dict):  # tolerate a wrapper object
        data = data.get("neuron_devices") or data.get("devices") or []
    if not isinstance(data, list):
        return exe, None, "neuron-ls --json-output printed an unexpected shape"
    return exe, [d for d in data if isinstance(d, dict)], None


def neuron_facts(ctx: ProbeContext) -> NeuronFacts:
    f = NeuronFacts()
    f.driver_version = ctx.read_text("/sys/module/neuron/version") or None
    dev_root = ctx.path("/sys/devices/virtual/neuron_device")
    sysfs_dirs = sorted(dev_root.glob("neuron[0-9]*")) if dev_root.is_dir() else []
    f.sysfs_devices = len(sysfs_dirs)
    dev = ctx.path("/dev")
    f.dev_files = len(list(dev.glob("neuron[0-9]*"))) if dev.is_dir() else 0
    f.instance_type = ctx.read_text("/sys/devices/virtual/dmi/id/product_name") or None

    f.neuron_ls_path, chips, f.neuron_ls_error = run_neuron_ls(ctx)
    env_lnc, env_src = _lnc_from_env_or_file(ctx)
    own_pid = os.getpid()

    if chips:
        f.chips = len(chips)
        ls_lnc = as_int(chips[0].get("logical_neuroncore_config"))
        logical = sum(as_int(c.get("nc_count")) or 0 for c in chips)
        f.physical_cores = logical * (ls_lnc or 1)
        mem = as_int(chips[0].get("memory_size"))
        f.memory_bytes_per_chip = mem
        f.instance_type = f.instance_type or chips[0].get("instance_type")
        if env_src == "env NEURON_LOGICAL_NC_CONFIG":
            f.lnc, f.lnc_source = env_lnc, env_src
        elif ls_lnc in (1, 2):
            f.lnc, f.lnc_source = ls_lnc, "neuron-ls"
        else:
            f.lnc, f.lnc_source = env_lnc, env_src
        for chip in chips:
            for proc in chip.get("neuron_processes") or []:
                pid = as_int(proc.get("pid"))
                if pid == own_pid:
                    continue
                f.held_by.append(
                    {
                        "pid": pid,
                        "command": redact(str(proc.get("command", "")))[:200],
                        "neuron_device": chip.get("neuron_device"),
                        "neuroncore_ids": chip.get("neuroncore_ids"),
                    }
                )
    elif sysfs_dirs:
        f.chips = len(sysfs_dirs)
        f.physical_cores = sum(as_int((d / "core_count").read_text() if (d / "core_count").is_file() else None) or 0
                               for d in sysfs_dirs)
        if not f.physical_cores and f.family:
            f.physical_cores = f.chips * PHYSICAL_CORES_PER_CHIP[f.family]
        f.lnc, f.lnc_source = env_lnc, env_src

    if f.chips and f.lnc is None and f.family:
        f.lnc, f.lnc_source = DEFAULT_LNC[f.family], f"default for {f.family}"
    if f.chips and f.lnc is None:
        f.lnc, f.lnc_source = 1, "assumed"
    if f.physical_cores and f.lnc:
        f.logical_cores = f.physical_cores // f.lnc
    if f.chips and f.memory_bytes_per_chip is None and f.family:
        f.memory_bytes_per_chip = HBM_PER_CHIP[f.family]
    if f.memory_bytes_per_chip and f.chips and f.logical_cores:
        f.memory_bytes_per_rank = f.memory_bytes_per_chip // (f.logical_cores // f.chips or 1)
    return f


def neuron_peak_flops(family: Optional[str], lnc: Optional[int]) -> Optional[float]:
    if family in ("trn2", "trn3") and lnc:
        return PEAK_BF16_PER_LNC2_CORE * lnc / 2
    return None


def neuron_compiler_version(ctx: ProbeContext) -> tuple[Optional[str], Optional[str]]:
    """(path, version) from ``neuronx-cc --version`` (it prints on stdout or stderr)."""
    exe = ctx.which("neuronx-cc") or (
        str(ctx.path("/opt/aws/neuron/bin/neuronx-cc")) if ctx.path("/opt/aws/neuron/bin/neuronx-cc").is_file() else None
    )
    if exe is None:
        return None, None
    code, out, err = ctx.run([exe, "--version"])
    m = re.search(r"version\s+([0-9][\w.+\-]*)", f"{out}\n{err}", re.IGNORECASE)
    return exe, (m.group(1) if m else None)


_TORCH_NEURONX_PROBE = r"""
import json, sys
out = {}
try:
    import torch_neuronx
    out["import_ok"] = True
    out["__version__"] = str(getattr(torch_neuronx, "__version__", None))
    try:
        from torch_neuronx import utils as u
    except Exception:
        u = None
    if u is not None and hasattr(u, "get_logical_neuron_cores"):
        try:
            out["lnc"] = str(u.get_logical_neuron_cores())
        except Exception as exc:
            out["lnc_error"] = f"{type(exc).__name__}: {exc}"
    if u is not None and hasattr(u, "get_platform_target"):
        try:
            out["platform"] = str(u.get_platform_target())
        except Exception as exc:
            out["platform_error"] = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    out["import_ok"] = False
    out["error"] = f"{type(exc).__name__}: {exc}"
print("TRNQWEN_PROBE " + json.dumps(out))
"""


def probe_torch_neuronx(ctx: ProbeContext) -> dict[str, Any]:
    """Import torch_neuronx in a short-lived subprocess (never here: it would claim cores)."""
    code, out, err = ctx.run([ctx.python, "-c", _TORCH_NEURONX_PROBE], timeout=max(ctx.timeout, 120))
    for line in out.splitlines():
        if line.startswith("TRNQWEN_PROBE "):
            return json.loads(line[len("TRNQWEN_PROBE "):])
    tail = (err or out).strip().splitlines()
    return {"import_ok": False, "error": tail[-1] if tail else f"probe exited {code}"}



def neuron_absence_reason(nf: NeuronFacts) -> str:
    if nf.driver_version and not (nf.sysfs_devices or nf.dev_files or nf.chips):
        return f"the Neuron driver {nf.driver_version} is loaded but sees no devices"
    if not nf.driver_version and not nf.sysfs_devices and not nf.dev_files:
        return "no Neuron driver loaded and no /dev/neuron* devices"
    if nf.neuron_ls_error:
        return nf.neuron_ls_error
    return "neuron-ls reports no NeuronCores"


def neuron_absence_fix(nf: NeuronFacts) -> str:
    if nf.driver_version:
        return (
            "check `lsmod | grep neuron` and `ls /dev/neuron*`; reload the driver "
            "(sudo modprobe -r neuron && sudo modprobe neuron) or reboot; on a non-Trainium "
            "instance pass --device cpu"
        )
    return "run on a Trainium instance (trn2.48xlarge) with aws-neuronx-dkms installed, or pass --device cpu"


