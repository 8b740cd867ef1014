"""The app factory: every (sub)app gets the same help, width and error behaviour."""

from __future__ import annotations

import typer

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


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

