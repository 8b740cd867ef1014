"""lm-evaluation-harness's one stray line: ``fatal: not a git repository``, dropped and nothing else.

``lm_eval.simple_evaluate`` records a git hash by running ``git describe --always`` in the current
folder, its stderr not captured: outside a git checkout (where users run trnqwen) git prints
``fatal: not a git repository (or any of the parent directories): .git`` on the terminal, which
reads like trnqwen failed.  There is no option to skip it, and trnqwen does not patch the harness,
so for the length of the call the process's stderr (file descriptor 2, which the git child
inherits) passes through a pipe that forwards every byte as it comes, progress bars included,
except that line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

GIT_NOISE = b"fatal: not a git repository"


class _Filter:
    """Drops whole lines that start with :data:`GIT_NOISE`; holds back an unfinished tail only
    while it could still become one."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        self.pending = b""
        out, start = [], 0
        while True:
            end = min((i for i in (data.find(b"\n", start), data.find(b"\r", start)) if i >= 0), default=-1)
            if end < 0:
                break
            line = data[start:end + 1]
            if not line.startswith(GIT_NOISE):
                out.append(line)
            start = end + 1
        tail = data[start:]
        if tail and (GIT_NOISE.startswith(tail) or tail.startswith(GIT_NOISE)):
            self.pending = tail  # maybe the line, not finished yet
        else:
            out.append(tail)
        return b"".join(out)

    def close(self) -> bytes:
        tail, self.pending = self.pending, b""
        return b"" if tail.startswith(GIT_NOISE) else tail


@contextlib.contextmanager
def without_git_noise() -> Iterator[None]:
    """Run the body with fd 2 filtered (see the module doc); restored, and everything forwarded,
    before it returns or raises."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep clean
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    filt = _Filter()

    def pump() -> None:
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                break
            if not chunk:
                break
            _write_all(saved, filt.feed(chunk))
        _write_all(saved, filt.close())

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump reads to its end and stops
        thread.join(timeout=10)
        os.close(read_end)
        os.close(saved)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except OSError:
            return
        data = data[written:]
