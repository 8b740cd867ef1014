"""What every preference method shares on the hf-trainer backend: the pair rows, the Trainer with
the method's pair loss, its validation and its values, and the hooks ``runtime/hf_trainer.py``
loads.  A method's ``hf_trainer`` module keeps only what differs (its terms, its line, what runs
before step 1).

* :class:`PairRows` reads the rank's rows of a preference cache in the training order of every
  backend (:mod:`trnqwen.runtime.token_stream`); a row carries the method's fields (targets,
  segments, stored per-pair values), and ``labels``/``shift_labels`` mark one position per pair, so
  the Trainer's ``num_items_in_batch`` counts pairs (on every rank and accumulation step) and the
  mean is over every pair of the step, as in torchtitan.
* :func:`pair_trainer_class` replaces the loss with the method's (:func:`trnqwen.methods.pairs.batch_terms`),
  the validation with the pairs' (torchtitan's ``validate step:`` line, loss = mean pair loss),
  adds the ``<method>/*`` values to the Trainer's logs (TensorBoard/W&B and the metrics stream)
  and prints the method's line after the step line.
* :class:`PairHooks`: ``datasets``, ``trainer_class`` and ``before_train``, the three points where
  a method enters the Trainer run (``runtime/hf_trainer.py`` loads a method's subclass from the
  spec's ``method_hooks``, built with the plan's settings).

TRL's ``DPOTrainer``/``ORPOTrainer`` were not used: they would bring a second data path (their own
tokenisation and padding, not the cache every backend shares) and a second loss implementation,
so the backends could no longer be compared number for number.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.methods.pairs import PairMeter, TermsFn, batch_terms, method_rows, sum_over_ranks, trainer_sample
from trnqwen.runtime.hf_trainer_data import CacheRows, cache_datasets

LineFn = Callable[..., str]  # format_line(step, values, validate=False): the method's text line


class PairRows(CacheRows):
    """One rank's rows of a preference cache split, as Trainer batch rows with the method's fields."""

    def __init__(self, cache_dir: str, split: str, *, keys: Sequence[str],
                 stored: Optional[Callable[[str], np.ndarray]] = None, missing: str = "", **rows: int) -> None:
        super().__init__(cache_dir, split, **rows)  # seq_len, rank, world, batch_size, infinite, seed
        self.keys = tuple(keys)
        self.stored = stored  # split name -> the stored per-pair values (opened when the rows are read)
        self.missing = missing  # where those values come from, for the error on a row without them

    def __iter__(self):
        if not self.stream.infinite:
            self.stream.rows_read = 0
        stored = self.stored(self.split.name) if self.stored is not None else None
        for ids, positions, markers, named in method_rows(self.split, self.stream, self.keys, stored,
                                                          missing=self.missing):
            yield trainer_sample(ids, positions, markers, named)


def pair_trainer_class(trainer_cls: type, *, method: str, keys: Sequence[str], metrics: Sequence[str], terms: TermsFn,
                       terms_cls: type, format_line: LineFn, log_validation: Callable[[int, float, float], None]):
    """``trainer_cls`` (the cache trainer) with ``method``'s pair loss, its validation and its line."""
    from transformers import TrainerCallback

    def forward_terms(model, inputs):
        missing = [k for k in keys if k not in inputs]
        if missing:
            raise RuntimeError(f"the {method.upper()} loss ran without its pairs ({', '.join(missing)} missing): "
                               "the batch did not come from a preference token cache")
        batch_fields = [inputs.pop(k) for k in keys]
        inputs.pop("labels", None)
        inputs.pop("shift_labels", None)
        out = model(**inputs, use_cache=False)
        return batch_terms(out.logits, batch_fields, terms), out

    class PairLines(TrainerCallback):
        """The values summed over every rank at each step's end; rank 0 prints them after the step line."""

        def __init__(self, meter: PairMeter) -> None:
            self.meter, self.values = meter, None

        def on_step_end(self, args, state, control, **kwargs):
            self.values = (state.global_step, self.meter.reduce(sum_over_ranks))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.values and self.values[1] and state.is_world_process_zero and "loss" in (logs or {}):
                print(format_line(self.values[0], self.values[1]), flush=True)
            self.values = None

    class PairTrainer(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pair_meter = PairMeter(terms_cls)
            self.pair_lines = PairLines(self.pair_meter)
            self.add_callback(self.pair_lines)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            pair_terms, out = forward_terms(model, inputs)
            self.pair_meter.add(pair_terms)
            loss = pair_terms.losses.sum()
            if num_items_in_batch is not None:  # the step's pairs on every rank (one marker per pair)
                loss = loss / num_items_in_batch
                if self.args.average_tokens_across_devices:  # undo DDP's gradient mean, as the Trainer's own loss does
                    loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            else:
                loss = pair_terms.losses.mean()
            return (loss, out) if return_outputs else loss

        def log(self, logs, *args, **kwargs):
            """The step's values join the Trainer's own logs (its TensorBoard/W&B writers, the stream)."""
            values = self.pair_lines.values
            if values and values[1] and "loss" in logs:
                logs = {**logs, **{f"{method}/{k}": values[1][k] for k in metrics}}
            return super().log(logs, *args, **kwargs)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
            started = time.perf_counter()
            model = self.model
            was_training = model.training
            model.eval()
            meter, tokens = PairMeter(terms_cls), 0
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
            out = {f"{metric_key_prefix}_loss": loss}
            if values:
                out.update({f"{metric_key_prefix}_{method}_{k}": values[k] for k in metrics})
            self.log(out)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, out)
            return out

    PairTrainer.__name__ = PairTrainer.__qualname__ = f"{method.upper()}Trainer"
    return PairTrainer


class PairHooks:
    """A preference method's hf-trainer hooks (module doc).  A method's subclass names itself
    (``METHOD``), its arithmetic module (``ARITH``: ``KEYS``, ``METRICS``, ``TERMS``) and its line
    (``format_line(step, values, validate=...)``), and builds its terms from the plan's settings
    (:meth:`terms`); one with stored per-pair values (a reference) overrides :meth:`row_settings`."""

    METHOD = ""
    ARITH: ModuleType
    format_line: LineFn

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)

    def terms(self) -> TermsFn:
        raise NotImplementedError

    def row_settings(self) -> dict[str, Any]:
        """What the rows read beside the cache (``stored``: split -> per-pair values; ``missing``)."""
        return {}

    def datasets(self, spec: HFTrainerSpec, *, rank: int, world: int):
        """(train, validation or None): the rank's pair rows of the token cache."""
        return cache_datasets(spec, rank=rank, world=world, rows=PairRows, keys=self.ARITH.KEYS,
                              **self.row_settings())

    def trainer_class(self, trainer_cls: type, *, log_validation: Callable[[int, float, float], None]) -> type:
        return pair_trainer_class(trainer_cls, method=self.METHOD, keys=self.ARITH.KEYS, metrics=self.ARITH.METRICS,
                                  terms=self.terms(), terms_cls=self.ARITH.TERMS, format_line=self.format_line,
                                  log_validation=log_validation)

    def before_train(self, spec: HFTrainerSpec, model, *, rank: int, world: int, replicas: int, grad_accum: int,
                     resumed_at: int, log: Callable[[str], None]) -> None:
        """Nothing by default: a method with a pass before step 1 (a reference) overrides it."""
