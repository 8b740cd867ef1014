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
