"""What a fetch will write: the commit, the vetted file list, where it goes.

The Hub's tree API gives the commit and every file (sizes, sha256 / git blob ids); the allow-list
keeps what training needs (config, generation config, tokenizer files, safetensors; never
``.bin`` or ``original/``); every remote name is checked for path traversal before any write.
huggingface_hub is imported inside functions only.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Optional

from trnqwen.constants import BUILTIN_PREFIX
from trnqwen.errors import CheckFailed, EnvironmentProblem, TrnqwenError
from trnqwen.fetch.errors import hub_error
from trnqwen.fsutil import free_bytes, writable
from trnqwen.units import format_bytes

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
DEFAULT_KEEP_FREE = 256 * 1024**2  # bytes left free after the download


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


def exact_pattern(name: str) -> str:
    """An fnmatch pattern matching exactly ``name``."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


def is_builtin(repo_id: str) -> bool:
    return repo_id.startswith(BUILTIN_PREFIX)



def check_disk(repo_id: str, local_dir: Path, need: int, keep_free: int, *, verb: str = "download") -> None:
    """Refuse, before a byte is written, when ``need`` more bytes would leave less than
    ``keep_free`` free where ``local_dir`` lives."""
    base, free = free_bytes(local_dir)
    if not writable(base):  # a read-only mount says so, not "not enough space"
        raise EnvironmentProblem(
            f"cannot write {local_dir}: {base} is read-only (or not writable by this user)",
            hint="pick a writable folder with --local-dir (or fix its permissions/mount); nothing was written",
        )
    if free is not None and free - need < keep_free:
        raise EnvironmentProblem(
            f"not enough disk space for {repo_id} in {local_dir}: {format_bytes(need)} to {verb}, "
            f"{format_bytes(free)} free, {format_bytes(keep_free)} to keep free",
            hint="free some space, choose another --local-dir, or lower --keep-free; nothing was written",
        )


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



def default_local_dir(repo_id: str) -> Path:
    """``./assets/hf/<name>``: where ``train`` looks by default."""
    from trnqwen.config import model_name

    return Path("assets") / "hf" / model_name(repo_id)


