"""``trnqwen fetch``: plan, check the disk, download with huggingface_hub, verify, record.

:func:`fetch` does what ``hf download REPO --local-dir DIR`` does, through huggingface_hub's own
``snapshot_download`` (parallel downloads, resume of ``.incomplete`` files, progress bars), and
adds what that command leaves to the user:

1. plan (:mod:`trnqwen.fetch.plan`): the commit and the vetted file list;
2. preflight: free disk space against what is still missing, before a byte is written;
3. download: ``snapshot_download`` limited to exactly the vetted names, at the resolved commit,
   each file hashed while it arrives (:class:`TailHasher`);
4. verify and record (:mod:`trnqwen.fetch.verify`): sizes, hashes, headers, index, config, and
   the manifest that lets a rerun verify quickly and download nothing.

``builtin:tiny-qwen3`` is written locally by :mod:`trnqwen.fetch.builtin` and verified the same
way.  huggingface_hub is imported inside functions only; the token is never printed (messages
pass through :func:`trnqwen.errors.redact`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from trnqwen.assets import MANIFEST, read_manifest
from trnqwen.errors import TrnqwenError, UsageError
from trnqwen.fetch.builtin import fetch_builtin
from trnqwen.fetch.errors import HubUnreachable, hub_error, offline_mode
from trnqwen.fetch.plan import (
    DEFAULT_KEEP_FREE,
    DEFAULT_MAX_WORKERS,
    FetchResult,
    RemoteFile,
    check_disk,
    check_repo_path,
    exact_pattern,
    is_builtin,
    remote_files,
    select_files,
)
from trnqwen.fetch.verify import (
    HASH_CHUNK,
    VerifyReport,
    verify_offline,
    verify_snapshot,
    write_manifest,
)

DOWNLOAD_ATTEMPTS = 3  # passes of snapshot_download when the connection is lost mid-way
RETRY_BACKOFF_S = 1.0


def _stale_partials(local_dir: Path) -> list[Path]:
    """Partial files a killed download left behind.  huggingface_hub downloads each file to a
    process-unique ``*.incomplete`` name and deletes it on failure, so such a file is never
    resumed by a later run: it only takes space."""
    folder = local_dir / ".cache" / "huggingface" / "download"
    return sorted(folder.rglob("*.incomplete")) if folder.is_dir() else []


@contextmanager
def _exclusive(local_dir: Path):
    """One fetch at a time per folder (a second one would race on the same files)."""
    import fcntl

    lock_path = local_dir / MANIFEST.parent / "lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"another trnqwen fetch is writing to {local_dir}", hint="wait for it to finish, then run this again"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)




def fetch(
    repo_id: str,
    local_dir: Path,
    *,
    revision: Optional[str] = None,
    include: Optional[list[str]] = None,
    exclude: Optional[list[str]] = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    dry_run: bool = False,
    keep_free: int = DEFAULT_KEEP_FREE,
    progress: bool = True,
    on_plan: Optional[Callable[[FetchResult], None]] = None,
) -> FetchResult:
    """Fetch ``repo_id`` into ``local_dir`` and verify it.  Returns the result; raises a
    TrnqwenError for anything the user must act on.  A result with ``verified=False`` and
    ``problems`` means the snapshot is not usable (the CLI exits 1)."""
    started = time.monotonic()
    local_dir = Path(local_dir).expanduser().absolute()
    if is_builtin(repo_id):
        if revision or include or exclude:
            raise UsageError("built-in models have no revisions and no file filters", hint="run: " + shlex.join(["trnqwen", "fetch", repo_id]))
        result = fetch_builtin(repo_id, local_dir, dry_run=dry_run, keep_free=keep_free)
        result.seconds = round(time.monotonic() - started, 3)
        return result
    if max_workers < 1:
        raise UsageError("--max-workers must be at least 1")
    if local_dir.exists() and not local_dir.is_dir():
        raise UsageError(f"{local_dir} exists and is not a folder", hint="pass --local-dir pointing at a folder")
    manifest = read_manifest(local_dir)
    if offline_mode():
        return verify_offline(repo_id, local_dir, revision, manifest, started, dry_run)

    try:
        commit, listing = remote_files(repo_id, revision)
    except HubUnreachable as exc:
        # Like `hf download`: with no Hub, a complete local snapshot is still good to use.
        if not (manifest and manifest.get("repo_id") == repo_id and manifest.get("verified")):
            raise
        return verify_offline(repo_id, local_dir, revision, manifest, started, dry_run, reason=exc.message)
    files = select_files(listing, include, exclude)
    if not files:
        raise UsageError(
            f"no files of {repo_id} match the include/exclude patterns",
            hint="check --include/--exclude; the repo has: " + ", ".join(f.path for f in listing[:8]),
        )
    known = manifest.get("files", {}) if manifest and manifest.get("commit") == commit else {}
    chosen = {f.path for f in files}
    not_selected = sorted(f.path for f in listing if f.path not in chosen)
    result = FetchResult(
        repo_id=repo_id,
        local_dir=str(local_dir),
        revision=revision or "main",
        commit=commit,
        files=[f.path for f in files],
        bytes=sum(f.size for f in files),
        dry_run=dry_run,
        sizes={f.path: f.size for f in files},
    )
    # What is already there and good (hash checked once, then trusted while size+mtime hold).
    present = verify_snapshot(local_dir, files, known=known, not_selected=not_selected) if local_dir.is_dir() else VerifyReport()
    todo = [f for f in files if f.path not in present.checked]
    result.to_download = [f.path for f in todo]
    need = sum(f.size for f in todo)
    if on_plan is not None:
        on_plan(result)
    if dry_run:
        result.verified = not todo and present.ok
        result.warnings = present.warnings
        result.seconds = round(time.monotonic() - started, 3)
        return result

    if todo:
        check_disk(repo_id, local_dir, need, keep_free)

    if todo:
        local_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(local_dir):
            for stale in _stale_partials(local_dir):
                stale.unlink(missing_ok=True)
            for name in present.bad_files:  # wrong size/hash: fetch it again from scratch
                result.repaired.append(name)
                (local_dir / name).unlink(missing_ok=True)
                _forget_hf_metadata(local_dir, name)
            with TailHasher(local_dir, todo) as hashed:  # hash while the bytes arrive
                _download(repo_id, commit, local_dir, [f.path for f in todo], max_workers, progress)
        result.downloaded_bytes = need
        known = {**known, **hashed.entries()}

    report = verify_snapshot(local_dir, files, known={**known, **present.checked}, not_selected=not_selected)
    if report.ok and manifest and manifest.get("commit") not in (None, commit):
        _remove_previous(local_dir, manifest, chosen, report)
    elif report.ok:
        _remove_previous(local_dir, None, chosen, report)  # only the warning about foreign shards
    result.problems = report.problems
    result.warnings = report.warnings
    result.verified = report.ok
    write_manifest(
        local_dir,
        {
            "repo_id": repo_id,
            "revision": revision,
            "commit": commit,
            "verified": report.ok,
            "verified_at": time.time(),
            "files": report.checked,
            "expected": [asdict(f) for f in files],
            "not_selected": not_selected,
        },
    )
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _interruptible(fn, *args, **kwargs):
    """Run ``fn`` in a daemon thread and wait in short joins, so Ctrl-C reaches this (main) thread
    at once.  Called directly, snapshot_download's thread pool would first wait, on the way out,
    for every worker still blocked reading a stalled connection."""
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="trnqwen-download", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _download(repo_id: str, commit: str, local_dir: Path, names: list[str], max_workers: int, progress: bool) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars, are_progress_bars_disabled

    import httpx

    from trnqwen import output

    was_disabled = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                _interruptible(
                    snapshot_download,
                    repo_id,
                    revision=commit,
                    local_dir=str(local_dir),
                    allow_patterns=[exact_pattern(n) for n in names],
                    max_workers=max_workers,
                )
                return
            except httpx.TransportError as exc:
                # A reset connection is not retried by huggingface_hub itself; its .incomplete
                # files stay, so another pass resumes them with HTTP Range.
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise
                output.warn(f"connection lost ({type(exc).__name__}); resuming (attempt {attempt + 1}/{DOWNLOAD_ATTEMPTS})")
                time.sleep(RETRY_BACKOFF_S * attempt)
    except TrnqwenError:
        raise
    except Exception as exc:
        raise hub_error(exc, repo_id, commit) from None
    finally:
        if not progress and not was_disabled:
            enable_progress_bars()


def _remove_previous(local_dir: Path, manifest: Optional[dict[str, Any]], chosen: set[str], report: VerifyReport) -> None:
    """Files an earlier fetch put here that the new snapshot does not have (another revision's
    shards) are removed: torchtitan loads every ``*.safetensors`` in the folder.  Files trnqwen
    did not write are never touched, only warned about."""
    previous = {f.get("path") for f in (manifest or {}).get("expected", [])} - chosen - {None}
    removed = []
    for name in sorted(previous):
        path = local_dir / check_repo_path(name)
        if path.is_file():
            path.unlink()
            _forget_hf_metadata(local_dir, name)
            removed.append(name)
    if removed:
        report.warnings.append(f"removed {len(removed)} file(s) of the previously fetched revision: {', '.join(removed[:4])}")
    foreign = sorted(
        p.relative_to(local_dir).as_posix()
        for p in local_dir.rglob("*.safetensors")
        if ".cache" not in p.relative_to(local_dir).parts and p.relative_to(local_dir).as_posix() not in chosen
    )
    if foreign:
        report.warnings.append(
            f"{len(foreign)} safetensors file(s) here are not part of the snapshot ({', '.join(foreign[:3])}); "
            "training reads every *.safetensors in the folder"
        )


class TailHasher:
    """Hashes each file while huggingface_hub downloads it, so verification adds no wall time.

    huggingface_hub appends each download to ``.cache/huggingface/download/<h>.<etag>.<id>.incomplete``
    and renames it into place when complete.  A thread follows those files (the etag in the name
    says which file it is), hashes the bytes as they are appended, and keeps the digest of every
    file it read whole.  After the download, a digest counts only if the file now in place is the
    very inode that was read (same device, inode and mtime), with the expected size; its manifest entry then lets
    :func:`verify_snapshot` skip re-reading it.  Anything unusual (a truncation, a copy instead of a
    rename, a digest that does not match) falls back to hashing the file in place, so this can only
    save work, never pass a bad file.
    """

    POLL_S = 0.05

    def __init__(self, local_dir: Path, files: list[RemoteFile]):
        self.local_dir = local_dir
        self.by_etag = {(f.sha256 or f.blob_id): f for f in files if f.sha256 or f.blob_id}
        self.folder = local_dir / ".cache" / "huggingface" / "download"
        self.tracks: dict[str, dict[str, Any]] = {}  # incomplete path -> state
        self.done: dict[str, tuple[tuple[int, int, int], int, str]] = {}  # path -> ((dev, ino, mtime), size, digest)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trnqwen-tail-hash", daemon=True)

    def __enter__(self) -> "TailHasher":
        if self.by_etag:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for t in self.tracks.values():
            os.close(t["fd"])

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self._scan()
                self._advance()
            except OSError:
                pass  # a file vanished mid-step: it will be hashed in place instead
            if stopping:
                return
            self._stop.wait(self.POLL_S)

    def _scan(self) -> None:
        if not self.folder.is_dir():
            return
        for path in self.folder.rglob("*.incomplete"):
            key = str(path)
            parts = path.name.split(".")
            rf = self.by_etag.get(parts[-3]) if len(parts) >= 4 else None
            if key in self.tracks or rf is None or rf.path in self.done:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            h = hashlib.sha256() if rf.sha256 else hashlib.sha1(b"blob %d\0" % rf.size)
            self.tracks[key] = {"fd": fd, "file": rf, "hash": h, "pos": 0, "dead": False}

    def _advance(self) -> None:
        for t in self.tracks.values():
            rf: RemoteFile = t["file"]
            if t["dead"] or rf.path in self.done:
                continue
            size = os.fstat(t["fd"]).st_size
            if size < t["pos"] or size > rf.size:  # rewritten from the start, or not what we expect
                t["dead"] = True
                continue
            while t["pos"] < size:
                chunk = os.pread(t["fd"], min(HASH_CHUNK, size - t["pos"]), t["pos"])
                if not chunk:
                    break
                t["hash"].update(chunk)
                t["pos"] += len(chunk)
            if t["pos"] == rf.size:
                st = os.fstat(t["fd"])
                self.done[rf.path] = ((st.st_dev, st.st_ino, st.st_mtime_ns), rf.size, t["hash"].hexdigest())

    def entries(self) -> dict[str, dict[str, Any]]:
        """Manifest entries for the files that were hashed whole and are now in place unchanged."""
        out = {}
        for name, (identity, size, digest) in self.done.items():
            try:
                st = (self.local_dir / name).stat()
            except OSError:
                continue
            if (st.st_dev, st.st_ino, st.st_mtime_ns) == identity and st.st_size == size:
                rf = next(f for f in self.by_etag.values() if f.path == name)
                kind = "sha256" if rf.sha256 else "git"
                out[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, kind: digest}
        return out


def _forget_hf_metadata(local_dir: Path, name: str) -> None:
    """Drop huggingface_hub's record of a file, or it would trust the bad copy at this commit."""
    meta = local_dir / ".cache" / "huggingface" / "download" / f"{name}.metadata"
    meta.unlink(missing_ok=True)


