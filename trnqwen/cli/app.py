"""The app factory: every (sub)app gets the same help, width and error behaviour."""

from __future__ import annotations

from typing import Optional

import typer

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
KEEP_LINES = "\b"  # click's mark: the paragraph after it is printed as written, never rewrapped


def make_app(*, help: str, name: str | None = None) -> typer.Typer:
    """A Typer app with no pretty exceptions (tracebacks could carry tokens) and -h/--help."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings=CONTEXT_SETTINGS,
    )


def keep_examples(epilog: Optional[str]) -> Optional[str]:
    """A command's epilog with every indented paragraph (example command lines and their comments)
    marked to be printed line by line.  click rewraps each paragraph of an epilog into one, so an
    unmarked block of examples ran together with its comments; prose stays wrapped to the width."""
    if not epilog:
        return epilog
    paragraphs = epilog.split("\n\n")
    for i, paragraph in enumerate(paragraphs):
        lines = [line for line in paragraph.split("\n") if line.strip()]
        if lines and lines[0] != KEEP_LINES and all(line[:1].isspace() for line in lines):
            paragraphs[i] = KEEP_LINES + "\n" + paragraph.strip("\n")
    return "\n\n".join(paragraphs)
