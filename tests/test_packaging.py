"""Installing trnqwen must never replace a Neuron build of torch.

Only the ``dev`` extra (this CPU test machine) may name torch; the core dependencies and the
``train`` extra, which a Trainium host installs next to its Neuron torch, must not.
"""

from __future__ import annotations

import re
import tomllib

from tests.helpers import REPO_ROOT


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].strip().lower().replace("_", "-") for req in requirements}


def test_only_the_dev_extra_names_torch():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "torch" not in _names(project["dependencies"])
    extras = project["optional-dependencies"]
    for extra, requirements in extras.items():
        if extra != "dev":
            assert "torch" not in _names(requirements), f"extra [{extra}] would pull a torch build"
    assert "torch" in _names(extras["dev"])  # the test machine's pin lives there, and only there


def test_console_script_points_at_the_cli_main():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["trnqwen"] == "trnqwen.cli.main:main"


# Modules a test may skip on that no extra can install: they exist only on a Trainium host.
DEVICE_ONLY = {"torchtitan_neuron": "torchtitan's Neuron plugin, installed with the Neuron SDK"}


def test_every_module_a_test_skips_on_is_in_an_extra():
    """A test that skips when a module is missing must name a module `pip install -e '.[dev]'`
    (or another extra) brings, so the skip never hides on the test machine (wandb was in none)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    installable = _names(project["dependencies"])
    for requirements in project["optional-dependencies"].values():
        installable |= _names(requirements)
    skipped_on = set()
    for path in (REPO_ROOT / "tests").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        skipped_on |= set(re.findall(r"""(?:find_spec|importorskip)\(\s*["']([A-Za-z0-9_]+)""", text))
    assert "wandb" in skipped_on  # the scan sees the skips it is about
    missing = sorted(m for m in skipped_on if m.replace("_", "-").lower() not in installable and m not in DEVICE_ONLY)
    assert not missing, f"tests skip on {missing}, which no extra of pyproject.toml installs"
