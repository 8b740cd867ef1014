"""GRPO on the hf-trainer backend: the torchtitan ranks' rollout, rewards, advantages and loss in the
Transformers Trainer.

Everything a micro-batch does is :mod:`trnqwen.methods.grpo.rollout`'s (the one copy the torchtitan
hook uses too); this module only wires it into the Trainer:

* :class:`PromptRows`: the rank's prompt rows of the cache in every backend's training order
  (:mod:`trnqwen.runtime.token_stream`), with their mask and row number; no ``labels``, so the
  Trainer counts no items and leaves the normalising to the loss;
* :func:`grpo_trainer_class`: ``training_step`` turns the prompts into their scored prompt +
  completion rows (:meth:`~trnqwen.methods.grpo.rollout.GroupRollout.rollout`, one micro-batch a
  step, sampled afresh each step: the plan refuses ``--global-batch-size``, ``--num-iterations`` and
  ``--kl-beta`` here, the torchtitan hook's for now) before the Trainer's own step (the rollout on
  the model being trained: the base plus the adapter under ``--lora``; sampling seeded by (seed,
  step, rank, micro-batch) with the step being trained, as torchtitan counts it, so a resumed run
  draws the same completions);
  ``compute_loss`` is :func:`~trnqwen.methods.grpo.rollout.staged_loss` on that forward, times the
  data-parallel ranks (DDP averages gradients, torchtitan sums them: the same update, and the
  logged loss, a mean over ranks, is torchtitan's sum); the step's ``grpo/...`` values join the
  Trainer's logs (TensorBoard/W&B, the metrics stream) and rank 0 prints the ``[GRPO] step:`` line
  after the step line;
* :class:`GRPOHooks`: what ``runtime/hf_trainer.py`` loads from the spec's ``method_hooks``, built
  with the plan's settings (the rollout's, and the loss's: ``loss_type``, ``epsilon``, ``epsilon_high``).

TRL's ``GRPOTrainer`` is not used, for the reason DPO's is not (``pair_hf_trainer``): a second data
path and loss would break the number-for-number comparison between backends.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.methods.grpo.log_lines import format_line
from trnqwen.methods.grpo.rollout import GroupRollout, read_prompts, staged_loss
from trnqwen.runtime.hf_trainer_data import CacheRows, cache_datasets

METHOD = "grpo"


class PromptRows(CacheRows):
    """One rank's prompt rows, as Trainer batch rows (``input_ids``, ``position_ids``,
    ``grpo_prompt_mask``, ``grpo_row``)."""

    def __iter__(self):
        for ids, _labels, positions, mask, row in read_prompts(self.split, self.stream):
            yield {"input_ids": torch.from_numpy(ids), "position_ids": torch.from_numpy(positions),
                   "grpo_prompt_mask": torch.from_numpy(mask), "grpo_row": torch.tensor(row)}


def grpo_trainer_class(trainer_cls: type, settings: dict[str, Any]) -> type:
    """``trainer_cls`` (the cache trainer) with GRPO's rollout, loss, values and line (module doc)."""
    from transformers import TrainerCallback

    class GRPOLines(TrainerCallback):
        """The step's values over every rank at its end; rank 0 prints them after the step line."""

        def __init__(self, trainer) -> None:
            self.trainer, self.values = trainer, None

        def on_step_end(self, args, state, control, **kwargs):
            rollout = self.trainer.grpo
            values = rollout.step_values(self.trainer.take_grpo_sums()) if rollout is not None else {}
            self.values = (state.global_step, values) if values else None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.values and state.is_world_process_zero and "loss" in (logs or {}):
                print(format_line(*self.values), flush=True)
            self.values = None

    class GRPOTrainer(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.grpo: Optional[GroupRollout] = None  # built at the first step, on the model being trained
            self.grpo_staged = None
            self.grpo_sums: Optional[torch.Tensor] = None
            self.grpo_lines = GRPOLines(self)
            self.add_callback(self.grpo_lines)

        def _replicas(self) -> int:
            return max(1, self.accelerator.num_processes // self.get_tp_size())

        def training_step(self, model, inputs, num_items_in_batch=None):
            if "grpo_row" not in inputs:
                raise RuntimeError("the GRPO step ran without its prompts: the batch did not come from a prompt cache")
            if self.grpo is None:
                self.grpo = GroupRollout(settings, model=self.model, kind="hf")
            # one micro-batch a step (the plan refuses --global-batch-size here), its rollout fresh each step
            # (and --num-iterations); the step being trained, as torchtitan counts it, seeds the sampling
            began = time.perf_counter()
            [staged] = self.grpo.rollout(self.state.global_step + 1,
                                         [(inputs["input_ids"], inputs["grpo_prompt_mask"], inputs["grpo_row"])])
            self.grpo.training_on([staged], time.perf_counter() - began)
            self.grpo_staged = staged
            return super().training_step(model, {"input_ids": staged.seq, "position_ids": staged.positions()},
                                         num_items_in_batch)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            staged, self.grpo_staged = self.grpo_staged, None
            if staged is None:
                raise RuntimeError("the GRPO loss ran without its rollout")
            out = model(**inputs, use_cache=False)
            loss, row = staged_loss(
                out.logits, targets=staged.targets, advantages=staged.advantages, global_tokens=staged.tokens,
                micro_batches=self._replicas() * max(1, int(self.args.gradient_accumulation_steps)),
                loss_type=str(settings["loss_type"]), epsilon=float(settings["epsilon"]),
                epsilon_high=float(settings["epsilon_high"]), temperature=float(settings["temperature"]),
                max_completion_length=int(settings["max_completion_length"]))
            self.grpo_sums = row if self.grpo_sums is None else self.grpo_sums + row.to(self.grpo_sums.device)
            loss = loss * self._replicas()  # undo DDP's gradient mean: torchtitan sums the ranks' shares
            return (loss, out) if return_outputs else loss

        def take_grpo_sums(self) -> Optional[torch.Tensor]:
            sums, self.grpo_sums = self.grpo_sums, None
            return sums

        def log(self, logs, *args, **kwargs):
            """The step's values join the Trainer's own logs (its TensorBoard/W&B writers, the stream)."""
            values = self.grpo_lines.values
            if values and "loss" in logs:
                logs = {**logs, **{f"{METHOD}/{k}": v for k, v in values[1].items()}}
            return super().log(logs, *args, **kwargs)

    GRPOTrainer.__name__ = GRPOTrainer.__qualname__ = "GRPOTrainer"
    return GRPOTrainer


class GRPOHooks:
    """The hf-trainer ranks' entry points for GRPO (``datasets``, ``trainer_class``, ``before_train``:
    the points where a method enters the Trainer run, as :class:`~trnqwen.methods.pair_hf_trainer.PairHooks`)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)

    def datasets(self, spec: HFTrainerSpec, *, rank: int, world: int):
        """(train, None): the rank's prompt rows (GRPO has no validation yet: the plan refuses it)."""
        return cache_datasets(spec, rank=rank, world=world, rows=PromptRows)

    def trainer_class(self, trainer_cls: type, *, log_validation: Callable[[int, float, float], None]) -> type:
        del log_validation
        return grpo_trainer_class(trainer_cls, self.settings)

    def before_train(self, spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int,
                     resumed_at: int, log: Callable[[str], None]) -> None:
        """Nothing runs before step 1 (the rollout runs in each step)."""
