"""Every command's ``--help`` shows its examples one per line (issue 34 item 11).

click rewraps each paragraph of an epilog into one: a block of example commands and their comments
ran together into a paragraph (``train --help``'s first screen).  Here: every command has an
Examples section whose lines are indented, and each of those lines is one line of ``--help`` at
both usual widths, in the stored fast-path text and in the generated docs/cli page.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trnqwen.cli import docgen
from trnqwen.cli.app import keep_examples

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [(name, cmd) for name, cmd, _ctx in docgen.iter_commands() if not hasattr(cmd, "list_commands")]


def _example_lines(epilog: str) -> list[str]:
    return [line.strip() for line in epilog.splitlines() if line[:1].isspace() and line.strip()]


@pytest.mark.parametrize("name,cmd", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_example_is_one_line_of_help(name, cmd):
    from trnqwen.cli import _help_text

    epilog = cmd.epilog or ""
    assert "Example" in epilog, f"trnqwen {name} --help shows no examples"
    examples = _example_lines(epilog)
    assert examples, f"trnqwen {name}: the examples are not lines of their own (one indented command per line)"
    page = (ROOT / "docs" / "cli" / f"{name.replace(' ', '-')}.md").read_text(encoding="utf-8")
    for columns in docgen.HELP_COLUMNS:
        rendered = docgen.render_typer_help(name.split(), columns)
        stored = _help_text.HELP[(name, columns - 2)]
        for text in (rendered, stored, page):
            lines = {line.strip() for line in text.splitlines()}
            merged = [e for e in examples if e not in lines]
            assert not merged, f"trnqwen {name} --help ({columns} columns) runs these example lines together: {merged}"


def test_a_block_of_examples_keeps_its_lines_and_prose_is_still_wrapped():
    epilog = "Examples:\n\n  # one\n  trnqwen x\n\n  # two\n  trnqwen y --z\n\nSome prose that click may wrap.\n"
    out = keep_examples(epilog)
    assert out.count("\b\n") == 2 and "\n\nSome prose" in out and "\b\nSome" not in out
    assert keep_examples(out) == out  # a block already marked is left as it is
