"""One owner per checkpoint folder for the life of a run: an OS lock on a file inside it.

``<folder>/.trnqwen-lock`` is locked with ``fcntl.flock`` (exclusive, non-blocking) by the
launcher before it writes anything for the run, and held until the run's record is final.
The kernel releases the lock when the holder dies, however it dies (SIGKILL, OOM, a lost node),
so a lock is never left held by a dead run; the file it leaves names that run (run id, pid,
host), which the next owner reports when it takes over.  A clean end removes the file.

A second run, or a second ``--resume`` of the same run, finds the lock held and is refused
with one line naming the holder (:class:`UsageError`, exit 2).  A run takes it through
:mod:`trnqwen.train.ownership`.  Pure Python; no torch.

A filesystem without ``flock`` (some Lustre/FSx mounts: ``ENOLCK``, ``EOPNOTSUPP``) is refused
with one line saying so.  ``TRNQWEN_LOCK_DIR`` moves the lock file to a local folder: there it
is ``<LOCK_DIR>/<hash of the folder's resolved path>-<folder name>.lock``, so every run on the
same machine naming the same folder (by any path) contends for the same lock.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.contract.checkpoint_layout import LOCK_NAME
from trnqwen.errors import UsageError

_RETRIES = 20  # the file swapped under us (a holder removing it at its clean end): try again
LOCK_DIR_ENV = "TRNQWEN_LOCK_DIR"
# flock itself is not there on this filesystem (as opposed to: someone else holds the lock)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}


def lock_path(folder: Path) -> Path:
    """Where ``folder``'s lock file lives: inside it, or under ``$TRNQWEN_LOCK_DIR`` when set."""
    folder = Path(folder)
    where = os.environ.get(LOCK_DIR_ENV, "").strip()
    if not where:
        return folder / LOCK_NAME
    resolved = str(folder.expanduser().resolve())
    key = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return Path(where).expanduser() / f"{key}-{folder.name or 'root'}.lock"


def _no_flock(folder: Path, path: Path, exc: OSError, what: str) -> UsageError:
    """One line for a filesystem that cannot lock at all."""
    name = exc.strerror or os.strerror(exc.errno or 0)
    if os.environ.get(LOCK_DIR_ENV, "").strip():
        return UsageError(
            f"{what} {folder}: the lock folder {path.parent} ({LOCK_DIR_ENV}) does not support file locks "
            f"(flock on {path} failed: {name})",
            hint=f"point {LOCK_DIR_ENV} at a folder on a local disk, e.g. /tmp/trnqwen-locks")
    return UsageError(
        f"{what} {folder} is on a filesystem without file locks (flock on {path} failed: {name}; "
        "some Lustre/FSx mounts lack the flock option)",
        hint=f"set {LOCK_DIR_ENV} to a folder on a local disk (e.g. {LOCK_DIR_ENV}=/tmp/trnqwen-locks) to keep "
             "the lock there, or mount the filesystem with flock; see docs/resume.md, \"One owner at a time\"")


@dataclass
class FolderLock:
    """A held lock: release it (or let the process end) to hand the folder on."""

    folder: Path
    fd: int
    holder: dict[str, Any]
    lock_file: Optional[Path] = None  # where the lock lives (default: inside ``folder``)
    took_over: Optional[dict[str, Any]] = None  # what a killed run's lock file said
    released: bool = field(default=False)

    @property
    def path(self) -> Path:
        return self.lock_file or self.folder / LOCK_NAME

    def takeover_note(self) -> Optional[str]:
        if not self.took_over:
            return None
        return f"took over {self.folder}: its lock was left by {describe(self.took_over)}, which is no longer running"

    def release(self) -> None:
        """Remove the lock file (still holding the lock, so nobody else holds this inode) and unlock."""
        if self.released:
            return
        self.released = True
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def describe(info: dict[str, Any]) -> str:
    """``run 20261201-101500-native-sft (pid 4242 on node-a)``."""
    run = info.get("run_id") or "an unnamed run"
    where = f"pid {info.get('pid', '?')}" + (f" on {info['host']}" if info.get("host") else "")
    return f"run {run} ({where})"


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd_or_path: int | Path) -> dict[str, Any]:
    try:
        if isinstance(fd_or_path, int):
            os.lseek(fd_or_path, 0, os.SEEK_SET)
            raw = b""
            while True:
                chunk = os.read(fd_or_path, 65536)
                if not chunk:
                    break
                raw += chunk
        else:
            raw = Path(fd_or_path).read_bytes()
        data = json.loads(raw.decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def refusal(folder: Path, holder: dict[str, Any], what: str = "checkpoint folder") -> UsageError:
    """The one-line refusal naming who holds ``folder``."""
    who = describe(holder) if holder else "another trnqwen process"
    run = holder.get("run_id")
    hint = "wait for it to end, or stop it (kill -TERM saves a resumable checkpoint)"
    if run:
        hint += f"; a new run needs its own --checkpoint-dir, a stopped one continues with `trnqwen train --resume {run}`"
    return UsageError(f"{what} {folder} is in use by {who}", hint=hint)


def holder_of(folder: Path) -> Optional[dict[str, Any]]:
    """Who holds ``folder``'s lock right now (None when nobody does).  Takes nothing."""
    import fcntl

    path = lock_path(Path(folder))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read(fd) or {}
            return None
        return None
    finally:
        os.close(fd)


def acquire(folder: Path, *, run_id: str, what: str = "checkpoint folder") -> FolderLock:
    """Take ``folder`` for run ``run_id`` or raise :class:`UsageError` naming the holder.

    Creates the folder (and nothing else in it but the lock file).  A lock file left by a
    killed run (unlocked, still naming it) is taken over: :attr:`FolderLock.took_over`.
    """
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = lock_path(folder)
    if path.parent != folder:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{LOCK_DIR_ENV}={path.parent}: cannot create the lock folder ({exc.strerror})",
                             hint=f"point {LOCK_DIR_ENV} at a writable folder on a local disk") from None
    for _ in range(_RETRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _NO_FLOCK:
                if os.fstat(fd).st_size == 0 and _same_file(fd, path):  # the empty file just made: leave nothing
                    path.unlink(missing_ok=True)
                os.close(fd)
                raise _no_flock(folder, path, exc, what) from None
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = _read(fd)
            if not holder:  # the holder has the lock but has not written its name yet
                time.sleep(0.2)
                holder = _read(fd)
            os.close(fd)
            raise refusal(folder, holder, what) from None
        if not _same_file(fd, path):  # removed (or replaced) by its previous holder meanwhile
            os.close(fd)
            continue
        previous = _read(fd)
        me = {"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
              "folder": str(folder)}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(me) + "\n").encode())
        os.fsync(fd)
        return FolderLock(folder=folder, fd=fd, holder=me, lock_file=path, took_over=previous or None)
    raise UsageError(f"{what} {folder}: could not take its lock {path} (it kept changing)", hint="try again")


__all__ = ["FolderLock", "LOCK_DIR_ENV", "acquire", "holder_of", "describe", "lock_path", "refusal"]
