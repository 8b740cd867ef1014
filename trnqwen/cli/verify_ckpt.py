"""`trnqwen verify-ckpt` (not implemented yet)."""

from __future__ import annotations

from trnqwen.cli.app import not_implemented

HELP = "Not implemented yet."
EPILOG = None


def verify_ckpt() -> None:
    not_implemented("verify-ckpt")
