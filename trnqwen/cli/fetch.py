"""`trnqwen fetch` (not implemented yet)."""

from __future__ import annotations

from trnqwen.cli.app import not_implemented

HELP = "Not implemented yet."
EPILOG = None


def fetch() -> None:
    not_implemented("fetch")
