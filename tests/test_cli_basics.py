"""The CLI shell: command listing, `python -m trnqwen`, stubs, error edge, debug tracebacks, secrets."""

from __future__ import annotations

import importlib

import pytest

from tests.helpers import assert_clean_error, run_subprocess
from trnqwen.cli import main as cli_main
from trnqwen.errors import EXIT_USAGE

EXPECTED = ("fetch", "check-env", "train", "verify-ckpt", "inspect-logs", "config")


def _help_of(module: str) -> str:
    return importlib.import_module(module).HELP


def test_help_lists_every_command_with_its_help(cli):
    r = cli("--help")
    assert r.code == 0
    flat = " ".join(r.out.split())
    for name in EXPECTED:
        assert f"  {name} " in r.out, r.out
    for name, (module, _) in {**cli_main.COMMANDS, **cli_main.GROUPS}.items():
        assert " ".join(_help_of(module).split()) in flat, name
    assert "--version" in r.out and "Usage: trnqwen" in r.out


def test_fast_help_matches_the_typer_app():
    """The instant root help (no typer import) says what the real Typer app would."""
    import typer

    group = typer.main.get_command(cli_main.build_app())
    ctx = group.make_context("trnqwen", ["--help"], resilient_parsing=True)
    names = group.list_commands(ctx)
    assert set(names) == set(cli_main.COMMANDS) | set(cli_main.GROUPS), (
        "a command registered outside COMMANDS/GROUPS would be missing from `trnqwen --help`"
    )
    fast = " ".join(cli_main.render_root_help().split())
    for name in names:
        cmd = group.get_command(ctx, name)
        first_line = " ".join((cmd.help or "").strip().splitlines()[0].split())
        assert f"{name} {first_line}" in fast, (name, first_line)
    root_flags = {opt for p in group.get_params(ctx) for opt in p.opts}
    fast_flags = {f.strip() for flags, _ in cli_main.ROOT_OPTIONS for f in flags.split(",")}
    assert root_flags == fast_flags


def test_falls_back_to_typer_when_help_is_not_a_literal(cli, monkeypatch, tmp_path):
    mod = tmp_path / "dyn_cmd.py"
    mod.write_text('HELP = "Dynamic " + "help."\nEPILOG = None\n\ndef dyn() -> None:\n    """x"""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli_main.COMMANDS, "dyn", ("dyn_cmd", "dyn"))
    monkeypatch.setattr(cli_main, "_APP", None)
    assert cli_main.render_root_help() is None
    r = cli("--help")
    assert r.code == 0 and "dyn" in r.out and "Dynamic help." in r.out and "check-env" in r.out


def test_python_dash_m_works():
    r = run_subprocess("--help")
    assert r.code == 0 and all(name in r.out for name in EXPECTED), r.text
    r = run_subprocess("--version")
    assert r.code == 0 and r.out.startswith("trnqwen ")


def test_console_script_help():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "trnqwen"
    if not exe.exists():
        pytest.skip("trnqwen console script not installed in this interpreter's bin")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and all(name in proc.stdout for name in EXPECTED)


def test_no_arguments_shows_help_and_exits_2(cli):
    r = cli()
    assert r.code == EXIT_USAGE and "Commands:" in r.out


def test_subcommand_help(cli):
    r = cli("check-env", "--help")
    assert r.code == 0 and "--json" in r.out and "--device" in r.out
    r = cli("config", "show", "-h")
    assert r.code == 0 and "[default: hf-v5]" in r.out  # help text is shown literally, not as markup


def test_unknown_command_and_option(cli):
    r = cli("chek-env")
    assert r.code == 2 and "No such command" in r.err and "check-env" in r.err
    r = cli("check-env", "--bogus")
    assert r.code == 2 and "No such option" in r.err and "Traceback" not in r.text


def test_debug_env_shows_traceback(in_tmp):
    (in_tmp / "trnqwen.toml").write_text("steps = 0\n")
    quiet = run_subprocess("config", "show", cwd=in_tmp)
    assert_clean_error(quiet, code=2, contains="steps = 0")
    loud = run_subprocess("config", "show", cwd=in_tmp, env={"TRNQWEN_DEBUG": "1"})
    assert loud.code != 0 and "Traceback" in loud.err and "ConfigError" in loud.err


@pytest.mark.parametrize("token", ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "plain-secret-value-42"])
def test_token_never_in_error_output(in_tmp, token):
    missing = in_tmp / f"cfg-{token}.toml"
    r = run_subprocess("config", "show", "--config-file", str(missing), env={"HF_TOKEN": token})
    assert r.code == 2 and "does not exist" in r.err
    assert token not in r.text, r.text
    r = run_subprocess("check-env", "--json", env={"HF_TOKEN": token}, cwd=in_tmp)
    assert token not in r.text


def test_error_table_reaches_every_row():
    """One table maps error types to output: a row after a base class of its type would never match."""
    import typer  # noqa: F401  (the table adds typer's rows once typer is loaded)

    rows = [kind for kind, _, _ in cli_main._error_table()]
    assert rows[-1] is Exception
    for i, kind in enumerate(rows):
        assert not any(issubclass(kind, earlier) for earlier in rows[:i]), (kind, rows[:i])


# --- --json on failure ---------------------------------------------------------------------------

JSON_FAILURES = {  # one failing call of every command that has --json: (argv, exit code, words of the error)
    "fetch": (["fetch", "bad!!id"], 2, "must be a Hub repo id"),
    "check-env": (["check-env", "--device", "nope"], 2, "device"),
    "data": (["data", "nope.jsonl"], 2, "no tokenizer"),
    "train": (["train", "--steps", "0", "--dry-run"], 2, "steps"),
    "verify-ckpt": (["verify-ckpt", "nope"], 2, "no such path"),
    "merge": (["merge", "nope"], 2, "no such adapter folder"),
    "push": (["push", "--repo", "no-owner"], 2, "not a Hub repo id OWNER/NAME"),
    "serve": (["serve", "nope", "--engine", "transformers"], 2, "no checkpoint or run named"),
    "eval": (["eval", "nope"], 2, "no checkpoint or run named"),
    "inspect-logs": (["inspect-logs", "binary.log"], 2, "does not look like a text log"),
    "quickstart": (["quickstart", "--device", "nope"], 2, "nope"),
    "config show": (["config", "show", "--config-file", "nope.toml"], 2, "nope.toml"),
    "a bad flag": (["verify-ckpt", "--nosuch"], 2, "No such option"),
}


@pytest.mark.parametrize("case", list(JSON_FAILURES))
def test_json_failure_is_one_json_object_on_stdout(cli, in_tmp, case):
    import json
    import os

    (in_tmp / "binary.log").write_bytes(os.urandom(3000) + b"\0" * 64)
    argv, code, words = JSON_FAILURES[case]
    r = cli(*argv, "--json")
    assert r.code == code, r.text
    doc = json.loads(r.out)  # the whole of stdout: one object
    assert doc["ok"] is False and doc["exit_code"] == code and words.lower() in doc["error"].lower(), doc
    assert words.lower() in r.err.lower()  # the usual error line is still on stderr


def test_every_json_command_is_covered_and_plain_output_is_untouched(cli, in_tmp):
    """Each command whose function takes json_out answers a failure in JSON (the table above covers them
    all); without --json nothing goes to stdout."""
    commands = [name for name in cli_main.COMMANDS if cli_main.takes_json([name, "--json"])]
    assert set(commands) == {argv[0] for argv, _, _ in JSON_FAILURES.values()} - {"config"}
    assert cli_main.takes_json(["config", "show", "--json"]) and not cli_main.takes_json(["verify-ckpt", "--", "--json"])
    r = cli("verify-ckpt", "nope")
    assert r.code == 2 and r.out == ""
