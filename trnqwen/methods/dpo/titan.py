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

What every preference method does the same (staging the batch, the pair mean, the meters, the
values) is :mod:`trnqwen.methods.pair_titan`'s; here only what is DPO's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchtitan.components.loss import BaseLoss

from trnqwen.methods.dpo import loss as arith
from trnqwen.methods.dpo.log_lines import format_line
from trnqwen.methods.pair_titan import PairHook, PairLoss

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer


class DPOLoss(PairLoss):
    """torchtitan loss: the mean DPO loss over the step's pairs (see the module doc)."""

    NAME = "DPO"
    ARITH = arith

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        beta: float = 0.1
        loss_type: str = "sigmoid"
        reference_dir: str = ""
        """Where the reference log-probs of these starting weights live (``<cache>/reference/<key>``)."""

    def terms_fn(self):
        return arith.terms_fn(beta=self.config.beta, loss_type=self.config.loss_type)


def dpo_loss_config(*, beta: float, loss_type: str, reference_dir: str) -> DPOLoss.Config:
    """The loss config for the generated module (its :class:`DPOHook` goes in ``config.hooks``)."""
    return DPOLoss.Config(beta=beta, loss_type=loss_type, reference_dir=reference_dir)


class DPOHook(PairHook):
    """DPO's trainer hook: :class:`~trnqwen.methods.pair_titan.PairHook` plus the reference pass
    after the checkpoint load."""

    name = "dpo"
    LOSS = DPOLoss
    format_line = staticmethod(format_line)

    def after_checkpoint_load(self, trainer: Trainer) -> None:
        if isinstance(trainer.loss_fn, DPOLoss):
            from trnqwen.methods.dpo import reference_pass

            reference_pass.ensure(trainer)

    def describe(self) -> dict[str, str]:
        return {
            "rewards_chosen": "beta * (policy - reference) log-prob of the chosen answers, mean over pairs",
            "rewards_rejected": "beta * (policy - reference) log-prob of the rejected answers, mean over pairs",
            "margin": "rewards_chosen - rewards_rejected, mean over pairs",
            "accuracy": "fraction of pairs whose chosen reward beats the rejected one",
        }
