"""The Trainer's resumable checkpoints with model and optimizer state in DCP form.

transformers 5.x refuses ``save_strategy="steps"`` for a model sharded at load (``DistributedConfig``):
its checkpoint code saves the optimizer with ``torch.save`` on rank 0, which cannot hold state spread
over DTensor shards.  The Trainer's own resume machinery (``trainer_state.json``, the LR scheduler,
per-rank RNG, skipping the batches already seen) is sound, so this keeps all of it and replaces only
the model and optimizer state: they go through ``torch.distributed.checkpoint`` into
``<checkpoint-N>/dcp/``, every rank writing its own shards.  Every hf-trainer run uses this one form
(1 rank, DDP, DistributedConfig), so a checkpoint resumes on a different rank count: DCP reshards.

Pinned by tests/test_resume_e2e.py: a 2-rank run preempted after step 4 and resumed logs the same
losses at steps 5-8 as the uninterrupted run, and a 2-rank checkpoint continues on 1 rank.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable

DCP_DIR = "dcp"  # <checkpoint-N>/dcp/: model and optimizer, one DCP checkpoint
SCHEDULER_FILE = "scheduler.pt"  # the Trainer's own name for it


def dcp_checkpoint_class(base: type, log: Callable[[str], None] = print) -> type:
    """A subclass of the Trainer class ``base`` whose checkpoints hold DCP model + optimizer state;
    ``log`` (rank 0) says when a checkpoint resumes on a different number of ranks."""

    class DCPCheckpointTrainer(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            targs = kwargs.get("args")
            wanted = targs is not None and not targs.save_only_model
            if wanted:  # pass transformers' refusal for a model sharded at load, which this class answers ...
                targs.save_only_model = True
            super().__init__(*args, **kwargs)
            if wanted:  # ... then save the optimizer, scheduler and RNG after all
                self.args.save_only_model = False

        # -- saving: called by Trainer._save_checkpoint before trainer_state.json (the completeness mark)
        def save_model(self, output_dir: Any = None, _internal_call: bool = False) -> None:
            if not _internal_call:
                return super().save_model(output_dir, _internal_call)
            # The resumable checkpoint: model weights go into the DCP checkpoint with the optimizer
            # (_save_optimizer_and_scheduler); no gathered full copy per checkpoint.
            if self.args.should_save:
                os.makedirs(output_dir, exist_ok=True)

        def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
            import torch
            import torch.distributed.checkpoint as dcp

            model_state, optim_state = _state_dicts(self)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(output_dir, DCP_DIR))
            if self.args.should_save:
                torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_FILE))

        # -- loading: the model right after load (before training starts), the optimizer once it exists
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            started = time.perf_counter()
            model = self.model if model is None else model
            saved = saved_world_size(Path(resume_from_checkpoint))
            if saved is not None and saved != self.args.world_size and self.args.process_index == 0:
                from trnqwen.runtime.resume_state import RESHARD_MARK

                log(
                    f"{RESHARD_MARK} {Path(resume_from_checkpoint).name} was saved by {saved} rank(s), resuming on "
                    f"{self.args.world_size}: model, optimizer, LR schedule and step reshard exactly; each rank "
                    "skips as many batches of its new data shard as were trained, and the RNG states are not "
                    "restored (docs/resume.md)"
                )
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=os.path.join(resume_from_checkpoint, DCP_DIR))
            set_model_state_dict(model, state["model"])
            self._trnqwen_load_s = time.perf_counter() - started

        def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
            if checkpoint is None:
                return
            import torch
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            started = time.perf_counter()
            _, optim_state = _state_dicts(self)
            state = {"optim": optim_state}
            dcp.load(state, checkpoint_id=os.path.join(checkpoint, DCP_DIR))
            set_optimizer_state_dict(self.model, _inner_optimizer(self.optimizer), state["optim"])
            scheduler = torch.load(os.path.join(checkpoint, SCHEDULER_FILE), weights_only=True)
            self.lr_scheduler.load_state_dict(scheduler)
            if self.args.process_index == 0:  # torchtitan's wording: inspect-logs and the benchmarks read it
                seconds = getattr(self, "_trnqwen_load_s", 0.0) + time.perf_counter() - started
                log(f"Finished loading the checkpoint in {seconds:.2f} seconds.")

    DCPCheckpointTrainer.__qualname__ = f"DCPCheckpoint{base.__name__}"
    return DCPCheckpointTrainer


def saved_world_size(checkpoint: Path) -> int | None:
    """How many ranks wrote ``checkpoint``: the Trainer saves one ``rng_state_<rank>.pth`` per
    process (``rng_state.pth`` alone on one rank)."""
    ranks = [p for p in checkpoint.glob("rng_state_*.pth") if re.fullmatch(r"rng_state_\d+\.pth", p.name)]
    if ranks:
        return len(ranks)
    return 1 if (checkpoint / "rng_state.pth").is_file() else None


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _state_dicts(trainer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state as DTensor shards (``get_state_dict`` initialises empty optimizer state)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(trainer.model, _inner_optimizer(trainer.optimizer))
