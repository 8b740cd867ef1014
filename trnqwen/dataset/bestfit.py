"""Best-fit-decreasing packing: which row each document goes into, and where in it.

Documents are taken longest first (ties in their order); each goes into the open row with the
least room that still fits it, or starts a new row.  That is the classic bin-packing heuristic
TRL's ``bfd`` packing and axolotl's multipack use: it fills rows far better than laying
documents back to back in file order (next-fit), which starts a new row whenever the next
document does not fit the current one and leaves the gap as padding.

The row with the least room that fits is found in O(log seq_len) with a segment tree over the
room left (0..seq_len): each leaf counts the open rows with that much room.  Inside a row the
documents keep their original order; the rows themselves are put in an order drawn from the
seed (``numpy.random.default_rng(seed)``), so longest-first does not become "long rows first" in
training, and the same data and seed give the same rows on every machine and backend.

numpy only (the launcher and tests use it; no torch).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

Alloc = Callable[[type, int], np.ndarray]  # (dtype, length) -> an array to fill: in memory, or a scratch file's map


def in_memory(dtype: type, n: int) -> np.ndarray:
    return np.empty(n, dtype=dtype)


class _RoomTree:
    """Counts of open rows by room left, with "the smallest room >= n that some row has"."""

    def __init__(self, seq_len: int) -> None:
        size = 1
        while size < seq_len + 1:
            size *= 2
        self.size = size
        self.count = [0] * (2 * size)
        self.rows: dict[int, list[int]] = {}  # room -> open rows with exactly that room

    def add(self, room: int, row: int, delta: int = 1) -> None:
        if delta > 0:
            self.rows.setdefault(room, []).append(row)
        i = room + self.size
        while i:
            self.count[i] += delta
            i >>= 1

    def take(self, need: int) -> int:
        """The row with the least room >= ``need`` (removed from the tree), or -1 when none fits."""
        count, size = self.count, self.size
        i = need + size
        if not count[i]:
            while i > 1:
                if not i & 1 and count[i + 1]:
                    i += 1
                    break
                i >>= 1
            else:
                return -1
            while i < size:
                i = 2 * i if count[2 * i] else 2 * i + 1
        room = i - size
        row = self.rows[room].pop()
        self.add(room, row, -1)
        return row


_STEP = 1 << 16  # documents turned into Python ints at a time (a whole-set list costs ~36 bytes a document)


def counting_order(keys: np.ndarray, n_keys: int, out: np.ndarray, *, descending: bool = False) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` (of ``-keys`` when ``descending``) for keys in
    ``[0, n_keys)``, written into ``out`` a slice of :data:`_STEP` at a time: a counting sort, no
    whole-set temporary (``out`` may be a memory map)."""
    counts = np.zeros(n_keys, dtype=np.int64)
    for lo in range(0, len(keys), _STEP):
        counts += np.bincount(keys[lo:lo + _STEP], minlength=n_keys)
    taken = counts[::-1] if descending else counts
    free = np.cumsum(taken) - taken  # where each key's documents start in the order
    free = free[::-1].copy() if descending else free
    for lo in range(0, len(keys), _STEP):
        chunk = np.asarray(keys[lo:lo + _STEP])
        local = np.argsort(-chunk if descending else chunk, kind="stable")
        ordered = chunk[local]
        first = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # each run of one key
        rank = np.arange(len(ordered)) - np.repeat(first, np.diff(np.r_[first, len(ordered)]))
        out[free[ordered] + rank] = local + lo
        free += np.bincount(chunk, minlength=n_keys)
    return out


def best_fit_rows(lengths: np.ndarray, seq_len: int, seed: int, alloc: Alloc = in_memory) -> tuple[np.ndarray, np.ndarray]:
    """(row, first column) of every document of ``lengths`` (each <= ``seq_len``), best-fit
    decreasing, rows in a seeded order, documents inside a row in their given order.
    Per document: the two results and one sort order, each from ``alloc`` (memory maps in bounded
    preparation), no Python list of them all."""
    lengths = np.asarray(lengths)
    n = len(lengths)
    if n and int(lengths.max()) > seq_len:
        raise ValueError(f"a document of {int(lengths.max())} tokens does not fit in {seq_len}")
    dtype = np.int32 if n < 2**31 else np.int64
    tree = _RoomTree(seq_len)
    room_of: list[int] = []
    row_of = alloc(dtype, n)
    order = counting_order(lengths, seq_len + 1, alloc(dtype, n), descending=True)  # longest first, ties in order
    for lo in range(0, n, _STEP):
        picked = order[lo:lo + _STEP]
        made = []
        for d, need in zip(picked.tolist(), lengths[picked].tolist()):
            row = tree.take(need) if need else -1
            if row < 0:
                row = len(room_of)
                room_of.append(seq_len)
            room_of[row] -= need
            if room_of[row]:
                tree.add(room_of[row], row)
            made.append(row)
        row_of[picked] = made
    del order
    shuffled = np.random.default_rng(seed).permutation(len(room_of))
    place = np.empty(len(room_of), dtype=dtype)
    place[shuffled] = np.arange(len(room_of))  # creation row -> its place in the shuffled order
    for lo in range(0, n, _STEP):
        row_of[lo:lo + _STEP] = place[row_of[lo:lo + _STEP]]
    return row_of, _columns(row_of, lengths, len(room_of), alloc(dtype, n))


def _columns(rows: np.ndarray, lengths: np.ndarray, n_rows: int, cols: np.ndarray) -> np.ndarray:
    """Each document's first column: the documents of a row side by side in their given order."""
    fill = [0] * n_rows
    for lo in range(0, len(rows), _STEP):
        out = []
        for row, n in zip(rows[lo:lo + _STEP].tolist(), lengths[lo:lo + _STEP].tolist()):
            out.append(fill[row])
            fill[row] += n
        cols[lo:lo + _STEP] = out
    return cols


def next_fit_rows(lengths: np.ndarray, seq_len: int, alloc: Alloc = in_memory) -> tuple[np.ndarray, np.ndarray]:
    """(row, first column) of every document laid back to back in order: a new row when the next
    one does not fit (sequential packing)."""
    rows = alloc(np.int64, len(lengths))
    cols = alloc(np.int64, len(lengths))
    row, fill = 0, 0
    for lo in range(0, len(lengths), _STEP):
        for i, n in enumerate(np.asarray(lengths[lo:lo + _STEP]).tolist(), start=lo):
            if fill + n > seq_len:
                row, fill = row + 1, 0
            rows[i], cols[i] = row, fill
            fill += n
    return rows, cols


def next_fit_count(lengths: np.ndarray, seq_len: int, indices: np.ndarray | None = None) -> int:
    """How many rows :func:`next_fit_rows` makes, without making them (the report's comparison);
    of ``lengths[indices]`` when given, read a slice at a time."""
    rows, fill = 0, 0
    count = len(lengths) if indices is None else len(indices)
    for lo in range(0, count, _STEP):
        piece = lengths[lo:lo + _STEP] if indices is None else lengths[indices[lo:lo + _STEP]]
        for n in np.asarray(piece).tolist():
            if fill + n > seq_len:
                rows, fill = rows + 1, 0
            fill += n
    return rows + 1 if count else 0


def padding_fraction(lengths: np.ndarray, n_rows: int, seq_len: int) -> float:
    """The share of ``n_rows`` rows' positions that are padding."""
    return 1.0 - float(np.asarray(lengths).sum()) / max(1, n_rows * seq_len)
