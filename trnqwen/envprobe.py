"""What this machine can train on, found without ever initializing a device runtime here.

The probe reads package metadata (``importlib.metadata``, never ``import torch``), sysfs,
``neuron-ls --json-output``, ``nvidia-smi`` and, only where torch-neuronx is installed, a
short-lived subprocess that imports it.  Initializing the Neuron runtime in trnqwen's own
process would hold NeuronCores that the torchrun ranks need ("NeuronCore(s) not available").

Everything the probe reads from outside is injectable through :class:`ProbeContext`:

* ``root``: a directory standing in for ``/`` when reading ``/sys``, ``/dev``, ``/proc`` and
  ``/opt/aws/neuron`` (env ``TRNQWEN_SYSFS_ROOT``), so tests can point it at a fake sysfs;
* ``env``: the environment, whose ``PATH`` finds ``neuron-ls``, ``neuronx-cc``,
  ``nvidia-smi`` and ``torchrun`` and whose ``PYTHONPATH`` the subprocess inherits.

:func:`probe_environment` builds the full ``check-env`` report; :func:`detect_device` is the
cheap part the launcher needs (device type, rank count, LNC, HBM per rank, peak FLOP/s).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from trnqwen.device import DeviceInfo
from trnqwen.errors import SECRET_ENV_VARS, EnvironmentProblem, UsageError, redact
from trnqwen.versions import (
    NEURON_PACKAGES,
    NEURON_PIP_REPO,
    REPORTED_PACKAGES,
    check_combination,
    is_legacy_torch_neuronx,
    release_tuple,
)

GiB = 1024**3
SYSFS_ROOT_ENV = "TRNQWEN_SYSFS_ROOT"

# Per-chip facts by instance family (neuron-facts.md); used when neuron-ls does not say.
PHYSICAL_CORES_PER_CHIP = {"trn1": 2, "trn2": 8, "trn3": 8}
HBM_PER_CHIP = {"trn1": 32 * GiB, "trn2": 96 * GiB, "trn3": 144 * GiB}
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}
# bf16 peak of one logical core at LNC=2 on trn2 (the figure torchtitan's Neuron MFU used).
PEAK_BF16_PER_LNC2_CORE = 157e12

# Below this much free space at the assets dir a Qwen3-4B fetch plus an HF export will not fit.
MIN_FREE_DISK = 20 * GiB

NEURON_INSTALL_FIX = (
    f"install it from the Neuron repository with --no-deps so the Neuron build of torch is kept: "
    f"pip install --no-deps --extra-index-url {NEURON_PIP_REPO} '{{pkg}}'"
)

SEVERITIES = ("error", "warning", "info")


# --- context ---------------------------------------------------------------------------------


@dataclass
class ProbeContext:
    """Where the probe looks: a stand-in for ``/`` and an environment (PATH, PYTHONPATH, ...)."""

    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str = sys.executable
    timeout: float = 30.0

    @classmethod
    def from_env(cls, root: Optional[Path] = None, env: Optional[Mapping[str, str]] = None) -> "ProbeContext":
        env = dict(os.environ) if env is None else dict(env)
        if root is None:
            root = Path(env[SYSFS_ROOT_ENV]) if env.get(SYSFS_ROOT_ENV) else Path("/")
        return cls(root=Path(root), env=env)

    def path(self, absolute: str) -> Path:
        """``/sys/module/neuron/version`` under the root."""
        return self.root / absolute.lstrip("/")

    def read_text(self, absolute: str) -> Optional[str]:
        try:
            return self.path(absolute).read_text(errors="replace").strip()
        except OSError:
            return None

    def which(self, name: str) -> Optional[str]:
        return shutil.which(name, path=self.env.get("PATH", ""))

    def run(self, argv: list[str], timeout: Optional[float] = None) -> tuple[Optional[int], str, str]:
        """(returncode, stdout, stderr); returncode None when it could not run or timed out."""
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=dict(self.env),
                timeout=timeout or self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return None, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr


# --- results ---------------------------------------------------------------------------------


@dataclass
class Problem:
    severity: str  # "error" blocks training on the target device; "warning"/"info" do not
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "message": redact(self.message), "fix": redact(self.fix)}


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


@dataclass
class CudaFacts:
    count: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)
    source: Optional[str] = None
    error: Optional[str] = None


@dataclass
class EnvReport:
    python: dict[str, Any]
    packages: dict[str, Optional[str]]
    torch: dict[str, Any]
    device: dict[str, Any]
    neuron: dict[str, Any]
    cuda: dict[str, Any]
    tools: dict[str, Optional[str]]
    paths: dict[str, Any]
    hf: dict[str, Any]
    combination: dict[str, Any]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        """Nothing blocks training on the detected (or requested) device."""
        return not any(p.severity == "error" for p in self.problems)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "problems"}
        out["problems"] = [p.as_dict() for p in self.problems]
        out["ok"] = self.ok
        return out


# --- small readers ---------------------------------------------------------------------------


def instance_family(instance_type: Optional[str]) -> Optional[str]:
    """``trn2.48xlarge`` -> ``trn2``; ``trn1n.32xlarge`` -> ``trn1``."""
    if not instance_type:
        return None
    m = re.match(r"(trn\d)", instance_type.strip().lower())
    return m.group(1) if m else None


def package_versions(names: tuple[str, ...] = REPORTED_PACKAGES) -> dict[str, Optional[str]]:
    """Installed distribution versions from metadata; nothing is imported."""
    out: dict[str, Optional[str]] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def is_placeholder_distribution(name: str) -> bool:
    """The public index's Neuron names are empty placeholders ("WRONG PACKAGE")."""
    try:
        meta = importlib.metadata.metadata(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    text = " ".join(str(meta.get(k) or "") for k in ("Summary", "Description")) + " " + str(meta.get_payload() or "")
    return "wrong package" in text.lower()


def torch_build() -> dict[str, Any]:
    """torch's version and build (cuda/rocm/cpu) read from ``torch/version.py``, not by importing torch."""
    info: dict[str, Any] = {"version": None, "build": None, "cuda": None, "hip": None}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return info
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return info
    values: dict[str, Any] = {}
    for key in ("__version__", "cuda", "hip"):
        m = re.search(rf"^{re.escape(key)}\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
        if m:
            raw = m.group(1).strip()
            values[key] = None if raw == "None" else raw.strip("'\"")
    info["version"] = values.get("__version__")
    info["cuda"] = values.get("cuda")
    info["hip"] = values.get("hip")
    info["build"] = "cuda" if info["cuda"] else ("rocm" if info["hip"] else "cpu")
    return info


def free_bytes(path: Path) -> tuple[Optional[Path], Optional[int]]:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return p, shutil.disk_usage(p).free
    except OSError:
        return p, None


def writable(path: Path) -> bool:
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return os.access(p, os.W_OK)


def _int(value: Any) -> Optional[int]:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


# --- Neuron ----------------------------------------------------------------------------------


def _lnc_from_env_or_file(ctx: ProbeContext) -> tuple[Optional[int], Optional[str]]:
    value = _int(ctx.env.get("NEURON_LOGICAL_NC_CONFIG"))
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
        ls_lnc = _int(chips[0].get("logical_neuroncore_config"))
        logical = sum(_int(c.get("nc_count")) or 0 for c in chips)
        f.physical_cores = logical * (ls_lnc or 1)
        mem = _int(chips[0].get("memory_size"))
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
                pid = _int(proc.get("pid"))
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
        f.physical_cores = sum(_int((d / "core_count").read_text() if (d / "core_count").is_file() else None) or 0
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


# --- CUDA ------------------------------------------------------------------------------------


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
                mib = _int(parts[1]) if len(parts) > 1 else None
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


# --- device decision -------------------------------------------------------------------------


def _device_from_facts(requested: str, nf: NeuronFacts, cf: CudaFacts) -> DeviceInfo:
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
            f"--device neuron but no Neuron device found ({_neuron_absence_reason(nf)})",
            hint=_neuron_absence_fix(nf),
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


def _neuron_absence_reason(nf: NeuronFacts) -> str:
    if nf.driver_version and not (nf.sysfs_devices or nf.dev_files or nf.chips):
        return f"the Neuron driver {nf.driver_version} is loaded but sees no devices"
    if not nf.driver_version and not nf.sysfs_devices and not nf.dev_files:
        return "no Neuron driver loaded and no /dev/neuron* devices"
    if nf.neuron_ls_error:
        return nf.neuron_ls_error
    return "neuron-ls reports no NeuronCores"


def _neuron_absence_fix(nf: NeuronFacts) -> str:
    if nf.driver_version:
        return (
            "check `lsmod | grep neuron` and `ls /dev/neuron*`; reload the driver "
            "(sudo modprobe -r neuron && sudo modprobe neuron) or reboot; on a non-Trainium "
            "instance pass --device cpu"
        )
    return "run on a Trainium instance (trn2.48xlarge) with aws-neuronx-dkms installed, or pass --device cpu"


def detect_device(requested: str = "auto", *, ctx: Optional[ProbeContext] = None) -> DeviceInfo:
    """Resolve ``auto`` (neuron, else cuda, else cpu) and count ranks; no runtime is initialized.

    Raises :class:`EnvironmentProblem` when the requested device is not present.
    """
    ctx = ctx or ProbeContext.from_env()
    requested = (requested or "auto").lower()
    nf = neuron_facts(ctx) if requested in ("auto", "neuron") else NeuronFacts()
    cf = cuda_facts(ctx) if requested in ("auto", "cuda") and nf.logical_cores == 0 else CudaFacts()
    return _device_from_facts(requested, nf, cf)


# --- the full report -------------------------------------------------------------------------


def probe_environment(
    *,
    device: str = "auto",
    assets_dir: Path = Path("assets"),
    compile_cache_dir: Optional[Path] = None,
    root: Optional[Path] = None,
    env: Optional[Mapping[str, str]] = None,
    ctx: Optional[ProbeContext] = None,
) -> EnvReport:
    """Everything ``trnqwen check-env`` shows, with one :class:`Problem` (and its fix) per issue."""
    ctx = ctx or ProbeContext.from_env(root, env)
    requested = (device or "auto").lower()
    problems: list[Problem] = []

    packages = package_versions()
    tb = torch_build()
    nf = neuron_facts(ctx)
    cf = cuda_facts(ctx)
    try:
        dev = _device_from_facts(requested, nf, cf)
        device_error = None
    except EnvironmentProblem as exc:
        dev = DeviceInfo(type=requested, count=0)
        device_error = exc
        problems.append(Problem("error", exc.message, exc.hint or ""))
    target = dev.type

    neuron_installed = packages.get("torch-neuronx") is not None
    tnx: dict[str, Any] = {}
    if neuron_installed and not is_placeholder_distribution("torch-neuronx"):
        tnx = probe_torch_neuronx(ctx)
    compiler_path, compiler_version = neuron_compiler_version(ctx)

    torch_ver = packages.get("torch")
    # A Neuron host runs the CPU build of torch with torch-neuronx adding the `neuron` device.
    build = "neuron" if neuron_installed else tb["build"]
    torch_info = {
        "version": tb["version"] or torch_ver,
        "build": build if torch_ver else None,
        "cuda": tb["cuda"],
        "torch_neuronx": packages.get("torch-neuronx"),
        "torch_neuronx_legacy": is_legacy_torch_neuronx(packages.get("torch-neuronx")),
        "torch_neuronx_probe": tnx or None,
    }

    # -- packages every device needs --
    for name, why in (
        ("torch", "the ranks run PyTorch"),
        ("torchtitan", "training runs torchtitan.train"),
        ("transformers", "the default hf-v5 backend and the tokenizer need it"),
        ("safetensors", "checkpoint export and verify-ckpt read safetensors"),
        ("huggingface_hub", "fetch downloads with it"),
    ):
        if packages.get(name) is None:
            if name == "torch" and target == "neuron":
                fix = "install the Neuron build of torch (torch 2.14 with torch-neuronx 2.14.*) from the Neuron repository"
            elif name == "torch":
                fix = "pip install torch==2.14.1 (CPU/CUDA build), or `make venv`"
            elif name == "torchtitan":
                fix = "pip install 'trnqwen[train]' (torchtitan 0.3.0), or `make venv`"
            else:
                fix = f"pip install '{name}' (or `pip install 'trnqwen[train]'`)"
            problems.append(Problem("error", f"{name} not installed: {why}", fix))

    # -- placeholders from the public index --
    for name in NEURON_PACKAGES:
        if packages.get(name) and is_placeholder_distribution(name):
            problems.append(
                Problem(
                    "error",
                    f"{name} {packages[name]} is the empty placeholder from the public package index",
                    f"pip uninstall -y {name}; then " + NEURON_INSTALL_FIX.format(pkg=name),
                )
            )

    # -- device-specific --
    neuron_target = target == "neuron" or (requested == "auto" and (nf.stack_present or neuron_installed))
    if nf.stack_present and nf.logical_cores == 0 and requested != "cpu" and device_error is None:
        severity = "error" if requested in ("auto", "neuron") and target != "cuda" else "warning"
        problems.append(
            Problem(severity, f"no usable Neuron device: {_neuron_absence_reason(nf)}", _neuron_absence_fix(nf))
        )
    if neuron_target:
        _neuron_problems(problems, packages, nf, tnx, compiler_version, torch_info, strict=target == "neuron")
    if target == "cuda" and torch_ver and tb["build"] == "cpu":
        problems.append(
            Problem(
                "error",
                f"torch {tb['version']} is a CPU build but {cf.count} CUDA GPU(s) are present",
                "install a CUDA build of torch 2.14 (pip install torch==2.14.* --index-url https://download.pytorch.org/whl/cu128)",
            )
        )

    # -- known-good combinations --
    py = sys.version_info[:2]
    combo = check_combination(packages, target if target in ("neuron", "cuda", "cpu") else "cpu", py)
    if combo.best is not None and combo.mismatches:
        best = combo.best
        wanted = [f"{k}=={v}" for k, v in best.packages.items() if any(m.startswith(f"{k} ") for m in combo.mismatches)]
        steps = []
        if any(m.startswith("python ") for m in combo.mismatches):
            steps.append(f"use Python {best.python[0][0]}.{best.python[0][1]}-{best.python[1][0]}.{best.python[1][1]}")
        if wanted:
            steps.append(
                "install " + ", ".join(wanted)
                + (f" (Neuron packages from {NEURON_PIP_REPO} with --no-deps)" if target == "neuron" else "")
            )
        problems.append(
            Problem(
                "warning",
                f"untested combination for {target} (closest known-good: {best.name}): " + "; ".join(combo.mismatches),
                "; ".join(steps) or "install the versions listed in trnqwen/versions.py",
            )
        )

    # -- tools --
    torchrun = ctx.which("torchrun")
    if torchrun is None:
        venv_torchrun = Path(ctx.python).parent / "torchrun"
        problems.append(
            Problem(
                "warning" if packages.get("torch") else "error",
                "torchrun is not on PATH",
                f"activate the virtualenv (source {Path(ctx.python).parent}/activate) or add "
                f"{Path(ctx.python).parent} to PATH"
                + ("" if venv_torchrun.exists() else "; install torch to get torchrun"),
            )
        )

    # -- paths --
    assets = Path(assets_dir).expanduser()
    disk_at, free = free_bytes(assets)
    if free is not None and free < MIN_FREE_DISK:
        problems.append(
            Problem(
                "warning",
                f"only {free / GiB:.1f} GiB free at {disk_at} (assets {assets}); Qwen3-4B weights plus an "
                f"HF export need about {MIN_FREE_DISK // GiB} GiB",
                "free space there, or point --assets-dir / TRNQWEN_ASSETS_DIR at a larger volume",
            )
        )
    cache_env = ctx.env.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    cache = Path(cache_env) if cache_env else (compile_cache_dir or Path(".trnqwen/neff-cache"))
    cache_ok = writable(cache)
    if not cache_ok:
        problems.append(
            Problem(
                "error" if target == "neuron" else "warning",
                f"compile cache dir {cache} is not writable",
                "set TORCH_NEURONX_NEFF_CACHE_DIR (or compile_cache_dir in trnqwen.toml) to a writable folder",
            )
        )

    # -- Hugging Face --
    token_set = any(ctx.env.get(n) for n in SECRET_ENV_VARS) or _hf_token_file(ctx).is_file()
    offline = ctx.env.get("HF_HUB_OFFLINE")
    assets_present = (assets / "config.json").is_file()
    if offline not in (None, "", "0", "false", "False") and not assets_present:
        problems.append(
            Problem(
                "info",
                f"HF_HUB_OFFLINE={offline} and no model at {assets}: fetch cannot download",
                "unset HF_HUB_OFFLINE to fetch, or copy an existing snapshot there",
            )
        )

    device_dict: dict[str, Any] = {
        "type": dev.type,
        "count": dev.count,
        "requested": requested,
        "lnc": dev.lnc,
        "memory_bytes_per_rank": dev.memory_bytes_per_rank,
        "instance_type": dev.instance_type or nf.instance_type,
        "peak_flops_per_rank": dev.peak_flops_per_rank,
    }
    neuron_dict = {
        "driver_version": nf.driver_version,
        "devices": nf.chips or nf.sysfs_devices,
        "physical_cores": nf.physical_cores,
        "logical_cores": nf.logical_cores,
        "lnc": nf.lnc,
        "lnc_source": nf.lnc_source,
        "memory_bytes_per_chip": nf.memory_bytes_per_chip,
        "memory_bytes_per_rank": nf.memory_bytes_per_rank,
        "instance_type": nf.instance_type,
        "neuron_ls": nf.neuron_ls_path,
        "neuron_ls_error": nf.neuron_ls_error if nf.stack_present else None,
        "compiler_version": compiler_version,
        "held_by_other_processes": nf.held_by,
    }
    return EnvReport(
        python={"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()},
        packages=packages,
        torch=torch_info,
        device=device_dict,
        neuron=neuron_dict,
        cuda={"count": cf.count, "gpus": cf.gpus, "source": cf.source},
        tools={
            "torchrun": torchrun,
            "neuron-ls": nf.neuron_ls_path,
            "neuronx-cc": compiler_path,
            "nvidia-smi": ctx.which("nvidia-smi"),
        },
        paths={
            "assets_dir": str(assets),
            "assets_present": assets_present,
            "free_bytes_at_assets": free,
            "compile_cache_dir": str(cache),
            "compile_cache_writable": cache_ok,
        },
        hf={"token_set": bool(token_set), "hub_offline": offline},
        combination={
            "closest": combo.best.name if combo.best else None,
            "ok": combo.ok,
            "mismatches": combo.mismatches,
        },
        problems=sorted(problems, key=lambda p: SEVERITIES.index(p.severity)),
    )


def _hf_token_file(ctx: ProbeContext) -> Path:
    hf_home = ctx.env.get("HF_HOME") or str(Path(ctx.env.get("HOME", "~")).expanduser() / ".cache" / "huggingface")
    return Path(ctx.env.get("HF_TOKEN_PATH") or Path(hf_home) / "token")


def _neuron_problems(
    problems: list[Problem],
    packages: Mapping[str, Optional[str]],
    nf: NeuronFacts,
    tnx: Mapping[str, Any],
    compiler_version: Optional[str],
    torch_info: Mapping[str, Any],
    *,
    strict: bool,
) -> None:
    """Problems of the Neuron stack; ``strict`` when the run will use it (else warnings)."""
    blocking = "error" if strict else "warning"
    tnx_ver = packages.get("torch-neuronx")
    if tnx_ver is None:
        problems.append(
            Problem(blocking, "torch-neuronx not installed: the native `neuron` device needs it",
                    NEURON_INSTALL_FIX.format(pkg="torch-neuronx==2.14.*"))
        )
    elif is_legacy_torch_neuronx(tnx_ver):
        problems.append(
            Problem(
                blocking,
                f"torch-neuronx {tnx_ver} is the legacy XLA-based library (before 2.13), not the native "
                "`neuron` device torchtitan needs",
                "upgrade to the native backend (Neuron SDK 2.33): "
                + NEURON_INSTALL_FIX.format(pkg="torch-neuronx==2.14.*")
                + " with torch 2.14",
            )
        )
    else:
        torch_ver = packages.get("torch")
        if torch_ver and release_tuple(torch_ver)[:2] != release_tuple(tnx_ver)[:2]:
            problems.append(
                Problem(
                    blocking,
                    f"torch {torch_ver} does not match torch-neuronx {tnx_ver} (they must share major.minor)",
                    f"install torch=={'.'.join(map(str, release_tuple(tnx_ver)[:2]))}.* or the matching "
                    "torch-neuronx, from the Neuron repository with --no-deps",
                )
            )
        if tnx and not tnx.get("import_ok", True):
            problems.append(
                Problem(
                    blocking,
                    f"torch-neuronx {tnx_ver} is installed but does not import: {tnx.get('error')}",
                    "reinstall torch-neuronx matching your torch from the Neuron repository with --no-deps",
                )
            )
        lnc_reported = _int(tnx.get("lnc")) if tnx else None
        if lnc_reported and nf.lnc and lnc_reported != nf.lnc:
            problems.append(
                Problem(
                    "warning",
                    f"torch_neuronx reports LNC={lnc_reported} but the device is configured for LNC={nf.lnc} "
                    f"({nf.lnc_source})",
                    "set NEURON_LOGICAL_NC_CONFIG to one value for the ranks and the compiler (--lnc)",
                )
            )
    if packages.get("neuronx-cc") is None and compiler_version is None:
        problems.append(
            Problem(blocking, "neuronx-cc (the Neuron compiler) not found",
                    NEURON_INSTALL_FIX.format(pkg="neuronx-cc==2.*"))
        )
    if packages.get("torchtitan-neuron") is None:
        problems.append(
            Problem(
                "warning",
                "torchtitan-neuron not installed: the Trainium override modules of the native and nki-moe "
                "backends come from it",
                "clone torchtitan-neuron (release 0.2.2+neuron.1), `pip install -r requirements.txt` and "
                "`pip install -e .` with --no-deps",
            )
        )
    if packages.get("nkilib") is None:
        problems.append(
            Problem("info", "nkilib not installed: only the nki-moe backend needs it",
                    NEURON_INSTALL_FIX.format(pkg="nkilib"))
        )
    if nf.stack_present and not nf.driver_version:
        problems.append(
            Problem(blocking, "Neuron driver version unknown (/sys/module/neuron/version missing)",
                    "install/load aws-neuronx-dkms (sudo modprobe neuron)")
        )
    if nf.held_by:
        who = ", ".join(
            f"pid {h['pid']} ({h['command'] or '?'}) on device {h['neuron_device']}" for h in nf.held_by[:4]
        )
        more = f" and {len(nf.held_by) - 4} more" if len(nf.held_by) > 4 else ""
        pids = " ".join(str(h["pid"]) for h in nf.held_by if h["pid"] is not None)
        problems.append(
            Problem(
                blocking,
                f"NeuronCores are held by other processes: {who}{more}; ranks would fail with "
                "'NeuronCore(s) not available'",
                f"stop them (kill {pids}) or wait for them to finish, then rerun",
            )
        )
