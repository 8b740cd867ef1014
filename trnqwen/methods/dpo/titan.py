"""DPO inside torchtitan ranks (native and hf-v5): the loss, its batch, its log lines.

The generated config module sets ``config.loss = dpo_loss_config(beta=..., loss_type=...,
reference_dir=...)``, points its dataloaders at the same reference folder and passes
:class:`DPOHook` to trnqwen's trainer (``trnqwen_config(config, hooks=[DPOHook()])``, the hook
protocol of :mod:`trnqwen.runtime.trainer`; each a no-op when the loss is not DPO's):

* ``on_batch`` (train and validation): a DPO batch carries ``dpo_targets``,
  ``dpo_segments`` and ``dpo_ref`` beside ``input``/``positions``; they are taken out (the model
  must not see them) and handed to the loss, which runs right after that forward;
* ``after_checkpoint_load``: right after the checkpoint load, the reference pass
  (:mod:`trnqwen.methods.dpo.reference_pass`) computes the reference log-probs from the starting
  weights, or finds them on disk;
* ``step_values`` / ``log_lines``: the step's (or validation's) rewards, margin and accuracy, summed
  over every rank, go to TensorBoard/W&B and the metrics stream (``dpo/...``) and to one ``[DPO]``
  line after the step line.

The batch's ``labels`` mark one position per pair (:func:`trnqwen.methods.pairs.pair_markers`),
so torchtitan's "valid tokens" count pairs and its ``sum / global_valid_tokens`` normalisation
makes the logged loss the mean DPO loss over every pair of the step.  Pipeline parallelism is not
supported (the loss needs its batch next to the forward); trnqwen never enables it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

import torch
from torchtitan.components.loss import BaseLoss

from trnqwen.methods.dpo.loss import KEYS, METRICS, Meter, pair_terms
from trnqwen.methods.pairs import segment_logps, sum_over_ranks
from trnqwen.runtime.trainer import TrainerHook

_ACTIVE: Optional["DPOLoss"] = None  # the rank's DPO loss (one trainer per process)


class DPOLoss(BaseLoss):
    """torchtitan loss: the mean DPO loss over the step's pairs (see the module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        beta: float = 0.1
        loss_type: str = "sigmoid"
        reference_dir: str = ""
        """Where the reference log-probs of these starting weights live (``<cache>/reference/<key>``)."""

    def __init__(self, config: Config, *, compile_config: Any = None) -> None:
        global _ACTIVE
        self.config = config
        self.batch: Optional[dict[str, torch.Tensor]] = None
        self.mode = "train"
        self.meters = {"train": Meter(), "val": Meter()}
        _ACTIVE = self

    def stage(self, extras: dict[str, torch.Tensor], mode: str) -> None:
        self.batch, self.mode = extras, mode

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, kwargs
        batch, self.batch = self.batch, None
        if batch is None:
            raise RuntimeError("the DPO loss ran without its pairs: the batch did not come from a DPO token cache")
        device = pred.device
        targets, segments, reference = (batch[k].to(device) for k in KEYS)
        policy, counts = segment_logps(pred, targets, segments, reference.shape[1])
        terms = pair_terms(policy, reference, counts, beta=self.config.beta, loss_type=self.config.loss_type)
        self.meters[self.mode].add(terms)
        loss = terms.losses.sum()
        if global_valid_tokens is not None:  # = the step's pairs on every rank (one marker per pair)
            loss = loss / global_valid_tokens
        return loss, {}


def active() -> Optional[DPOLoss]:
    return _ACTIVE


def dpo_loss_config(*, beta: float, loss_type: str, reference_dir: str) -> DPOLoss.Config:
    """The loss config for the generated module (its :class:`DPOHook` goes in ``config.hooks``)."""
    return DPOLoss.Config(beta=beta, loss_type=loss_type, reference_dir=reference_dir)


class DPOHook(TrainerHook):
    """DPO's trainer hook (:class:`trnqwen.runtime.trainer.TrainerHook`): each a no-op when the
    run's loss is not :class:`DPOLoss`."""

    name = "dpo"
    method = True

    def __init__(self) -> None:
        self.last: dict[str, Optional[dict[str, float]]] = {}

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        extras = {k: input_dict.pop(k) for k in KEYS if k in input_dict}
        if extras and isinstance(trainer.loss_fn, DPOLoss):
            trainer.loss_fn.stage(extras, mode)

    def after_checkpoint_load(self, trainer: Trainer) -> None:
        if isinstance(trainer.loss_fn, DPOLoss):
            from trnqwen.methods.dpo import reference_pass

            reference_pass.ensure(trainer)

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        loss = _ACTIVE
        values = loss.meters[mode].reduce(sum_over_ranks) if loss is not None else None
        self.last[mode] = values
        return {k: values[k] for k in METRICS} if values else {}

    def log_lines(self, step: int, mode: str) -> list[str]:
        from trnqwen.methods.dpo.log_lines import format_line

        values = self.last.get(mode)
        return [format_line(step, values, validate=mode == "val")] if values else []

    def describe(self) -> dict[str, str]:
        return {
            "rewards_chosen": "beta * (policy - reference) log-prob of the chosen answers, mean over pairs",
            "rewards_rejected": "beta * (policy - reference) log-prob of the rejected answers, mean over pairs",
            "margin": "rewards_chosen - rewards_rejected, mean over pairs",
            "accuracy": "fraction of pairs whose chosen reward beats the rejected one",
        }
