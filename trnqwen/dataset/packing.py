"""Documents -> fixed-shape rows of ``seq_len`` tokens (on Neuron every new shape recompiles).

Packing fills rows best-fit-decreasing by default (:mod:`trnqwen.dataset.bestfit`: rows in a
seeded order), or, with ``strategy="sequential"``, lays whole documents back to back in their
order and starts a new row when the next one does not fit (next-fit: order-preserving, O(n));
``packing=False`` gives one document per row.  A document is never split across rows: a conversation's answer must see its
own context.  Inside a row (the cache contract, ``trnqwen/dataset/cache.py``):

* ``labels[t]`` is the token at ``t + 1`` when that token is trained, else -100, and the last
  position of every document is -100 (never predict the next conversation);
* ``positions`` restart at 0 at every document, so consumers build block-causal masks;
* padding fills the row's end: ``pad_id``, label -100, positions counting from 0 as one extra
  document that attends only to itself.

Everything is vectorised with numpy: each token's (row, column) destination is computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trnqwen.dataset.bestfit import Alloc, best_fit_rows, in_memory, next_fit_rows
from trnqwen.dataset.cache import IGNORE_INDEX, SplitArrays
from trnqwen.dataset.encode import TokenizedDocs

LONG_POLICIES = ("truncate", "drop")


@dataclass
class Fitted:
    """Documents cut to fit ``seq_len``: which were kept, truncated or dropped, and why."""

    keep: np.ndarray  # document indices kept, in order
    lengths: np.ndarray  # their token counts after truncation
    truncated: list[int] = field(default_factory=list)  # document indices
    dropped: dict[str, list[int]] = field(default_factory=dict)  # reason -> document indices
    targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # every document's trained targets


def fit_documents(docs: TokenizedDocs, seq_len: int, policy: str) -> Fitted:
    """Apply ``--long-conversations``: cut (or drop) documents longer than ``seq_len``.

    A document left with no trained target (all its answers past ``seq_len``) is dropped: it
    would cost compute and teach nothing.
    """
    if policy not in LONG_POLICIES:
        raise ValueError(f"long-conversations policy must be one of {LONG_POLICIES}")
    lengths = docs.lengths.copy()
    too_long = np.flatnonzero(lengths > seq_len)
    dropped: dict[str, list[int]] = {}
    truncated: list[int] = []
    keep_mask = np.ones(len(lengths), dtype=bool)
    if policy == "drop":
        keep_mask[too_long] = False
        if len(too_long):
            dropped[f"longer than {seq_len} tokens"] = too_long.tolist()
    else:
        lengths[too_long] = seq_len
        truncated = too_long.tolist()
    # Targets left per document: trained tokens at positions 1..len-1 of the (cut) document.
    targets = _targets_per_doc(docs, lengths)
    empty = np.flatnonzero(keep_mask & (targets == 0))
    if len(empty):
        keep_mask[empty] = False
        dropped[f"no trained tokens within {seq_len} tokens"] = empty.tolist()
        truncated = [d for d in truncated if keep_mask[d]]
    keep = np.flatnonzero(keep_mask)
    return Fitted(keep=keep, lengths=lengths[keep], truncated=truncated, dropped=dropped,
                  targets=np.where(keep_mask, targets, 0))


def fit_problems(noun: str, cut: str, truncated: list[int], dropped: dict[str, list[int]], where) -> list[str]:
    """The report's lines for what fitting cut or dropped, each naming its first record
    (``where(i)``); one wording for chat records and preference pairs."""
    problems = []
    if truncated:
        problems.append(f"{len(truncated)} {noun}(s) {cut} (first: {where(truncated[0])})")
    for reason, indices in dropped.items():
        problems.append(f"{len(indices)} {noun}(s) dropped: {reason} (first: {where(indices[0])})")
    return problems


def _targets_per_doc(docs: TokenizedDocs, lengths: np.ndarray) -> np.ndarray:
    start = docs.bounds[:-1]
    position = np.arange(len(docs.ids)) - np.repeat(start, docs.lengths)
    doc_of = np.repeat(np.arange(len(docs)), docs.lengths)
    counts = docs.trained & (position >= 1) & (position < lengths[doc_of])
    return np.bincount(doc_of[counts], minlength=len(docs))


def assign_rows(lengths: np.ndarray, seq_len: int, packing: bool, strategy: str = "sequential",
                seed: int = 0, alloc: Alloc = in_memory) -> tuple[np.ndarray, np.ndarray]:
    """(row of each document, column where it starts): best-fit or next-fit packing, or one per row;
    ``alloc(dtype, n)``: where the per-document arrays go (memory maps in bounded preparation)."""
    if not packing:
        rows, cols = alloc(np.int64, len(lengths)), alloc(np.int64, len(lengths))
        for lo in range(0, len(lengths), 1 << 20):
            rows[lo:lo + (1 << 20)] = np.arange(lo, min(lo + (1 << 20), len(lengths)))
        cols[:] = 0
        return rows, cols
    if strategy == "best-fit":
        return best_fit_rows(lengths, seq_len, seed, alloc)
    return next_fit_rows(lengths, seq_len, alloc)


def build_rows(
    docs: TokenizedDocs, fitted: Fitted, doc_indices: np.ndarray, *, seq_len: int, packing: bool, pad_id: int,
    strategy: str = "sequential", seed: int = 0,
) -> SplitArrays:
    """The split made of documents ``doc_indices`` (kept ones of ``fitted.keep``; a mixture may repeat one)."""
    where_kept = np.searchsorted(fitted.keep, doc_indices)
    lengths = fitted.lengths[where_kept].astype(np.int64)
    rows, cols = assign_rows(lengths, seq_len, packing, strategy, seed)
    n_rows = int(rows.max()) + 1 if len(rows) else 0
    # Source token index of every kept token, and where it goes.
    src_start = docs.bounds[doc_indices]
    owner = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    src = src_start[owner] + position
    dst_row, dst_col = rows[owner], cols[owner] + position

    ids = docs.ids[src]
    is_last = position == lengths[owner] - 1
    nxt = np.minimum(src + 1, len(docs.ids) - 1)
    labels = np.where(~is_last & docs.trained[nxt], docs.ids[nxt], IGNORE_INDEX)

    input_ids = np.full((n_rows, seq_len), pad_id, dtype=np.int32)
    label_rows = np.full((n_rows, seq_len), IGNORE_INDEX, dtype=np.int32)
    fill = np.zeros(n_rows, dtype=np.int64)
    np.maximum.at(fill, rows, cols + lengths)
    column = np.arange(seq_len)[None, :]
    positions = np.maximum(column - fill[:, None], 0).astype(np.int32)  # padding counts from 0
    input_ids[dst_row, dst_col] = ids
    label_rows[dst_row, dst_col] = labels
    positions[dst_row, dst_col] = position
    padding = int(n_rows * seq_len - len(src))
    return SplitArrays(input_ids, label_rows, positions, documents=len(lengths), padding_tokens=padding)
