"""Proof that an override or patch trnqwen installs in a rank actually ran.

An ``[Override]`` line (or a patch being installed) only says the replacement is in place; a
module can still take a fallback on every call.  Each of trnqwen's own overrides and patches
counts the calls that ran its code and the calls that fell back, and logs one line per rank
after the first optimizer step (torch's global step hook, so torchtitan's loop and the
Transformers Trainer both trigger it)::

    [OverrideCalls] NAME: calls=C fallbacks=F modules=M rank=R step=1[ reason: TEXT]

``calls``: calls that ran the override's own code; ``fallbacks``: calls that ran the code it
replaces instead; ``modules``: how many distinct modules ran it (one per layer for a per-layer
override); ``step``: this process's optimizer steps when it logged, always 1 (on a resumed run the first
step after the resume, whatever its global number); ``reason``: why the first fallback happened.  The shipped examples
(``examples/torch_rope``, ``examples/nki_rope``) log the same line from their own copy of this
logic (they must stay standalone files).  ``trnqwen inspect-logs`` reads it.

The counters are Python integers: trnqwen's own overrides run eagerly (CPU shims, and an init-time
patch); the examples count with tensors so ``torch.compile`` sees every call.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Optional

CALLS_TAG = "[OverrideCalls]"
CALLS_RE = re.compile(
    r"\[OverrideCalls\]\s+(?P<name>[^:\s]+):\s+calls=(?P<calls>\d+)\s+fallbacks=(?P<fallbacks>\d+)"
    r"\s+modules=(?P<modules>\d+)\s+rank=(?P<rank>\d+)\s+step=(?P<step>\d+)(?:\s+reason:\s*(?P<reason>.*?))?\s*$"
)

_log = logging.getLogger()  # the root logger: torchtitan's ``logger`` and its format


def format_calls_line(
    name: str, calls: int, fallbacks: int, modules: int, rank: Any, step: int = 1, reason: Optional[str] = None
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


class OverrideCalls:
    """Counts one override's calls in this process and logs them after the first step."""

    def __init__(self, name: str):
        self.name = name
        self.calls = 0
        self.fallbacks = 0
        self.reason: Optional[str] = None
        self._modules: set[int] = set()
        self._hook: Any = None
        self.logged = False

    def ran(self, *modules: Any) -> None:
        """One call that ran the override's code, on these modules."""
        self.calls += 1
        self._modules.update(id(m) for m in modules)

    def fell_back(self, reason: str) -> None:
        self.fallbacks += 1
        if self.reason is None:
            self.reason = reason
            _log.warning(f"{self.name}: fell back: {reason}")

    @property
    def modules(self) -> int:
        return len(self._modules)

    def line(self) -> str:
        return format_calls_line(self.name, self.calls, self.fallbacks, self.modules,
                                 os.environ.get("RANK", "0"), reason=self.reason)

    def arm(self) -> None:
        """Log :meth:`line` once, after the first optimizer step of this process."""
        if self._hook is not None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # The hook stays registered: torch iterates the hooks while calling them, so removing
        # one here would break the optimizer step.
        # A resumed run's checkpoint load takes one optimizer step with zero gradients to create
        # the optimizer state (torch.distributed.checkpoint.state_dict), before any forward: wait
        # for a step that followed a call, or for the second step.
        self._steps_seen = getattr(self, "_steps_seen", 0) + 1
        if not self.logged and (self.calls + self.fallbacks > 0 or self._steps_seen >= 2):
            self.logged = True
            _log.info(self.line())


_COUNTERS: dict[str, OverrideCalls] = {}


def counter(name: str) -> OverrideCalls:
    """The process-wide counter of override ``name`` (created on first use)."""
    if name not in _COUNTERS:
        _COUNTERS[name] = OverrideCalls(name)
    return _COUNTERS[name]
