"""Where records come from: a JSONL / JSON / Parquet / text file, a folder of them, or the Hub.

Every record keeps where it came from (``data.jsonl line 7``, ``part-0.parquet record 3``) so a
bad record is reported by file and 1-based position, never as a traceback.  Reading does not
judge the records' shape: :mod:`trnqwen.dataset.formats` does that.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from trnqwen.dataset.cache import ContentKey
from trnqwen.dataset.mapping import Mapping
from trnqwen.errors import EnvironmentProblem, UsageError
from trnqwen.fsutil import broken_link, expand_user

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
    skipped: list[str] = field(default_factory=list)  # what a folder held that is not read, and why
    mapping: Mapping | None = None  # the dataset's own names -> trnqwen's (trnqwen.dataset.mapping)
    first_raw: Any = field(default=None, repr=False)  # the first record as read, before its mapping (the report)
    bytes_read: int = field(default=0, repr=False)  # how far iter_records has read (a progress bar)
    _hub_dataset: Any = field(default=None, repr=False)

    def add_to_key(self, key: ContentKey, label: str) -> None:
        """Hash what the records are made of: file bytes, or the Hub dataset's fingerprint, and the mapping."""
        if self.hub_name:
            fingerprint = getattr(self.hub_dataset(), "_fingerprint", None) or ""
            key.add_text(f"{label}:hub", f"{self.hub_name}\0{self.split}\0{fingerprint}")
        else:
            key.add_files(label, self.files)
        if self.mapping is not None:
            key.add_text(f"{label}:mapping", self.mapping.key_text())

    def records(self) -> list[Record]:
        """Every record, its mapping applied (the first one that does not fit it stops the run, named)."""
        records = self._read()
        if self.mapping is None or not records:
            return records
        self.first_raw = records[0].data
        return [Record(self.mapping.apply(r.data, r.where), r.where) for r in records]

    def iter_records(self) -> Iterator[Record]:
        """The records of :meth:`records`, one at a time: a ``.jsonl`` file is read line by line
        (memory bounded by one line, not the file); other files as a whole."""
        first = True
        for record in self._iter():
            if self.mapping is None:
                yield record
                continue
            if first:
                self.first_raw, first = record.data, False
            yield Record(self.mapping.apply(record.data, record.where), record.where)

    def streams_lines(self) -> bool:
        """Whether every file is ``.jsonl`` (local): :meth:`line_chunks` can read it."""
        return not self.hub_name and all(SUFFIXES[path.suffix.lower()] == "jsonl" for path in self.files)

    def line_chunks(self, size: int) -> Iterator[tuple[Record | None, LineChunk]]:
        """The records of :meth:`iter_records` (:meth:`streams_lines` sources), ``size`` lines at a time,
        not yet read, decoded or parsed (:class:`LineChunk`: where they are in the file, what a worker
        process is cheaply sent; it reads and parses them); with each chunk the source's first record
        when the chunk holds it, else None.  Each file's first record is read here too, so a file
        that is one JSON array is refused here, as :meth:`iter_records` refuses it."""
        self.bytes_read, done, found = 0, 0, False
        first: Record | None = None  # the source's first record, until a chunk has carried it
        for path in self.files:
            record = _first_line_record(path)
            if record is not None and not found:
                if self.mapping is not None:
                    self.first_raw = record.data
                    record = Record(self.mapping.apply(record.data, record.where), record.where)
                first, found = record, True
            for start, length, number in _line_blocks(path, size) if record is not None else ():
                self.bytes_read = done + start + length
                yield first, LineChunk(path, self.mapping, start, length, number)
                first = None
            done += path.stat().st_size
            self.bytes_read = done

    def size_bytes(self) -> int:
        """The local files' total size (0 for a Hub dataset): what a progress bar counts."""
        return sum(path.stat().st_size for path in self.files)

    def _iter(self) -> Iterator[Record]:
        self.bytes_read = 0
        if self.hub_name:
            yield from self._read()
            return
        done = 0
        for path in self.files:
            kind = SUFFIXES[path.suffix.lower()]
            if kind == "jsonl":
                yield from _stream_jsonl(path, lambda offset: setattr(self, "bytes_read", done + offset))
            else:
                yield from _READERS[kind](self, path)
            done += path.stat().st_size
            self.bytes_read = done

    def hub_dataset(self):
        if self._hub_dataset is None:
            self._hub_dataset = _load_hub(self.hub_name, self.split)
        return self._hub_dataset

    def _read(self) -> list[Record]:
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


def resolve_source(dataset: str | os.PathLike | None, *, split: str = "train", mapping: Mapping | None = None) -> Source:
    """``dataset`` (a path or Hub name; None = the bundled chat set) as a :class:`Source`, its
    records read through ``mapping``."""
    name = str(dataset) if dataset is not None else str(bundled_chat_path())
    path = expand_user(name)
    if path.exists():
        files, skipped = _local_files(path.resolve())
        return Source(name=name, files=files, split=split, skipped=skipped, mapping=mapping)
    link = broken_link(path)
    if link:  # a local path the user can see: never taken for a Hub name
        raise UsageError(f"dataset {name} is {link}", hint="point the link at the data, or pass the data's own path")
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
    return Source(name=name, hub_name=name, split=split, mapping=mapping)


def _local_files(path: Path) -> tuple[list[Path], list[str]]:
    """The data files of ``path`` (a file, or a folder walked with its links followed) and what
    a folder held that is not read, each with why."""
    skipped: list[str] = []
    if path.is_dir():
        files = _walk(path, skipped)
        if not files:
            raise UsageError(
                f"dataset folder {path} has no .jsonl/.json/.parquet/.txt files"
                + (f" ({'; '.join(skipped)})" if skipped else ""),
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
    return files, skipped


_SHOWN_SKIPPED = 5


def _walk(top: Path, notes: list[str]) -> list[Path]:
    """Every data file under ``top``, following links to folders and files (a folder of linked
    shards is the data); a link back to a folder above it (a loop), a second way to a folder or
    file already read, a broken link, an unreadable folder and files of other types are left out
    and named in ``notes``, never silently."""
    files: list[Path] = []
    skipped: list[str] = []
    other_types: list[str] = []
    seen: dict[tuple[int, int], Path] = {}

    def visit(folder: Path, above: tuple[tuple[int, int], ...]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(f"{folder} (cannot be read: {exc.strerror or exc})")
            return
        for entry in entries:
            path = Path(entry.path)
            try:
                st = path.stat()  # follows links
            except OSError:
                skipped.append(f"{path} ({broken_link(path) or 'cannot be read'})")
                continue
            ident = (st.st_dev, st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                if ident in above:
                    skipped.append(f"{path} (a link back to {seen.get(ident, 'a folder above it')}: a loop)")
                elif ident in seen:
                    skipped.append(f"{path} (the same folder as {seen[ident]}, read once)")
                else:
                    seen[ident] = path
                    visit(path, (*above, ident))
            elif path.suffix.lower() not in SUFFIXES:
                if stat.S_ISREG(st.st_mode) and not entry.name.startswith("."):
                    other_types.append(str(path.relative_to(top)))
            elif ident in seen:
                skipped.append(f"{path} (the same file as {seen[ident]}, read once)")
            elif stat.S_ISREG(st.st_mode):
                seen[ident] = path
                files.append(path)

    root = top.stat()
    seen[(root.st_dev, root.st_ino)] = top
    visit(top, ((root.st_dev, root.st_ino),))
    if skipped:
        more = f"; and {len(skipped) - _SHOWN_SKIPPED} more" if len(skipped) > _SHOWN_SKIPPED else ""
        notes.append(f"{len(skipped)} path(s) in {top} not read: {'; '.join(skipped[:_SHOWN_SKIPPED])}{more}")
    if other_types:
        more = ", ..." if len(other_types) > _SHOWN_SKIPPED else ""
        notes.append(f"{len(other_types)} file(s) in {top} not read, not .jsonl/.json/.parquet/.txt: "
                     f"{', '.join(other_types[:_SHOWN_SKIPPED])}{more}")
    return sorted(files)


def _read_text(path: Path) -> str:
    """The file as text: UTF-8, a leading byte-order mark dropped (it is not part of the data)."""
    data = path.read_bytes()
    bom = data.startswith(codecs.BOM_UTF8)
    body = data[len(codecs.BOM_UTF8):] if bom else data
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{path} line {line}: not UTF-8 text (byte {exc.start + (3 if bom else 0)} of the file, {body[exc.start:exc.start + 1]!r})",
            hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


_SCAN = json.JSONDecoder().scan_once  # what json.loads reads a value with, less its whitespace checks


def _parse(text: str, where: str) -> Any:
    """One JSON value; too deep a nesting is the record's fault, named.  An object with nothing around
    it (a .jsonl line) is scanned from its first to its last character, as ``json.loads`` would
    scan it; anything else, or a scan that fails, goes through ``json.loads`` (its value, its error)."""
    try:
        if text[:1] == "{" and text[-1:] == "}":
            try:
                value, end = _SCAN(text, 0)
            except (StopIteration, ValueError):
                end = -1
            if end == len(text):
                return value
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to read as JSON", hint="flatten or remove that record") from None


def _has_surrogate_escape(text: str) -> bool:
    return "\\ud" in text or "\\uD" in text


def _check_unicode(value: Any, where: str) -> None:
    """A ``\\ud800``-style escape alone is valid JSON but no character: name the record."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"{where}: a string holds a lone surrogate \\u{ord(exc.object[exc.start]):04x} "
            "(half of a UTF-16 pair, not a character)",
            hint="fix the escape (a pair like \\ud83d\\ude00 is one character) or remove it",
        ) from None


def _whole_file_is(text: str, kind: type) -> bool:
    try:
        return isinstance(json.loads(text), kind)
    except (ValueError, RecursionError):
        return False


def _read_jsonl(source: Source, path: Path) -> list[Record]:
    """One JSON object per line.  Lines end at ``\\n`` only (``\\r\\n`` too): U+2028, U+2029 and
    U+0085 are valid inside JSON strings, so ``str.splitlines`` would cut records in two."""
    text = _read_text(path)
    records = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        records.append(_line_record(path, line, number, first=not records, whole=lambda: text))
    return records


def _line_record(path: Path, line: str, number: int, *, first: bool, whole: Callable[[], str]) -> Record:
    """One .jsonl line as a record (``first``: no record before it; ``whole``: the file's text, read
    only to tell a JSON array saved as .jsonl from a broken line)."""
    where = f"{path} line {number}"
    try:
        value = _parse(line, where)
    except json.JSONDecodeError as exc:
        if first and line.lstrip().startswith("[") and _whole_file_is(whole(), list):
            raise _rename(path, "one JSON array of records", ".json") from None
        raise UsageError(
            f"{where}: not valid JSON ({exc.msg}, column {exc.colno})",
            hint="each line of a .jsonl file must be one JSON object",
        ) from None
    if first and isinstance(value, list):
        raise _rename(path, "a JSON array of records", ".json")
    if _has_surrogate_escape(line):  # (a pair, or half of one: rare, so checked only then)
        _check_unicode(value, where)
    return Record(value, where)


@dataclass(frozen=True)
class LineChunk:
    """Lines of one ``.jsonl`` file, by place (:meth:`Source.line_chunks`): ``length`` bytes from
    byte ``start``, the first of them line ``number`` (1-based), so a bad one is named.
    :meth:`records` reads, decodes and parses them as :func:`_stream_jsonl` does (the same
    records, the same errors), in the process that encodes them: the reading process only finds
    where the lines end."""

    path: Path
    mapping: Mapping | None
    start: int
    length: int
    number: int

    def records(self) -> list[Record]:
        with self.path.open("rb") as fh:
            fh.seek(self.start)
            data = fh.read(self.length)
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()  # (what follows the last newline is no line)
        out, start = [], self.start
        for number, raw in enumerate(lines, start=self.number):
            at, start = start, start + len(raw) + 1
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw, at = raw[len(codecs.BOM_UTF8):], at + len(codecs.BOM_UTF8)
            line = _decode_line(self.path, raw, number, at)
            if not line or line.isspace():
                continue
            record = _line_record(self.path, line, number, first=False, whole=lambda: "")
            if self.mapping is not None:
                record = Record(self.mapping.apply(record.data, record.where), record.where)
            out.append(record)
        return out


_BLOCK_BYTES = 1 << 20  # read at a time while finding where lines end (its bytes, a byte mask and the newlines: ~2 MB)


def _first_line_record(path: Path) -> Record | None:
    """The file's first record (None when it holds none), read as :func:`_stream_jsonl` reads it."""
    return next(_stream_jsonl(path, lambda offset: None), None)


def _line_blocks(path: Path, size: int) -> Iterator[tuple[int, int, int]]:
    """(first byte, byte count, first line number) of each run of ``size`` lines of ``path``, the
    last one shorter (and without a last newline when the file has none); found with numpy, a
    buffer at a time, not line by line."""
    import numpy as np

    block, number, lines, offset = 0, 1, 0, 0  # the open block's start, first line, lines so far
    with path.open("rb", buffering=0) as fh:
        while buf := fh.read(_BLOCK_BYTES):
            ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10) + (offset + 1)  # just past each newline
            close = size - lines - 1  # the newline that closes the open block
            for end in ends[close::size].tolist():
                yield block, end - block, number
                block, number = end, number + size
            lines = (lines + len(ends)) % size
            offset += len(buf)
    if offset > block:
        yield block, offset - block, number


def _decode_line(path: Path, raw: bytes, number: int, start: int) -> str:
    """One line's bytes (``start``: its offset in the file) as text, as ``split("\\n")`` leaves it ("\\r" kept)."""
    try:
        return raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} line {number}: not UTF-8 text (byte {start + exc.start} of the file, {raw[exc.start:exc.start + 1]!r})",
            hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def _stream_jsonl(path: Path, at: Callable[[int], None]) -> Iterator[Record]:
    """:func:`_read_jsonl`, line by line from the file (the same records, the same errors); each
    line is decoded and parsed on its own, so a 10 GB file needs one line's memory."""
    offset, seen = 0, False
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            at(offset)
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw, start = raw[len(codecs.BOM_UTF8):], start + len(codecs.BOM_UTF8)
            line = _decode_line(path, raw, number, start)
            if not line.strip():
                continue
            yield _line_record(path, line, number, first=not seen, whole=lambda: _read_text(path))
            seen = True


def _rename(path: Path, what: str, suffix: str) -> UsageError:
    layout = "JSON Lines (one object per line)" if suffix == ".json" else "one JSON list of records"
    return UsageError(f"{path}: holds {what}, not {layout}", hint=f"rename it to {path.stem}{suffix}")


def _read_json(source: Source, path: Path) -> list[Record]:
    text = _read_text(path)
    try:
        data = _parse(text, str(path))
    except json.JSONDecodeError as exc:
        first = next((line for line in text.split("\n") if line.strip()), "")
        if exc.msg == "Extra data" and _whole_file_is(first, dict):
            raise _rename(path, "one JSON object per line (JSON Lines)", ".jsonl") from None
        raise UsageError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})", hint="fix the file") from None
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]} / {"train": [...]}
    if not isinstance(data, list):
        raise UsageError(f"{path}: expected a JSON list of records", hint="or write one record per line as .jsonl")
    records = [Record(item, f"{path} record {i}") for i, item in enumerate(data, start=1)]
    if _has_surrogate_escape(text):
        for record in records:
            _check_unicode(record.data, record.where)
    return records


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
