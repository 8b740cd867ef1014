"""trnqwen's torchtitan checkpointer: a ``CheckpointManager`` subclass chosen through the config.

:func:`trnqwen.runtime.trainer.trnqwen_config` puts :class:`TrnqwenCheckpointManager.Config` in
``config.checkpoint`` (every field of torchtitan's own config kept), so ``config.checkpoint.build()``
in ``Trainer.__init__`` makes this class.  What it adds, in this order within one step (the whole
order is :data:`trnqwen.runtime.trainer.HOOK_ORDER`):

* ``__init__``: this rank's RNG joins the saved state (:class:`trnqwen.runtime.resume_state.RankRNG`);
* ``dcp_load``: loading the published HF base, each trainer hook may leave keys out
  (``hf_load_state``: LoRA's adapters keep their init, the base has no such keys);
* ``_load``: a checkpoint written by another world size skips the data position and RNG (one line);
* ``load``: first every attached trainer hook's ``checkpoint_states`` join the saved state (per-rank:
  skipped with the RNG on a world-size change), then, after the load, its ``after_checkpoint_load``
  (e.g. a reference pass);
* ``save``: the fault drill (:data:`~trnqwen.runtime.resume_state.FAULT_ENV`), torchtitan's save,
  then the ranks agree whether a preemption signal came: if so, a resumable checkpoint of this
  step (if not already saved) and the ``[trnqwen] preempted:`` line; the loop then stops;
* ``_save_last_step``: the last step is saved resumable in ``<root>/resume`` *and* exported to
  ``<root>/hf/step-N`` (never among the resume points);
* ``dcp_save``: a trainer hook may write the HF export itself (``hf_export``: a LoRA run's is the
  PEFT adapter folder, not the base model).

Only ranks import this (torch and torchtitan at module level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpointer.dcp import AsyncMode, CheckpointManager

from trnqwen.runtime import resume_state
from trnqwen.runtime.resume_state import RNG_KEY, RankRNG
from trnqwen.runtime.trainer_parts import TrainerAttached, as_trnqwen_config


class TrnqwenCheckpointManager(TrainerAttached, CheckpointManager):
    """torchtitan's DCP checkpointer with trnqwen's resume and preemption rules and its hooks' (module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.per_rank_states: tuple[str, ...] = ()  # the trainer hooks' states (checkpoint_states)
        if self.enable:
            self.states[RNG_KEY] = RankRNG(resume_state.rank())

    # --- load -----------------------------------------------------------------------------------

    def load(self, step: int = -1) -> bool:
        if self.enable:
            for hook in self.hooks:
                extra = hook.checkpoint_states(self.trainer)
                self.states.update(extra)
                self.per_rank_states = (*self.per_rank_states, *extra)
        loaded = super().load(step)
        for hook in self.hooks:
            hook.after_checkpoint_load(self.trainer)
        return loaded

    def _load(self, step: int = -1) -> bool:
        load_step = self._find_load_step() if step == -1 else step
        if load_step > 0:
            skip = resume_state.skip_on_world_change(
                self._create_checkpoint_id(load_step), load_step, self.states, self.exclude_from_loading,
                per_rank=self.per_rank_states,
            )
            if skip:
                self.exclude_from_loading = [*self.exclude_from_loading, *skip]
        return super()._load(step)

    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized):
        if from_hf:  # e.g. the published base has no adapter keys: load the base, keep the adapters' init
            for hook in self.hooks:
                state_dict = hook.hf_load_state(state_dict)
        return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)

    # --- save -----------------------------------------------------------------------------------

    def dcp_save(self, state_dict, checkpoint_id, *args, to_hf: bool = False, **kwargs):
        if to_hf and any(hook.hf_export(self, checkpoint_id) for hook in self.hooks):
            return None  # a hook wrote it (LoRA: the PEFT adapter)
        return super().dcp_save(state_dict, checkpoint_id, *args, to_hf=to_hf, **kwargs)

    def _full_save(self, step: int) -> str:
        checkpoint_id = self._create_checkpoint_id(step)
        self.dcp_save(
            self._flattened_model_states_sd(), checkpoint_id=checkpoint_id,
            async_mode=AsyncMode.DISABLED, enable_garbage_collection=True,
        )
        self._purge_stale_checkpoints()
        return checkpoint_id

    def _save_last_step(self, curr_step: int) -> None:
        from trnqwen.contract.checkpoint_layout import export_root, root_of_resume_folder

        root = root_of_resume_folder(self.folder)
        if root is None:  # not trnqwen's layout (a hand-edited config): torchtitan's behaviour
            return super()._save_last_step(curr_step)
        self._full_save(curr_step)  # resumable: `--resume --steps M` can extend a finished run
        if not self.last_save_model_only:
            return None
        resume_folder = self.folder
        self.folder = str(export_root(root))  # the export goes beside, never among, resume points
        try:
            return super()._save_last_step(curr_step)
        finally:
            self.folder = resume_folder

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        resume_state.maybe_inject_fault(curr_step)
        saved = super().save(curr_step, last_step)
        if last_step or not resume_state.everyone_stops():
            return saved
        name = resume_state.signal_name()
        where = self._create_checkpoint_id(curr_step) if saved else (self._full_save(curr_step) if self.enable else None)
        resume_state.request_stop()
        if resume_state.rank() == 0:
            text = f"saved a resumable checkpoint of step {curr_step} to {where}" if where else "checkpointing is off: nothing saved"
            resume_state.log(f"{resume_state.PREEMPTED_MARK} {name} at step {curr_step}; {text}")
        return True


def checkpoint_config(base: CheckpointManager.Config) -> TrnqwenCheckpointManager.Config:
    """torchtitan's checkpoint config as trnqwen's (the same values); kept when already one."""
    return as_trnqwen_config(base, TrnqwenCheckpointManager.Config, titan_cls=CheckpointManager.Config,
                             where="checkpoint")
