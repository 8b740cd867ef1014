"""The shared options that need no run configuration (``--json``, ``--config-file``, the path
callback), apart from :mod:`trnqwen.cli._options` (which re-exports them): that module reads
every default from ``RunConfig`` and so imports pydantic and :mod:`trnqwen.config` (about 0.1 s
of CPU), which commands such as ``inspect-logs`` given a log path never use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

ConfigFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--config-file",
        "-c",
        help="Project config file (default: ./trnqwen.toml if present). Env: TRNQWEN_CONFIG_FILE.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]


def user_paths(value: Any) -> Any:
    """typer callback for path arguments outside the config: ``~nosuchuser/x`` is a UsageError now."""
    from trnqwen.fsutil import expand_user

    for item in value if isinstance(value, list) else [value]:
        if item is not None and item != "-":
            expand_user(item)
    return value
