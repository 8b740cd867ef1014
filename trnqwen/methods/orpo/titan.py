"""ORPO inside torchtitan ranks (native and hf-v5): the loss, its batch, its values.

The generated config module sets ``config.loss = orpo_loss_config(lam=...)``, points its
dataloaders at ORPO's pair rows (:func:`trnqwen.methods.orpo.loss.titan_rows`) and passes
:class:`ORPOHook` to trnqwen's trainer (``trnqwen_config(config, hooks=[ORPOHook()])``, the hook
protocol of :mod:`trnqwen.runtime.trainer`; each a no-op when the loss is not ORPO's):

* ``on_batch`` (train and validation): an ORPO batch carries ``orpo_targets``,
  ``orpo_segments`` and ``orpo_slots`` beside ``input``/``positions``; they are taken out (the model must not see
  them) and handed to the loss, which runs right after that forward;
* ``step_values`` / ``log_lines``: the step's (or validation's) NLL, log odds (ratio), rewards,
  margin and accuracy, summed over every rank, go to TensorBoard/W&B and the metrics stream
  (``orpo/...``) and to one ``[ORPO]`` line after the step line.

No ``after_checkpoint_load``: ORPO has no reference, so nothing runs before step 1.  The batch's
``labels`` mark one position per pair (:func:`trnqwen.methods.pairs.pair_markers`), so
torchtitan's ``sum / global_valid_tokens`` makes the logged loss the mean ORPO loss over every
pair of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

import torch
from torchtitan.components.loss import BaseLoss

from trnqwen.methods.orpo.loss import KEYS, METRICS, Meter, orpo_terms
from trnqwen.methods.pairs import segment_logps, sum_over_ranks
from trnqwen.runtime.trainer import TrainerHook

MARK = "[ORPO]"


class ORPOLoss(BaseLoss):
    """torchtitan loss: the mean ORPO loss over the step's pairs (see the module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        lam: float = 0.1
        """lambda: the odds-ratio term's weight beside the chosen answers' NLL."""

    def __init__(self, config: Config, *, compile_config: Any = None) -> None:
        self.config = config
        self.batch: Optional[dict[str, torch.Tensor]] = None
        self.mode = "train"
        self.meters = {"train": Meter(), "val": Meter()}

    def stage(self, extras: dict[str, torch.Tensor], mode: str) -> None:
        self.batch, self.mode = extras, mode

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, kwargs
        batch, self.batch = self.batch, None
        if batch is None:
            raise RuntimeError("the ORPO loss ran without its pairs: the batch did not come from a preference token cache")
        targets, segments, slots = (batch[k].to(pred.device) for k in KEYS)
        sums, counts = segment_logps(pred, targets, segments, slots.shape[1])
        terms = orpo_terms(sums, counts, lam=self.config.lam)
        self.meters[self.mode].add(terms)
        loss = terms.losses.sum()
        if global_valid_tokens is not None:  # = the step's pairs on every rank (one marker per pair)
            loss = loss / global_valid_tokens
        return loss, {}


def orpo_loss_config(*, lam: float) -> ORPOLoss.Config:
    """The loss config for the generated module (its :class:`ORPOHook` goes in ``config.hooks``)."""
    return ORPOLoss.Config(lam=lam)


def format_line(step: int, values: dict[str, float], *, validate: bool = False) -> str:
    """``[ORPO] step: 3  nll: ...  log_odds_ratio: ...  ...  pairs: 8`` (the validation's adds its loss)."""
    text = f"{MARK} {'validate ' if validate else ''}step: {step}  " + "  ".join(
        f"{k}: {values[k]:.6f}" for k in METRICS)
    if validate:
        text += f"  orpo_loss: {values['loss']:.6f}"
    return text + f"  pairs: {int(values['pairs'])}"


class ORPOHook(TrainerHook):
    """ORPO's trainer hook (:class:`trnqwen.runtime.trainer.TrainerHook`): each a no-op when the
    run's loss is not :class:`ORPOLoss`."""

    name = "orpo"
    method = True

    def __init__(self) -> None:
        self.loss: Optional[ORPOLoss] = None
        self.last: dict[str, Optional[dict[str, float]]] = {}

    def on_init(self, trainer: Trainer) -> None:
        if isinstance(trainer.loss_fn, ORPOLoss):
            self.loss = trainer.loss_fn

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        extras = {k: input_dict.pop(k) for k in KEYS if k in input_dict}
        if extras and isinstance(trainer.loss_fn, ORPOLoss):
            self.loss = trainer.loss_fn
            trainer.loss_fn.stage(extras, mode)

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        loss = self.loss if self.loss is not None else (
            trainer.loss_fn if isinstance(getattr(trainer, "loss_fn", None), ORPOLoss) else None)
        values = loss.meters[mode].reduce(sum_over_ranks) if loss is not None else None
        self.last[mode] = values
        return {k: values[k] for k in METRICS} if values else {}

    def log_lines(self, step: int, mode: str) -> list[str]:
        values = self.last.get(mode)
        return [format_line(step, values, validate=mode == "val")] if values else []

    def describe(self) -> dict[str, str]:
        return {
            "nll": "mean NLL per token of the chosen answers, mean over pairs",
            "log_odds_ratio": "log sigmoid(log odds) of chosen vs rejected, mean over pairs (the term lambda weighs)",
            "log_odds": "log odds(chosen) - log odds(rejected) of the mean token log-probs, mean over pairs",
            "rewards_chosen": "lambda x mean token log-prob of the chosen answers, mean over pairs",
            "rewards_rejected": "lambda x mean token log-prob of the rejected answers, mean over pairs",
            "margin": "rewards_chosen - rewards_rejected, mean over pairs",
            "accuracy": "fraction of pairs whose chosen reward beats the rejected one",
        }
