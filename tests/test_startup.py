"""Start-up stays light: the CLI module and check-env never import torch/transformers/torchtitan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

HEAVY = ("torch", "transformers", "torchtitan", "numpy", "safetensors", "huggingface_hub", "matplotlib")

_REPORT = """
import atexit, json, sys
def _report():
    sys.stderr.write("LOADED " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {names})) + "\\n")
atexit.register(_report)
"""


def _run_reporting(code: str, names=HEAVY, **env_overrides: str) -> tuple[list[str], str]:
    """(top-level packages of ``names`` loaded when ``code`` ends, its stdout)."""
    env = dict(os.environ, **env_overrides)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    script = _REPORT.format(names=set(names)) + code
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("LOADED ")]
    assert lines, proc.stderr
    return sorted({m.split(".")[0] for m in json.loads(lines[-1][len("LOADED "):])}), proc.stdout


def _loaded_after(code: str, names=HEAVY, **env_overrides: str) -> list[str]:
    return _run_reporting(code, names, **env_overrides)[0]


def test_importing_the_cli_loads_nothing_heavy():
    assert _loaded_after("import trnqwen.cli.main", HEAVY + ("typer", "rich", "pydantic")) == []


def test_root_help_needs_no_typer():
    code = "from trnqwen.cli.main import main\nmain(['--help'])"
    assert _loaded_after(code, HEAVY + ("typer", "rich", "pydantic")) == []


def test_subcommand_help_loads_nothing_heavy():
    assert _loaded_after("from trnqwen.cli.main import main\nmain(['check-env', '--help'])", COLUMNS="80") == []


# --- the subcommand help fast path: typer's own text, generated, never drifting ---------------


def test_the_help_module_holds_what_typer_renders_now():
    """trnqwen/cli/_help_text.py equals a fresh render of every command through typer (regenerate
    with `make docs` after changing any help text)."""
    from trnqwen.cli import docgen

    assert docgen.HELP_MODULE.read_text(encoding="utf-8") == docgen.render_help_module(), "run `make docs`"


@pytest.mark.parametrize("columns", ["80", "100", "132"])
def test_subcommand_help_is_typers_text_without_importing_typer(columns, monkeypatch):
    """A real process prints the same bytes typer prints at that width, with no typer, pydantic or rich."""
    from trnqwen.cli import docgen

    loaded, out = _run_reporting(
        "from trnqwen.cli.main import main\nmain(['config', 'show', '--help'])",
        HEAVY + ("typer", "rich", "pydantic"),
        COLUMNS=columns,
    )
    assert loaded == []
    monkeypatch.setenv("COLUMNS", columns)
    assert out == docgen.render_typer_help(["config", "show"], int(columns))


def test_a_width_without_stored_text_is_rendered_by_typer(monkeypatch):
    from trnqwen.cli import docgen

    loaded, out = _run_reporting(
        "from trnqwen.cli.main import main\nmain(['check-env', '--help'])", ("typer",), COLUMNS="61"
    )
    assert loaded == ["typer"]
    assert out == docgen.render_typer_help(["check-env"], 61)
    assert "Usage: trnqwen check-env [OPTIONS]" in out


def test_short_help_flag_prints_the_same_text_for_every_command(cli, monkeypatch):
    from trnqwen.cli import _help_text

    monkeypatch.setenv("COLUMNS", "80")
    names = sorted({name for name, width in _help_text.HELP})
    assert {"check-env", "config", "config show", "train"} <= set(names)
    for name in names:
        result = cli(*name.split(), "-h")
        assert result.code == 0 and result.out == _help_text.HELP[(name, 78)], name
    # typer's own -h (a flag before it: not a stored key, so typer renders it) is the same text
    assert cli("check-env", "--json", "-h").out == _help_text.HELP[("check-env", 78)]
    assert cli("config", "show", "--json", "-h").out == _help_text.HELP[("config show", 78)]


def test_check_env_does_not_import_torch_in_process():
    code = "from trnqwen.cli.main import main\nmain(['check-env', '--json'])"
    assert _loaded_after(code) == []


def test_detect_device_does_not_import_torch():
    assert _loaded_after("from trnqwen.env.device import detect_device\ndetect_device('auto')") == []


def test_a_broken_help_module_falls_back_to_typer(cli, monkeypatch):
    """The fast path never breaks help: a broken generated module means typer renders it (and
    TRNQWEN_DEBUG=1 shows why, without changing the exit code)."""
    import types

    from trnqwen.cli import _help_text

    expected = _help_text.HELP[("check-env", 78)]
    monkeypatch.setitem(sys.modules, "trnqwen.cli._help_text", types.ModuleType("trnqwen.cli._help_text"))
    monkeypatch.setattr("trnqwen.cli._help_text", sys.modules["trnqwen.cli._help_text"], raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TRNQWEN_DEBUG", "1")
    result = cli("check-env", "--help")
    assert result.code == 0 and result.out == expected
    assert "AttributeError" in result.err
