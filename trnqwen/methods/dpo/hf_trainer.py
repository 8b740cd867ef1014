"""DPO on the hf-trainer backend: the same rows, reference pass and loss as the torchtitan ranks.

* :class:`PairRows` reads the rank's rows of a DPO cache in the training order of every backend
  (:mod:`trnqwen.runtime.token_stream`); a row carries its pairs' targets, segments and reference
  log-probs, and ``labels``/``shift_labels`` mark one position per pair, so the Trainer's
  ``num_items_in_batch`` counts pairs (on every rank and accumulation step) and the mean is over
  every pair of the step, as in torchtitan.
* :func:`reference_pass` runs :func:`trnqwen.methods.dpo.reference_pass.run_pass` with the loaded
  model (LoRA attached, B = 0) before ``trainer.train``.
* :func:`dpo_trainer_class` replaces the loss with :mod:`trnqwen.methods.dpo.loss`'s and the
  validation with the pairs' (torchtitan's ``validate step:`` line, loss = mean pair loss), and
  prints the ``[DPO]`` lines after the step lines.

TRL's ``DPOTrainer`` was not used: it would bring a second data path (its own tokenisation and
padding, not the cache every backend shares) and a second loss implementation, so the backends
could no longer be compared number for number.

:class:`DPOHooks` is what ``runtime/hf_trainer.py`` loads from the spec's ``method_hooks``
(``trnqwen.methods.dpo.hf_trainer:DPOHooks``), built with the plan's settings: ``datasets``,
``trainer_class`` and ``before_train``, the three points where a method enters the Trainer run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.dataset import reference as store
from trnqwen.methods.dpo.log_lines import format_line
from trnqwen.methods.dpo.loss import KEYS, METRICS, Meter, pair_terms
from trnqwen.methods.pairs import read_pairs, segment_logps, sum_over_ranks, trainer_sample
from trnqwen.runtime.hf_trainer_data import CacheRows


class PairRows(CacheRows):
    """One rank's rows of a DPO cache split, as Trainer batch rows."""

    def __init__(self, *args: Any, reference_dir: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reference_dir = reference_dir

    def __iter__(self):
        if not self.stream.infinite:
            self.stream.rows_read = 0
        reference = store.open_reference(self.reference_dir, self.split.name)
        for row, (ids, positions, targets, segments, ref, markers) in read_pairs(self.split, self.stream, reference):
            if np.isnan(ref).any():
                raise RuntimeError(f"row {row} of the {self.split.name} split has no reference log-probs in {self.reference_dir}")
            yield trainer_sample(ids, positions, markers, dict(zip(KEYS, (targets, segments, ref))))


def pair_datasets(spec: HFTrainerSpec, *, rank: int, world: int, reference_dir: str):
    seed = int(spec.seed or 0)
    common = dict(seq_len=spec.seq_len, rank=rank, world=world, batch_size=spec.local_batch_size,
                  reference_dir=reference_dir)
    train = PairRows(spec.cache_dir, "train", infinite=True, seed=seed, **common)
    val = PairRows(spec.cache_dir, "val", infinite=False, **common) if spec.val_every else None
    return train, val


def reference_pass(spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int, resumed_at: int,
                   log: Callable[[str], None], reference_dir: str, beta: float, loss_type: str) -> None:
    from trnqwen.dataset.cache import open_split
    from trnqwen.methods.dpo.reference_pass import run_pass

    train_rows = len(open_split(spec.cache_dir, "train"))
    needed = {"train": store.prefix_rows(train_rows, spec.steps, spec.local_batch_size * world * grad_accum)}
    if spec.val_every:
        needed["val"] = len(open_split(spec.cache_dir, "val"))
    device = next(model.parameters()).device

    def forward(ids, positions, markers):
        return model(input_ids=torch.from_numpy(ids).to(device), position_ids=torch.from_numpy(positions).to(device),
                     use_cache=False).logits

    run_pass(Path(reference_dir), spec.cache_dir, needed, model=model, forward=forward, rank=rank, world=world,
             batch_size=spec.local_batch_size, resumed_at=resumed_at, replicas=replicas, log=log,
             settings={"beta": beta, "loss_type": loss_type})


def dpo_trainer_class(trainer_cls: type, *, beta: float, loss_type: str, log_validation: Callable[[int, float, float], None]):
    """``trainer_cls`` (the cache trainer) with the DPO loss, DPO validation and the [DPO] lines."""
    from transformers import TrainerCallback

    def forward_terms(model, inputs):
        extras = [inputs.pop(k) for k in KEYS]
        inputs.pop("labels", None)
        inputs.pop("shift_labels", None)
        out = model(**inputs, use_cache=False)
        targets, segments, ref = (t.to(out.logits.device) for t in extras)
        policy, counts = segment_logps(out.logits, targets, segments, ref.shape[1])
        return pair_terms(policy, ref, counts, beta=beta, loss_type=loss_type), out

    class DPOLines(TrainerCallback):
        """Rewards summed over every rank at each step's end; rank 0 prints them after the step line."""

        def __init__(self, meter: Meter) -> None:
            self.meter, self.values = meter, None

        def on_step_end(self, args, state, control, **kwargs):
            self.values = (state.global_step, self.meter.reduce(sum_over_ranks))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.values and self.values[1] and state.is_world_process_zero and "loss" in (logs or {}):
                print(format_line(self.values[0], self.values[1]), flush=True)
            self.values = None

    class DPOTrainer(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dpo_meter = Meter()
            self.add_callback(DPOLines(self.dpo_meter))

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            terms, out = forward_terms(model, inputs)
            self.dpo_meter.add(terms)
            loss = terms.losses.sum()
            if num_items_in_batch is not None:  # the step's pairs on every rank (one marker per pair)
                loss = loss / num_items_in_batch
                if self.args.average_tokens_across_devices:  # undo DDP's gradient mean, as the Trainer's own loss does
                    loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            else:
                loss = terms.losses.mean()
            return (loss, out) if return_outputs else loss

        def log(self, logs, *args, **kwargs):
            """The step's DPO numbers join the Trainer's own logs (its TensorBoard/W&B writers)."""
            lines = next((c for c in self.callback_handler.callbacks if isinstance(c, DPOLines)), None)
            if lines is not None and lines.values and lines.values[1] and "loss" in logs:
                logs = {**logs, **{f"dpo/{k}": lines.values[1][k] for k in METRICS}}
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
                metrics.update({f"{metric_key_prefix}_dpo_{k}": values[k] for k in METRICS})
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return DPOTrainer


class DPOHooks:
    """The hf-trainer ranks' entry points for DPO (built with the plan's settings: beta,
    loss_type, reference_dir)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.beta = float(settings["beta"])
        self.loss_type = str(settings["loss_type"])
        self.reference_dir = str(settings["reference_dir"])

    def datasets(self, spec: HFTrainerSpec, *, rank: int, world: int):
        """(train, validation or None): the rank's pair rows of the token cache."""
        return pair_datasets(spec, rank=rank, world=world, reference_dir=self.reference_dir)

    def trainer_class(self, trainer_cls: type, *, log_validation: Callable[[int, float, float], None]) -> type:
        return dpo_trainer_class(trainer_cls, beta=self.beta, loss_type=self.loss_type, log_validation=log_validation)

    def before_train(self, spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int,
                     resumed_at: int, log: Callable[[str], None]) -> None:
        """The reference log-probs of these starting weights, before step 1."""
        reference_pass(spec, model, rank=rank, world=world, replicas=replicas, grad_accum=grad_accum,
                       resumed_at=resumed_at, log=log, reference_dir=self.reference_dir, beta=self.beta,
                       loss_type=self.loss_type)
