"""The ``[OverrideCalls]`` line: written by every rank that runs one of trnqwen's overrides
(:mod:`trnqwen.runtime.override_calls` counts the calls), read back by ``trnqwen inspect-logs``::

    [OverrideCalls] NAME: calls=C fallbacks=F modules=M rank=R step=1[ reason: TEXT]

``calls``: calls that ran the override's own code; ``fallbacks``: calls that ran the code it
replaces instead; ``modules``: how many distinct modules ran it; ``step``: this process's
optimizer steps when it logged (always 1); ``reason``: why the first fallback happened.
"""

from __future__ import annotations

import re
from typing import Optional

CALLS_TAG = "[OverrideCalls]"
CALLS_RE = re.compile(
    r"\[OverrideCalls\]\s+(?P<name>[^:\s]+):\s+calls=(?P<calls>\d+)\s+fallbacks=(?P<fallbacks>\d+)"
    r"\s+modules=(?P<modules>\d+)\s+rank=(?P<rank>\d+)\s+step=(?P<step>\d+)(?:\s+reason:\s*(?P<reason>.*?))?\s*$"
)


# The overrides trnqwen puts in by itself (never a user's --override-imports), by the function
# name they are logged under (torchtitan logs ``module.function`` or the registered name): what
# inspect-logs calls them, so they are not listed as if the user had asked for them.
TRNQWEN_OWN = {"cpu_dense_attention": "trnqwen's CPU attention, put in on every CPU run"}


def override_label(name: str) -> str:
    """``override NAME``, or for one of trnqwen's own: ``override NAME (trnqwen's ..., ...)``."""
    own = TRNQWEN_OWN.get(name.rpartition(".")[2]) if name.startswith("trnqwen.") or "." not in name else None
    return f"override {name}" + (f" ({own})" if own else "")


def format_calls_line(
    name: str, calls: int, fallbacks: int, modules: int, rank: int | str, step: int = 1, reason: Optional[str] = None
) -> str:
    """The one documented line shape (see the module docstring)."""
    text = f"{CALLS_TAG} {name}: calls={calls} fallbacks={fallbacks} modules={modules} rank={rank} step={step}"
    return text + (f" reason: {reason}" if fallbacks and reason else "")


def parse_calls_line(line: str) -> Optional[dict]:
    """One ``[OverrideCalls]`` line (any prefix, no ANSI colours) -> {name, calls, fallbacks,
    modules, rank, step, reason}, or None."""
    if CALLS_TAG not in line:
        return None
    m = CALLS_RE.search(line)
    if not m:
        return None
    rec: dict = {k: int(m.group(k)) for k in ("calls", "fallbacks", "modules", "rank", "step")}
    rec["name"] = m.group("name")
    rec["reason"] = m.group("reason") or None
    return rec
