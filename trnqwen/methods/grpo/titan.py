"""GRPO inside torchtitan ranks (native): the rollout, the rewards, the advantages, the loss, its values.

The generated config module sets ``config.loss = grpo_loss_config(...)``, points the dataloader at
:func:`titan_rows` (one prompt per row, from :mod:`trnqwen.methods.grpo.prompt_cache`) and passes
:class:`GRPOHook` to trnqwen's trainer (``trnqwen_config(config, hooks=[GRPOHook(...)])``, the hook
protocol of :mod:`trnqwen.runtime.trainer`).  Each training micro-batch, in ``on_batch``, the
rank's prompts become their scored prompt + completion rows (rollout, rewards, advantages:
:class:`~trnqwen.methods.grpo.rollout.GroupRollout`, every backend's one copy) and the loss
(:class:`GRPOLoss`) gets each completion token's target and its row's advantage:
:func:`~trnqwen.methods.grpo.rollout.staged_loss` on that forward.

``step_values`` / ``log_lines``: the step's values over every rank
(:meth:`~trnqwen.methods.grpo.rollout.GroupRollout.step_values`) to TensorBoard/W&B, the metrics
stream (``grpo/...``) and one ``[GRPO] step:`` line (:mod:`trnqwen.methods.grpo.log_lines`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torchtitan.components.loss import BaseLoss
from torchtitan.config import CompileConfig

from trnqwen.methods.grpo.log_lines import format_line
from trnqwen.methods.grpo.rollout import GroupRollout, describe, read_prompts, staged_loss
from trnqwen.runtime.trainer import TrainerHook

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

KEYS = ("grpo_row", "grpo_prompt_mask")  # what a GRPO batch carries beside input/positions


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
        settings: str = "{}"
        """The hook's settings, JSON (:func:`trnqwen.methods.grpo.plan.hook_settings`): the rollout, the rewards, the data."""

    def __init__(self, config: Config, *, compile_config: Optional[CompileConfig] = None) -> None:
        del compile_config
        self.config = config
        self.staged: Optional[dict[str, Any]] = None
        self.sums: Optional[torch.Tensor] = None  # [SUMS..., tokens, clipped-token count]

    def stage(self, *, targets: torch.Tensor, advantages: torch.Tensor, global_tokens: float, micro_batches: int) -> None:
        """The next forward's rollout: each completion token's target (-100 elsewhere), each row's
        advantage, the step's completion tokens over every rank (dapo) and its micro-batches (the rest)."""
        self.staged = {"targets": targets, "advantages": advantages, "global_tokens": global_tokens,
                       "micro_batches": micro_batches}

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, global_valid_tokens, kwargs
        batch, self.staged = self.staged, None
        if batch is None:
            raise RuntimeError("the GRPO loss ran without its rollout: the batch did not come from a prompt cache")
        c = self.config
        loss, row = staged_loss(pred, **batch, loss_type=c.loss_type, epsilon=c.epsilon, epsilon_high=c.epsilon_high,
                                temperature=c.temperature, max_completion_length=c.max_completion_length)
        self.sums = row if self.sums is None else self.sums + row.to(self.sums.device)
        return loss, {}

    def take_sums(self) -> Optional[torch.Tensor]:
        sums, self.sums = self.sums, None
        return sums


def grpo_loss_config(*, loss_type: str, epsilon: float, epsilon_high: float, temperature: float,
                     max_completion_length: int, settings: dict[str, Any]) -> GRPOLoss.Config:
    """The loss config for the generated module (its :class:`GRPOHook` goes in ``config.hooks``)."""
    return GRPOLoss.Config(loss_type=loss_type, epsilon=epsilon, epsilon_high=epsilon_high, temperature=temperature,
                           max_completion_length=max_completion_length, settings=json.dumps(settings, sort_keys=True))


class GRPOHook(TrainerHook):
    """GRPO's trainer hook (module doc); its settings are the plan's, carried by the loss config."""

    name = "grpo"
    method = True

    def __init__(self) -> None:
        # no parameters: tyro (torchtitan's config parser) rebuilds each hook from its constructor's
        # defaults; the settings ride on the loss config (GRPOLoss.Config.settings), read in on_init
        self.values: dict[str, Any] = {}
        self.rollout: Optional[GroupRollout] = None
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

    # --- each micro-batch -----------------------------------------------------------------------

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        if "grpo_row" not in input_dict:
            return
        rows = input_dict.pop("grpo_row").cpu()
        prompt_mask = input_dict.pop("grpo_prompt_mask").cpu()
        if mode != "train" or not isinstance(trainer.loss_fn, GRPOLoss):
            return
        micro_batches = self.rollout.world * max(1, int(getattr(trainer, "gradient_accumulation_steps", 1)))
        staged = self.rollout.micro_batch(input_dict["input"], prompt_mask, rows, step=trainer.step,
                                          micro_batches=micro_batches)
        device = input_dict["input"].device
        input_dict["input"] = staged.seq.to(device)
        input_dict["positions"] = staged.positions.to(device)
        trainer.loss_fn.stage(targets=staged.targets, advantages=staged.advantages,
                              global_tokens=staged.tokens, micro_batches=staged.micro_batches)

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
