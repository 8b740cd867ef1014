"""Where the environment probe looks: a stand-in for ``/`` and an environment, injectable.

* ``root``: a directory standing in for ``/`` when reading ``/sys``, ``/dev``, ``/proc`` and
  ``/opt/aws/neuron`` (env ``TRNQWEN_SYSFS_ROOT``), so tests can point it at a fake sysfs;
* ``env``: the environment, whose ``PATH`` finds ``neuron-ls``, ``neuronx-cc``,
  ``nvidia-smi`` and ``torchrun`` and whose ``PYTHONPATH`` the subprocess inherits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

SYSFS_ROOT_ENV = "TRNQWEN_SYSFS_ROOT"


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



def as_int(value: Any) -> Optional[int]:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


