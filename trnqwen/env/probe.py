"""``trnqwen check-env``: what this machine can train on, found without initializing a device here.

The probe reads package metadata (:mod:`trnqwen.env.versions`, never ``import torch``), sysfs
and ``neuron-ls --json-output`` (:mod:`trnqwen.env.neuron`), ``nvidia-smi``
(:mod:`trnqwen.env.cuda`) and, only where torch-neuronx is installed, a short-lived subprocess
that imports it.  Initializing the Neuron runtime in trnqwen's own process would hold
NeuronCores that the torchrun ranks need ("NeuronCore(s) not available").

Everything it reads from outside is injectable through :class:`~trnqwen.env.context.ProbeContext`.
:func:`probe_environment` builds the full report with one :class:`Problem` (and its fix) per
issue; the device decision itself is :mod:`trnqwen.env.device`, which the launcher uses alone.
"""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from trnqwen.assets import folder_problems
from trnqwen.env.context import ProbeContext, as_int
from trnqwen.env.cuda import cuda_facts
from trnqwen.env.device import DeviceInfo, device_from_facts
from trnqwen.env.neuron import (
    GiB,
    NeuronFacts,
    neuron_absence_fix,
    neuron_absence_reason,
    neuron_compiler_version,
    neuron_facts,
    probe_torch_neuronx,
)
from trnqwen.env.versions import (
    KNOWN_GOOD,
    NEURON_PACKAGES,
    NEURON_PIP_REPO,
    check_combination,
    is_legacy_torch_neuronx,
    is_placeholder_distribution,
    neuron_combo_for,
    neuron_series,
    package_versions,
    python_note,
    release_tuple,
    torch_build,
)
from trnqwen.errors import SECRET_ENV_VARS, EnvironmentProblem, redact
from trnqwen.fsutil import free_bytes, writable
from trnqwen.units import format_bytes

# Below this much free space at the assets dir a Qwen3-4B fetch plus an HF export will not fit.
MIN_FREE_DISK = 20 * GiB

NEURON_INSTALL_FIX = (
    f"install it from the Neuron repository with --no-deps so the Neuron build of torch is kept: "
    f"pip install --no-deps --extra-index-url {NEURON_PIP_REPO} '{{pkg}}'"
)

SEVERITIES = ("error", "warning", "info")


@dataclass
class Problem:
    severity: str  # "error" blocks training on the target device; "warning"/"info" do not
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "message": redact(self.message), "fix": redact(self.fix)}



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




def probe_environment(
    *,
    device: str = "auto",
    assets_dir: Path = Path("assets"),
    compile_cache_dir: Optional[Path] = None,
    root: Optional[Path] = None,
    env: Optional[Mapping[str, str]] = None,
    ctx: Optional[ProbeContext] = None,
    model: Optional[str] = None,
    check_assets: bool = True,
) -> EnvReport:
    """Everything ``trnqwen check-env`` shows, with one :class:`Problem` (and its fix) per issue.

    ``model`` names the fetch command in the fix for missing assets; ``check_assets=False`` skips
    the model folder (the quickstart checks the machine before it fetches)."""
    ctx = ctx or ProbeContext.from_env(root, env)
    requested = (device or "auto").lower()
    problems: list[Problem] = []

    packages = package_versions()
    tb = torch_build()
    nf = neuron_facts(ctx)
    cf = cuda_facts(ctx)
    try:
        dev = device_from_facts(requested, nf, cf)
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
                series = neuron_series(neuron_combo_for(sys.version_info[:2]))
                fix = (
                    f"install the Neuron build of torch (torch {series} with torch-neuronx {series}.*) "
                    "from the Neuron repository"
                )
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
            Problem(severity, f"no usable Neuron device: {neuron_absence_reason(nf)}", neuron_absence_fix(nf))
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
                "; ".join(steps) or "install the versions listed in trnqwen/env/versions.py",
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
                f"only {format_bytes(free, smallest='GiB', largest='GiB')} free at {disk_at} (assets {assets}); Qwen3-4B weights plus an "
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

    # -- the model: training cannot start without it --
    if check_assets:
        fix = f"fetch it: {fetch_command(model, assets)}"
        problems.extend(Problem("error", p.message, fix) for p in folder_problems(assets, weights=False))

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


def fetch_command(model: Optional[str], assets: Path) -> str:
    """The ``trnqwen fetch`` line that puts ``model`` where training will look (``assets``)."""
    from trnqwen.fetch.plan import default_local_dir

    if model and Path(assets) == default_local_dir(model):
        return shlex.join(["trnqwen", "fetch", model])
    return shlex.join(["trnqwen", "fetch", model or "MODEL", "--local-dir", str(assets)])


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
    # One recommendation per Python: the torch 2.14 set needs Python >= 3.12 (3.10/3.11 get 2.13).
    combo = neuron_combo_for(sys.version_info[:2])
    series = neuron_series(combo)
    tnx_pin = f"torch-neuronx=={series}.*"
    newest = next(c for c in KNOWN_GOOD if c.device == "neuron")
    newer = (
        f"; torch-neuronx {neuron_series(newest)} needs Python >= {newest.python[0][0]}.{newest.python[0][1]}"
        if newest is not combo
        else python_note(combo).replace(" (needs", "; it needs").rstrip(")")
    )
    tnx_ver = packages.get("torch-neuronx")
    if tnx_ver is None:
        problems.append(
            Problem(blocking, "torch-neuronx not installed: the native `neuron` device needs it",
                    NEURON_INSTALL_FIX.format(pkg=tnx_pin) + newer)
        )
    elif is_legacy_torch_neuronx(tnx_ver):
        problems.append(
            Problem(
                blocking,
                f"torch-neuronx {tnx_ver} is the legacy XLA-based library (before 2.13), not the native "
                "`neuron` device torchtitan needs",
                "upgrade to the native backend (Neuron SDK 2.33): "
                + NEURON_INSTALL_FIX.format(pkg=tnx_pin)
                + f" with torch {series}{newer}",
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
        lnc_reported = as_int(tnx.get("lnc")) if tnx else None
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
