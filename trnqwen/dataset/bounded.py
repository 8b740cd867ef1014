"""Bounded-memory preparation: a dataset larger than memory becomes the same cache as in memory.

:func:`trnqwen.dataset.prepare.prepare` holds every record, its rendered text and its tokens
(about 14 KB per short conversation).  For a large dataset (:func:`wanted`) it reads the records
through this module instead, with the same rendering, masking, fitting and packing:

* records are read one at a time and taken :data:`CHUNK_RECORDS` at a time through
  ``chat.render``, ``chat.tokenize`` and ``packing.fit_documents`` (:class:`Encoder`), by
  ``workers`` processes (forked, so each has the tokenizer already; at most two chunks per worker
  in flight, taken back in file order).  A ``.jsonl`` file's lines go to the workers as their
  place in the file (``Source.line_chunks``) and are read and parsed there: this process only
  finds where each run of lines ends (numpy, a buffer at a time) and reads each file's first
  record, for its format; parsing every record and pickling its objects to a worker made it the
  bottleneck, and splitting the lines one by one cost it ~10 s a GB of the workers' cores; other
  files are read as records (``Source.iter_records``);
* each chunk's token ids and trained flags go to two scratch files beside the cache, and its
  per-document numbers (length, length after fitting, trained targets) to three more
  (:class:`DocStore`): what stays in memory is counts and the first record of each problem;
  the numbers are read back as memory maps (:meth:`DocStore.arrays`), fixed-width, never lists;
* the mixture's choice and the rows are computed from those numbers (``mixture.select``,
  ``packing.assign_rows``: the same calls as in memory), and the rows are written to the cache
  :data:`ROW_BLOCK_TOKENS` at a time (``cache.StreamedSplit``), each block's documents read from
  the scratch files one by one (``pread``: a mapping would hold every page a block touches);
  with workers, forked writers make the blocks and write each at its place in the cache's files
  (``StreamedSplit.write_rows``), a block of ``ROW_BLOCK_TOKENS / workers`` each.

The per-document arrays after reading (the split's indices from ``mixture.hold_out``/``load_parts``,
int32 where the count allows; the chosen documents, a mixture's seeded orders for its weights and
record counts included, shuffled in place; lengths, rows, columns, the best-fit and by-row orders:
counting sorts, no argsort) are memory maps in the scratch folder too
(:meth:`DocStore.scratch_array`), filled a slice at a time, and the report's sums read them a slice
at a time.  What still grows with the record count in memory is a few numbers per *row* (best-fit's
open rows by room, the row starts); not the records, texts, tokens or per-document numbers.  The cache is byte for
byte the one the in-memory path writes, with any number of workers (tests/test_data_bounded.py),
so the choice between the two is only about memory.  A progress callback hears (bytes read,
bytes in all) after every chunk.
"""

from __future__ import annotations

import contextlib

import gc
import os
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import numpy as np

from trnqwen.dataset import mixture
from trnqwen.dataset.cache import IGNORE_INDEX, StreamedSplit
from trnqwen.dataset.sources import LineChunk, Record, Source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHUNK_RECORDS = 2048
MAX_WORKERS = 8  # one parent reads the records and writes the tokens: more workers than this wait on it
BOUNDED_FROM_BYTES = 64 << 20  # local data of this size or more is prepared in bounded memory
ROW_BLOCK_TOKENS = 1 << 20  # rows written per block: its arrays and temporaries are what the rows cost (~60 MB)
Progress = Callable[[int, int], None]  # (bytes read, bytes in all)
# (source, its first record, the forced format or None) -> its format (refusals included): prepare's rule
Detect = Callable[[Source, Record, Optional[str]], str]
_PER_DOC = ("lengths", "cut", "targets")  # int32 per document, in read order


def default_workers() -> int:
    """The CPUs this process may use, up to :data:`MAX_WORKERS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def sources_of(parts: list[mixture.Part], val_source: Optional[Source]) -> list[Source]:
    out = [s for part in parts for s in (part.source, part.val_source) if s is not None]
    return out + ([val_source] if val_source is not None else [])


def wanted(parts: list[mixture.Part], val_source: Optional[Source]) -> bool:
    """Local data of :data:`BOUNDED_FROM_BYTES` or more (a Hub dataset is memory-mapped by ``datasets``)."""
    sources = sources_of(parts, val_source)
    return not any(s.hub_name for s in sources) and sum(s.size_bytes() for s in sources) >= BOUNDED_FROM_BYTES


@dataclass
class Chunk:
    """One chunk of documents encoded and fitted (what a worker sends back): flat token ids and
    trained flags, per document its length, its length after fitting (0 = dropped) and its
    trained targets; what fitting cut or dropped as (count, first record's where)."""

    ids: np.ndarray
    trained: np.ndarray
    lengths: np.ndarray
    cut: np.ndarray
    targets: np.ndarray
    truncated: tuple[int, Optional[str]]
    dropped: dict[str, tuple[int, str]]
    renders: tuple[int, int] = (0, 0)  # chat-template renders pasted from role skeletons, rendered by jinja (skeleton.py)
    starts: tuple[int, int] = (0, 0)  # chunks whose token starts were counted from byte lengths, redone (encode.STARTS)


@dataclass
class Encoder:
    """Records of one format -> a :class:`Chunk` (``normalise``, ``render``, ``tokenize``, ``fit_documents``)."""

    tokenizer: PreTrainedTokenizerBase
    seq_len: int
    policy: str
    train_on_inputs: bool
    context: dict[str, Any]

    def __call__(self, records: list[Record], fmt: str) -> Chunk:
        from trnqwen.dataset import chat, skeleton
        from trnqwen.dataset.formats import normalise
        from trnqwen.dataset.packing import fit_documents

        from trnqwen.dataset.encode import STARTS

        pasted, rendered = skeleton.COUNTS.totals()
        counted, redone = STARTS.counted, STARTS.redone
        examples = normalise(records, fmt)
        texts, spans = chat.render(self.tokenizer, examples, train_on_inputs=self.train_on_inputs, context=self.context)
        docs = chat.tokenize(self.tokenizer, texts, spans)
        fitted = fit_documents(docs, self.seq_len, self.policy)
        cut = np.zeros(len(docs), dtype=np.int32)
        cut[fitted.keep] = fitted.lengths
        after = skeleton.COUNTS.totals()
        return Chunk(ids=np.ascontiguousarray(docs.ids, dtype=np.int32), trained=docs.trained.astype(np.uint8),
                     lengths=docs.lengths.astype(np.int32), cut=cut, targets=fitted.targets.astype(np.int32),
                     truncated=(len(fitted.truncated), examples[fitted.truncated[0]].where if fitted.truncated else None),
                     dropped={reason: (len(i), examples[i[0]].where) for reason, i in fitted.dropped.items()},
                     renders=(after[0] - pasted, after[1] - rendered),
                     starts=(STARTS.counted - counted, STARTS.redone - redone))


@dataclass
class DocStore:
    """Every document's tokens and per-document numbers on disk, in read order (see the module);
    in memory: counts, and the first record of each problem."""

    folder: Path
    count: int = 0
    tokens: int = 0
    truncated: list[Any] = field(default_factory=lambda: [0, None])  # [count, first record's where]
    dropped: dict[str, list[Any]] = field(default_factory=dict)  # reason -> [count, first record's where]
    renders: list[int] = field(default_factory=lambda: [0, 0])  # Chunk.renders, summed
    starts: list[int] = field(default_factory=lambda: [0, 0])  # Chunk.starts, summed
    arrays_made: int = 0  # scratch_array's files

    def __post_init__(self) -> None:
        self.ids_path, self.trained_path = self.folder / "ids.bin", self.folder / "trained.bin"
        self._files = {name: (self.folder / f"{name}.bin").open("wb") for name in ("ids", "trained", *_PER_DOC)}

    def add(self, chunk: Chunk) -> None:
        for name in ("ids", "trained", *_PER_DOC):
            self._files[name].write(getattr(chunk, name).tobytes())
        count, first = chunk.truncated
        if count:
            self.truncated = [self.truncated[0] + count, self.truncated[1] or first]
        for reason, (count, first) in chunk.dropped.items():
            seen = self.dropped.setdefault(reason, [0, first])
            seen[0] += count
        self.count += len(chunk.lengths)
        self.tokens += len(chunk.ids)
        self.renders = [self.renders[0] + chunk.renders[0], self.renders[1] + chunk.renders[1]]
        self.starts = [self.starts[0] + chunk.starts[0], self.starts[1] + chunk.starts[1]]

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()

    def scratch_array(self, dtype: type, n: int) -> np.ndarray:
        """A new array of ``n`` in the scratch folder (a memory map: its pages the kernel's to drop or write back)."""
        self.arrays_made += 1
        if not n:
            return np.zeros(0, dtype=dtype)
        return np.lib.format.open_memmap(self.folder / f"scratch-{self.arrays_made}.npy", mode="w+", dtype=dtype,
                                         shape=(n,))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bounds [count + 1] int64, cut lengths, trained targets, kept) over every document, as
        read-only memory maps of the scratch files (kept: cut > 0, a bool map)."""
        per_doc = {name: self._map(f"{name}.bin", np.int32, self.count) for name in _PER_DOC}
        bounds = np.lib.format.open_memmap(self.folder / "bounds.npy", mode="w+", dtype=np.int64, shape=(self.count + 1,))
        kept = np.lib.format.open_memmap(self.folder / "kept.npy", mode="w+", dtype=bool, shape=(self.count,))
        bounds[0], step = 0, 1 << 20
        for lo in range(0, self.count, step):  # a slice at a time: no whole-set temporary
            np.cumsum(per_doc["lengths"][lo:lo + step], dtype=np.int64, out=bounds[lo + 1:lo + 1 + step])
            bounds[lo + 1:lo + 1 + step] += bounds[lo]
            np.greater(per_doc["cut"][lo:lo + step], 0, out=kept[lo:lo + step])
        bounds.flush()
        kept.flush()
        return (np.load(self.folder / "bounds.npy", mmap_mode="r"), per_doc["cut"], per_doc["targets"],
                np.load(self.folder / "kept.npy", mmap_mode="r"))

    def _map(self, name: str, dtype, count: int) -> np.ndarray:
        if not count:
            return np.zeros(0, dtype=dtype)
        return np.memmap(self.folder / name, dtype=dtype, mode="r", shape=(count,))

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


_WORKER: dict[str, Encoder] = {}  # in a worker process: its encoder (inherited through fork)


def _start_worker(encoder: Encoder) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it ends the pool): no worker tracebacks
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the workers are the parallelism
    # a chunk makes ~100k short-lived objects that live until it is sent: automatic collections
    # (every 700 allocations) kept traversing them, ~6-8% of a worker's time; one collection per
    # chunk instead frees any cycles just as surely (memory: one chunk's garbage at most)
    gc.disable()
    _WORKER["encoder"] = encoder


def _records(records: list[Record] | LineChunk) -> list[Record]:
    return records.records() if isinstance(records, LineChunk) else records


def _encode_in_worker(records: list[Record] | LineChunk, fmt: str) -> Chunk:
    try:
        return _WORKER["encoder"](_records(records), fmt)
    finally:
        gc.collect()


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _forked_pool(workers: int, initializer: Callable[..., None], initargs: tuple):
    """A pool of ``workers`` forked processes (they inherit this one's objects: the tokenizer, closures)."""
    import multiprocessing

    # a forked child of a process that has used the tokenizer's own threads turns them off
    # and says so on stderr unless TOKENIZERS_PARALLELISM is set: set while forking only
    # (and gc.freeze: a worker's collections then leave the parent's objects alone, their pages shared)
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    gc.freeze()
    try:
        return multiprocessing.get_context("fork").Pool(workers, initializer, initargs)
    finally:
        gc.unfreeze()
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class _Pipeline:
    """Chunks encoded by ``workers`` processes (or in this one), taken back in the order given."""

    def __init__(self, encoder: Encoder, workers: int, store: DocStore) -> None:
        self.encoder, self.store, self.pool, self.failed = encoder, store, None, False
        self.pending: deque = deque()
        self.window = 2 * workers
        if workers > 1 and _can_fork():
            self.pool = _forked_pool(workers, _start_worker, (encoder,))

    def submit(self, records: list[Record] | LineChunk, fmt: str, after: Callable[[], None]) -> None:
        """Encode ``records`` (a :class:`LineChunk`: parsed where it is encoded); ``after`` runs once
        they are stored (in order)."""
        if self.pool is None:
            self.store.add(self.encoder(_records(records), fmt))
            after()
            return
        self.pending.append((self.pool.apply_async(_encode_in_worker, (records, fmt)), after))
        while len(self.pending) >= self.window:
            self._take()

    def drain(self) -> None:
        while self.pending:
            self._take()

    def _take(self) -> None:
        result, after = self.pending.popleft()
        try:
            chunk = result.get()
        except BaseException:  # a worker's error (a bad record), in file order: the later chunks are not waited for
            self.failed = True
            self.pending.clear()
            raise
        self.store.add(chunk)
        after()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def read_documents(parts: list[mixture.Part], val_source: Optional[Source], store: DocStore, encoder: Encoder, *,
                   detect: Detect, forced: Optional[str], val_split: float, seed: int, workers: int = 1,
                   progress: Optional[Progress] = None) -> mixture.Loaded:
    """Every source's documents into ``store``, split and counted as ``mixture.load_parts`` does."""
    sources = sources_of(parts, val_source)
    total_bytes = sum(s.size_bytes() for s in sources)
    done_before = [0]
    pipeline = _Pipeline(encoder, workers, store)

    def told(done: int) -> Callable[[], None]:
        return (lambda: progress(done, total_bytes)) if progress is not None else (lambda: None)

    @contextlib.contextmanager
    def submitting(source: Source):
        """One source's chunks handed to the workers, all of them done before the next source."""
        try:
            yield
        except BaseException:
            if not pipeline.failed:
                pipeline.drain()  # a record the workers refuse comes before a later line that is unreadable
            raise
        pipeline.drain()
        done_before[0] += source.size_bytes()
        told(done_before[0])()

    def read(source: Source, fmt: Optional[str]) -> tuple[int, str, int]:
        if source.streams_lines():
            return read_lines(source, fmt)
        n, chunk, chosen = 0, [], None
        with submitting(source):
            for record in source.iter_records():
                if chosen is None:
                    chosen = detect(source, record, fmt)
                chunk.append(record)
                if len(chunk) == CHUNK_RECORDS:
                    pipeline.submit(chunk, chosen, told(done_before[0] + source.bytes_read))
                    n, chunk = n + len(chunk), []
            if chosen is None:
                detect(source, None, fmt)  # no records: refused there
            if chunk:
                pipeline.submit(chunk, chosen, lambda: None)
                n += len(chunk)
        return n, chosen, n

    def read_lines(source: Source, fmt: Optional[str]) -> tuple[int, str, int]:
        # .jsonl lines go to the workers as bytes, parsed there: this process only splits lines
        # (parsed JSON would cost it the parsing and the pickling of every record's objects)
        before, chosen = store.count, None
        with submitting(source):
            for first, lines in source.line_chunks(CHUNK_RECORDS):
                if first is not None:
                    chosen = detect(source, first, fmt)
                pipeline.submit(lines, chosen, told(done_before[0] + source.bytes_read))
            if chosen is None:
                detect(source, None, fmt)  # no records: refused there
        n = store.count - before  # the records (the workers skip the lines that hold none)
        return n, chosen, n

    try:
        return mixture.load_parts(parts, val_source, read, forced=forced, val_split=val_split, seed=seed,
                                  alloc=store.scratch_array)
    finally:
        pipeline.close()
        store.close()


def split_rows(store: DocStore, bounds: np.ndarray, cut: np.ndarray, targets: np.ndarray, doc_indices: np.ndarray, *,
               seq_len: int, packing: bool, pad_id: int, strategy: str, seed: int, workers: int = 1) -> StreamedSplit:
    """The split made of documents ``doc_indices`` as ``packing.build_rows`` makes it, written block by
    block (by ``workers`` forked processes, each writing its blocks into the cache's files); its
    per-document arrays (lengths, rows, columns, the orders) are memory maps in the scratch folder,
    filled a slice at a time."""
    from trnqwen.dataset.bestfit import counting_order
    from trnqwen.dataset.packing import assign_rows

    n, step = len(doc_indices), 1 << 20
    lengths = store.scratch_array(np.int32, n)
    trained_tokens = 0
    for lo in range(0, n, step):
        picked = doc_indices[lo:lo + step]
        lengths[lo:lo + step] = cut[picked]
        trained_tokens += int(targets[picked].sum())
    rows, cols = assign_rows(lengths, seq_len, packing, strategy, seed, store.scratch_array)
    n_rows = int(rows.max()) + 1 if len(rows) else 0

    def by_row() -> Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """rows [r0, r1) -> their block: documents by row, each row's in their order (= by column: a
        row's columns grow in that order)."""
        order = counting_order(rows, n_rows, store.scratch_array(np.int32 if n < 2**31 else np.int64, n))
        row_start = np.zeros(n_rows + 1, dtype=np.int64)
        for lo in range(0, n, step):
            row_start[1:] += np.bincount(rows[lo:lo + step], minlength=n_rows)
        np.cumsum(row_start, out=row_start)

        def block(r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            mine = order[row_start[r0]:row_start[r1]]
            return _block(store, bounds, doc_indices[mine], lengths[mine], rows[mine] - r0, cols[mine], r1 - r0,
                          seq_len, pad_id)
        return block

    def ranges(per_block: int) -> list[tuple[int, int]]:
        return [(r0, min(n_rows, r0 + per_block)) for r0 in range(0, n_rows, per_block)]

    def blocks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        block = by_row()
        for r0, r1 in ranges(max(1, ROW_BLOCK_TOKENS // seq_len)):
            yield block(r0, r1)

    def write_rows(paths: list[Path], start: int) -> int:
        # each process a block at a time, of ROW_BLOCK_TOKENS / workers: the blocks' memory as one process's
        return _write_in_parallel(by_row(), ranges(max(1, ROW_BLOCK_TOKENS // seq_len // workers)), paths,
                                  start, seq_len, workers)

    parallel = workers > 1 and n_rows > max(1, ROW_BLOCK_TOKENS // seq_len) and _can_fork()
    return StreamedSplit(sequences=n_rows, seq_len=seq_len, documents=n, tokens=int(lengths.sum(dtype=np.int64)),
                         trained_tokens=trained_tokens, blocks=blocks, write_rows=write_rows if parallel else None)


_WRITER: dict[str, Any] = {}  # in a writing process: (block, paths, start, seq_len), inherited through fork


def _write_block(r0: int, r1: int) -> int:
    """Rows [r0, r1) made and written at their place in each file (in a writing process)."""
    block, paths, start, seq_len = _WRITER["job"]
    if "fds" not in _WRITER:
        _WRITER["fds"] = [os.open(path, os.O_WRONLY) for path in paths]
    for fd, array in zip(_WRITER["fds"], block(r0, r1)):
        data = memoryview(np.ascontiguousarray(array, dtype=np.int32)).cast("B")
        offset = start + r0 * seq_len * 4
        while len(data):
            done = os.pwrite(fd, data, offset)
            data, offset = data[done:], offset + done
    return r1 - r0


def _start_writer(job: tuple) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's (it ends the pool)
    _WRITER.clear()
    _WRITER["job"] = job


def _write_in_parallel(block: Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
                       ranges: list[tuple[int, int]], paths: list[Path], start: int, seq_len: int, workers: int) -> int:
    """Every range's rows written by ``workers`` forked processes (the cache's ``write_rows``); the rows written."""
    pool = _forked_pool(min(workers, len(ranges)), _start_writer, ((block, paths, start, seq_len),))
    try:
        return sum(pool.starmap(_write_block, ranges, chunksize=1))
    finally:
        pool.terminate()
        pool.join()


def _block(store: DocStore, bounds, docs, lengths, rows, cols, n_rows: int, seq_len: int, pad_id: int):
    """Rows ``[0, n_rows)`` of one block (``build_rows``' arithmetic), the documents' tokens read
    from the scratch files (:func:`_read_documents`)."""
    total = int(lengths.sum())
    doc_start = np.cumsum(lengths) - lengths  # where each document's tokens start among the block's
    position = np.arange(total) - np.repeat(doc_start, lengths)
    input_ids = np.full((n_rows, seq_len), pad_id, dtype=np.int32)
    label_rows = np.full((n_rows, seq_len), IGNORE_INDEX, dtype=np.int32)
    fill = np.zeros(n_rows, dtype=np.int64)
    np.maximum.at(fill, rows, cols + lengths)
    positions = np.maximum(np.arange(seq_len, dtype=np.int32)[None, :] - fill.astype(np.int32)[:, None], 0)  # padding counts from 0
    # Every packing (packing.assign_rows) lays a row's documents side by side from column 0, and they
    # come by row, then column: so the block's tokens in that order are each row's first ``fill``
    # positions, row after row (far cheaper to place than a scatter by row and column)
    row_start = np.cumsum(fill) - fill  # where each row's tokens start among the block's
    if int(fill.sum()) != total or not np.all(cols == doc_start - row_start[rows]):
        raise ValueError("a block's documents are not side by side from column 0, row after row")
    if total:
        starts, counts = bounds[docs].tolist(), lengths.tolist()  # a document's kept tokens: all its labels need
        ids = _read_documents(store.ids_path, 4, np.int32, starts, counts)
        trained = _read_documents(store.trained_path, 1, np.uint8, starts, counts)
        nxt_ids, nxt_trained = np.empty_like(ids), np.zeros_like(trained)  # the token after each (its label)
        nxt_ids[:-1], nxt_trained[:-1] = ids[1:], trained[1:]
        nxt_trained[(doc_start + lengths - 1)[lengths > 0]] = 0  # a document's last token predicts nothing
        labels = np.where(nxt_trained != 0, nxt_ids, IGNORE_INDEX)
        placed = np.arange(total) + np.repeat(np.arange(n_rows) * seq_len - row_start, fill)  # flat: row * seq_len + column
        input_ids.reshape(-1)[placed] = ids
        label_rows.reshape(-1)[placed] = labels
        positions.reshape(-1)[placed] = position
    return input_ids, label_rows, positions


def _read_documents(path: Path, itemsize: int, dtype: type, starts: list[int], counts: list[int]) -> np.ndarray:
    """The documents' values from a scratch file, one ``pread`` each: a block's documents lie all over
    the file (best-fit rows are in a seeded order), and a mapping would bring every page it touches,
    and the kernel's fault-around its neighbours, into this process (measured: a mapping per 256k
    tokens was ~5% cheaper in CPU than the preads and held ~180 MB more per writer)."""
    with path.open("rb") as fh:
        fd = fh.fileno()
        return np.frombuffer(b"".join(os.pread(fd, itemsize * n, itemsize * s) for s, n in zip(starts, counts)), dtype=dtype)


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
