"""Byte sizes in and out: one parser for ``--keep-free 2G`` and one formatter for every message.

Callers pick the style their output has always had (binary or SI units, how many decimals, the
smallest and largest unit) so each command's wording stays as it was.
"""

from __future__ import annotations

import re

from trnqwen.errors import UsageError

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("B", "KB", "MB", "GB", "TB", "PB")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"200M"``, ``"1.5GiB"``, ``"0"``, ``12345`` -> bytes (powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"not a size: {text!r}", hint="use bytes or a suffix, e.g. 500M, 2G, 0")
    unit = "kmgtp".find(m.group(2).lower()) + 1 if m.group(2) else 0
    return int(float(m.group(1)) * 1024**unit)


def format_bytes(n: float, *, digits: int = 1, si: bool = False, smallest: str = "B", largest: str = "") -> str:
    """``4404019`` -> ``"4.2 MiB"``.  Whole bytes have no decimals; ``si`` counts in 1000s
    (``KB``, ``MB``); ``smallest``/``largest`` pin the unit range (``smallest="GiB"`` always says
    GiB)."""
    units = _SI if si else _BINARY
    base = 1000 if si else 1024
    first = units.index(smallest) if smallest in units else 0
    last = units.index(largest) if largest in units else len(units) - 1
    n = n / base**first
    for unit in units[first : last + 1]:
        if abs(n) < base or unit == units[last]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= base
    return f"{n} B"  # pragma: no cover
