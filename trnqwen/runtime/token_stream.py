"""Which rows of a tokenized cache split a rank reads, and in which order (numpy only).

One rule for every backend (torchtitan's native and hf-v5 dataloader, the Trainer's), so that
with the same world size all of them see the identical rows in the identical order:

* **Training** (``infinite``): the *stream* is the split's rows epoch after epoch: epoch 0 in
  cache order, epoch ``e > 0`` a permutation of the rows seeded by ``(seed, e)``.  Rank ``r`` of
  ``W`` reads stream items ``r, r + W, r + 2W, ...``: its ``k``-th row is stream item
  ``k * W + r``.  Nothing is dropped, ranks never overlap within an epoch, and the whole read
  position is one integer per rank, ``rows_read`` (what a checkpoint stores).
* **Validation** (finite): one pass; rank ``r`` reads rows ``r, r + W, ...`` below ``N``, then
  *fill* rows (pad tokens, every label ignored) until every rank has read the same whole number
  of batches.  Every validation row is counted exactly once, no rank waits for another at a
  collective, and every batch has the training shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

IGNORE_INDEX = -100


class StreamStateError(ValueError):
    """A saved read position that does not belong to this cache split / rank layout."""


@dataclass
class RankStream:
    """Rank ``rank`` of ``world``'s read position in one split of ``n_rows`` rows."""

    n_rows: int
    rank: int = 0
    world: int = 1
    infinite: bool = True
    batch_size: int = 1
    seed: int = 0
    rows_read: int = 0
    _perm: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.n_rows < 1:
            raise ValueError("the split has no rows")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")

    @property
    def length(self) -> Optional[int]:
        """Rows (real + fill) this rank yields in a finite pass; None when infinite."""
        if self.infinite:
            return None
        per_rank = math.ceil(self.n_rows / self.world)
        return math.ceil(per_rank / self.batch_size) * self.batch_size

    def row_at(self, k: int) -> Optional[int]:
        """The cache row this rank reads ``k``-th; None for a fill row."""
        item = k * self.world + self.rank
        if not self.infinite:
            return item if item < self.n_rows else None
        epoch, index = divmod(item, self.n_rows)
        return int(self._permutation(epoch)[index]) if epoch else index

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perm.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)
            self._perm = {epoch: perm}  # one epoch at a time is all a reader needs
        return perm

    def exhausted(self) -> bool:
        length = self.length
        return length is not None and self.rows_read >= length

    def advance(self) -> Optional[int]:
        """The next row (None = fill row) and move past it; StopIteration at the end of a pass."""
        if self.exhausted():
            raise StopIteration
        row = self.row_at(self.rows_read)
        self.rows_read += 1
        return row

    def state_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "rank": self.rank, "world": self.world, "rows": self.n_rows,
                "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where ``state`` was taken; refuse a state from another layout."""
        for name, mine in (("rows", self.n_rows), ("world", self.world), ("rank", self.rank), ("seed", self.seed)):
            if name in state and int(state[name]) != mine:
                raise StreamStateError(
                    f"the saved data position was taken with {name}={state[name]}, this run has {name}={mine}: "
                    "resume with the same dataset cache, data-parallel degree and seed"
                )
        rows_read = int(state["rows_read"])
        if rows_read < 0:
            raise StreamStateError(f"the saved data position is negative ({rows_read})")
        self.rows_read = rows_read


def fill_row(seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, labels, positions) of a row that trains nothing: pads, all labels ignored,
    positions counting from 0 (one document that attends only to itself)."""
    return (
        np.full(seq_len, pad_id, dtype=np.int64),
        np.full(seq_len, IGNORE_INDEX, dtype=np.int64),
        np.arange(seq_len, dtype=np.int64),
    )


def read_row(split: Any, row: Optional[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, labels, positions) of cache row ``row`` as int64 (None = a fill row)."""
    if row is None:
        return fill_row(split.seq_len, int(split.meta.get("pad_id", 0)))
    return (
        np.asarray(split.input_ids[row], dtype=np.int64),
        np.asarray(split.labels[row], dtype=np.int64),
        np.asarray(split.positions[row], dtype=np.int64),
    )
