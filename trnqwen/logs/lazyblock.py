"""A block of the log file that this process does not read: a worker planned its region and
sent the few bytes the engine still looks at (:mod:`trnqwen.logs.parallel`).

Once a worker has planned a block, the engine needs from it only: its first and last newline,
the bytes up to the first (the end of the line that straddles the block boundary), the bytes
after the last (carried to the next block), and the end of the region (where
:func:`~trnqwen.logs.bulk.read_other_ranks` looks for each rank's last step).  Reading the
other 16 MB only to skip them cost this process - the one that orders everything - about 5 ms
a block.  :class:`LazyBlock` answers ``find``/``rfind``/``count``/``startswith``/slicing from
those two windows, and anything else (a quiet rank searched further back, a crash to read line
by line, a plan the engine cannot use) from the whole block, read then with ``os.pread``.
"""

from __future__ import annotations

import os
from typing import Optional

WINDOW = 128 << 10  # bytes of the region's end sent with a plan


class LazyBlock:
    """``size`` bytes of file descriptor ``fd`` at ``offset``, of which ``head`` (from the
    block's start) and ``tail`` (from ``tail_at`` to the end) are known."""

    __slots__ = ("_fd", "_offset", "_size", "_head", "_tail_at", "_tail", "_whole")

    def __init__(self, fd: int, offset: int, size: int, head: bytes, tail_at: int, tail: bytes):
        self._fd, self._offset, self._size = fd, offset, size
        self._head, self._tail_at, self._tail = head, tail_at, tail
        self._whole: Optional[bytes] = None

    def __len__(self) -> int:
        return self._size

    def whole(self) -> bytes:
        """The block's bytes (read once)."""
        if self._whole is None:
            data = os.pread(self._fd, self._size, self._offset)
            if len(data) != self._size:
                raise OSError(f"the file changed while it was read (offset {self._offset})")
            self._whole = data
        return self._whole

    def _range(self, start: Optional[int], end: Optional[int]) -> tuple[int, int]:
        start = 0 if start is None else start
        end = self._size if end is None else min(end, self._size)
        if start < 0 or end < 0:
            raise ValueError("LazyBlock takes offsets from the block's start")
        return start, end

    def _window(self, start: int, end: int) -> Optional[tuple[bytes, int]]:
        """(window, its offset) when ``[start, end)`` lies in one (and nothing is loaded)."""
        if self._whole is not None:
            return None
        if end <= len(self._head):
            return self._head, 0
        if start >= self._tail_at:
            return self._tail, self._tail_at
        return None

    def find(self, sub: bytes, start: Optional[int] = None, end: Optional[int] = None) -> int:
        start, end = self._range(start, end)
        got = self._window(start, end)
        if got is None and self._whole is None and start < len(self._head):
            hit = self._head.find(sub, start)  # a hit wholly in the head is the first one
            if hit >= 0 and hit + len(sub) <= min(end, len(self._head)):
                return hit
        if got is None:
            return self.whole().find(sub, start, end)
        data, at = got
        hit = data.find(sub, start - at, end - at)
        return hit + at if hit >= 0 else -1

    def rfind(self, sub: bytes, start: Optional[int] = None, end: Optional[int] = None) -> int:
        start, end = self._range(start, end)
        got = self._window(start, end)
        if got is None and self._whole is None and end > self._tail_at:
            hit = self._tail.rfind(sub, 0, end - self._tail_at)  # a hit wholly in the tail is the last one
            if hit >= 0:
                return hit + self._tail_at
        if got is None:
            return self.whole().rfind(sub, start, end)
        data, at = got
        hit = data.rfind(sub, start - at, end - at)
        return hit + at if hit >= 0 else -1

    def count(self, sub: bytes, start: Optional[int] = None, end: Optional[int] = None) -> int:
        start, end = self._range(start, end)
        got = self._window(start, end)
        if got is None:
            return self.whole().count(sub, start, end)
        data, at = got
        return data.count(sub, start - at, end - at)

    def startswith(self, prefix: bytes, start: int = 0) -> bool:
        got = self._window(start, start + len(prefix))
        if got is None:
            return self.whole().startswith(prefix, start)
        data, at = got
        return data.startswith(prefix, start - at)

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step is not None:
            return self.whole()[key]
        start, end = self._range(key.start, key.stop)
        if end <= start:
            return b""
        got = self._window(start, end)
        if got is None:
            return self.whole()[start:end]
        data, at = got
        return data[start - at:end - at]
