"""What every preference method shares inside torchtitan ranks (native and hf-v5): its loss and
its trainer hook, each method's modules keeping only what differs (its batch fields, its terms,
its line).

* :class:`PairLoss` (a torchtitan ``BaseLoss``): the batch's pair fields are staged by the hook
  just before the forward; the loss is the sum of the method's per-pair terms
  (:func:`trnqwen.methods.pairs.batch_terms`) over ``global_valid_tokens``, which counts pairs
  (the batch's labels mark one position per pair), so the logged loss is the mean over every
  pair of the step; a meter per mode (train, val) sums the terms for the log.
* :class:`PairHook` (:class:`trnqwen.runtime.trainer.TrainerHook`): ``on_batch`` takes the
  method's fields out of the batch (the model must not see them) and stages them on the loss;
  ``step_values`` reduces the meter over every rank (``<method>/<value>``: TensorBoard/W&B and the
  metrics stream); ``log_lines`` writes the method's line after torchtitan's.  Each a no-op when the
  run's loss is not the method's.

Pipeline parallelism is not supported (the loss needs its batch next to the forward); trnqwen
never enables it.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torchtitan.components.loss import BaseLoss
from torchtitan.config import CompileConfig

from trnqwen.methods.pairs import PairMeter, TermsFn, batch_terms, sum_over_ranks
from trnqwen.runtime.trainer import TrainerHook

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer


class PairLoss(BaseLoss):
    """A preference method's torchtitan loss (module doc); a method's subclass names itself
    (``NAME``) and its arithmetic module (``ARITH``: ``KEYS``, the batch's fields; ``TERMS``, what
    the meter sums; ``METRICS``, the values logged) and builds :meth:`terms_fn` from its config."""

    NAME = ""  # the method, for messages
    ARITH: ModuleType

    def __init__(self, config: BaseLoss.Config, *, compile_config: Optional[CompileConfig] = None) -> None:
        del compile_config  # nothing to compile: the terms are a few ops per pair
        self.config = config
        self.batch: Optional[dict[str, torch.Tensor]] = None
        self.mode = "train"
        self.meters = {"train": PairMeter(self.ARITH.TERMS), "val": PairMeter(self.ARITH.TERMS)}
        self.terms = self.terms_fn()

    def terms_fn(self) -> TermsFn:
        raise NotImplementedError

    def stage(self, extras: dict[str, torch.Tensor], mode: str) -> None:
        self.batch, self.mode = extras, mode

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, kwargs
        batch, self.batch = self.batch, None
        if batch is None:
            raise RuntimeError(f"the {self.NAME} loss ran without its pairs: the batch did not come from a "
                               "preference token cache")
        terms = batch_terms(pred, [batch[k] for k in self.ARITH.KEYS], self.terms)
        self.meters[self.mode].add(terms)
        loss = terms.losses.sum()
        if global_valid_tokens is not None:  # = the step's pairs on every rank (one marker per pair)
            loss = loss / global_valid_tokens
        return loss, {}


class PairHook(TrainerHook):
    """A preference method's trainer hook (module doc); a method's subclass names its loss class
    (``LOSS``) and its line (``format_line(step, values, validate=...)``)."""

    method = True
    LOSS: type = PairLoss
    format_line: Callable[..., str]

    def __init__(self) -> None:
        self.last: dict[str, Optional[dict[str, float]]] = {}

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        extras = {k: input_dict.pop(k) for k in self.LOSS.ARITH.KEYS if k in input_dict}
        if extras and isinstance(trainer.loss_fn, self.LOSS):
            trainer.loss_fn.stage(extras, mode)

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        loss = getattr(trainer, "loss_fn", None)
        values = loss.meters[mode].reduce(sum_over_ranks) if isinstance(loss, self.LOSS) else None
        self.last[mode] = values
        return {k: values[k] for k in self.LOSS.ARITH.METRICS} if values else {}

    def log_lines(self, step: int, mode: str) -> list[str]:
        values = self.last.get(mode)
        return [self.format_line(step, values, validate=mode == "val")] if values else []
