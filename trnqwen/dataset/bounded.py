"""Bounded-memory preparation: a dataset larger than memory becomes the same cache as in memory.

:func:`trnqwen.dataset.prepare.prepare` holds every record, its rendered text and its tokens
(about 14 KB per short conversation).  For a large dataset (:func:`wanted`) it reads the records
through this module instead, with the same rendering, masking, fitting and packing:

* records are read one at a time (``Source.iter_records``: a ``.jsonl`` file line by line) and
  taken :data:`CHUNK_RECORDS` at a time through ``chat.render``, ``chat.tokenize`` and
  ``packing.fit_documents``;
* each chunk's token ids and trained flags go to two scratch files beside the cache
  (:class:`DocStore`); only per-document numbers stay in memory (length, trained targets, which
  dataset, later its row: about a hundred bytes a record), and the first record of each problem;
* the mixture's choice and the rows are computed from those numbers (``mixture.select``,
  ``packing.assign_rows``: the same calls as in memory), and the rows are written to the cache
  :data:`ROW_BLOCK_TOKENS` at a time (``cache.StreamedSplit``), each block's documents read from
  the scratch files one by one (``pread``: a mapping would hold every page a block touches).

The cache is byte for byte the one the in-memory path writes (tests/test_data_bounded.py), so the
choice between the two is only about memory.  A progress callback hears (bytes read, bytes in all)
after every chunk.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from trnqwen.dataset import mixture
from trnqwen.dataset.cache import IGNORE_INDEX, StreamedSplit
from trnqwen.dataset.sources import Record, Source

CHUNK_RECORDS = 2048
BOUNDED_FROM_BYTES = 64 << 20  # local data of this size or more is prepared in bounded memory
ROW_BLOCK_TOKENS = 1 << 20  # rows written per block: its arrays and temporaries are what the rows cost (~60 MB)
Progress = Callable[[int, int], None]  # (bytes read, bytes in all)
# (source, its first record, the forced format or None) -> its format (refusals included): prepare's rule
Detect = Callable[[Source, Record, Optional[str]], str]


def sources_of(parts: list[mixture.Part], val_source: Optional[Source]) -> list[Source]:
    out = [s for part in parts for s in (part.source, part.val_source) if s is not None]
    return out + ([val_source] if val_source is not None else [])


def wanted(parts: list[mixture.Part], val_source: Optional[Source]) -> bool:
    """Local data of :data:`BOUNDED_FROM_BYTES` or more (a Hub dataset is memory-mapped by ``datasets``)."""
    sources = sources_of(parts, val_source)
    return not any(s.hub_name for s in sources) and sum(s.size_bytes() for s in sources) >= BOUNDED_FROM_BYTES


@dataclass
class DocStore:
    """Every document's tokens on disk, in read order; per document in memory: its token count,
    its count after fitting (0 = dropped), its trained targets; the first record of each problem."""

    folder: Path
    seq_len: int
    policy: str
    lengths: list[np.ndarray] = field(default_factory=list)
    cut: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    count: int = 0
    tokens: int = 0
    truncated: list[Any] = field(default_factory=lambda: [0, None])  # [count, first record's where]
    dropped: dict[str, list[Any]] = field(default_factory=dict)  # reason -> [count, first record's where]

    def __post_init__(self) -> None:
        self.ids_path, self.trained_path = self.folder / "ids.bin", self.folder / "trained.bin"
        self._ids, self._trained = self.ids_path.open("wb"), self.trained_path.open("wb")

    def add(self, docs, wheres: list[str]) -> None:
        from trnqwen.dataset.packing import fit_documents

        fitted = fit_documents(docs, self.seq_len, self.policy)
        self._ids.write(np.ascontiguousarray(docs.ids, dtype=np.int32).tobytes())
        self._trained.write(np.ascontiguousarray(docs.trained, dtype=np.uint8).tobytes())
        cut = np.zeros(len(docs), dtype=np.int64)
        cut[fitted.keep] = fitted.lengths
        self.lengths.append(docs.lengths.astype(np.int64))
        self.cut.append(cut)
        self.targets.append(fitted.targets.astype(np.int64))
        if fitted.truncated:
            self.truncated = [self.truncated[0] + len(fitted.truncated), self.truncated[1] or wheres[fitted.truncated[0]]]
        for reason, indices in fitted.dropped.items():
            seen = self.dropped.setdefault(reason, [0, wheres[indices[0]]])
            seen[0] += len(indices)
        self.count += len(docs)
        self.tokens += len(docs.ids)

    def close(self) -> None:
        self._ids.close()
        self._trained.close()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bounds [count + 1], cut lengths, trained targets, kept) over every document."""
        def joined(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        lengths, cut = joined(self.lengths), joined(self.cut)
        bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        return bounds, cut, joined(self.targets), cut > 0

    def problems(self, noun: str, cut_what: str) -> list[str]:
        """The report's lines, worded as ``packing.fit_problems`` words them (its reasons in its order)."""
        out = []
        if self.truncated[0]:
            out.append(f"{self.truncated[0]} {noun}(s) {cut_what} (first: {self.truncated[1]})")
        for reason in sorted(self.dropped, key=lambda r: not r.startswith("longer")):
            count, first = self.dropped[reason]
            out.append(f"{count} {noun}(s) dropped: {reason} (first: {first})")
        return out

    def dropped_counts(self) -> dict[str, int]:
        return {reason: self.dropped[reason][0] for reason in sorted(self.dropped, key=lambda r: not r.startswith("longer"))}


def read_documents(parts: list[mixture.Part], val_source: Optional[Source], store: DocStore, *, tokenizer,
                   detect: Detect, forced: Optional[str], val_split: float, seed: int, train_on_inputs: bool,
                   context: dict[str, Any], progress: Optional[Progress] = None) -> mixture.Loaded:
    """Every source's documents into ``store``, split and counted as ``mixture.load_parts`` does."""
    from trnqwen.dataset import chat
    from trnqwen.dataset.formats import normalise

    sources = sources_of(parts, val_source)
    total_bytes = sum(s.size_bytes() for s in sources)
    done_before = [0]

    def read(source: Source, fmt: Optional[str]) -> tuple[int, str, int]:
        n, chunk, chosen = 0, [], None
        for record in source.iter_records():
            if chosen is None:
                chosen = detect(source, record, fmt)
            chunk.append(record)
            if len(chunk) == CHUNK_RECORDS:
                n += _flush(chunk, chosen)
                chunk = []
                if progress is not None:
                    progress(done_before[0] + source.bytes_read, total_bytes)
        if chosen is None:
            detect(source, None, fmt)  # no records: refused there
        n += _flush(chunk, chosen)
        done_before[0] += source.size_bytes()
        if progress is not None:
            progress(done_before[0], total_bytes)
        return n, chosen, n

    def _flush(chunk: list[Record], fmt: str) -> int:
        if not chunk:
            return 0
        examples = normalise(chunk, fmt)
        texts, spans = chat.render(tokenizer, examples, train_on_inputs=train_on_inputs, context=context)
        store.add(chat.tokenize(tokenizer, texts, spans), [ex.where for ex in examples])
        return len(chunk)

    try:
        return mixture.load_parts(parts, val_source, read, forced=forced, val_split=val_split, seed=seed)
    finally:
        store.close()


def split_rows(store: DocStore, bounds: np.ndarray, cut: np.ndarray, targets: np.ndarray, doc_indices: np.ndarray, *,
               seq_len: int, packing: bool, pad_id: int, strategy: str, seed: int) -> StreamedSplit:
    """The split made of documents ``doc_indices`` as ``packing.build_rows`` makes it, written block by block."""
    from trnqwen.dataset.packing import assign_rows

    lengths = cut[doc_indices]
    rows, cols = assign_rows(lengths, seq_len, packing, strategy, seed)
    n_rows = int(rows.max()) + 1 if len(rows) else 0

    def blocks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        order = np.lexsort((cols, rows))
        row_sorted = rows[order]
        per_block = max(1, ROW_BLOCK_TOKENS // seq_len)
        for r0 in range(0, n_rows, per_block):
            r1 = min(n_rows, r0 + per_block)
            lo, hi = np.searchsorted(row_sorted, [r0, r1])
            yield _block(store, bounds, doc_indices[order[lo:hi]], lengths[order[lo:hi]], rows[order[lo:hi]] - r0,
                         cols[order[lo:hi]], r1 - r0, seq_len, pad_id)

    return StreamedSplit(sequences=n_rows, seq_len=seq_len, documents=len(doc_indices), tokens=int(lengths.sum()),
                         trained_tokens=int(targets[doc_indices].sum()), blocks=blocks)


def _block(store: DocStore, bounds, docs, lengths, rows, cols, n_rows: int, seq_len: int, pad_id: int):
    """Rows ``[0, n_rows)`` of one block (``build_rows``' arithmetic), each document's tokens read
    from the scratch files with ``pread``: a block's documents lie all over the files (best-fit rows
    are in a seeded order), and a mapping would bring every page it touches into this process."""
    import os

    owner = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((n_rows, seq_len), pad_id, dtype=np.int32)
    label_rows = np.full((n_rows, seq_len), IGNORE_INDEX, dtype=np.int32)
    fill = np.zeros(n_rows, dtype=np.int64)
    np.maximum.at(fill, rows, cols + lengths)
    positions = np.maximum(np.arange(seq_len)[None, :] - fill[:, None], 0).astype(np.int32)
    if len(owner):
        starts, counts = bounds[docs].tolist(), lengths.tolist()  # a document's kept tokens: all its labels need
        with store.ids_path.open("rb") as ids_file, store.trained_path.open("rb") as trained_file:
            ids_fd, trained_fd = ids_file.fileno(), trained_file.fileno()
            ids = np.frombuffer(b"".join(os.pread(ids_fd, 4 * n, 4 * s) for s, n in zip(starts, counts)), dtype=np.int32)
            trained = np.frombuffer(b"".join(os.pread(trained_fd, n, s) for s, n in zip(starts, counts)), dtype=np.uint8)
        src = np.arange(len(ids))
        nxt = np.minimum(src + 1, len(ids) - 1)
        is_last = position == lengths[owner] - 1
        labels = np.where(~is_last & (trained[nxt] != 0), ids[nxt], IGNORE_INDEX)
        dst_row, dst_col = rows[owner], cols[owner] + position
        input_ids[dst_row, dst_col] = ids
        label_rows[dst_row, dst_col] = labels
        positions[dst_row, dst_col] = position
    return input_ids, label_rows, positions


def scratch(cache_root: Path, key: str) -> Path:
    """A scratch folder beside the cache (same disk), removed by :func:`remove`."""
    cache_root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", suffix=".docs", dir=cache_root))


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def nth_record(source: Source, n: int) -> Record:
    """The ``n``-th record (0-based) of ``source``, read again (the report's sample)."""
    for i, record in enumerate(source.iter_records()):
        if i == n:
            return record
    raise IndexError(n)
