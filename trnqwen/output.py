"""One way to talk to the user: results on stdout, progress and status on stderr.

Results a user may pipe (``--json``, a final verdict line, the paths a command wrote) go to
stdout through :func:`print_json`, :func:`result` and :func:`table`; progress, status and
warnings go to stderr through :func:`info` and :func:`warn`, so ``trnqwen ... --json | jq``
always works.  A stream that is not a terminal (a redirected log, CI) is never hard-wrapped at
80 columns: a line stays one line (``4.1 MiB`` never splits).  rich is imported lazily.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator

from trnqwen.errors import redact


@lru_cache(maxsize=None)
def console(stderr: bool = True):
    from rich.console import Console

    no_color = bool(os.environ.get("NO_COLOR") or os.environ.get("TRNQWEN_NO_COLOR"))
    con = Console(stderr=stderr, no_color=no_color, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        # rich would wrap at 80 columns here; a log file or a pipe wants whole lines
        con.soft_wrap = True
        if not os.environ.get("COLUMNS"):
            con.width = NON_TERMINAL_WIDTH
    return con


# Width for tables and rules when the stream is not a terminal: wide enough that no cell is cut.
NON_TERMINAL_WIDTH = 160


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout (secrets redacted)."""
    text = json.dumps(payload, indent=2, default=str, sort_keys=False)
    sys.stdout.write(redact(text) + "\n")
    sys.stdout.flush()


def result(message: str, *, markup: bool = False) -> None:
    """One result line on stdout (a verdict, a path written): what a script reads or pipes."""
    console(stderr=False).print(redact(message), markup=markup)


def info(message: str) -> None:
    console().print(redact(message))


def warn(message: str) -> None:
    console().print(f"[yellow]warning:[/yellow] {redact(message)}")


def number(x: object, spec: str = ".4f", *, finite: bool = False) -> str:
    """``x`` formatted by ``spec``, or "-" when it is not a number (None, text; ``finite``: NaN/Inf too)."""
    ok = isinstance(x, (int, float)) and (not finite or math.isfinite(x))
    return format(x, spec) if ok else "-"


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


@contextlib.contextmanager
def work_progress(description: str, *, quiet: bool = False, con=None) -> Iterator[Callable[[int, int], None]]:
    """Long work on stderr: a spinner, then a progress bar (bytes, speed, time left) from the first
    ``report(done, total)`` the work makes.  Nothing at all with ``quiet`` (``--json``) or when
    stderr is not a terminal (a log stays clean); ``con``: another console (tests)."""
    con = con or console()
    if quiet or not con.is_terminal:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    status = con.status(f"{description}...", spinner="dots")
    status.start()
    shown: dict[str, Any] = {}

    def report(done: int, total: int) -> None:
        if not shown:
            status.stop()
            shown["bar"] = Progress(TextColumn(description), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                    TimeRemainingColumn(), console=con, transient=True)
            shown["bar"].start()
            shown["task"] = shown["bar"].add_task(description, total=total)
        shown["bar"].update(shown["task"], completed=done, total=total)

    try:
        yield report
    finally:
        status.stop()
        if shown:
            shown["bar"].stop()
