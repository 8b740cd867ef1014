"""The hf-trainer backend's data: trnqwen's tokenized cache, read exactly as torchtitan's ranks read it
(and a dataset torchtitan streams itself, read by torchtitan's own reader: :class:`StreamedRows`).

Same rows, same order, same sharding (:mod:`trnqwen.runtime.token_stream`), so from the same
weights the Trainer's first step sees the batch native and hf-v5 see.  A batch is::

    {"input_ids", "position_ids", "labels", "shift_labels"}   int64 [B, S]

* ``labels`` are already shifted in the cache, so they go in as ``shift_labels`` (transformers'
  causal-LM loss then uses them as they are; ``labels`` only switches the loss on) and the
  Trainer counts the same trained tokens torchtitan does.
* No ``attention_mask``: with ``position_ids`` restarting at 0 per packed document (and no KV
  cache) transformers 5 detects packed sequences (``masking_utils.find_packed_sequence_indices``)
  and builds a block-causal mask, so no conversation attends into another.

Validation (``--val-every N``, plus step 1 as torchtitan does) runs through the Trainer's own
evaluation hook, but the loss is torchtitan's: summed over every trained token of the ``val``
split on all ranks, divided by their count (the Trainer's default is a mean of batch means), and
printed in torchtitan's ``validate step:`` line format.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
from trnqwen.dataset.cache import open_split
from trnqwen.runtime.token_stream import IGNORE_INDEX, RankStream, read_row


class CacheRows(torch.utils.data.IterableDataset):
    """One rank's rows of one cache split as Trainer batches' rows."""

    def __init__(self, cache_dir: str, split: str, *, seq_len: int, rank: int, world: int, batch_size: int,
                 infinite: bool, seed: int = 0) -> None:
        self.split = open_split(cache_dir, split)
        if self.split.seq_len != seq_len:
            raise ValueError(
                f"the dataset cache {cache_dir} was built for seq_len {self.split.seq_len}, the run uses {seq_len}"
            )
        self.stream = RankStream(len(self.split), rank=rank, world=world, infinite=infinite,
                                 batch_size=batch_size, seed=seed)

    def __iter__(self):
        if not self.stream.infinite:
            self.stream.rows_read = 0  # every validation is one whole pass
        while not self.stream.exhausted():
            input_ids, labels, positions = (torch.from_numpy(a) for a in read_row(self.split, self.stream.advance()))
            yield {"input_ids": input_ids, "position_ids": positions, "labels": labels, "shift_labels": labels}


class StreamedRows(torch.utils.data.IterableDataset):
    """One rank's rows of a dataset torchtitan streams itself (the model's default corpus, ``c4``...),
    read by torchtitan's own ``HuggingFaceTextDataset``: the same documents, tokenized with its
    tokenizer (BOS/EOS per document), packed back to back into ``seq_len`` rows, split over the
    data-parallel ranks as the torchtitan backends' ranks split them.  ``positions`` restart at each
    document, so transformers builds the block-causal mask torchtitan does.  (A torchtitan whose
    rows carry no ``positions`` trains whole rows causally; they are then ``0..seq_len-1``.)"""

    def __init__(self, dataset: Optional[str], *, assets_dir: str, model_is_builtin: bool, seq_len: int,
                 rank: int, world: int) -> None:
        from torchtitan.components.tokenizer import HuggingFaceTokenizer
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

        from trnqwen.dataset.streamed import register_corpus, resolve_dataset

        data = resolve_dataset(dataset, model_is_builtin=model_is_builtin)
        name = register_corpus(data.data_files, data.source) if data.kind == "corpus" else data.titan_name
        self.seq_len = seq_len
        self.rows = HuggingFaceTextDataset(
            name, None, HuggingFaceTokenizer(tokenizer_path=assets_dir), seq_len=seq_len,
            dp_rank=rank, dp_world_size=world, infinite=True)

    def __iter__(self):
        for sample, labels in self.rows:
            positions = sample.get("positions")
            if positions is None:
                positions = torch.arange(self.seq_len, dtype=torch.long)
            yield {"input_ids": sample["input"], "position_ids": positions, "labels": labels, "shift_labels": labels}


def rank_loader(dataset: torch.utils.data.IterableDataset, batch_size: int) -> torch.utils.data.DataLoader:
    """A plain DataLoader: the rows are sharded already, so accelerate must not shard them again."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=0)


def cache_datasets(spec: HFTrainerSpec, *, rank: int, world: int, rows: type = CacheRows,
                   **row_settings: object) -> tuple[CacheRows, Optional[CacheRows]]:
    """(train, val or None) for this rank; the world is the data-parallel world.  ``rows``: the
    row reader (a method's :class:`CacheRows` subclass, built with ``row_settings`` too)."""
    common = dict(seq_len=spec.seq_len, rank=rank, world=world, batch_size=spec.local_batch_size, **row_settings)
    train = rows(spec.cache_dir, "train", infinite=True, seed=int(spec.seed or 0), **common)
    val = rows(spec.cache_dir, "val", infinite=False, **common) if spec.val_every else None
    return train, val


def cache_trainer_class(trainer_cls: type, *, batch_size: int, log_validation: Callable[[int, float, float], None]):
    """``trainer_cls`` reading the rank's rows and validating with torchtitan's token-weighted loss."""
    from transformers import TrainerCallback

    class ValidateAtFirstStep(TrainerCallback):
        """torchtitan validates at step 1 and every N steps; the Trainer only every N."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1 and args.eval_strategy != "no":
                control.should_evaluate = True

    class CacheTrainer(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(ValidateAtFirstStep())

        def get_train_dataloader(self):
            return rank_loader(self.train_dataset, batch_size)

        def get_eval_dataloader(self, eval_dataset=None):
            return rank_loader(eval_dataset if eval_dataset is not None else self.eval_dataset, batch_size)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
            started = time.perf_counter()
            model = self.model
            was_training = model.training
            model.eval()
            totals = torch.zeros(2, dtype=torch.float64, device=self.args.device)
            tokens = 0
            with torch.no_grad():
                for batch in self.get_eval_dataloader(eval_dataset):
                    batch = self._prepare_inputs(batch)
                    count = (batch["shift_labels"] != IGNORE_INDEX).sum()
                    # num_items_in_batch=1: the model's own loss function returns the summed loss.
                    out = model(**batch, num_items_in_batch=torch.ones((), device=count.device), use_cache=False)
                    totals[0] += out.loss.detach().double()
                    totals[1] += count.double()
                    tokens += batch["input_ids"].numel()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(totals)
            if was_training:
                model.train()
            loss = float(totals[0] / totals[1]) if totals[1] > 0 else float("nan")
            seconds = time.perf_counter() - started
            if self.state.is_world_process_zero:
                log_validation(self.state.global_step, loss, tokens / seconds if seconds > 0 else 0.0)
            metrics = {f"{metric_key_prefix}_loss": loss}
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return CacheTrainer


def format_validation_line(step: int, loss: float, memory_gib: float, memory_pct: float, tps: float) -> str:
    """torchtitan's validation line, character for character (colours off)."""
    return (
        f"validate step: {step:2}  "
        f"loss: {loss:7.4f}  "
        f"memory: {memory_gib:5.2f}GiB"
        f"({memory_pct:.2f}%)  "
        f"tps: {round(tps):,}"
    )
