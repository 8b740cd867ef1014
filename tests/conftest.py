"""Test isolation: HOME, caches and TRNQWEN_*/HF_* env point at temp folders.

Nothing a test does touches the developer's real config, caches or tokens, and
nothing reaches the network (HF_HUB_OFFLINE=1 unless a test starts its own server).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# A shell starts a background job (`make test &`) with SIGINT ignored, and every process the tests start
# inherits that: the Ctrl-C tests (a fetch, the quickstart's lanes, a run) then wait for an interrupt that
# never comes. Python's own handler back, as in a foreground run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """One tiny Qwen3 HF snapshot for the session (built offline, deterministic); a module may
    define its own."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "assets" / "hf" / "tiny-qwen3")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    for name in list(os.environ):
        if name.startswith(("TRNQWEN_", "HF_", "HUGGING")) or name in ("TORCH_NEURONX_NEFF_CACHE_DIR",):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    yield home


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test from an empty working directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cli():
    """Run the real CLI entry point in-process; returns (exit_code, stdout, stderr)."""
    from tests.helpers import run_cli

    return run_cli


@pytest.fixture
def neuron_double(monkeypatch):
    """torchtitan-neuron's test double (tests/doubles/torchtitan_neuron), imported fresh; its CALLS
    list records every call of the documented entry point."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "doubles"))
    for name in [m for m in sys.modules if m.startswith("torchtitan_neuron")]:
        monkeypatch.delitem(sys.modules, name)
    yield importlib.import_module("torchtitan_neuron.models.qwen3.config_registry")
    for name in [m for m in sys.modules if m.startswith("torchtitan_neuron")]:
        sys.modules.pop(name, None)
