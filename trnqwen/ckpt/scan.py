"""Stream every tensor byte once with bounded memory: non-finite counts and relative change.

The scan walks each file's data section in windows (64 MiB) memory-mapped read-only and looks at the raw bits with numpy integer ops: a float is non-finite exactly
when its exponent bits are all ones, so ``(bits & abs_mask) >= exp_all_ones``.  Per 1 MiB block
the check is one ``bitwise_and`` into a cache-sized scratch array plus one ``max``; only a block
whose max crosses the threshold is counted exactly (NaN vs Inf).  That is ~30x cheaper than
``torch.isfinite`` and needs no torch import.  Measured on the 8 GB benchmark checkpoint,
mapping cost about a third of the CPU time of ``readinto`` into reused buffers (no copy into
user memory; the same CPU time as ``cat > /dev/null``); only one window is mapped at a time, so
peak RSS stays near 100 MB whatever the checkpoint size.  Windows are scanned by a small
thread pool (numpy and mmap release the GIL), one mapping per worker.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from trnqwen.safetensors_format import DTYPES, SafetensorsHeader, TensorInfo

CHUNK_BYTES = 64 << 20
BLOCK_BYTES = 1 << 20  # inner block: scratch stays in L2 cache

ProgressFn = Callable[[int], None]  # called with bytes just processed


@dataclass
class NonFinite:
    nan: int = 0
    inf: int = 0

    @property
    def total(self) -> int:
        return self.nan + self.inf


def _uint(np, itemsize: int):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]


def _chunk_plan(tensors: list[TensorInfo], data_len: int, chunk: int) -> list[tuple[int, int]]:
    """Byte ranges of the data section, each ending on an element boundary of its last tensor."""
    plan = []
    pos = 0
    idx = 0
    while pos < data_len:
        end = min(pos + chunk, data_len)
        while idx < len(tensors) and tensors[idx].end <= end:
            idx += 1
        if idx < len(tensors) and tensors[idx].begin < end < tensors[idx].end:
            t = tensors[idx]
            item = DTYPES[t.dtype].itemsize
            aligned = t.begin + (end - t.begin) // item * item
            if aligned > pos:
                end = aligned
            else:  # chunk smaller than one element: take the element whole
                end = t.begin + ((pos - t.begin) // item + 1) * item
        plan.append((pos, end))
        pos = end
    return plan


def _open_window(fd: int, header: SafetensorsHeader, begin: int, end: int):
    """Map the data bytes ``[begin, end)`` read-only; returns ``(window, offset of begin)``.

    Nothing is copied into user memory.  No ``MAP_POPULATE``: with several scan threads, page
    faults (the kernel maps cached pages around each fault) run in parallel, while populating
    serialises the mapping in one call; measured on the 8 GB benchmark, 0.76 s vs 1.12 s.
    """
    lo, hi = header.data_start + begin, header.data_start + end
    if os.fstat(fd).st_size < hi:  # shrank since the header check: never touch unmapped pages
        raise EOFError(f"file shrank below byte {hi:,} while being read")
    base = lo - lo % mmap.ALLOCATIONGRANULARITY
    return mmap.mmap(fd, hi - base, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=base), lo - base


def _close_window(window) -> None:
    try:
        window.close()
    except BufferError:  # a caller still holds a view: unmapped when it is dropped
        pass


def scan_workers() -> int:
    """Threads for the scan: numpy's integer kernels and mmap release the GIL, so windows of a
    checkpoint are scanned in parallel (bounded: each in-flight window is one mapping)."""
    env = os.environ.get("TRNQWEN_SCAN_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _scan_window(np, fd: int, header: SafetensorsHeader, tensors: list[TensorInfo], begin: int, end: int):
    """NaN/Inf counts of the float tensors overlapping ``[begin, end)`` of one file's data."""
    window, base = _open_window(fd, header, begin, end)
    scratch: dict[int, object] = {}
    counts: list[tuple[str, int, int]] = []
    try:
        for t in tensors:
            if t.end <= begin or t.begin >= end:
                continue
            dt = DTYPES[t.dtype]
            if not dt.is_float:
                continue
            lo, hi = max(t.begin, begin), min(t.end, end)
            utype = _uint(np, dt.itemsize)
            if dt.itemsize not in scratch:
                scratch[dt.itemsize] = np.empty(BLOCK_BYTES // dt.itemsize, dtype=utype)
            bits = np.frombuffer(window, dtype=utype, count=(hi - lo) // dt.itemsize, offset=base + lo - begin)
            nan, inf = _count_block(np, bits, dt.abs_mask, dt.exp_all_ones, scratch[dt.itemsize])
            del bits  # release the window before it is unmapped
            if nan or inf:
                counts.append((t.name, nan, inf))
    finally:
        _close_window(window)
    return counts


def scan_nonfinite(
    headers: Iterable[SafetensorsHeader],
    progress: Optional[ProgressFn] = None,
    chunk: int = CHUNK_BYTES,
    workers: Optional[int] = None,
) -> dict[str, NonFinite]:
    """NaN/Inf counts for every float tensor that has any (an empty dict = all finite)."""
    import bisect
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    found: dict[str, NonFinite] = {}
    workers = workers or scan_workers()
    fds: list[int] = []
    try:
        tasks = []
        for header in headers:
            tensors = [t for t in header.ordered() if t.nbytes]
            ends = [t.end for t in tensors]
            fd = os.open(header.path, os.O_RDONLY)
            fds.append(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            for begin, end in _chunk_plan(tensors, header.data_len, chunk):
                first = bisect.bisect_right(ends, begin)  # tensors ending at or before begin are done
                last = first
                while last < len(tensors) and tensors[last].begin < end:
                    last += 1
                tasks.append((fd, header, tensors[first:last], begin, end))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trnqwen-scan") as pool:
            # map() yields in order; windows are mapped only inside a running task, so at most
            # ``workers`` windows exist at once whatever the checkpoint size.
            results = pool.map(lambda task: (task[4] - task[3], _scan_window(np, *task)), tasks)
            for nbytes, counts in results:
                for name, nan, inf in counts:
                    acc = found.setdefault(name, NonFinite())
                    acc.nan += nan
                    acc.inf += inf
                if progress:
                    progress(nbytes)
    finally:
        for fd in fds:
            os.close(fd)
    return found


def _count_block(np, bits, abs_mask: int, threshold: int, scratch) -> tuple[int, int]:
    """(NaN, Inf) counts in ``bits``; a fast max test per block, exact counts only when needed."""
    step = len(scratch)
    mask = scratch.dtype.type(abs_mask)
    thr = scratch.dtype.type(threshold)
    nan = inf = 0
    n = len(bits)
    for i in range(0, n, step):
        block = bits[i : i + step]
        out = scratch[: len(block)]
        np.bitwise_and(block, mask, out=out)
        if out.max() >= thr:
            bad = out[out >= thr]
            k = int(np.count_nonzero(bad == thr))
            if threshold == 0x7F and abs_mask == 0x7F:  # float8 e4m3fn: no infinity, all-ones is NaN
                nan += len(bad)
            else:
                inf += k
                nan += len(bad) - k
    return nan, inf


# --- relative change against a reference checkpoint ---------------------------------------------


@dataclass
class Change:
    rel: Optional[float]  # ||a - b|| / ||b|| (None when b is all zeros or values are non-finite)
    diff_norm: float
    ref_norm: float
    changed: bool


def _to_float(np, raw: memoryview, dtype: str):
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32)
        np.left_shift(u, 16, out=u)
        return u.view(np.float32).astype(np.float64)
    npd = {"F16": np.float16, "F32": np.float32, "F64": np.float64}.get(dtype)
    if npd is not None:
        return np.frombuffer(raw, dtype=npd).astype(np.float64)
    if not DTYPES[dtype].is_float:
        return np.frombuffer(raw, dtype=_uint(np, DTYPES[dtype].itemsize)).astype(np.float64)
    raise ValueError(f"cannot compare {dtype} tensors")


def compare_tensors(
    pairs: list[tuple[TensorInfo, SafetensorsHeader, TensorInfo, SafetensorsHeader]],
    progress: Optional[ProgressFn] = None,
    elements_per_read: int = 1 << 20,
) -> dict[str, Change]:
    """Per-tensor ||a-b||/||b|| for (checkpoint tensor, its file, reference tensor, its file)."""
    import numpy as np

    out: dict[str, Change] = {}
    fds: dict[Path, int] = {}
    try:
        for a, ha, b, hb in pairs:
            for h in (ha, hb):
                if h.path not in fds:
                    fds[h.path] = os.open(h.path, os.O_RDONLY)
            ia, ib = DTYPES[a.dtype].itemsize, DTYPES[b.dtype].itemsize
            diff2 = ref2 = 0.0
            changed = False
            buf_a = bytearray(min(a.nbytes, elements_per_read * ia))
            buf_b = bytearray(min(b.nbytes, elements_per_read * ib))
            for start in range(0, a.numel, elements_per_read):
                count = min(elements_per_read, a.numel - start)
                va = _pread(fds[ha.path], memoryview(buf_a)[: count * ia], ha.data_start + a.begin + start * ia)
                vb = _pread(fds[hb.path], memoryview(buf_b)[: count * ib], hb.data_start + b.begin + start * ib)
                fa, fb = _to_float(np, va, a.dtype), _to_float(np, vb, b.dtype)
                d = fa - fb
                diff2 += float(np.dot(d, d))
                ref2 += float(np.dot(fb, fb))
                changed = changed or bool(np.any(fa != fb))
                if progress:
                    progress(count * ia)
            dn, rn = diff2 ** 0.5, ref2 ** 0.5
            finite = np.isfinite(dn) and np.isfinite(rn)
            rel = dn / rn if finite and rn > 0 else (0.0 if finite and dn == 0 else None)
            out[a.name] = Change(rel, dn, rn, changed)
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


def _pread(fd: int, view: memoryview, offset: int) -> memoryview:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise EOFError(f"file ended at byte {offset + got:,}")
        got += n
    return view


def nonzero_tensors(header: SafetensorsHeader, names: Iterable[str], chunk: int = CHUNK_BYTES) -> set[str]:
    """The tensors among ``names`` holding any value other than +-0 (raw bits: a float is zero
    exactly when its bits without the sign bit are all zero; an integer when all its bits are).
    Reads each tensor in ``chunk``-sized windows and stops at its first non-zero window."""
    import numpy as np

    found: set[str] = set()
    with open(header.path, "rb") as fh:
        for name in names:
            t = header.tensors[name]
            dtype = DTYPES[t.dtype]
            mask = dtype.abs_mask or (1 << (8 * dtype.itemsize)) - 1
            step = max(dtype.itemsize, chunk - chunk % dtype.itemsize)
            for lo in range(t.begin, t.end, step):
                n = min(step, t.end - lo)
                fh.seek(header.data_start + lo)
                raw = fh.read(n)
                if len(raw) != n:
                    raise EOFError(f"{header.path.name} ended inside {name}")
                bits = np.frombuffer(raw, dtype=_uint(np, dtype.itemsize))
                if np.bitwise_and(bits, bits.dtype.type(mask)).any():
                    found.add(name)
                    break
    return found
