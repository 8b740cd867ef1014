"""One way to talk to the user: tables and progress on stderr, results (``--json``) on stdout.

Keeping machine output on stdout and everything human on stderr means
``trnqwen ... --json | jq`` always works.  rich is imported lazily.
"""

from __future__ import annotations

import json
import os
import sys
from functools import lru_cache
from typing import Any, Iterable

from trnqwen.errors import redact


@lru_cache(maxsize=None)
def console(stderr: bool = True):
    from rich.console import Console

    no_color = bool(os.environ.get("NO_COLOR") or os.environ.get("TRNQWEN_NO_COLOR"))
    return Console(stderr=stderr, no_color=no_color, highlight=False, soft_wrap=False)


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout (secrets redacted)."""
    text = json.dumps(payload, indent=2, default=str, sort_keys=False)
    sys.stdout.write(redact(text) + "\n")
    sys.stdout.flush()


def info(message: str) -> None:
    console().print(redact(message))


def warn(message: str) -> None:
    console().print(f"[yellow]warning:[/yellow] {redact(message)}")


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], *, stdout: bool = True) -> None:
    """A rich table; on stdout by default since a table is the command's result."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(str(col))
    for row in rows:
        t.add_row(*(escape(redact("" if v is None else str(v))) for v in row))
    console(stderr=not stdout).print(t)
