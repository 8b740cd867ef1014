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
step after the resume, whatever its global number); ``reason``: why the first fallback happened.
``trnqwen inspect-logs`` reads it; the line's format is :mod:`trnqwen.contract.override_calls`.

:class:`OverrideCalls` counts with Python integers: trnqwen's own overrides run eagerly (CPU
shims, and an init-time patch).  :class:`ModuleCallCounter` counts with a 0-d tensor per module
(``custom_calls`` / ``fallback_calls`` buffers) so ``torch.compile`` sees every call: the shipped
examples (``examples/torch_rope``, ``examples/nki_rope``) use it through :func:`module_counter`,
so their line follows the same rule as trnqwen's own, resumed runs included.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Optional

from trnqwen.contract.override_calls import format_calls_line

_log = logging.getLogger()  # the root logger: torchtitan's ``logger`` and its format


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

    def totals(self) -> tuple[int, int, int]:
        """(calls, fallbacks, modules) so far."""
        return self.calls, self.fallbacks, self.modules

    def line(self) -> str:
        calls, fallbacks, modules = self.totals()
        return format_calls_line(self.name, calls, fallbacks, modules, os.environ.get("RANK", "0"), reason=self.reason)

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
        if self.logged:
            return
        self._steps_seen = getattr(self, "_steps_seen", 0) + 1
        calls, fallbacks, _modules = self.totals()
        if calls + fallbacks > 0 or self._steps_seen >= 2:
            self.logged = True
            _log.info(self.line())


class ModuleCallCounter(OverrideCalls):
    """An override's counter whose counts live in its modules, as tensors.

    Each tracked module holds two 0-d int64 buffers, ``custom_calls`` and ``fallback_calls``, and
    adds 1 to one of them per call (a tensor op, so the count stays right under
    ``torch.compile``, where a Python ``+= 1`` would be traced once).  ``calls`` and ``fallbacks``
    are their sums over this rank's modules; ``modules`` counts the modules whose own path ran at
    least once (one per layer the override replaced).  Logged by the same rule as
    :class:`OverrideCalls`: after the first optimizer step that followed a call, or the second.
    """

    def __init__(self, name: str):
        super().__init__(name)
        self._tracked: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def track(self, module: Any) -> None:
        """Count ``module`` (it holds the two buffers) and log after the first step."""
        self._tracked.add(module)
        self.arm()

    def fell_back(self, reason: str) -> None:
        """Remember (and warn once about) the first fallback's reason; the module counts it."""
        if self.reason is None:
            self.reason = reason
            _log.warning(f"{self.name}: fell back: {reason}")

    def totals(self) -> tuple[int, int, int]:
        calls = fallbacks = modules = 0
        for module in list(self._tracked):
            if module.custom_calls.is_meta:  # built on the meta device and never materialised
                continue
            c, f = _count(module.custom_calls), _count(module.fallback_calls)
            calls, fallbacks, modules = calls + c, fallbacks + f, modules + (c > 0)
        return calls, fallbacks, modules


def _count(buf: Any) -> int:
    from torch.distributed.tensor import DTensor

    return int((buf.to_local() if isinstance(buf, DTensor) else buf).item())


_COUNTERS: dict[str, OverrideCalls] = {}


def counter(name: str) -> OverrideCalls:
    """The process-wide counter of override ``name`` (created on first use)."""
    if name not in _COUNTERS:
        _COUNTERS[name] = OverrideCalls(name)
    return _COUNTERS[name]


def module_counter(name: str) -> ModuleCallCounter:
    """The process-wide tensor-counting counter of override ``name`` (created on first use)."""
    found = _COUNTERS.get(name)
    if found is None:
        found = _COUNTERS[name] = ModuleCallCounter(name)
    if not isinstance(found, ModuleCallCounter):
        raise TypeError(f"override {name} already counts with Python integers (counter()), not module buffers")
    return found
