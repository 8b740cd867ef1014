"""Files that are never half-written and follow the user's umask: one implementation for all.

Run records, manifests, CSVs, config modules and plots are written to a temp file in the same
folder and renamed over the target, so a reader (or a crash) never sees a partial file.
``mkstemp`` creates files 0600, so the final mode is set from the umask explicitly.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional


def expand_user(path: "str | Path") -> Path:
    """``Path.expanduser``, with ``~nosuchuser/...`` a one-line usage error instead of a RuntimeError."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        from trnqwen.errors import UsageError

        raise UsageError(
            f"cannot expand a path starting with ~: {path} (no such user here)",
            hint="use an absolute path, or ~/ for your own home",
        ) from None


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[str], Any], *, mode: int = 0o666) -> Path:
    """Make ``path`` by ``write(temp path)`` (a temp file beside it, with its suffix) and a rename;
    ``mode`` is masked by the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str, *, mode: int = 0o666) -> None:
    """Write ``text`` to ``path`` via a temp file + rename; ``mode`` is masked by the umask."""
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8", newline=""), mode=mode)


def usual_modes(folder: Path) -> None:
    """A folder made with ``tempfile.mkdtemp`` (0700, files in it possibly 0600) given the modes a
    plain ``mkdir`` and ``open`` would have given it (0777 / 0666 less the umask), so another user
    or a serving container reads it like every other export."""
    mask = current_umask()
    os.chmod(folder, 0o777 & ~mask)
    for path in Path(folder).rglob("*"):
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Pretty JSON (non-JSON values as ``str``), written atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")


def nearest_existing(path: Path) -> Path:
    """``path`` itself, or its nearest parent that exists (what a new file there would land on)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> tuple[Path, Optional[int]]:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent), and that
    parent; the size is None when it cannot be read."""
    p = nearest_existing(path)
    try:
        return p, shutil.disk_usage(p).free
    except OSError:
        return p, None


def writable(path: Path) -> bool:
    """Whether ``path`` (or, not there yet, its nearest existing parent) can be written."""
    return os.access(nearest_existing(path), os.W_OK)


def broken_link(path: Path) -> Optional[str]:
    """What a symbolic link that leads nowhere is ("a symbolic link to itself", "a symlink loop",
    "a broken symbolic link to X"), or None when ``path`` is not such a link."""
    p = Path(path)
    if not p.is_symlink() or p.exists():
        return None
    target = os.readlink(p)
    if (p.parent / target).absolute() == p.absolute():
        return "a symbolic link to itself"
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
    return f"a broken symbolic link (to {target}, which does not exist)"


def disk_full_at(root: Optional[Path]) -> Optional[str]:
    """``"12 KiB free on <dir>"`` when the disk holding ``root`` (or its nearest existing parent)
    is (nearly) full, else None."""
    import shutil

    where = root
    while where is not None and not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free if where is not None else None
    except OSError:
        return None
    return f"{free // 1024} KiB free on {where}" if free is not None and free < 4 * 1024 * 1024 else None


def first_match(log_path: Path, pattern: Any, marker: bytes, offset: int = 0) -> Any:
    """The first ``pattern`` match on a line of ``log_path`` after byte ``offset`` that contains
    ``marker`` (a cheap byte test before decoding); None when there is none or the file is unreadable."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            for raw in fh:
                if marker in raw:
                    m = pattern.search(raw.decode("utf-8", "replace"))
                    if m:
                        return m
    except OSError:
        return None
    return None
