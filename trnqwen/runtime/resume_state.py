"""Inside each rank: exact resume and preemption for torchtitan runs (docs/resume.md).

trnqwen's ``CheckpointManager`` and ``Trainer`` subclasses (:mod:`trnqwen.runtime.trainer_checkpoint`,
:mod:`trnqwen.runtime.trainer`, chosen by the generated config) call the functions here; :func:`install`
only installs the signal handlers:

* **RNG in the checkpoint.**  torchtitan saves model, optimizer, LR schedule, dataloader
  position and step, not the random generators; each rank's torch / Python / NumPy (and device)
  RNG state is added as ``trnqwen_rng.rank_<r>``, so a resumed run draws what the uninterrupted
  one would have.  Starting to iterate the dataloader draws one number from the global torch
  RNG (torch's DataLoader seeds its iterator with it) at the first step of every process: step 1
  of a fresh run but the first step after the load in a resumed one, which shifted every later
  dropout mask.  That draw leaves the global RNG as it was (:class:`_RngNeutralIterable`).
* **Exports never land among resume points.**  torchtitan's ``checkpoint.folder`` is
  ``<root>/resume`` (trnqwen.contract.checkpoint_layout); the last step saves the full resumable state
  there *and* the HF export to ``<root>/hf/step-N`` (a finished run can be extended).
* **Preemption.**  SIGTERM or SIGUSR1 sets a flag; at the next step boundary every rank agrees
  (one all-reduce of a single integer), saves a resumable checkpoint of that step, logs
  ``[trnqwen] preempted: ...`` (the launcher reads it) and stops the loop cleanly.
* **A different world size.**  Model and optimizer reshard through DCP; the per-rank dataloader
  and RNG states cannot, so they are skipped with one warning (policy in docs/resume.md).

It runs only in ranks (torch is imported inside functions, never in the launcher).
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from typing import Any, Iterable, Optional

RNG_KEY = "trnqwen_rng"
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1")
# Fault injection for tests and drills: every rank raises SIGUSR1 on itself at the end of step N.
FAULT_ENV = "TRNQWEN_FAULT_PREEMPT_AT_STEP"
PREEMPTED_MARK = "[trnqwen] preempted:"
RESHARD_MARK = "[trnqwen] world size changed:"

_state: dict[str, Any] = {"signal": None, "stop": False, "installed": False}


def _log(message: str) -> None:
    try:
        from torchtitan.tools.logging import logger

        logger.info(message)
    except Exception:  # pragma: no cover - logging must never break training
        print(message, flush=True)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


# --- RNG ---------------------------------------------------------------------------------------


class RankRNG:
    """A DCP ``Stateful`` holding this rank's generators under a per-rank key, as fixed-shape
    tensors only (DCP loads into tensors of the saved shape; nothing is pickled)."""

    def __init__(self, rank: int):
        self.key = f"rank_{rank}"

    def state_dict(self) -> dict[str, Any]:
        import numpy as np
        import torch

        version, mt, gauss = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": torch.tensor([version, *mt], dtype=torch.int64),
            "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
            "numpy": torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64),
            "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
        }
        device = _device_rng()
        if device is not None:
            state["device"] = device.get_rng_state()
        return {self.key: state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get(self.key)
        if not state:
            return
        import numpy as np
        import torch

        torch.set_rng_state(state["torch"])
        py = [int(v) for v in state["python"].tolist()]
        has_gauss, gauss = state["python_gauss"].tolist()
        random.setstate((py[0], tuple(py[1:]), gauss if has_gauss else None))
        pos, npg, *keys = [int(v) for v in state["numpy"].tolist()]
        np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, npg, float(state["numpy_gauss"][0])))
        device = _device_rng()
        if device is not None and "device" in state:
            device.set_rng_state(state["device"])


class _RngNeutralIterable:
    """``iter()`` of the wrapped iterable with the global CPU torch RNG restored afterwards."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __iter__(self):
        import torch

        with torch.random.fork_rng(devices=[]):
            return iter(self.inner)


def _device_rng():
    """The accelerator's RNG module (torch.cuda, torch.neuron, ...), None on CPU."""
    try:
        from torchtitan.tools.utils import device_module, device_type
    except Exception:
        return None
    if device_type == "cpu" or not hasattr(device_module, "get_rng_state"):
        return None
    try:
        if hasattr(device_module, "is_available") and not device_module.is_available():
            return None
    except Exception:
        return None
    return device_module


def saved_world_size(checkpoint_id: str) -> Optional[int]:
    """How many ranks wrote a DCP checkpoint (its ``trnqwen_rng.rank_<r>`` keys), None if unknown."""
    try:
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata.keys()
    except Exception:
        return None
    ranks = {m.group(1) for m in (re.match(rf"{RNG_KEY}\.rank_(\d+)\.", k) for k in keys) if m}
    return len(ranks) or None


# --- preemption ----------------------------------------------------------------------------------


def _on_signal(signum: int, _frame: Any) -> None:
    if _state["signal"] is None:
        _state["signal"] = signum
        name = signal.Signals(signum).name
        if _rank() == 0:
            print(f"[trnqwen] received {name}: saving a resumable checkpoint at the next step boundary", flush=True)


def install_signal_handlers() -> None:
    for name in PREEMPT_SIGNALS:
        signal.signal(getattr(signal, name), _on_signal)


def _everyone_stops() -> bool:
    """True on every rank when any rank got a preemption signal (ranks must agree on the step)."""
    local = 1 if _state["signal"] is not None else 0
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return bool(local)
    import torch

    if dist.get_backend() == "gloo":
        device = torch.device("cpu")
    else:
        from torchtitan.tools.utils import device_module, device_type

        device = torch.device(device_type, device_module.current_device())
    flag = torch.tensor([local], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(int(flag.item()))


def _maybe_inject_fault(step: int) -> None:
    target = os.environ.get(FAULT_ENV)
    if target and target.isdigit() and int(target) == step and _state["signal"] is None:
        signal.raise_signal(signal.SIGUSR1)


# --- what trnqwen's checkpointer and trainer ask (trnqwen.runtime.trainer_checkpoint, .trainer) ------


def install() -> None:
    """Install the preemption signal handlers (idempotent); the checkpointer and trainer
    subclasses chosen by trnqwen's config (:mod:`trnqwen.runtime.trainer`) do the rest."""
    if _state["installed"]:
        return
    _state["installed"] = True
    install_signal_handlers()


def rank() -> int:
    return _rank()


def log(message: str) -> None:
    _log(message)


def everyone_stops() -> bool:
    return _everyone_stops()


def maybe_inject_fault(step: int) -> None:
    _maybe_inject_fault(step)


def request_stop() -> None:
    """The loop stops after this step (every rank agreed a preemption signal came)."""
    _state["stop"] = True


def rng_neutral(data_iterable: Iterable) -> Iterable:
    """The dataloader, iterated without moving the global torch RNG (see the module doc)."""
    return _RngNeutralIterable(data_iterable)


def skip_on_world_change(checkpoint_id: str, load_step: int, states: dict, excluded: list,
                         per_rank: Iterable[str] = ()) -> list[str]:
    """The per-rank states a checkpoint saved by another world size cannot restore (logged once):
    the data position, the RNG and ``per_rank`` (a trainer hook's)."""
    import torch.distributed.checkpoint  # noqa: F401  (FileSystemReader)

    saved = saved_world_size(checkpoint_id)
    if saved is None or saved == _world():
        return []
    skip = [k for k in ("dataloader", RNG_KEY, *per_rank) if k in states and k not in excluded]
    if _rank() == 0:
        _log(
            f"{RESHARD_MARK} step {load_step} was saved by {saved} rank(s), resuming on {_world()}: "
            "model, optimizer, LR schedule and step reshard exactly; the data position and RNG "
            "cannot, so each rank starts its new data shard from the beginning (docs/resume.md)"
        )
    return skip


def signal_name() -> str:
    return signal.Signals(_state["signal"]).name if _state["signal"] else "a peer rank's signal"


def signal_received() -> bool:
    """Whether SIGTERM/SIGUSR1 has reached this rank's handler (the save at the next boundary is due)."""
    return _state["signal"] is not None


def preempted() -> bool:
    return bool(_state["stop"])


__all__ = ["install", "RankRNG", "saved_world_size", "preempted", "PREEMPTED_MARK", "RESHARD_MARK", "FAULT_ENV"]

if sys.version_info < (3, 10):  # pragma: no cover
    raise ImportError("trnqwen needs Python 3.10+")
