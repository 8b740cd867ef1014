"""`trnqwen check-env` (not implemented yet)."""

from __future__ import annotations

from trnqwen.cli.app import not_implemented

HELP = "Not implemented yet."
EPILOG = None


def check_env() -> None:
    not_implemented("check-env")
