"""Hub snapshots that arrive whole: plan, preflight, download (huggingface_hub), verify.

``fetch()`` does what ``hf download REPO --local-dir DIR`` does, through huggingface_hub's own
``snapshot_download`` (parallel downloads, resume of ``.incomplete`` files, progress bars), and
adds what that command leaves to the user:

1. plan: the commit and the file list (sizes, sha256/git blob ids) from the Hub's tree API,
   filtered by an allow-list (config, generation config, tokenizer files, safetensors; never
   ``.bin`` or ``original/``); every remote name checked for path traversal before any write;
2. preflight: free disk space against what is still missing, before a byte is written;
3. download: ``snapshot_download`` limited to exactly the vetted names, at the resolved commit;
4. verify: every file present with its expected size and hash, every safetensors header
   readable with its tensors inside the file, every index entry present in its shard,
   ``config.json`` a Qwen3-family model (warning otherwise);
5. record: ``<local_dir>/.cache/trnqwen/fetch.json`` (the manifest) says what was verified, so
   a rerun of a complete snapshot verifies quickly and downloads nothing, and offline runs
   (``HF_HUB_OFFLINE=1``) can check the folder against it.

``builtin:tiny-qwen3`` is written locally by :mod:`trnqwen.tiny_model` and verified the same way.

huggingface_hub is imported inside functions only; the token is never printed (messages pass
through :func:`trnqwen.errors.redact`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Optional

from trnqwen.constants import BUILTIN_PREFIX, TINY_MODEL
from trnqwen.errors import CheckFailed, EnvironmentProblem, TrnqwenError, UsageError, redact

# Default allow-list: what training needs and nothing else.
DEFAULT_INCLUDE: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
DEFAULT_EXCLUDE: tuple[str, ...] = (
    "original/*",
    "*/original/*",
    "*.bin",
    "*.pth",
    "*.pt",
    "*.gguf",
    "*.msgpack",
    "*.h5",
    "*.onnx",
)
DEFAULT_MAX_WORKERS = 8
DOWNLOAD_ATTEMPTS = 3  # passes of snapshot_download when the connection is lost mid-way
RETRY_BACKOFF_S = 1.0
DEFAULT_KEEP_FREE = 256 * 1024**2  # bytes left free after the download
MANIFEST = Path(".cache") / "trnqwen" / "fetch.json"
QWEN3_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_omni_moe")
_HASH_CHUNK = 8 * 1024 * 1024
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F4": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


class HubUnreachable(EnvironmentProblem):
    """The Hub could not be reached (connection refused, DNS, timeout, dropped connection)."""


# --- data --------------------------------------------------------------------------------------


@dataclass
class RemoteFile:
    """One file of the snapshot as the Hub describes it."""

    path: str
    size: int
    sha256: Optional[str] = None  # LFS files: sha256 of the content
    blob_id: Optional[str] = None  # git blob sha1 (checks small, non-LFS files)


@dataclass
class FetchResult:
    """What ``trnqwen fetch --json`` prints."""

    repo_id: str
    local_dir: str
    revision: Optional[str]
    commit: Optional[str]
    files: list[str]
    bytes: int
    downloaded_bytes: int = 0
    verified: bool = False
    dry_run: bool = False
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    to_download: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VerifyReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)  # to delete and fetch again
    checked: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> manifest entry

    @property
    def ok(self) -> bool:
        return not self.problems


# --- small pure helpers --------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"200M"``, ``"1.5GiB"``, ``"0"``, ``12345`` -> bytes (powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"not a size: {text!r}", hint="use bytes or a suffix, e.g. 500M, 2G, 0")
    unit = "kmgtp".find(m.group(2).lower()) + 1 if m.group(2) else 0
    return int(float(m.group(1)) * 1024**unit)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def check_repo_path(name: str) -> str:
    """A file name from the Hub, refused unless it is a plain relative path inside the snapshot."""
    bad = (
        not name
        or "\\" in name
        or "\0" in name
        or name.startswith("/")
        or re.match(r"^[A-Za-z]:", name) is not None
        or any(part in ("", ".", "..") for part in name.split("/"))
        or any(ord(c) < 32 for c in name)
    )
    if bad or PurePosixPath(name).is_absolute():
        raise CheckFailed(
            f"refusing a file name from the Hub that would escape the download folder: {name!r}",
            hint="the repo (or the server behind HF_ENDPOINT) is not trustworthy; nothing was written",
        )
    return name


def select_files(files: Iterable[RemoteFile], include: Optional[list[str]], exclude: Optional[list[str]]) -> list[RemoteFile]:
    """Apply the allow/deny lists. ``include`` replaces the default allow-list and its default
    deny-list; ``exclude`` alone adds to the default deny-list."""
    from huggingface_hub.utils import filter_repo_objects

    allow, deny = allow_deny(include, exclude)
    return sorted(filter_repo_objects(list(files), allow_patterns=allow, ignore_patterns=deny, key=lambda f: f.path), key=lambda f: f.path)


def allow_deny(include: Optional[list[str]], exclude: Optional[list[str]]) -> tuple[list[str], list[str]]:
    if include:
        return list(include), list(exclude or [])
    return list(DEFAULT_INCLUDE), list(DEFAULT_EXCLUDE) + list(exclude or [])


def _exact_pattern(name: str) -> str:
    """An fnmatch pattern matching exactly ``name``."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


def is_builtin(repo_id: str) -> bool:
    return repo_id.startswith(BUILTIN_PREFIX)


# --- verification ----------------------------------------------------------------------------------


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, checked against the file: every tensor's byte range
    inside the data section and matching its dtype and shape.  Raises ValueError if not."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n == 0 or n > _SAFETENSORS_MAX_HEADER or 8 + n > size:
            raise ValueError(f"header length {n} does not fit a {size}-byte file")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            count = 1
            for d in info["shape"]:
                count *= int(d)
            width = _DTYPE_BYTES.get(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: malformed entry") from None
        if not (0 <= start <= end <= data_len):
            raise ValueError(f"tensor {name!r}: bytes {start}..{end} outside the {data_len}-byte data section")
        if width is not None and info["dtype"] != "F4" and end - start != count * width:
            raise ValueError(f"tensor {name!r}: {end - start} bytes for {info['dtype']}{info['shape']}")
    return header


def file_digest(path: Path, kind: str) -> str:
    """``sha256`` of the content, or ``git`` blob sha1 (``sha1("blob <size>\\0" + content)``)."""
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _digests(jobs: list[tuple[Path, str]]) -> dict[str, str]:
    """Hash several files at once (hashlib releases the GIL: one thread per core)."""
    if len(jobs) <= 1:
        return {str(p): file_digest(p, k) for p, k in jobs}
    from concurrent.futures import ThreadPoolExecutor

    jobs = sorted(jobs, key=lambda j: -j[0].stat().st_size)  # biggest first
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1, 8)) as pool:
        return dict(zip((str(p) for p, _ in jobs), pool.map(lambda j: file_digest(*j), jobs)))


def verify_snapshot(
    local_dir: Path,
    expected: Optional[list[RemoteFile]] = None,
    *,
    known: Optional[dict[str, dict[str, Any]]] = None,
    not_selected: Iterable[str] = (),
) -> VerifyReport:
    """Check a snapshot folder.  ``expected``: the files it must hold (size and hash); without it,
    every file present is checked for internal consistency only.  ``known``: manifest entries of
    files already hashed; a file whose size and mtime still match is not hashed again.
    ``not_selected``: repo files left out by include/exclude (an index naming them is a warning)."""
    local_dir = Path(local_dir)
    report = VerifyReport()
    known = known or {}
    if expected is None:
        expected = [
            RemoteFile(p.relative_to(local_dir).as_posix(), p.stat().st_size)
            for p in sorted(local_dir.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(local_dir).parts
        ]
    pending = []  # (rf, stat, kind, want, digest or None = to compute)
    for rf in expected:
        path = local_dir / rf.path
        if not path.is_file():
            report.problems.append(f"{rf.path}: missing")
            continue
        st = path.stat()
        if st.st_size != rf.size:
            report.problems.append(f"{rf.path}: {st.st_size} bytes, expected {rf.size}")
            report.bad_files.append(rf.path)
            continue
        kind, want = ("sha256", rf.sha256) if rf.sha256 else (("git", rf.blob_id) if rf.blob_id else (None, None))
        prev = known.get(rf.path) or {}
        trusted = kind and prev.get("size") == st.st_size and prev.get("mtime_ns") == st.st_mtime_ns and prev.get(kind) == want
        pending.append([rf, st, kind, want, want if trusted else None])
    digests = _digests([(local_dir / p[0].path, p[2]) for p in pending if p[2] and p[4] is None])
    for rf, st, kind, want, got in pending:
        entry: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if kind:
            got = got if got is not None else digests[str(local_dir / rf.path)]
            if got != want:
                report.problems.append(f"{rf.path}: content does not match the Hub's {kind} (corrupted)")
                report.bad_files.append(rf.path)
                continue
            entry[kind] = got
        report.checked[rf.path] = entry

    names = {rf.path for rf in expected}
    headers: dict[str, set[str]] = {}
    for rf in expected:
        if rf.path.endswith(".safetensors") and rf.path in report.checked:
            try:
                headers[rf.path] = {k for k in read_safetensors_header(local_dir / rf.path) if k != "__metadata__"}
            except (OSError, ValueError) as exc:
                report.problems.append(f"{rf.path}: unreadable safetensors header ({exc})")
                report.bad_files.append(rf.path)
                report.checked.pop(rf.path, None)
    for rf in expected:
        if not rf.path.endswith(".safetensors.index.json") or rf.path not in report.checked:
            continue
        _check_index(local_dir, rf.path, names, headers, report, set(not_selected))
    if "config.json" in report.checked:
        _check_config(local_dir / "config.json", report)
    elif "config.json" not in names:
        report.warnings.append("no config.json in the snapshot: training cannot build the model from it")
    if not any(n in names for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        report.warnings.append("no tokenizer files in the snapshot")
    return report


def _check_index(
    local_dir: Path, name: str, names: set[str], headers: dict[str, set[str]], report: VerifyReport, not_selected: set[str]
) -> None:
    try:
        weight_map = json.loads((local_dir / name).read_text())["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        report.problems.append(f"{name}: not a safetensors index (no weight_map)")
        return
    base = PurePosixPath(name).parent
    missing_files: set[str] = set()
    absent: list[str] = []
    for tensor, shard in weight_map.items():
        shard_path = (base / shard).as_posix() if str(base) != "." else shard
        if shard_path not in headers:
            if shard_path not in names:
                missing_files.add(shard_path)
            continue
        if tensor not in headers[shard_path]:
            absent.append(f"{tensor} (in {shard_path})")
    for shard in sorted(missing_files):
        if shard in not_selected:
            report.warnings.append(f"{name}: references {shard}, left out by --include/--exclude")
        else:
            report.problems.append(f"{name}: references {shard}, which is not in the snapshot")
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        report.problems.append(f"{name}: {len(absent)} tensors missing from their shards: {', '.join(absent[:3])}{more}")


def _check_config(path: Path, report: VerifyReport) -> None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        report.problems.append(f"config.json: not valid JSON ({exc})")
        return
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in QWEN3_MODEL_TYPES:
        report.warnings.append(
            f"config.json: model_type is {model_type!r}, not a Qwen3 family model; trnqwen's recipes are built for Qwen3"
        )


# --- the manifest --------------------------------------------------------------------------------


def read_manifest(local_dir: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads((Path(local_dir) / MANIFEST).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _write_manifest(local_dir: Path, payload: dict[str, Any]) -> None:
    from trnqwen.rundir import write_json_atomic

    write_json_atomic(Path(local_dir) / MANIFEST, payload)


def snapshot_status(local_dir: Path) -> dict[str, Any]:
    """For other commands (check-env, train): is ``local_dir`` a snapshot that ``fetch`` verified,
    and is it still as verified (sizes)?  Quick: no hashing."""
    local_dir = Path(local_dir)
    manifest = read_manifest(local_dir)
    status: dict[str, Any] = {"local_dir": str(local_dir), "fetched": manifest is not None, "complete": False}
    if manifest is None:
        status["complete"] = (local_dir / "config.json").is_file()
        status["note"] = "not fetched by trnqwen (no manifest); checked for config.json only"
        return status
    files = manifest.get("files", {})
    missing = [p for p, e in files.items() if not (local_dir / p).is_file() or (local_dir / p).stat().st_size != e.get("size")]
    status.update(
        repo_id=manifest.get("repo_id"),
        commit=manifest.get("commit"),
        verified=bool(manifest.get("verified")),
        missing=missing,
        complete=bool(manifest.get("verified")) and not missing,
    )
    return status


# --- the Hub side ------------------------------------------------------------------------------------


def hub_error(exc: BaseException, repo_id: str, revision: Optional[str]) -> TrnqwenError:
    """One clear line + what to do, for each way talking to the Hub fails."""
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    page = f"{endpoint}/{repo_id}"
    if isinstance(exc, OfflineModeIsEnabled) or (isinstance(exc, LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE):
        return _offline_error(repo_id)
    if isinstance(exc, HFValidationError):
        return UsageError(f"not a valid Hub repo id or revision: {redact(str(exc)).splitlines()[0]}",
                          hint="repo ids look like Qwen/Qwen3-4B-Instruct-2507")
    if isinstance(exc, GatedRepoError):
        return EnvironmentProblem(
            f"{repo_id} is a gated repo and this account has not been granted access",
            hint=f"accept its terms at {page}, then log in (`hf auth login`) or set HF_TOKEN to a token of that account",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return UsageError(
            f"repo {repo_id} not found on {endpoint} (or it is private and no valid token was sent)",
            hint="check the repo id, e.g. Qwen/Qwen3-4B-Instruct-2507; for a private repo log in "
            "(`hf auth login`) or set HF_TOKEN",
        )
    if isinstance(exc, RevisionNotFoundError):
        return UsageError(
            f"revision {revision!r} not found in {repo_id}",
            hint=f"use a branch, tag or commit that exists (see {page}/tree/main), or drop --revision",
        )
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        code = exc.response.status_code
        if code == 401:
            return EnvironmentProblem(
                "the Hub rejected the access token (401 Unauthorized)",
                hint="the token in HF_TOKEN or from `hf auth login` is invalid or expired: make a new one at "
                "https://huggingface.co/settings/tokens, or unset HF_TOKEN for public repos",
            )
        if code == 403:
            return EnvironmentProblem(
                f"the Hub refused access to {repo_id} (403 Forbidden)",
                hint="the token lacks read access to this repo (fine-grained token?): grant it, or use another token",
            )
        if code == 429:
            return EnvironmentProblem("the Hub is rate-limiting this machine (429)", hint="wait a minute and run the same command again")
        if code >= 500:
            return EnvironmentProblem(
                f"the Hub answered {code} (server error)", hint="try again later; a rerun resumes where this one stopped"
            )
        return EnvironmentProblem(f"the Hub answered {code} for {repo_id}", hint="rerun with TRNQWEN_DEBUG=1 to see the request")
    if isinstance(exc, (httpx.TransportError, LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, LocalEntryNotFoundError)):
            what = f"cannot reach {endpoint}"
        else:
            what = f"the connection to {endpoint} failed during the download"
        return HubUnreachable(
            f"{what}: {redact(reason)[:200]}",
            hint="check the network or proxy (HTTPS_PROXY), or set HF_ENDPOINT to a mirror; "
            "the same command again resumes where this one stopped",
        )
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return EnvironmentProblem("the disk filled up during the download", hint="free space and run the same command again; it resumes")
    return EnvironmentProblem(
        f"download failed: {type(exc).__name__}: {redact(str(exc)).splitlines()[0] if str(exc) else ''}",
        hint="run the same command again (it resumes); TRNQWEN_DEBUG=1 shows the traceback",
    )


def _offline_error(repo_id: str, local_dir: Optional[Path] = None) -> EnvironmentProblem:
    where = f" and {local_dir} holds no complete snapshot of it" if local_dir else ""
    return EnvironmentProblem(
        f"HF_HUB_OFFLINE is set, so {repo_id} cannot be downloaded{where}",
        hint="unset HF_HUB_OFFLINE (or set it to 0) to download, or copy a complete snapshot there; "
        "builtin:tiny-qwen3 works offline",
    )


def offline_mode() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def remote_files(repo_id: str, revision: Optional[str]) -> tuple[str, list[RemoteFile]]:
    """The commit ``revision`` resolves to, and every file at that commit (tree API)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision)
        commit = info.sha
        if not commit:
            raise EnvironmentProblem(f"the Hub gave no commit for {repo_id}", hint="try again; check HF_ENDPOINT")
        files = []
        for entry in api.list_repo_tree(repo_id, recursive=True, revision=commit):
            if isinstance(entry, RepoFile):
                check_repo_path(entry.path)
                lfs = entry.lfs
                files.append(
                    RemoteFile(
                        path=entry.path,
                        size=int(lfs.size if lfs is not None else entry.size),
                        sha256=lfs.sha256 if lfs is not None else None,
                        blob_id=None if lfs is not None else entry.blob_id,
                    )
                )
    except TrnqwenError:
        raise
    except Exception as exc:  # huggingface_hub / httpx errors -> one line each
        raise hub_error(exc, repo_id, revision) from None
    return commit, files


def free_bytes(path: Path) -> int:
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


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


# --- fetch ------------------------------------------------------------------------------------------


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
            raise UsageError("built-in models have no revisions and no file filters", hint=f"run: trnqwen fetch {repo_id}")
        result = fetch_builtin(repo_id, local_dir, dry_run=dry_run)
        result.seconds = round(time.monotonic() - started, 3)
        return result
    if max_workers < 1:
        raise UsageError("--max-workers must be at least 1")
    if local_dir.exists() and not local_dir.is_dir():
        raise UsageError(f"{local_dir} exists and is not a folder", hint="pass --local-dir pointing at a folder")
    manifest = read_manifest(local_dir)
    if offline_mode():
        return _verify_offline(repo_id, local_dir, revision, manifest, started, dry_run)

    try:
        commit, listing = remote_files(repo_id, revision)
    except HubUnreachable as exc:
        # Like `hf download`: with no Hub, a complete local snapshot is still good to use.
        if not (manifest and manifest.get("repo_id") == repo_id and manifest.get("verified")):
            raise
        return _verify_offline(repo_id, local_dir, revision, manifest, started, dry_run, reason=exc.message)
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

    free = free_bytes(local_dir)
    if todo and free - need < keep_free:
        raise EnvironmentProblem(
            f"not enough disk space for {repo_id} in {local_dir}: {human_bytes(need)} to download, "
            f"{human_bytes(free)} free, {human_bytes(keep_free)} to keep free",
            hint="free some space, choose another --local-dir, or lower --keep-free; nothing was written",
        )

    if todo:
        local_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(local_dir):
            for stale in _stale_partials(local_dir):
                stale.unlink(missing_ok=True)
            for name in present.bad_files:  # wrong size/hash: fetch it again from scratch
                result.repaired.append(name)
                (local_dir / name).unlink(missing_ok=True)
                _forget_hf_metadata(local_dir, name)
            with _TailHasher(local_dir, todo) as hashed:  # hash while the bytes arrive
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
    _write_manifest(
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
                    allow_patterns=[_exact_pattern(n) for n in names],
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


class _TailHasher:
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

    def __enter__(self) -> "_TailHasher":
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
                chunk = os.pread(t["fd"], min(_HASH_CHUNK, size - t["pos"]), t["pos"])
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


def _verify_offline(
    repo_id: str,
    local_dir: Path,
    revision: Optional[str],
    manifest: Optional[dict[str, Any]],
    started: float,
    dry_run: bool,
    reason: str = "HF_HUB_OFFLINE is set",
) -> FetchResult:
    if not manifest or manifest.get("repo_id") != repo_id or not manifest.get("expected"):
        raise _offline_error(repo_id, local_dir)
    if revision and revision not in (manifest.get("revision"), manifest.get("commit")):
        raise _offline_error(f"{repo_id}@{revision}", local_dir)
    files = [RemoteFile(**f) for f in manifest["expected"]]
    report = verify_snapshot(
        local_dir, files, known=manifest.get("files", {}), not_selected=manifest.get("not_selected", [])
    )
    result = FetchResult(
        repo_id=repo_id,
        local_dir=str(local_dir),
        revision=revision or manifest.get("revision"),
        commit=manifest.get("commit"),
        files=[f.path for f in files],
        bytes=sum(f.size for f in files),
        verified=report.ok,
        dry_run=dry_run,
        problems=report.problems,
        warnings=[f"{reason}: checked the local snapshot against its manifest, nothing downloaded"]
        + report.warnings,
        seconds=round(time.monotonic() - started, 3),
    )
    if not report.ok:
        raise EnvironmentProblem(
            f"{reason} and {local_dir} is not a complete snapshot of {repo_id}: {report.problems[0]}",
            hint="unset HF_HUB_OFFLINE (or set it to 0) and run the same command again to repair it",
        )
    return result


# --- builtin models -------------------------------------------------------------------------------

BUILTINS = (TINY_MODEL,)
_TINY_RECIPE_VERSION = 1


def fetch_builtin(repo_id: str, local_dir: Path, *, dry_run: bool = False) -> FetchResult:
    """Write a built-in model (offline) and verify it; a verified copy is left as it is."""
    from trnqwen import tiny_model

    if repo_id not in BUILTINS:
        raise UsageError(f"unknown built-in model {repo_id!r}", hint=f"built-in models: {', '.join(BUILTINS)}")
    manifest = read_manifest(local_dir)
    expected: Optional[list[RemoteFile]] = None
    if manifest and manifest.get("repo_id") == repo_id and manifest.get("recipe") == _TINY_RECIPE_VERSION:
        expected = [RemoteFile(**f) for f in manifest.get("expected", [])]
    current = verify_snapshot(local_dir, expected, known=manifest.get("files") if manifest else None) if expected else None
    up_to_date = current is not None and current.ok
    names = list(tiny_model.SNAPSHOT_FILES)
    result = FetchResult(
        repo_id=repo_id,
        local_dir=str(local_dir),
        revision=f"recipe-{_TINY_RECIPE_VERSION}",
        commit=manifest.get("commit") if up_to_date and manifest else None,
        files=names,
        bytes=sum(f.size for f in expected) if up_to_date and expected else 0,
        dry_run=dry_run,
        to_download=[] if up_to_date else names,
    )
    if dry_run:
        result.verified = up_to_date
        return result
    if not up_to_date:
        tiny_model.write_tiny_qwen3(local_dir)
        expected = [
            RemoteFile(n, (local_dir / n).stat().st_size, sha256=file_digest(local_dir / n, "sha256")) for n in names
        ]
        result.repaired = list(current.bad_files) if current else []
    assert expected is not None
    report = verify_snapshot(local_dir, expected, known=manifest.get("files") if up_to_date and manifest else None)
    digest = tiny_model.snapshot_digest(local_dir)
    result.commit = digest[:40]
    result.bytes = sum(f.size for f in expected)
    result.sizes = {f.path: f.size for f in expected}
    result.verified = report.ok
    result.problems, result.warnings = report.problems, report.warnings
    _write_manifest(
        local_dir,
        {
            "repo_id": repo_id,
            "revision": result.revision,
            "commit": result.commit,
            "recipe": _TINY_RECIPE_VERSION,
            "verified": report.ok,
            "verified_at": time.time(),
            "files": report.checked,
            "expected": [asdict(f) for f in expected],
        },
    )
    return result


def default_local_dir(repo_id: str) -> Path:
    """``./assets/hf/<name>``: where ``train`` looks by default."""
    from trnqwen.config import model_name

    return Path("assets") / "hf" / model_name(repo_id)


__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_INCLUDE",
    "FetchResult",
    "RemoteFile",
    "check_repo_path",
    "default_local_dir",
    "fetch",
    "fetch_builtin",
    "parse_size",
    "read_safetensors_header",
    "select_files",
    "snapshot_status",
    "verify_snapshot",
]
