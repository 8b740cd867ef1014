"""A fake Trainium host: sysfs tree, `neuron-ls`/`neuronx-cc` on PATH, a fake `torch_neuronx`.

``neuron_host(tmp_path, ...)`` builds one and returns the environment variables that make
trnqwen's probe (and a subprocess importing ``torch_neuronx``) see it:

* ``TRNQWEN_SYSFS_ROOT``: a directory standing in for ``/`` (``sys/``, ``dev/``, ``opt/aws/neuron``);
* ``PATH``: ``bin/`` here first (``neuron-ls``, ``neuronx-cc``);
* ``PYTHONPATH``: ``site/`` (torch-neuronx 2.14.3.0, neuronx-cc, torchtitan-neuron dist-info) or
  ``legacy_site/`` (torch-neuronx 2.9.0.2.15.1, the pre-2.13 XLA library);
* ``FAKE_NEURON_LS_JSON``: the chips ``neuron-ls --json-output`` reports.

Shapes follow ../shared/reference/neuron-facts.md: a trn2.48xlarge has 16 chips of 8 physical
NeuronCores and 96 GiB HBM; at LNC=2 neuron-ls reports nc_count 4 per chip (64 logical cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

HERE = Path(__file__).resolve().parent
BIN = HERE / "bin"
SITE = HERE / "site"
LEGACY_SITE = HERE / "legacy_site"
CUDA_BIN = HERE.parent / "cuda" / "bin"

GiB = 1024**3
TRN2_CHIPS = 16
TRN2_PHYSICAL_CORES_PER_CHIP = 8
TRN2_HBM_PER_CHIP = 96 * GiB
DRIVER_VERSION = "2.31.7.0"


def trn2_chips(lnc: int = 2, held: Iterable[tuple[int, int, str]] = ()) -> list[dict]:
    """``neuron-ls --json-output`` for a trn2.48xlarge; ``held`` = (chip, pid, command) triples."""
    per_chip = TRN2_PHYSICAL_CORES_PER_CHIP // lnc
    held_by: dict[int, list[dict]] = {}
    for chip, pid, command in held:
        held_by.setdefault(chip, []).append({"pid": pid, "command": command, "neuron_runtime_version": "2.35.30.0"})
    chips = []
    for i in range(TRN2_CHIPS):
        chips.append(
            {
                "neuron_device": i,
                "bdf": f"0000:{0xcc + i:02x}:00.0",
                "cpu_affinity": "0-47,96-143" if i < 8 else "48-95,144-191",
                "numa_node": "0" if i < 8 else "1",
                "connected_to": [(i + 1) % 16, (i + 15) % 16, (i + 4) % 16, (i + 12) % 16],
                "nc_count": per_chip,
                "logical_neuroncore_config": lnc,
                "memory_size": TRN2_HBM_PER_CHIP,
                "neuroncore_ids": list(range(i * per_chip, (i + 1) * per_chip)),
                "neuron_processes": held_by.get(i, []),
                "instance_type": "trn2.48xlarge",
                "instance_id": "i-0123456789abcdef0",
            }
        )
    return chips


def make_sysfs(
    root: Path,
    *,
    instance: str = "trn2.48xlarge",
    chips: int = TRN2_CHIPS,
    driver: Optional[str] = DRIVER_VERSION,
    physical_cores_per_chip: int = TRN2_PHYSICAL_CORES_PER_CHIP,
    lnc_file: Optional[int] = None,
) -> Path:
    """The parts of /sys, /dev and /opt/aws/neuron the probe reads."""
    dmi = root / "sys/devices/virtual/dmi/id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "product_name").write_text(instance + "\n")
    if driver is not None:
        (root / "sys/module/neuron").mkdir(parents=True, exist_ok=True)
        (root / "sys/module/neuron/version").write_text(driver + "\n")
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(chips):
        d = root / f"sys/devices/virtual/neuron_device/neuron{i}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "core_count").write_text(f"{physical_cores_per_chip}\n")
        (root / f"dev/neuron{i}").write_text("")
    if lnc_file is not None:
        (root / "opt/aws/neuron").mkdir(parents=True, exist_ok=True)
        (root / "opt/aws/neuron/logical_nc_config").write_text(f"NEURON_LOGICAL_NC_CONFIG={lnc_file}\n")
    return root


def neuron_host(
    tmp_path: Path,
    *,
    lnc: int = 2,
    held: Iterable[tuple[int, int, str]] = (),
    devices: bool = True,
    legacy: bool = False,
    neuron_ls: bool = True,
    torch_neuronx: bool = True,
) -> dict[str, str]:
    """Build a fake trn2.48xlarge under ``tmp_path`` and return the env that points at it."""
    root = make_sysfs(tmp_path / "root", chips=TRN2_CHIPS if devices else 0)
    chips = trn2_chips(lnc, held) if devices else []
    ls_json = tmp_path / "neuron-ls.json"
    ls_json.write_text(json.dumps(chips))
    path = [str(BIN)] if neuron_ls else []
    if not neuron_ls:  # keep neuronx-cc reachable without neuron-ls
        only_cc = tmp_path / "bin"
        only_cc.mkdir(exist_ok=True)
        (only_cc / "neuronx-cc").symlink_to(BIN / "neuronx-cc")
        path = [str(only_cc)]
    env = {
        "TRNQWEN_SYSFS_ROOT": str(root),
        "PATH": os.pathsep.join(path + [os.environ.get("PATH", "")]),
        "FAKE_NEURON_LS_JSON": str(ls_json),
    }
    if torch_neuronx:
        env["PYTHONPATH"] = str(LEGACY_SITE if legacy else SITE)
    if lnc == 1:
        env["NEURON_LOGICAL_NC_CONFIG"] = "1"
    return env
