"""Run directories: every ``trnqwen train`` leaves one, so later commands need no paths.

Layout (``<runs_dir>/<run_id>/``, the id ``<time>-<backend>-<method>[-lora]``, e.g.
``20261204-101500-native-sft-lora``):
  run.json     the run record (see :class:`RunRecord`), rewritten atomically as the run progresses
  train.log    the full log of every rank (torchrun --tee), as printed
  config.py    the generated torchtitan config module (for hand-run torchrun, --export-config)
  command.sh   the exact command, re-runnable
``<runs_dir>/LAST`` names the newest run; ``verify-ckpt`` and ``inspect-logs`` default to it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from trnqwen.fsutil import write_json_atomic, write_text_atomic

RUN_RECORD = "run.json"
LOG_NAME = "train.log"
LAST_POINTER = "LAST"


@dataclass
class RunRecord:
    """What a run was and how it ended.  ``status``: created|running|succeeded|failed|interrupted."""

    run_id: str
    run_dir: str
    status: str = "created"
    config: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # only the variables trnqwen set, redacted
    versions: dict[str, Optional[str]] = field(default_factory=dict)
    log_path: str = ""
    checkpoint_dir: Optional[str] = None
    assets_dir: Optional[str] = None
    backend: Optional[str] = None
    steps: Optional[int] = None
    exit_code: Optional[int] = None
    ended_by: Optional[str] = None  # "completed", "SIGINT", "SIGTERM", "rank failure", ...
    error: Optional[str] = None  # the first root-cause line of a failed run
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        """Write run.json.  A record written before whose run.json or log has since gone (the run
        dir deleted mid-run) is written again, marked ``extra.run_dir_lost`` with what was lost."""
        lost = self.lost_files() if getattr(self, "_saved", False) else []
        if lost:  # every save after the deletion sees it; what each found missing adds up
            entry = self.extra.setdefault("run_dir_lost", {"at": time.time(), "lost": []})
            entry["lost"] = [n for n in (RUN_RECORD, LOG_NAME) if n in set(entry["lost"]) | set(lost)]
        write_json_atomic(Path(self.run_dir) / RUN_RECORD, asdict(self))
        self._saved = True  # not a field: never written to run.json
        if self.log_path and Path(self.log_path).exists():
            self._log_seen = True  # a log can only be lost once it was there (the first saves precede it)

    def lost_files(self) -> list[str]:
        """run.json and train.log when they are gone from the run dir (someone deleted it)."""
        lost = [] if (Path(self.run_dir) / RUN_RECORD).is_file() else [RUN_RECORD]
        if self.log_path and getattr(self, "_log_seen", False) and not Path(self.log_path).exists():
            lost.append(LOG_NAME)
        return lost

    @classmethod
    def load(cls, run_dir: Path) -> "RunRecord":
        data = json.loads((Path(run_dir) / RUN_RECORD).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{Path(run_dir) / RUN_RECORD} is not a JSON object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        record = cls(**known)
        record._saved = True
        record._log_seen = bool(record.log_path) and Path(record.log_path).exists()
        return record


def live_launcher(record: RunRecord) -> Optional[int]:
    """The pid of the launcher of a run that is training now: its record says created/running and
    that process, started when the record says, is alive.  None otherwise (a run killed without a
    word leaves a record that still says "running")."""
    import os

    if record.status not in ("created", "running"):
        return None
    pid = record.extra.get("launcher_pid")
    try:
        import psutil

        alive = bool(pid) and psutil.pid_exists(int(pid)) and int(pid) != os.getpid()
        if alive and record.extra.get("launcher_started_at"):
            alive = abs(psutil.Process(int(pid)).create_time() - float(record.extra["launcher_started_at"])) < 1.0
    except Exception:
        alive = False
    return int(pid) if alive else None


def run_kind(backend: str, method: str, lora: bool) -> str:
    """What a run trains, as its id says it: ``<backend>-<method>[-lora]`` (``native-sft-lora``)."""
    return f"{backend}-{method}" + ("-lora" if lora else "")


def next_run_id(runs_dir: Path, backend: str, *, method: str, lora: bool) -> str:
    """``<timestamp>-<backend>-<method>[-lora][-n]``: the first such name not yet taken under
    ``runs_dir`` (``20261204-101500-native-sft-lora``; a second one that second gets ``-1``)."""
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{run_kind(backend, method, lora)}"
    n = 0
    while (runs_dir / (base if n == 0 else f"{base}-{n}")).exists():
        n += 1
    return base if n == 0 else f"{base}-{n}"


def point_last(runs_dir: Path, run_id: str) -> None:
    """Point ``<runs_dir>/LAST`` at ``run_id`` (atomically: a reader never sees half a name)."""
    write_text_atomic(Path(runs_dir) / LAST_POINTER, run_id + "\n")


def read_last_pointer(runs_dir: Path) -> Optional[str]:
    """The run id ``LAST`` names, or None.  A pointer that is not a short UTF-8 run name (binary
    garbage, another path, unreadable) is ignored with a warning: the newest run is used instead."""
    pointer = Path(runs_dir) / LAST_POINTER
    if not pointer.exists() and not pointer.is_symlink():
        return None
    try:
        name = pointer.read_bytes()[:4096].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or str(exc))
        _warn(f"ignoring {pointer} ({why}); using the newest run instead")
        return None
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        _warn(f"ignoring {pointer} (it does not name a run); using the newest run instead")
        return None
    return name


def _warn(message: str) -> None:
    from trnqwen import output

    output.warn(message)


def last_run_dir(runs_dir: Path) -> Optional[Path]:
    """The newest run directory, or None when there has been no run."""
    name = read_last_pointer(runs_dir)
    if name is not None:
        candidate = runs_dir / name
        if (candidate / RUN_RECORD).is_file():
            return candidate
    runs = sorted((p for p in runs_dir.glob("*") if (p / RUN_RECORD).is_file()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def recent_records(runs_dir: Path, limit: int = 200) -> Iterator[tuple[Path, RunRecord]]:
    """(run dir, record) of the newest ``limit`` runs, newest first; unreadable records are skipped."""
    try:
        files = sorted(Path(runs_dir).glob(f"*/{RUN_RECORD}"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for record_file in files[:limit]:
        try:
            record = RunRecord.load(record_file.parent)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        yield record_file.parent, record
