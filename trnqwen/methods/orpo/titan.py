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

No ``after_checkpoint_load``: ORPO has no reference, so nothing runs before step 1.  What every
preference method does the same (staging the batch, the pair mean, the meters, the values) is
:mod:`trnqwen.methods.pair_titan`'s; here only what is ORPO's.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.components.loss import BaseLoss

from trnqwen.methods.orpo import loss as arith
from trnqwen.methods.pair_titan import PairHook, PairLoss

MARK = "[ORPO]"


class ORPOLoss(PairLoss):
    """torchtitan loss: the mean ORPO loss over the step's pairs (see the module doc)."""

    NAME = "ORPO"
    ARITH = arith

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        lam: float = 0.1
        """lambda: the odds-ratio term's weight beside the chosen answers' NLL."""

    def terms_fn(self):
        return arith.terms_fn(lam=self.config.lam)


def orpo_loss_config(*, lam: float) -> ORPOLoss.Config:
    """The loss config for the generated module (its :class:`ORPOHook` goes in ``config.hooks``)."""
    return ORPOLoss.Config(lam=lam)


def format_line(step: int, values: dict[str, float], *, validate: bool = False) -> str:
    """``[ORPO] step: 3  nll: ...  log_odds_ratio: ...  ...  pairs: 8`` (the validation's adds its loss)."""
    text = f"{MARK} {'validate ' if validate else ''}step: {step}  " + "  ".join(
        f"{k}: {values[k]:.6f}" for k in arith.METRICS)
    if validate:
        text += f"  orpo_loss: {values['loss']:.6f}"
    return text + f"  pairs: {int(values['pairs'])}"


class ORPOHook(PairHook):
    """ORPO's trainer hook: :class:`~trnqwen.methods.pair_titan.PairHook` with ORPO's loss, values and line."""

    name = "orpo"
    LOSS = ORPOLoss
    format_line = staticmethod(format_line)

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
