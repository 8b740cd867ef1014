"""Is a snapshot folder whole: every file with its size and hash, headers, index, config, manifest.

:func:`verify_snapshot` checks a folder against the file list the Hub gave (or, without one, each
file for internal consistency): sizes, sha256 / git blob ids (hashed once, then trusted while
size and mtime hold), every safetensors header readable with its tensors inside the file
(:mod:`trnqwen.safetensors_format`), every index entry present in its shard, ``config.json`` a
Qwen3-family model (a warning otherwise).  The manifest
``<local_dir>/.cache/trnqwen/fetch.json`` records what was verified, so a rerun of a complete
snapshot verifies quickly and offline runs (``HF_HUB_OFFLINE=1``) can check the folder against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Optional

from trnqwen.assets import MANIFEST
from trnqwen.errors import EnvironmentProblem
from trnqwen.fetch.errors import offline_error
from trnqwen.fetch.plan import FetchResult, RemoteFile
from trnqwen.fsutil import write_json_atomic
from trnqwen.safetensors_format import SafetensorsFormatError, read_header

QWEN3_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_omni_moe")
HASH_CHUNK = 8 * 1024 * 1024


@dataclass
class VerifyReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)  # to delete and fetch again
    checked: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> manifest entry

    @property
    def ok(self) -> bool:
        return not self.problems


def file_digest(path: Path, kind: str) -> str:
    """``sha256`` of the content, or ``git`` blob sha1 (``sha1("blob <size>\\0" + content)``)."""
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
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
                headers[rf.path] = set(read_header(local_dir / rf.path, known_dtypes=False).tensors)
            except (OSError, SafetensorsFormatError) as exc:
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




def write_manifest(local_dir: Path, payload: dict[str, Any]) -> None:
    write_json_atomic(Path(local_dir) / MANIFEST, payload)


def verify_offline(
    repo_id: str,
    local_dir: Path,
    revision: Optional[str],
    manifest: Optional[dict[str, Any]],
    started: float,
    dry_run: bool,
    reason: str = "HF_HUB_OFFLINE is set",
) -> FetchResult:
    if not manifest or manifest.get("repo_id") != repo_id or not manifest.get("expected"):
        raise offline_error(repo_id, local_dir)
    if revision and revision not in (manifest.get("revision"), manifest.get("commit")):
        raise offline_error(f"{repo_id}@{revision}", local_dir)
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

