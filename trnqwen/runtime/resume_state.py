"""Inside each rank: exact resume and preemption for torchtitan runs (docs/resume.md).

:func:`install` adapts torchtitan 0.3.0's checkpointer and trainer before the trainer is built:

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
from typing import Any, Optional

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


# --- torchtitan patches ---------------------------------------------------------------------------


def install() -> None:
    """Patch torchtitan's CheckpointManager and Trainer (idempotent)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    from torchtitan.components.checkpointer import dcp as titan_dcp
    from torchtitan.components.checkpointer.dcp import AsyncMode, CheckpointManager
    from torchtitan.trainer import Trainer

    from trnqwen.contract.checkpoint_layout import export_root, root_of_resume_folder

    original_init = CheckpointManager.__init__
    original_save_last = CheckpointManager._save_last_step
    original_save = CheckpointManager.save
    original_load = CheckpointManager._load
    original_continue = Trainer.should_continue_training
    original_batch_generator = Trainer.batch_generator

    def __init__(self, config, **kwargs):
        original_init(self, config, **kwargs)
        if self.enable:
            self.states[RNG_KEY] = RankRNG(_rank())

    def _full_save(self, step: int) -> str:
        checkpoint_id = self._create_checkpoint_id(step)
        self.dcp_save(
            self._flattened_model_states_sd(), checkpoint_id=checkpoint_id,
            async_mode=AsyncMode.DISABLED, enable_garbage_collection=True,
        )
        self._purge_stale_checkpoints()
        return checkpoint_id

    def _save_last_step(self, curr_step: int) -> None:
        root = root_of_resume_folder(self.folder)
        if root is None:  # not trnqwen's layout (a hand-edited config): torchtitan's behaviour
            return original_save_last(self, curr_step)
        _full_save(self, curr_step)  # resumable: `--resume --steps M` can extend a finished run
        if not self.last_save_model_only:
            return None
        resume_folder = self.folder
        self.folder = str(export_root(root))  # the export goes beside, never among, resume points
        try:
            return original_save_last(self, curr_step)
        finally:
            self.folder = resume_folder

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        _maybe_inject_fault(curr_step)
        saved = original_save(self, curr_step, last_step)
        if last_step or not _everyone_stops():
            return saved
        name = signal.Signals(_state["signal"]).name if _state["signal"] else "a peer rank's signal"
        where = self._create_checkpoint_id(curr_step) if saved else (_full_save(self, curr_step) if self.enable else None)
        _state["stop"] = True
        if _rank() == 0:
            text = f"saved a resumable checkpoint of step {curr_step} to {where}" if where else "checkpointing is off: nothing saved"
            _log(f"{PREEMPTED_MARK} {name} at step {curr_step}; {text}")
        return True

    def _load(self, step: int = -1) -> bool:
        import torch.distributed.checkpoint  # noqa: F401  (FileSystemReader)

        load_step = self._find_load_step() if step == -1 else step
        if load_step > 0:
            saved = saved_world_size(self._create_checkpoint_id(load_step))
            if saved is not None and saved != _world():
                skip = [k for k in ("dataloader", RNG_KEY) if k in self.states and k not in self.exclude_from_loading]
                self.exclude_from_loading = [*self.exclude_from_loading, *skip]
                if _rank() == 0:
                    _log(
                        f"{RESHARD_MARK} step {load_step} was saved by {saved} rank(s), resuming on {_world()}: "
                        "model, optimizer, LR schedule and step reshard exactly; the data position and RNG "
                        "cannot, so each rank starts its new data shard from the beginning (docs/resume.md)"
                    )
        return original_load(self, step)

    def should_continue_training(self) -> bool:
        return not _state["stop"] and original_continue(self)

    def batch_generator(self, data_iterable):
        return original_batch_generator(self, _RngNeutralIterable(data_iterable))

    CheckpointManager.__init__ = __init__
    CheckpointManager._save_last_step = _save_last_step
    CheckpointManager.save = save
    CheckpointManager._load = _load
    Trainer.should_continue_training = should_continue_training
    Trainer.batch_generator = batch_generator
    del titan_dcp
    install_signal_handlers()


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
