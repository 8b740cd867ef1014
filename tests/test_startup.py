"""Start-up stays light: the CLI module and check-env never import torch/transformers/torchtitan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO_ROOT

HEAVY = ("torch", "transformers", "torchtitan", "numpy", "safetensors", "huggingface_hub", "matplotlib")

_REPORT = """
import atexit, json, sys
def _report():
    sys.stderr.write("LOADED " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {names})) + "\\n")
atexit.register(_report)
"""


def _loaded_after(code: str, names=HEAVY) -> list[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    script = _REPORT.format(names=set(names)) + code
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("LOADED ")]
    assert lines, proc.stderr
    return sorted({m.split(".")[0] for m in json.loads(lines[-1][len("LOADED "):])})


def test_importing_the_cli_loads_nothing_heavy():
    assert _loaded_after("import trnqwen.cli.main", HEAVY + ("typer", "rich", "pydantic")) == []


def test_root_help_needs_no_typer():
    code = "from trnqwen.cli.main import main\nmain(['--help'])"
    assert _loaded_after(code, HEAVY + ("typer", "rich", "pydantic")) == []


def test_subcommand_help_loads_nothing_heavy():
    assert _loaded_after("from trnqwen.cli.main import main\nmain(['check-env', '--help'])") == []


def test_check_env_does_not_import_torch_in_process():
    code = "from trnqwen.cli.main import main\nmain(['check-env', '--json'])"
    assert _loaded_after(code) == []


def test_detect_device_does_not_import_torch():
    assert _loaded_after("from trnqwen.env.device import detect_device\ndetect_device('auto')") == []
