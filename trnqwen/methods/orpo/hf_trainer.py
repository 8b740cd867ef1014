"""ORPO on the hf-trainer backend: the same rows and loss as the torchtitan ranks.

* :class:`PairRows` reads the rank's rows of a preference cache in the training order of every
  backend (:mod:`trnqwen.runtime.token_stream`); ``labels``/``shift_labels`` mark one position
  per pair, so the Trainer's ``num_items_in_batch`` counts pairs (on every rank and accumulation
  step) and the mean is over every pair of the step, as in torchtitan.
* :func:`orpo_trainer_class` replaces the loss with :mod:`trnqwen.methods.orpo.loss`'s, the
  validation with the pairs' (torchtitan's ``validate step:`` line, loss = mean pair loss), adds
  the ``orpo/*`` values to the Trainer's logs (TensorBoard/W&B and the metrics stream) and prints
  the ``[ORPO]`` lines after the step lines.

:class:`ORPOHooks` is what ``runtime/hf_trainer.py`` loads from the spec's ``method_hooks``; ORPO
is reference-free, so its ``before_train`` does nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.methods.orpo.loss import KEYS, METRICS, Meter, orpo_terms
from trnqwen.methods.orpo.titan import format_line
from trnqwen.methods.pairs import read_pairs, segment_logps, sum_over_ranks, trainer_sample
from trnqwen.runtime.hf_trainer_data import CacheRows


class PairRows(CacheRows):
    """One rank's rows of a preference cache split, as Trainer batch rows."""

    def __iter__(self):
        if not self.stream.infinite:
            self.stream.rows_read = 0
        for _row, (ids, positions, targets, segments, slots, markers) in read_pairs(self.split, self.stream):
            yield trainer_sample(ids, positions, markers, dict(zip(KEYS, (targets, segments, slots))))


def pair_datasets(spec: HFTrainerSpec, *, rank: int, world: int):
    common = dict(seq_len=spec.seq_len, rank=rank, world=world, batch_size=spec.local_batch_size)
    train = PairRows(spec.cache_dir, "train", infinite=True, seed=int(spec.seed or 0), **common)
    val = PairRows(spec.cache_dir, "val", infinite=False, **common) if spec.val_every else None
    return train, val


def orpo_trainer_class(trainer_cls: type, *, lam: float, log_validation: Callable[[int, float, float], None]):
    """``trainer_cls`` (the cache trainer) with the ORPO loss, ORPO validation and the [ORPO] lines."""
    from transformers import TrainerCallback

    def forward_terms(model, inputs):
        extras = [inputs.pop(k) for k in KEYS]
        inputs.pop("labels", None)
        inputs.pop("shift_labels", None)
        out = model(**inputs, use_cache=False)
        targets, segments, slots = (t.to(out.logits.device) for t in extras)
        sums, counts = segment_logps(out.logits, targets, segments, slots.shape[1])
        return orpo_terms(sums, counts, lam=lam), out

    class ORPOLines(TrainerCallback):
        """The values summed over every rank at each step's end; rank 0 prints them after the step line."""

        def __init__(self, meter: Meter) -> None:
            self.meter, self.values = meter, None

        def on_step_end(self, args, state, control, **kwargs):
            self.values = (state.global_step, self.meter.reduce(sum_over_ranks))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.values and self.values[1] and state.is_world_process_zero and "loss" in (logs or {}):
                print(format_line(self.values[0], self.values[1]), flush=True)
            self.values = None

    class ORPOTrainer(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.orpo_meter = Meter()
            self.orpo_lines = ORPOLines(self.orpo_meter)
            self.add_callback(self.orpo_lines)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            missing = [k for k in KEYS if k not in inputs]
            if missing:
                raise RuntimeError(f"the ORPO loss ran without its pairs ({', '.join(missing)} missing): "
                                   "the batch did not come from a preference token cache")
            terms, out = forward_terms(model, inputs)
            self.orpo_meter.add(terms)
            loss = terms.losses.sum()
            if num_items_in_batch is not None:  # the step's pairs on every rank (one marker per pair)
                loss = loss / num_items_in_batch
                if self.args.average_tokens_across_devices:  # undo DDP's gradient mean, as the Trainer's own loss does
                    loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            else:
                loss = terms.losses.mean()
            return (loss, out) if return_outputs else loss

        def log(self, logs, *args, **kwargs):
            """The step's ORPO values join the Trainer's own logs (its TensorBoard/W&B writers, the stream)."""
            values = self.orpo_lines.values
            if values and values[1] and "loss" in logs:
                logs = {**logs, **{f"orpo/{k}": values[1][k] for k in METRICS}}
            return super().log(logs, *args, **kwargs)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
            started = time.perf_counter()
            model = self.model
            was_training = model.training
            model.eval()
            meter, tokens = Meter(), 0
            with torch.no_grad():
                for batch in self.get_eval_dataloader(eval_dataset):
                    batch = self._prepare_inputs(batch)
                    tokens += batch["input_ids"].numel()
                    meter.add(forward_terms(model, batch)[0])
            values = meter.reduce(sum_over_ranks)
            if was_training:
                model.train()
            loss = values["loss"] if values else float("nan")
            seconds = time.perf_counter() - started
            if self.state.is_world_process_zero:
                log_validation(self.state.global_step, loss, tokens / seconds if seconds > 0 else 0.0)
                if values:
                    print(format_line(self.state.global_step, values, validate=True), flush=True)
            metrics = {f"{metric_key_prefix}_loss": loss}
            if values:
                metrics.update({f"{metric_key_prefix}_orpo_{k}": values[k] for k in METRICS})
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return ORPOTrainer


class ORPOHooks:
    """The hf-trainer ranks' entry points for ORPO (built with the plan's settings: ``lam``)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.lam = float(settings["lam"])

    def datasets(self, spec: HFTrainerSpec, *, rank: int, world: int):
        """(train, validation or None): the rank's pair rows of the token cache."""
        return pair_datasets(spec, rank=rank, world=world)

    def trainer_class(self, trainer_cls: type, *, log_validation: Callable[[int, float, float], None]) -> type:
        return orpo_trainer_class(trainer_cls, lam=self.lam, log_validation=log_validation)

    def before_train(self, spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int,
                     resumed_at: int, log: Callable[[str], None]) -> None:
        """Nothing: ORPO is reference-free (no pass over the data before step 1)."""
