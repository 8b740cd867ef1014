"""ORPO on the hf-trainer backend: the same rows and loss as the torchtitan ranks.

Every preference method's Trainer part (the pair rows, the loss over ``num_items_in_batch`` pairs,
the validation, the ``orpo/*`` values in the Trainer's logs: TensorBoard/W&B and the metrics
stream) is :mod:`trnqwen.methods.pair_hf_trainer`'s; ORPO's own are its loss
(:func:`trnqwen.methods.orpo.loss.orpo_terms`) and its ``[ORPO]`` line.  ORPO is reference-free:
nothing runs before step 1.

:class:`ORPOHooks` is what ``runtime/hf_trainer.py`` loads from the spec's ``method_hooks``, built
with the plan's settings (``lam``).
"""

from __future__ import annotations

from typing import Any

from trnqwen.methods.orpo import loss as arith
from trnqwen.methods.orpo.titan import format_line
from trnqwen.methods.pair_hf_trainer import PairHooks


class ORPOHooks(PairHooks):
    """The hf-trainer ranks' entry points for ORPO (:class:`~trnqwen.methods.pair_hf_trainer.PairHooks`)."""

    METHOD = "orpo"
    ARITH = arith
    format_line = staticmethod(format_line)

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.lam = float(settings["lam"])

    def terms(self):
        return arith.terms_fn(lam=self.lam)
