"""The ranks' metrics stream: one JSON record per step and per validation, by name.

Global rank 0 of every backend appends to ``<run dir>/metrics.jsonl`` (the launcher names the
file in :data:`PATH_ENV`; a by-hand torchrun without it writes no stream and its text log is
read instead).  Each record is one line, written whole and flushed at once, so a reader that
only takes complete lines (:class:`StreamReader`) can follow the file while it grows::

    {"v": 1, "kind": "step", "step": 12, "time": 1764770000.1, "values": {"loss": 2.25, "lr": 1e-05, ...}}

``kind`` is ``step`` or ``validation`` (and ``header``, first: the backend, the method and what
its values mean).  ``values`` holds every number of that step by name: the core ones
(:data:`STEP_CORE`) and whatever the method declares (``<method>/margin``...), so a new metric reaches
every reader without a change to any of them.  A resumed run appends to its own stream; a step
written twice (redone after a resume) is read as its last record.  NaN and inf are written as
JSON's ``NaN``/``Infinity`` (Python's json reads them back).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Mapping, Optional

PATH_ENV = "TRNQWEN_METRICS_PATH"
FILE_NAME = "metrics.jsonl"
VERSION = 1
KINDS = ("header", "step", "validation")

# The values every backend writes for a training step (None where a backend cannot know one:
# MFU on a CPU, memory without a device).  Validation records carry VALIDATION_CORE.
STEP_CORE = ("loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu", "lr")
VALIDATION_CORE = ("loss", "memory_gib", "memory_pct", "tps")


@dataclass(frozen=True)
class Record:
    kind: str
    step: int
    values: dict[str, Optional[float]] = field(default_factory=dict)
    time: float = 0.0
    meta: dict = field(default_factory=dict)  # header only: backend, method, metric descriptions


def encode(record: Record) -> str:
    """One record as one line (ends with a newline)."""
    body: dict = {"v": VERSION, "kind": record.kind, "step": int(record.step), "time": round(record.time, 3)}
    if record.values:
        body["values"] = {k: as_number(v) for k, v in record.values.items()}
    if record.meta:
        body["meta"] = record.meta
    return json.dumps(body, separators=(",", ":"), allow_nan=True) + "\n"


def decode(line: str) -> Optional[Record]:
    """A record from one complete line, or None for a line that is not one (never raises)."""
    try:
        body = json.loads(line)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("kind") not in KINDS or not isinstance(body.get("step"), int):
        return None
    values = body.get("values") or {}
    if not isinstance(values, dict):
        return None
    clean = {str(k): as_number(v) for k, v in values.items() if v is None or isinstance(v, (int, float))}
    meta = body.get("meta") if isinstance(body.get("meta"), dict) else {}
    stamp = body.get("time")
    return Record(body["kind"], body["step"], clean, float(stamp) if isinstance(stamp, (int, float)) else 0.0, meta)


def as_number(value: object) -> Optional[float]:
    """A value as a float (tensors and numpy scalars too), None when it is not a number (None, a
    bool, a string): what a writer puts in a record from whatever its trainer logged."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class MetricsWriter:
    """Appends records to the stream; a no-op when there is no path (not rank 0, no launcher)."""

    def __init__(self, path: Optional[os.PathLike | str]) -> None:
        self.path = Path(path) if path else None
        self._fh: Optional[IO[str]] = None

    @classmethod
    def from_env(cls, rank: Optional[int] = None) -> "MetricsWriter":
        """The writer for this process: the launcher's path on global rank 0, else a no-op."""
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        return cls(os.environ.get(PATH_ENV) if rank == 0 else None)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def write(self, kind: str, step: int, values: Mapping[str, Optional[float]], meta: Optional[dict] = None) -> None:
        if self.path is None:
            return
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(encode(Record(kind, step, dict(values), time.time(), meta or {})))
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class StreamReader:
    """Reads the records appended since the last call; only complete lines (a writer mid-line
    is read next time), so it can follow a stream while a run writes it."""

    def __init__(self, path: os.PathLike | str) -> None:
        self.path = Path(path)
        self.offset = 0
        self.bad_lines = 0

    def poll(self) -> list[Record]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for raw in chunk[: end + 1].splitlines():
            record = decode(raw.decode("utf-8", "replace"))
            if record is None:
                self.bad_lines += 1
            else:
                out.append(record)
        return out


def read_stream(path: os.PathLike | str) -> list[Record]:
    """Every complete record of a stream, in file order."""
    return StreamReader(path).poll()


def latest(records: list[Record], kind: str) -> dict[int, Record]:
    """step -> the last record of that kind for it (a step redone after a resume counts once)."""
    out: dict[int, Record] = {}
    for record in records:
        if record.kind == kind:
            out[record.step] = record
    return dict(sorted(out.items()))


def finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
