"""torchtitan's dataloader over trnqwen's tokenized cache (native and hf-v5 ranks).

The launcher tokenized the dataset once (:mod:`trnqwen.dataset.cache`); each rank memory-maps
the split and reads its rows by the rule in :mod:`trnqwen.runtime.token_stream`.  A batch is
exactly what torchtitan 0.3.0's trainer and validator consume::

    ({"input": int64 [B, S], "positions": int64 [B, S]}, labels int64 [B, S])

``labels`` are already shifted (``labels[t]`` is the target at input ``t``; -100 = not trained)
and ``positions`` restart at 0 at every packed document, which is what torchtitan derives its
block-causal masks from (``get_document_mask_mod``: a document starts where ``positions == 0``)
and what RoPE uses.  Every batch has the same shape.  The checkpointable state is the number of
rows this rank has read (``state_dict`` / ``load_state_dict`` resume exactly).

The generated config module selects it with
``TokenCacheDataLoader.Config(cache_dir=..., split="train")`` (and ``split="val"`` for
``config.validator.dataloader``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader

from trnqwen.dataset.cache import open_split
from trnqwen.runtime.token_stream import RankStream, StreamStateError, read_row


class TokenCacheDataset(IterableDataset, Stateful):
    """One rank's rows of one cache split, as torchtitan samples."""

    def __init__(
        self,
        cache_dir: str,
        split: str = "train",
        *,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        batch_size: int = 1,
        infinite: bool = True,
        seed: int = 0,
        reference_dir: str = "",
        rows: str = "",
    ) -> None:
        self.split = open_split(cache_dir, split)
        self.reference_dir = reference_dir  # a method's per-row extras computed before step 1 (reference log-probs)
        self.rows = rows  # a training method's row reader, "module:function" (empty: the SFT rows below)
        if self.split.seq_len != seq_len:
            raise ValueError(
                f"the dataset cache {cache_dir} was built for seq_len {self.split.seq_len}, "
                f"but training.seq_len is {seq_len}: prepare the dataset again with this --seq-len"
            )
        self.key = str(self.split.meta.get("key", ""))
        self.stream = RankStream(
            len(self.split), rank=dp_rank, world=dp_world_size, infinite=infinite,
            batch_size=batch_size, seed=seed,
        )

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise ValueError("TokenCacheDataLoader reads its rows in one process: set num_workers to 0 or 1")
        if self.rows:  # the method's own rows (its extra fields beside input/positions): by dotted path,
            import importlib  # the ranks never import trnqwen.methods by name

            module, _, name = self.rows.partition(":")
            yield from getattr(importlib.import_module(module), name)(self)
            return
        while not self.stream.exhausted():
            input_ids, labels, positions = read_row(self.split, self.stream.advance())
            yield (
                {"input": torch.from_numpy(input_ids), "positions": torch.from_numpy(positions)},
                torch.from_numpy(labels),
            )

    def state_dict(self) -> dict[str, Any]:
        return {**self.stream.state_dict(), "key": self.key}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("key", self.key) != self.key:
            raise StreamStateError(
                "the checkpoint's data position belongs to another dataset cache "
                f"({state_dict['key'][:12]}…, this run reads {self.key[:12]}…): resume with the same dataset and settings"
            )
        self.stream.load_state_dict(state_dict)


class TokenCacheDataLoader(ParallelAwareDataloader):
    """torchtitan dataloader (``config.dataloader`` / ``config.validator.dataloader``) over a cache split."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        cache_dir: str = ""
        """The prepared dataset cache (``<cache_root>/<key>``), written by the launcher."""

        split: str = "train"
        """``train`` or ``val``."""

        infinite: bool = True
        """Loop over the split epoch after epoch (training); False = one pass (validation)."""

        seed: int = 0
        """Seeds the row order of epochs after the first."""

        reference_dir: str = ""
        """A method's per-row extras computed before step 1 (the reference log-probs folder; empty = none)."""

        rows: str = ""
        """A training method's row reader, ``"module:function"`` taking the dataset and yielding
        ``(input_dict, labels)`` (empty = the supervised rows); set by the method's config-module lines."""

        one_pass: bool = False
        """Validation: one pass over the split, the last batch filled with ignored rows, whatever
        ``infinite`` says (torchtitan's validator sets ``infinite`` from ``validator.steps``)."""

        def __post_init__(self) -> None:
            if not self.cache_dir:
                raise ValueError("TokenCacheDataLoader.Config needs cache_dir (a prepared dataset cache)")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: Any = None,
        snapshot_every_n_steps: int | None = 1,
        **kwargs: Any,
    ) -> None:
        dataset = TokenCacheDataset(
            config.cache_dir, config.split, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size,
            batch_size=local_batch_size, infinite=config.infinite and not config.one_pass, seed=config.seed,
            reference_dir=config.reference_dir, rows=config.rows,
        )
        super().__init__(
            dataset,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            batch_size=local_batch_size,
            num_workers=config.num_workers,
            persistent_workers=config.persistent_workers,
            pin_memory=config.pin_memory,
            prefetch_factor=config.prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
        )
