"""GRPO inside torchtitan ranks (native, hf-v5): the rollout's reuse and reference, the loss, its values.

The generated config module sets ``config.loss = grpo_loss_config(...)``, points the dataloader at
:func:`titan_rows` (one prompt per row, from :mod:`trnqwen.methods.grpo.prompt_cache`) and passes
:class:`GRPOHook` to trnqwen's trainer (``trnqwen_config(config, hooks=[GRPOHook(...)])``, the hook
protocol of :mod:`trnqwen.runtime.trainer`).  At each step that samples (every step; with
``num_iterations`` N, steps 1, N + 1, ...), ``batches`` takes the step's prompt batches (one per
gradient-accumulation micro-batch) from the dataloader before torchtitan's first forward and rolls
them out (completions, rewards, advantages, the prompt + completion rows:
:meth:`~trnqwen.methods.grpo.rollout.GroupRollout.rollout`, every backend's one copy); then, with
``kl_beta`` > 0, the starting weights' log-probs of the completions, with ``num_iterations`` > 1 the
sampling policy's (:mod:`trnqwen.methods.grpo.reference`: one no-grad forward each).

The rollout is held (:mod:`trnqwen.methods.grpo.replay`, kept by checkpoints when it is reused) and
handed out again at the steps that reuse it, the prompt stream left alone.  ``on_batch`` gives the
loss (:class:`GRPOLoss`) each micro-batch's completion targets, advantages and those log-probs:
:func:`~trnqwen.methods.grpo.rollout.staged_loss` on that forward.

``step_values`` / ``log_lines``: the step's values over every rank
(:meth:`~trnqwen.methods.grpo.rollout.GroupRollout.step_values`) to TensorBoard/W&B, the metrics
stream (``grpo/...``) and one ``[GRPO] step:`` line (:mod:`trnqwen.methods.grpo.log_lines`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import torch
from torchtitan.components.loss import BaseLoss
from torchtitan.config import CompileConfig

from trnqwen.methods.grpo.log_lines import format_line
from trnqwen.methods.grpo.reference import StartingWeights, completion_logps
from trnqwen.methods.grpo.replay import Rollouts, RolloutState
from trnqwen.methods.grpo.rollout import GroupRollout, describe, read_prompts, staged_loss
from trnqwen.runtime.trainer import TrainerHook

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

KEYS = ("grpo_row", "grpo_prompt_mask")  # what a GRPO prompt batch carries beside input/positions
ROLLOUT_KEY = "grpo_rollout"  # the checkpoint's state of the rollout being reused (num_iterations > 1)


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a prompt cache (``TokenCacheDataLoader.Config.rows``):
    the prompt (from position 0), its mask and its row number (the record its rewards read)."""
    for ids, labels, positions, mask, row in read_prompts(dataset.split, dataset.stream):
        yield ({"input": torch.from_numpy(ids), "positions": torch.from_numpy(positions),
                "grpo_prompt_mask": torch.from_numpy(mask), "grpo_row": torch.tensor(row)},
               torch.from_numpy(labels))


class GRPOLoss(BaseLoss):
    """torchtitan loss: GRPO's clipped surrogate on the staged rows (module doc); ``labels`` unused."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        loss_type: str = "dapo"
        epsilon: float = 0.2
        epsilon_high: float = 0.2
        temperature: float = 1.0
        max_completion_length: int = 64
        beta: float = 0.0
        """The KL term's weight (``--kl-beta``, TRL's ``beta``): the rollout then carries the reference's log-probs."""
        settings: str = "{}"
        """The hook's settings, JSON (:func:`trnqwen.methods.grpo.plan.hook_settings`): the rollout, the rewards, the data."""

    def __init__(self, config: Config, *, compile_config: Optional[CompileConfig] = None) -> None:
        del compile_config
        self.config = config
        self.staged: Optional[dict[str, Any]] = None
        self.sums: Optional[torch.Tensor] = None  # [SUMS..., tokens, clipped-token count]

    def stage(self, *, targets: torch.Tensor, advantages: torch.Tensor, global_tokens: float, micro_batches: int,
              old_logps: Optional[torch.Tensor] = None, ref_logps: Optional[torch.Tensor] = None) -> None:
        """The next forward's rollout: each completion token's target (-100 elsewhere), each row's
        advantage, the step's completion tokens over every rank (dapo) and its micro-batches (the rest);
        the sampling policy's log-probs (``num_iterations`` > 1) and the reference's (``beta`` > 0),
        ``[rows, seq_len]`` aligned with ``targets``."""
        self.staged = {"targets": targets, "advantages": advantages, "global_tokens": global_tokens,
                       "micro_batches": micro_batches, "old_logps": old_logps, "ref_logps": ref_logps}

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, global_valid_tokens, kwargs
        batch, self.staged = self.staged, None
        if batch is None:
            raise RuntimeError("the GRPO loss ran without its rollout: the batch did not come from a prompt cache")
        c = self.config
        loss, row = staged_loss(pred, **batch, beta=c.beta, loss_type=c.loss_type, epsilon=c.epsilon,
                                epsilon_high=c.epsilon_high, temperature=c.temperature,
                                max_completion_length=c.max_completion_length)
        self.sums = row if self.sums is None else self.sums + row.to(self.sums.device)
        return loss, {}

    def take_sums(self) -> Optional[torch.Tensor]:
        sums, self.sums = self.sums, None
        return sums


def grpo_loss_config(*, loss_type: str, epsilon: float, epsilon_high: float, temperature: float,
                     max_completion_length: int, settings: dict[str, Any], beta: float = 0.0) -> GRPOLoss.Config:
    """The loss config for the generated module (its :class:`GRPOHook` goes in ``config.hooks``)."""
    return GRPOLoss.Config(loss_type=loss_type, epsilon=epsilon, epsilon_high=epsilon_high, temperature=temperature,
                           max_completion_length=max_completion_length, beta=beta,
                           settings=json.dumps(settings, sort_keys=True))


class GRPOHook(TrainerHook):
    """GRPO's trainer hook (module doc); its settings are the plan's, carried by the loss config."""

    name = "grpo"
    method = True

    def __init__(self) -> None:
        # no parameters: tyro (torchtitan's config parser) rebuilds each hook from its constructor's
        # defaults; the settings ride on the loss config (GRPOLoss.Config.settings), read in on_init
        self.values: dict[str, Any] = {}
        self.rollout: Optional[GroupRollout] = None
        self.rollouts = Rollouts()
        self.starting: Optional[StartingWeights] = None  # kl_beta > 0: the reference's weights
        self.last: Optional[dict[str, float]] = None

    # --- set-up -------------------------------------------------------------------------------

    def on_init(self, trainer: Trainer) -> None:
        if not isinstance(trainer.loss_fn, GRPOLoss):
            return
        self.values = s = json.loads(trainer.loss_fn.config.settings)
        root = trainer.model_parts[0]
        # hf-v5: torchtitan's wrapper holds the transformers causal LM (which generates with its own
        # cache); its root holds the FSDP-sharded embeddings and lm_head
        inner = getattr(root, "model", None)
        hf = inner is not None and hasattr(inner, "generation_config")
        if hf:
            _fsdp_root_ready(root)
        self.rollout = GroupRollout(s, model=inner if hf else root, weights_root=root if hf else None,
                                    kind="hf" if hf else "titan")
        self.rollouts = Rollouts(int(s.get("num_iterations", 1)))

    def after_checkpoint_load(self, trainer: Trainer) -> None:
        """``kl_beta`` > 0: the reference's weights, the model's now at step 0 (a resumed run: reloaded)."""
        if not isinstance(trainer.loss_fn, GRPOLoss) or not trainer.loss_fn.config.beta:
            return
        model = trainer.model_parts[0]
        self.starting = StartingWeights.capture(model) if trainer.step == 0 else StartingWeights.reload(model, trainer)

    def checkpoint_states(self, trainer: Trainer) -> dict[str, Any]:
        """``num_iterations`` > 1: the rollout being reused, kept by a checkpoint (a resumed run goes on with it)."""
        if not isinstance(trainer.loss_fn, GRPOLoss) or self.rollouts.num_iterations == 1:
            return {}
        rows = int(trainer.config.training.local_batch_size) * int(self.values["num_generations"])
        return {ROLLOUT_KEY: RolloutState(
            self.rollouts, rank=self.rollout.rank,
            micro_batches=max(1, int(getattr(trainer, "gradient_accumulation_steps", 1))),
            rows=rows, seq_len=int(trainer.config.training.seq_len), world_rows=self.rollout.world * rows,
            width=len(self.rollout.rewards.names) + 4)}

    # --- each step's micro-batches ---------------------------------------------------------------

    def batches(self, trainer: Trainer, batches: Iterable) -> Iterable:
        if not isinstance(getattr(trainer, "loss_fn", None), GRPOLoss):
            return batches
        return self._rollout_batches(trainer, batches)

    def _rollout_batches(self, trainer: Trainer, prompt_batches: Iterable) -> Iterator:
        """Each step's micro-batches: at a step that samples (:meth:`Rollouts.due`) the step's prompt
        batches, all of them rolled out and scored before the first forward (TRL's generation batch:
        the advantages' "batch" statistics and dapo's token count span the whole step); at the others,
        the held rollout again (``num_iterations``), the prompt stream left where it is."""
        accumulation = max(1, int(getattr(trainer, "gradient_accumulation_steps", 1)))
        upstream = iter(prompt_batches)
        while True:
            step = trainer.step
            rollout_s = 0.0
            if self.rollouts.due(step):
                fetched = []
                for _ in range(accumulation):
                    try:
                        fetched.append(next(upstream))
                    except StopIteration:
                        return
                began = time.perf_counter()
                self.rollouts.fill(step, self._rollout(trainer, [batch for batch, _labels in fetched]))
                rollout_s = time.perf_counter() - began
            self.rollout.training_on(self.rollouts.items, rollout_s)
            for micro, item in enumerate(self.rollouts.items):
                yield item.batch(micro)

    def _rollout(self, trainer: Trainer, prompt_batches: list[dict]):
        """The step's prompt batches (one per micro-batch) as scored completion rows for the loss
        (:meth:`GroupRollout.rollout`), then, with ``kl_beta`` > 0 or ``num_iterations`` > 1, the
        reference's and the old policy's log-probs."""
        items = self.rollout.rollout(trainer.step, [(batch["input"], batch.pop("grpo_prompt_mask"), batch.pop("grpo_row"))
                                                    for batch in prompt_batches])
        temperature = float(self.values["temperature"])
        if self.starting is not None:  # the reference first: the swap leaves the trained weights as they were
            with self.starting.swapped_in():
                for item in items:
                    item.ref_logps = completion_logps(trainer, item.seq, item.targets, temperature=temperature)
        if self.rollouts.num_iterations > 1:
            for item in items:
                item.old_logps = completion_logps(trainer, item.seq, item.targets, temperature=temperature)
        return items

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        if "grpo_micro" not in input_dict:
            return
        micro = int(input_dict.pop("grpo_micro"))
        if mode != "train" or not isinstance(trainer.loss_fn, GRPOLoss):
            return
        item = self.rollouts.items[micro]
        trainer.loss_fn.stage(targets=item.targets, advantages=item.advantages, global_tokens=self.rollouts.tokens,
                              micro_batches=self.rollout.world * len(self.rollouts.items), old_logps=item.old_logps,
                              ref_logps=item.ref_logps)

    # --- each logged step ---------------------------------------------------------------------

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        loss = getattr(trainer, "loss_fn", None)
        if mode != "train" or not isinstance(loss, GRPOLoss) or self.rollout is None or not self.rollout.rows:
            self.last = None
            return {}
        values = self.rollout.step_values(loss.take_sums())
        self.last = values
        return values

    def log_lines(self, step: int, mode: str) -> list[str]:
        return [format_line(step, self.last)] if self.last and mode == "train" else []

    def describe(self) -> dict[str, str]:
        return describe(self.rollout.rewards.names if self.rollout is not None else [])


def _fsdp_root_ready(root: torch.nn.Module) -> None:
    """FSDP2 finds its root at the first forward of the root module; a rollout that calls the
    wrapped transformers model first would make each of its sharded children a root of its own
    (``FSDP requires a single root module``): the root's state is set up now, as its forward would."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return
    if isinstance(root, FSDPModule):
        root._get_fsdp_state()._lazy_init()
