"""`trnqwen inspect-logs` (not implemented yet)."""

from __future__ import annotations

from trnqwen.cli.app import not_implemented

HELP = "Not implemented yet."
EPILOG = None


def inspect_logs() -> None:
    not_implemented("inspect-logs")
