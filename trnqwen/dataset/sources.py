"""Where records come from: a JSONL / JSON / Parquet / text file, a folder of them, or the Hub.

Every record keeps where it came from (``data.jsonl line 7``, ``part-0.parquet record 3``) so a
bad record is reported by file and 1-based position, never as a traceback.  Reading does not
judge the records' shape: :mod:`trnqwen.dataset.formats` does that.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnqwen.dataset.cache import ContentKey
from trnqwen.errors import EnvironmentProblem, UsageError
from trnqwen.fsutil import expand_user

SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")


@dataclass(frozen=True)
class Record:
    data: Any
    where: str  # "data.jsonl line 7": names the file and the record for error messages


@dataclass
class Source:
    """A dataset the user named: local files (in a fixed order) or a Hub dataset + split."""

    name: str
    files: list[Path] = field(default_factory=list)
    hub_name: str | None = None
    split: str = "train"
    columns: list[str] | None = None  # Parquet / Hub: the columns, for "no recognised column" errors
    _hub_dataset: Any = field(default=None, repr=False)

    def add_to_key(self, key: ContentKey, label: str) -> None:
        """Hash what the records are made of: file bytes, or the Hub dataset's fingerprint."""
        if self.hub_name:
            fingerprint = getattr(self.hub_dataset(), "_fingerprint", None) or ""
            key.add_text(f"{label}:hub", f"{self.hub_name}\0{self.split}\0{fingerprint}")
        else:
            key.add_files(label, self.files)

    def hub_dataset(self):
        if self._hub_dataset is None:
            self._hub_dataset = _load_hub(self.hub_name, self.split)
        return self._hub_dataset

    def records(self) -> list[Record]:
        if self.hub_name:
            ds = self.hub_dataset()
            self.columns = list(ds.column_names)
            label = f"{self.hub_name} ({self.split})"
            return [Record(row, f"{label} record {i}") for i, row in enumerate(ds, start=1)]
        out: list[Record] = []
        for path in self.files:
            out.extend(_READERS[SUFFIXES[path.suffix.lower()]](self, path))
        return out


def bundled_chat_path() -> Path:
    """The bundled multi-turn chat set (calculator and unit conversions, with system prompts)."""
    from trnqwen.data import chat_recipe

    path = chat_recipe.chat_path()
    if not path.is_file():
        raise EnvironmentProblem(
            f"the bundled chat set is missing ({path})",
            hint="reinstall trnqwen, or regenerate it: python -m trnqwen.data.chat_recipe",
        )
    return path


def resolve_source(dataset: str | os.PathLike | None, *, split: str = "train") -> Source:
    """``dataset`` (a path or Hub name; None = the bundled chat set) as a :class:`Source`."""
    name = str(dataset) if dataset is not None else str(bundled_chat_path())
    path = expand_user(name)
    if path.exists():
        return Source(name=name, files=_local_files(path.resolve()), split=split)
    if name.startswith((".", "/", "~")) or Path(name).suffix.lower() in SUFFIXES or name.endswith("/"):
        raise UsageError(
            f"dataset {name} does not exist",
            hint="pass an existing JSONL/JSON/Parquet file or folder, or a Hub dataset name like org/name",
        )
    if not _HUB_NAME.fullmatch(name):
        raise UsageError(
            f"dataset {name!r} is neither a local file/folder nor a Hub dataset name",
            hint="pass a JSONL/JSON/Parquet/text file, a folder of them, or a Hub name like org/name",
        )
    return Source(name=name, hub_name=name, split=split)


def _local_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise UsageError(
                f"dataset folder {path} has no .jsonl/.json/.parquet/.txt files",
                hint="put the records in that folder, or pass one file",
            )
    else:
        if path.suffix.lower() not in SUFFIXES:
            raise UsageError(
                f"dataset {path}: unknown file type {path.suffix or '(no extension)'}",
                hint="use .jsonl, .json (a list of records), .parquet or .txt",
            )
        files = [path]
    kinds = {SUFFIXES[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise UsageError(f"dataset folder {path} mixes file types ({', '.join(sorted(kinds))})", hint="keep one type per folder")
    return files


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})", hint="save the file as UTF-8") from None


def _read_jsonl(source: Source, path: Path) -> list[Record]:
    records = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(Record(json.loads(line), f"{path} line {number}"))
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{path} line {number}: not valid JSON ({exc.msg}, column {exc.colno})",
                hint="each line of a .jsonl file must be one JSON object",
            ) from None
    return records


def _read_json(source: Source, path: Path) -> list[Record]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})", hint="fix the file") from None
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]} / {"train": [...]}
    if not isinstance(data, list):
        raise UsageError(f"{path}: expected a JSON list of records", hint="or write one record per line as .jsonl")
    return [Record(item, f"{path} record {i}") for i, item in enumerate(data, start=1)]


def _read_parquet(source: Source, path: Path) -> list[Record]:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except ImportError:
        raise EnvironmentProblem("reading Parquet needs pyarrow", hint="pip install pyarrow") from None
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise UsageError(f"{path}: not a readable Parquet file ({exc})") from None
    source.columns = list(table.column_names)
    return [Record(row, f"{path} record {i}") for i, row in enumerate(table.to_pylist(), start=1)]


def _read_txt(source: Source, path: Path) -> list[Record]:
    """Plain text: one document per blank-line-separated paragraph (as the text loader does)."""
    docs = [d.strip() for d in re.split(r"\n\s*\n", _read_text(path)) if d.strip()]
    return [Record({"text": d}, f"{path} paragraph {i}") for i, d in enumerate(docs, start=1)]


_READERS = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet, "text": _read_txt}


def _load_hub(name: str, split: str):
    try:
        import datasets
    except ImportError:
        raise EnvironmentProblem("Hub datasets need the `datasets` package", hint="pip install datasets") from None
    try:
        return datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ConnectionError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
        hint = (
            "offline mode is on (HF_HUB_OFFLINE=1): download it once while online, or pass a local file"
            if offline
            else "check the name (org/name) and your network, or pass a local file"
        )
        raise UsageError(f"Hub dataset {name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", hint=hint) from None
    except ValueError as exc:  # unknown split
        raise UsageError(f"Hub dataset {name}: {str(exc).splitlines()[0]}", hint="pick an existing --dataset-split") from None
