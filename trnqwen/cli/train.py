"""`trnqwen train` (not implemented yet)."""

from __future__ import annotations

from trnqwen.cli.app import not_implemented

HELP = "Not implemented yet."
EPILOG = None


def train() -> None:
    not_implemented("train")
