"""Package combinations known to work, and the check of an installed set against them.

Patterns are shell-style (``2.14.*``) and match the installed version with its local part
(``+cpu``, ``+cu130``) dropped unless the pattern itself has one.  Import-free on purpose:
``trnqwen check-env`` must not import torch to know what is installed: versions come from
package metadata (:func:`package_versions`) and torch's own ``version.py`` (:func:`torch_build`).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

# Every package check-env reports, as distribution names (importlib.metadata spelling).
REPORTED_PACKAGES: tuple[str, ...] = (
    "torch",
    "torch-neuronx",
    "torchtitan",
    "torchtitan-neuron",
    "nkilib",
    "neuronx-cc",
    "transformers",
    "safetensors",
    "huggingface_hub",
    "tokenizers",
    "typer",
    "rich",
    "pydantic",
)

# The Neuron packages only exist on AWS's own pip repository; the public index has placeholders.
NEURON_PACKAGES: tuple[str, ...] = ("torch-neuronx", "torchtitan-neuron", "nkilib", "neuronx-cc")
NEURON_PIP_REPO = "https://pip.repos.neuron.amazonaws.com"

# torch-neuronx below this version is the legacy XLA-based library, not the native `neuron` device.
NATIVE_TORCH_NEURONX_MIN = (2, 13)


@dataclass(frozen=True)
class Combo:
    """One set of versions tested together on one kind of device."""

    name: str
    device: str  # "neuron" | "cuda" | "cpu"
    packages: Mapping[str, str]  # distribution name -> version pattern
    python: tuple[tuple[int, int], tuple[int, int]] = ((3, 10), (3, 14))  # inclusive range
    notes: str = ""

    def matches(self, installed: Mapping[str, Optional[str]], python: tuple[int, int]) -> bool:
        return not self.mismatches(installed, python)

    def mismatches(self, installed: Mapping[str, Optional[str]], python: tuple[int, int]) -> list[str]:
        out = []
        lo, hi = self.python
        if not (lo <= python <= hi):
            out.append(f"python {python[0]}.{python[1]} (wants {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]})")
        for name, pattern in self.packages.items():
            have = installed.get(name)
            if have is None:
                out.append(f"{name} missing (wants {pattern})")
            elif not version_matches(have, pattern):
                out.append(f"{name} {have} (wants {pattern})")
        return out


KNOWN_GOOD: tuple[Combo, ...] = (
    Combo(
        name="Neuron SDK 2.33 (TorchNeuron native, torch 2.14)",
        device="neuron",
        packages={
            "torch": "2.14.*",
            "torch-neuronx": "2.14.3.0*",
            "torchtitan-neuron": "0.2.2+neuron.1",
            "neuronx-cc": "2.28.7631.0*",
        },
        python=((3, 12), (3, 14)),
        notes="driver aws-neuronx-dkms 2.31.7.0, runtime 2.35.30.0, tools 2.33.38.0",
    ),
    Combo(
        name="Neuron SDK 2.33 (TorchNeuron native, torch 2.13)",
        device="neuron",
        packages={"torch": "2.13.*", "torch-neuronx": "2.13.3.0*", "neuronx-cc": "2.28.7631.0*"},
        python=((3, 10), (3, 14)),
    ),
    Combo(
        name="CPU/dev (this project's CI)",
        device="cpu",
        packages={"torch": "2.14.1", "torchtitan": "0.3.0", "transformers": "5.24.*"},
        python=((3, 10), (3, 14)),
    ),
    Combo(
        name="CUDA (same stack as CPU/dev)",
        device="cuda",
        packages={"torch": "2.14.*", "torchtitan": "0.3.0", "transformers": "5.24.*"},
        python=((3, 10), (3, 14)),
    ),
)


def neuron_combo_for(python: tuple[int, int]) -> Combo:
    """The Neuron set to recommend on this Python: the first (newest) one whose Python range holds
    it (the torch 2.14 set needs Python >= 3.12, so 3.10 and 3.11 get the 2.13 set)."""
    neuron = [c for c in KNOWN_GOOD if c.device == "neuron"]
    return next((c for c in neuron if c.python[0] <= python <= c.python[1]), neuron[0])


def neuron_series(combo: Combo) -> str:
    """``2.14`` for a set pinning torch ``2.14.*``: the major.minor torch and torch-neuronx share."""
    return ".".join(combo.packages["torch"].split(".")[:2])


def python_note(combo: Combo) -> str:
    """`` (needs Python >= 3.12)`` when the set does not cover every Python trnqwen runs on."""
    lo = combo.python[0]
    return f" (needs Python >= {lo[0]}.{lo[1]})" if lo > (3, 10) else ""


def version_matches(version: str, pattern: str) -> bool:
    """``2.14.1+cu130`` matches ``2.14.*`` and ``2.14.1``; ``0.2.2+neuron.1`` needs its local part."""
    candidate = version if "+" in pattern else version.split("+", 1)[0]
    return fnmatch.fnmatchcase(candidate, pattern)


def release_tuple(version: Optional[str]) -> tuple[int, ...]:
    """Leading numeric release of a version string: ``2.9.0.2.15.1+abc`` -> (2, 9, 0, 2, 15, 1)."""
    if not version:
        return ()
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def is_legacy_torch_neuronx(version: Optional[str]) -> bool:
    """True for the pre-2.13 XLA-based torch-neuronx (e.g. 2.9.0.2.15.x)."""
    rel = release_tuple(version)
    return bool(rel) and rel[:2] < NATIVE_TORCH_NEURONX_MIN


@dataclass
class ComboCheck:
    best: Optional[Combo]
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.best is not None and not self.mismatches


def check_combination(
    installed: Mapping[str, Optional[str]], device: str, python: tuple[int, int]
) -> ComboCheck:
    """The known-good set for ``device`` closest to what is installed (fewest mismatches)."""
    candidates = [c for c in KNOWN_GOOD if c.device == device]
    if not candidates:
        return ComboCheck(None, [f"no known-good combination recorded for device {device}"])
    scored = sorted(((len(c.mismatches(installed, python)), i, c) for i, c in enumerate(candidates)))
    best = scored[0][2]
    return ComboCheck(best, best.mismatches(installed, python))


# --- what is installed (metadata only, nothing imported) -------------------------------------------


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
