"""A big log file parsed on several cores: the regions are planned in worker processes.

The engine (:mod:`trnqwen.logs.engine`) stays the one reader, in this process, in file order:
it keeps all cross-block state (the line count, the carried partial line, open tracebacks,
restarts, warnings) and reads the lines that need it one by one.  What the workers do is the
pure, expensive part of its fast path, :func:`~trnqwen.logs.bulk.plan_region` (classify every
line, read rank 0's step columns, find high-memory lines), for the blocks ahead, on their own
mapping of the file.  A plan is used only for exactly the region the engine would plan itself
(the same block object, offsets and rank prefix); anything else (the rank not yet known, an
overlong line being skipped, a traceback open) makes the engine plan that region itself, as
without workers.  So the result is the serial parser's, byte for byte
(``tests/test_logs_fastpath.py``).

A block a worker planned is not read here: the worker also sends the bytes the engine still
looks at (:class:`~trnqwen.logs.lazyblock.LazyBlock`).  Nor is a block this process plans
itself: it runs the workers' own :func:`_plan_block` on a mapping of the file (a read copied
16 MB per block, a tenth of the parse of a 400 MB log), then uses that plan as a worker's.
:data:`BLOCKS` counts how the last file's blocks were taken.  One worker per core but this process's
(at most 4), and this process plans its equal share of the blocks itself
(:func:`planned_here`): on two cores one worker and this process, not a third process competing
for the cores.

Only for regular files of at least :data:`MIN_BYTES` on a machine with two or more cores:
starting a worker (fork) costs a few tens of milliseconds.  Measured in
``benchmarks/inspect_logs.py``.
"""

from __future__ import annotations

import io
import os
from collections import deque
from typing import BinaryIO, Optional

from trnqwen.logs import bulk
from trnqwen.logs.engine import CHUNK_SIZE, MAX_LINE, LogParser
from trnqwen.logs.lazyblock import WINDOW, LazyBlock
from trnqwen.logs.record import ParsedLog

MIN_BYTES = 64 << 20
# how the last read_file's blocks were taken (tests check the fast paths ran): planned by a
# worker, planned here on a mapping of the file, or read whole (the first, the last, and any
# the engine plans itself)
BLOCKS = {"by_workers": 0, "mapped_here": 0, "read": 0}
AHEAD = 4  # blocks in flight at most (each plan holds about a MB)
FIRST_PIECE = 1 << 20  # the first block is read in two: the rank is known after this much, and
# the workers start on the next blocks while this process reads the rest of the first


def workers_for(size: int) -> int:
    """How many worker processes a file of ``size`` bytes is worth (0: parse serially): one per
    core but this process's, at most 4; ``TRNQWEN_LOG_WORKERS=N`` sets it (0: none)."""
    if size < MIN_BYTES:
        return 0
    return cores_to_spare()


def cores_to_spare() -> int:
    """Processes worth starting besides this one: one per core but this process's, at most 4;
    ``TRNQWEN_LOG_WORKERS=N`` sets it (0: everything in this process)."""
    forced = os.environ.get("TRNQWEN_LOG_WORKERS", "").strip()
    if forced == "0":
        return 0
    if forced.isdigit():
        return min(int(forced), 16)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(cores - 1, 4) if cores > 1 else 0


def planned_here(index: int, workers: int) -> bool:
    """Whether block ``index`` is planned by this process rather than a worker: every
    ``workers + 1``-th block (every other one with a single worker, on two cores).  This process
    reads no block a worker planned (:class:`~trnqwen.logs.lazyblock.LazyBlock`), so its own
    work per block is small and it takes an equal share of the planning; measured on two cores,
    a half share parses the issue-17 log in 0.67 s, a third in 0.79 s, 60% in 0.75 s."""
    return index % (workers + 1) == 0


def _quiet_worker() -> None:
    """Ctrl-C is the main process's to handle (it stops submitting and waits a block at most)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _plan_block(path: str, offset: int, size: int, prefix: bytes, max_line: int):
    """In a worker: plan the region the engine will cut from block ``[offset, offset + size)``
    of the file: ``(start, end, plan, head, tail_at, tail)`` with offsets inside the block
    (``head``, ``tail``: see :class:`~trnqwen.logs.lazyblock.LazyBlock`), or None (no region).
    The file is mapped, not read: no copy of the block, and its pages come from the page cache."""
    import mmap

    with open(path, "rb") as fh:
        total = os.fstat(fh.fileno()).st_size
        if offset >= total:
            return None
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            stop = min(offset + size, total)
            first = mm.find(b"\n", offset, stop)
            if first < 0:
                return None
            last = mm.rfind(b"\n", offset, stop)
            # LogParser.feed: a block after a whole line starts a region at 0; otherwise the
            # straddling line is read on its own and the region starts after the block's first newline
            start = offset if offset == 0 or mm[offset - 1] == 10 else first + 1
            if start > last:
                return None
            plan = bulk.plan_region(mm, start, last, prefix, max_line)
            # and what the engine reads of the block besides (lazyblock.LazyBlock): up to its
            # first newline, and from a little before the region's end to the block's end
            head = mm[offset: first + 1]
            tail_at = max(len(head), last - offset - WINDOW)
            return start - offset, last - offset, plan, head, tail_at, mm[offset + tail_at: stop]


def read_file(fh: BinaryIO, label: str, *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE,
              workers: Optional[int] = None) -> ParsedLog:
    """Parse an open regular file to the end; the same result as feeding its blocks to a
    :class:`LogParser`, with the planning spread over ``workers`` processes when worth it."""
    parser = LogParser(label, max_line=max_line)
    BLOCKS.update(by_workers=0, mapped_here=0, read=0)
    try:  # the workers open the file by name: it must be this very file, read from its start
        st = os.fstat(fh.fileno())
        path = fh.name if isinstance(getattr(fh, "name", None), str) else None
        same = path is not None and fh.tell() == 0 and os.path.isfile(path) and os.stat(path).st_ino == st.st_ino
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        same = False
    n = (workers_for(st.st_size) if workers is None else workers) if same else 0
    if n <= 0:
        return _serial(parser, fh, chunk_size)
    size = st.st_size
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pending: deque = deque()  # (block index, future), in block order
    submitted = 0
    blocks = -(-size // chunk_size)
    current: dict = {}

    def planned(buf: bytes, start: int, end: int, prefix: bytes):
        got = current.get("plan")
        if buf is not current.get("block") or got is None or current.get("prefix") != prefix:
            return None
        return got[2] if got[:2] == (start, end) else None

    try:
        context = multiprocessing.get_context("fork")
    except ValueError:  # pragma: no cover - no fork on this platform
        return _serial(parser, fh, chunk_size)
    parser.planned = planned
    broken = False
    with ProcessPoolExecutor(n, mp_context=context, initializer=_quiet_worker) as pool:
        for index, want in _pieces(chunk_size):
            prefix = parser._primary_prefix if parser._primary_decided else None
            current.clear()
            got = used = None
            if prefix:
                if submitted <= index:
                    submitted = index + 1  # this block: planned here; the next ones ahead
                while not broken and submitted < blocks and len(pending) < max(n, AHEAD):
                    # this process's share, but the last block: the workers are ahead by then,
                    # and this process would plan it alone at the end
                    if planned_here(submitted, n) and submitted < blocks - 1:
                        submitted += 1
                        continue
                    try:
                        future = pool.submit(_plan_block, path, submitted * chunk_size, chunk_size, prefix, max_line)
                    except Exception:  # workers could not start or died: plan every region here
                        broken = True
                        break
                    pending.append((submitted, prefix, future))
                    submitted += 1
                while pending and pending[0][0] < index:
                    pending.popleft()
                if pending and pending[0][0] == index:
                    _, used, future = pending.popleft()
                    try:
                        got = future.result()
                    except Exception:  # a worker that failed: this region is planned here
                        got = None
            offset = index * chunk_size
            whole = bool(index) and want == chunk_size and offset + want <= size
            if got is None and prefix and whole and os.fstat(fh.fileno()).st_size >= size:
                # this process's share: planned the same way, on a mapping of the file (a read
                # would copy the block, the largest cost here besides planning), then used as
                # a worker's plan is.  Only while the file is as long as it was: a mapped page
                # past the end of a file cut short meanwhile (a copy-truncate rotation) is a
                # SIGBUS, which a worker survives (its pool breaks) and this process would not
                try:
                    got, used = _plan_block(path, offset, want, prefix, max_line), prefix
                except Exception:  # as for a worker that failed: the engine plans this region itself
                    got = None
                if got is not None:
                    BLOCKS["mapped_here"] += 1
            elif got is not None:
                BLOCKS["by_workers"] += 1
            if got is not None and whole:
                # planned in full (by a worker, or just above): this process reads only what the engine looks at
                block = LazyBlock(fh.fileno(), offset, want, *got[3:])
                fh.seek(want, io.SEEK_CUR)
            else:
                block = fh.read(want)
                if not block:
                    break
                BLOCKS["read"] += 1
            if got is not None:
                current.update(block=block, prefix=used, plan=got)
            parser.feed(block)
        current.clear()
        for _, _, future in pending:
            future.cancel()
    return parser.close()


def _pieces(chunk_size: int):
    """(block index, bytes to read) in file order: block 0 in two pieces, then whole blocks."""
    first = min(FIRST_PIECE, chunk_size)
    yield 0, first
    if chunk_size > first:
        yield 0, chunk_size - first
    index = 1
    while True:
        yield index, chunk_size
        index += 1


def _serial(parser: LogParser, fh: BinaryIO, chunk_size: int) -> ParsedLog:
    while True:
        block = fh.read(chunk_size)
        if not block:
            break
        parser.feed(block)
    return parser.close()
