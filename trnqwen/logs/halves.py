"""A long text written in two halves made at once: the second by a forked child, which writes
it straight to the same file descriptor when the first half is out.

Why: ``inspect-logs --json`` on a 200k-step log spends a quarter of a second turning the step
columns into text after the parse, on one core, while the other core is idle.  Made in two
processes, that phase takes about half as long.  Nothing is sent back through a pipe (17 MB of
text would cost what the second core saves): the child waits for a go byte, then writes its half
itself, so the output is the same bytes in the same order.

What can go wrong, and what then happens:
* the child fails before writing anything (an exception, Ctrl-C): exit code :data:`REDO`, and
  this process makes and writes the second half itself (counted in :data:`STATS`); stopped
  while writing, it is never redone (some of it is out): an error here;
* writing fails in the child (a closed pipe, a full disk): exit code ``64 + errno``, raised here
  as that ``OSError`` (``BrokenPipeError`` for EPIPE), as a write here would have;
* this process fails first (Ctrl-C): the child sees no go byte and is killed, nothing more is
  written.
"""

from __future__ import annotations

import os
import signal
from typing import Callable, Iterable

REDO = 10  # the child wrote nothing: make the second half here
_STOPPED = 11  # the child was stopped while writing (Ctrl-C sent to it alone)
_WRITE_ERROR = 64  # + errno: the child's write failed
STATS = {"split": 0, "child_wrote": 0, "redone_here": 0}  # what the last writes did (tests read it)


def usable(out) -> bool:
    """Whether ``out`` is backed by a real file descriptor a child can write to."""
    if not hasattr(os, "fork"):
        return False
    try:
        out.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def write(out, first: Callable[[], Iterable[str]], second: Callable[[], Iterable[str]]) -> None:
    """Write the texts of ``first()`` then those of ``second()`` to ``out``; ``second()`` runs in a
    forked child at the same time as ``first()`` here (``out`` must be :func:`usable`)."""
    out.flush()
    fd = out.fileno()
    encoding = getattr(out, "encoding", None) or "utf-8"
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: make the half, wait for the go byte, write it
        code = REDO
        try:
            os.close(go_write)
            data = "".join(second()).encode(encoding)
            if os.read(go_read, 1) == b"g":
                code = _STOPPED  # from here some of it may be out: never redone
                view = memoryview(data)
                while view:
                    try:
                        view = view[os.write(fd, view):]
                    except OSError as exc:
                        code = _WRITE_ERROR + (exc.errno or 0)
                        raise
                code = 0
        except BaseException:  # noqa: BLE001 - the exit code says what happened
            pass
        finally:
            os._exit(code)
    os.close(go_read)
    STATS["split"] += 1
    status = None
    try:
        for text in first():
            out.write(text)
        out.flush()
        try:
            os.write(go_write, b"g")
        except BrokenPipeError:  # the child is gone already: its exit code says why
            pass
        os.close(go_write)
        go_write = -1
        _, status = os.waitpid(pid, 0)
    finally:
        if go_write >= 0:
            os.close(go_write)
        if status is None:  # failed here before the child wrote: stop it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - already gone
                pass
            os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        STATS["child_wrote"] += 1
    elif code == REDO:
        STATS["redone_here"] += 1
        for text in second():
            out.write(text)
    elif code > _WRITE_ERROR:
        raise OSError(code - _WRITE_ERROR, os.strerror(code - _WRITE_ERROR))
    else:  # stopped while writing, or killed: the output is cut short
        raise RuntimeError(f"the process writing the second half of the output ended with {code}: the output is incomplete")
