"""DPO inside torchtitan ranks (native and hf-v5): the loss, its batch, its log lines.

The generated config module sets ``config.loss = dpo_loss_config(beta=..., loss_type=...,
reference_dir=...)`` and points its dataloaders at the same reference folder.  That call installs
four small wraps around torchtitan 0.3.0 (each a no-op when the loss is not DPO's):

* ``Trainer/Validator.post_dataloading_process``: a DPO batch carries ``dpo_targets``,
  ``dpo_segments`` and ``dpo_ref`` beside ``input``/``positions``; they are taken out (the model
  must not see them) and handed to the loss, which runs right after that forward;
* ``Trainer.train``: right after the checkpoint load, the reference pass
  (:mod:`trnqwen.runtime.dpo_reference`) computes the reference log-probs from the starting
  weights, or finds them on disk;
* ``MetricsProcessor.log`` / ``log_validation``: the step's rewards, margin and accuracy, summed
  over every rank, go to TensorBoard/W&B (``dpo/...``) and to one ``[DPO]`` line after the step line.

The batch's ``labels`` mark one position per pair (:func:`trnqwen.runtime.dpo_loss.pair_markers`),
so torchtitan's "valid tokens" count pairs and its ``sum / global_valid_tokens`` normalisation
makes the logged loss the mean DPO loss over every pair of the step.  Pipeline parallelism is not
supported (the loss needs its batch next to the forward); trnqwen never enables it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torchtitan.components.loss import BaseLoss

from trnqwen.methods.dpo.loss import KEYS, METRICS, Meter, pair_terms, segment_logps

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
    """The loss config for the generated module; installs the wraps the loss needs."""
    install()
    return DPOLoss.Config(beta=beta, loss_type=loss_type, reference_dir=reference_dir)


def _sum_over_ranks(tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def _take_extras(input_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: input_dict.pop(k) for k in KEYS if k in input_dict}


def install() -> None:
    from torchtitan.components import metrics
    from torchtitan.components.validate import Validator
    from torchtitan.tools.logging import logger
    from torchtitan.trainer import Trainer

    from trnqwen.methods.dpo.log_lines import format_line

    if getattr(Trainer.train, "_trnqwen_dpo", False):
        return
    trainer_post = Trainer.post_dataloading_process
    validator_post = Validator.post_dataloading_process
    trainer_train = Trainer.train
    metrics_log = metrics.MetricsProcessor.log
    metrics_log_validation = metrics.MetricsProcessor.log_validation

    def post_train(self, input_dict, labels):
        extras = _take_extras(input_dict)
        if extras and isinstance(self.loss_fn, DPOLoss):
            self.loss_fn.stage(extras, "train")
        return trainer_post(self, input_dict, labels)

    def post_validate(self, input_dict, labels, model_parts):
        extras = _take_extras(input_dict)
        if extras and isinstance(self.loss_fn, DPOLoss):
            self.loss_fn.stage(extras, "val")
        return validator_post(self, input_dict, labels, model_parts)

    def train(self):
        if isinstance(self.loss_fn, DPOLoss):
            load = self.checkpointer.load

            def load_then_reference(*args, **kwargs):
                out = load(*args, **kwargs)
                from trnqwen.methods.dpo import reference_pass

                reference_pass.ensure(self)
                return out

            self.checkpointer.load = load_then_reference
        return trainer_train(self)

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        loss = _ACTIVE
        values = loss.meters["train"].reduce(_sum_over_ranks) if loss is not None else None
        if values:
            extra_metrics = {**(extra_metrics or {}), **{f"dpo/{k}": values[k] for k in METRICS}}
        out = metrics_log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        if values:
            logger.info(format_line(step, values))
        return out

    def log_validation(self, loss, step, extra_metrics=None):
        dpo = _ACTIVE
        values = dpo.meters["val"].reduce(_sum_over_ranks) if dpo is not None else None
        if values:
            extra_metrics = {**(extra_metrics or {}), **{f"validation_metrics/dpo/{k}": values[k] for k in METRICS}}
        out = metrics_log_validation(self, loss, step, extra_metrics=extra_metrics)
        if values:
            logger.info(format_line(step, values, validate=True))
        return out

    train._trnqwen_dpo = True  # type: ignore[attr-defined]
    Trainer.post_dataloading_process = post_train
    Validator.post_dataloading_process = post_validate
    Trainer.train = train
    metrics.MetricsProcessor.log = log
    metrics.MetricsProcessor.log_validation = log_validation
