"""The generated reference docs match the code (CI catches drift), and the hand-written docs
point at things that exist."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO_ROOT

DOCS = REPO_ROOT / "docs"
CLI_DOCS = DOCS / "cli"


def test_committed_cli_and_config_pages_equal_the_generated_ones():
    from trnqwen.cli import docgen

    files = docgen.generate(CLI_DOCS)
    problems = docgen.stale(files, CLI_DOCS)
    assert not problems, "docs are stale; run `make docs`:\n" + "\n".join(problems)


def test_every_exit_code_is_in_every_table_and_no_table_has_others():
    """issue 28 #15: one exit-code table; errors.py, the CLI reference and architecture.md all list it whole."""
    from trnqwen import errors
    from trnqwen.cli import docgen

    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_") and isinstance(value, int)}
    assert {0, 1, 2, 3, 70, 130, 138, 140, 143} <= codes
    assert {code for code, _ in docgen.EXIT_CODES} == codes
    index = (CLI_DOCS / "index.md").read_text().split("## Exit codes", 1)[1]
    assert {int(m) for m in re.findall(r"^\| (\d+) \|", index, re.M)} == codes
    doc_lines = errors.__doc__.split("Exit codes mean something:", 1)[1].split("TRNQWEN_DEBUG", 1)[0]
    assert {int(c) for c in re.findall(r"^\s+(\d+(?:/\d+)*)\s", doc_lines, re.M) for c in c.split("/")} == codes
    architecture = (DOCS / "architecture.md").read_text()
    paragraph = architecture.split("**One error type, meaningful exit codes.**", 1)[1].split("\n- **", 1)[0]
    mentioned = {int(c) for c in re.findall(r"(?<![\d.])(\d{1,3})(?![\d.])", paragraph)}
    assert codes - {0} <= mentioned, sorted(codes - {0} - mentioned)


def test_every_command_has_a_page_and_the_index_lists_it():
    from trnqwen.cli.main import COMMANDS, GROUPS

    index = (CLI_DOCS / "index.md").read_text()
    for name in [*COMMANDS, *GROUPS]:
        assert (CLI_DOCS / f"{name}.md").is_file(), name
        assert f"({name}.md)" in index, name


def test_a_page_is_the_commands_own_help(cli, monkeypatch):
    """The verbatim block on the page is what `trnqwen train --help` prints at the same width."""
    from trnqwen.cli import docgen

    monkeypatch.setenv("COLUMNS", str(docgen.WIDTH))
    result = cli("train", "--help")
    assert result.code == 0
    page = (CLI_DOCS / "train.md").read_text()
    block = page.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert [line.rstrip() for line in result.out.strip().splitlines()] == block.splitlines()


def test_generation_detects_a_changed_help_text(tmp_path, monkeypatch):
    """The check can fail: change one command's help and the committed page is reported stale."""
    from trnqwen.cli import docgen
    from trnqwen.cli import main as cli_main

    out = tmp_path / "cli"
    docgen.write(docgen.generate(out), out)
    assert docgen.stale(docgen.generate(out), out) == []
    (out / "gone-command.md").write_text("old\n")
    import trnqwen.cli.fetch as fetch_mod

    monkeypatch.setattr(fetch_mod, "HELP", fetch_mod.HELP + " CHANGED")
    monkeypatch.setattr(cli_main, "_APP", None)
    problems = docgen.stale(docgen.generate(out), out)
    assert any("fetch.md: out of date" in p for p in problems), problems
    assert any("gone-command.md" in p for p in problems), problems
    assert any("index.md: out of date" in p for p in problems), problems
    monkeypatch.setattr(cli_main, "_APP", None)


def test_config_reference_lists_every_field_with_env_and_default():
    from trnqwen.config import RunConfig

    text = (DOCS / "config.md").read_text()
    for name, info in RunConfig.model_fields.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert f"`TRNQWEN_{name.upper()}`" in row
        assert (info.description or "").split("(")[0].strip()[:20].replace("<", "&lt;") in row
    steps = next(line for line in text.splitlines() if line.startswith("| `steps` |"))
    assert "else 10" in steps and "one epoch with --dataset" in steps and "--steps (train" in steps


def test_docgen_check_mode_exit_codes(tmp_path):
    from trnqwen.cli import docgen

    out = tmp_path / "cli"
    assert docgen.main([str(out), "--check"]) == 1  # nothing there yet
    assert docgen.main([str(out)]) == 0
    assert docgen.main([str(out), "--check"]) == 0
    assert (tmp_path / "config.md").is_file()


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_in_docs_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (DOCS / target).exists(), f"{page}: broken link {target}"


def test_readme_links_resolve_and_lead_with_the_two_commands():
    text = (REPO_ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (REPO_ROOT / target).exists(), f"README: broken link {target}"
    first_block = text.split("```", 2)[1]
    assert "make quickstart" in first_block and "make test" in first_block


def test_versions_page_lists_every_known_good_combination():
    """docs/versions.md is hand-written; it must still say what trnqwen.env.versions knows."""
    from trnqwen.env.versions import KNOWN_GOOD

    text = (DOCS / "versions.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 5}
    for combo in KNOWN_GOOD:
        assert combo.name in rows, combo.name
        row = rows[combo.name]
        assert f"| {combo.device} |" in row
        lo, hi = combo.python
        assert f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}" in row
        for package, pattern in combo.packages.items():
            assert f"{package} `{pattern}`" in row, (combo.name, package)


def test_troubleshooting_covers_the_errors_users_meet():
    text = (DOCS / "troubleshooting.md").read_text()
    for needle in ("recompil", "LNC", 'device_map="auto"', "HBM out of memory", "Weights not loaded",
                   "TDRV:dmem_alloc_internal", "NCC_EOOM001", "NCC_EARG001", "NeuronCore(s) not available"):
        assert needle in text, needle


def test_getting_started_installs_what_check_env_recommends():
    """Issue 18 item 13: the install line pins a known-good Neuron set, names the set check-env
    recommends on older Pythons, and says where the torch 2.14 set's Python >= 3.12 matters."""
    import re

    from trnqwen.env.versions import KNOWN_GOOD, neuron_combo_for, neuron_series, python_note

    text = (DOCS / "getting-started.md").read_text()
    neuron = [c for c in KNOWN_GOOD if c.device == "neuron"]
    pinned = set(re.findall(r"torch-neuronx==(\d+\.\d+)\.\*", text))
    assert pinned == {neuron_series(c) for c in neuron}, pinned
    for combo in neuron:
        if python_note(combo):  # a set that does not run on every Python says so next to its pin
            lo = combo.python[0]
            assert f"torch {neuron_series(combo)} set needs\nPython >= {lo[0]}.{lo[1]}" in text or (
                f"Python >= {lo[0]}.{lo[1]} (torch {neuron_series(combo)} set)" in text
            ), combo.name
    for py in ((3, 10), (3, 11)):
        assert f"torch-neuronx=={neuron_series(neuron_combo_for(py))}.*" in text
    compiler = {c.packages["neuronx-cc"].split(".")[0] + "." + c.packages["neuronx-cc"].split(".")[1] for c in neuron}
    assert set(re.findall(r"neuronx-cc==(\d+\.\d+)\.\*", text)) <= compiler


def test_the_signal_tables_run_json_fields_are_where_stops_writes_them(tmp_path):
    """issue 28 #12: resume.md put `interrupted_at_step` at the top of run.json; stops.py writes it under extra."""
    from types import SimpleNamespace

    from trnqwen.rundir import RunRecord
    from trnqwen.train import stops
    from trnqwen.train.launch_result import LaunchResult

    table = (DOCS / "resume.md").read_text().split("| signal | when |", 1)[1].split("\n\n", 1)[0]
    rows = {row.split("|")[4].strip(" *"): row.split("|")[5] for row in table.splitlines()[2:]}
    log = tmp_path / "train.log"
    for code, line, steps in (("138", "[rank0]:[trnqwen] preempted: SIGTERM at step 4; saved\n", [{"step": 4}]),
                              ("140", "starting\n", [])):
        log.write_text(line)
        plan = SimpleNamespace(log_path=log, run_id="r1", config=None)
        record = RunRecord(run_id="r1", run_dir=str(tmp_path), status="running")
        stops.classify(plan, LaunchResult(exit_code=143, ended_by="SIGTERM", steps=steps), record, 0, None)
        written = {"extra." + k for k in record.extra} | {k for k in vars(record) if getattr(record, k) is not None}
        status, *fields = re.findall(r"`([\w.]+)`", rows[code])
        assert record.status == status and record.exit_code == int(code)
        assert set(fields) <= written, (code, sorted(set(fields) - written))
