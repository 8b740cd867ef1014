"""The tokenized dataset cache: the one place that knows its file names and layout.

The launcher tokenizes a dataset once and writes it here; every rank of every backend
memory-maps its shard of the same arrays, so all backends train on identical tokens and labels
(contract: ``notes/cache-contract.md``). numpy only, so launcher and ranks can both use it.

On disk, ``<cache_root>/<key>/``::

    meta.json                {"version": 1, "key", "seq_len", "packing", "pad_id", "eos_id",
                              "format", "source", "splits": {name: {sequences, documents,
                              tokens, trained_tokens, padding_tokens}}, ...}
    <split>.input_ids.npy    int32 [N, S]
    <split>.labels.npy       int32 [N, S]  target for input position t (already shifted);
                                           -100 = not trained
    <split>.positions.npy    int32 [N, S]  position inside its own document; 0 starts one

The directory is built under a temporary name and renamed into place, so a reader never sees
a half-written cache and a second run with the same key reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trnqwen.fsutil import current_umask

CACHE_VERSION = 1
IGNORE_INDEX = -100
ARRAY_NAMES = ("input_ids", "labels", "positions")
META_FILE = "meta.json"
SPLITS = ("train", "val")
_CHUNK = 1 << 20


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/trnqwen/datasets`` (``~/.cache/trnqwen/datasets`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trnqwen" / "datasets"


# --- the key ------------------------------------------------------------------------


class ContentKey:
    """sha256 over everything that changes the tokens: file bytes, template text, settings.

    Every part is framed with a label and its length so that ``("ab", "c")`` and
    ``("a", "bc")`` never collide.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._hash.update(f"trnqwen-dataset-cache-v{CACHE_VERSION}".encode())

    def _frame(self, label: str, size: int) -> None:
        self._hash.update(f"\0{label}\0{size}\0".encode())

    def add_bytes(self, label: str, data: bytes) -> ContentKey:
        self._frame(label, len(data))
        self._hash.update(data)
        return self

    def add_text(self, label: str, text: str) -> ContentKey:
        return self.add_bytes(label, text.encode("utf-8"))

    def add_file(self, label: str, path: Path) -> ContentKey:
        """The file's bytes (streamed, so a large dataset is never read whole into memory)."""
        path = Path(path)
        self._frame(label, path.stat().st_size)
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                self._hash.update(chunk)
        return self

    def add_files(self, label: str, paths: Iterable[Path]) -> ContentKey:
        for path in sorted(Path(p) for p in paths):
            self.add_file(f"{label}:{path.name}", path)
        return self

    def add_settings(self, settings: Mapping[str, Any]) -> ContentKey:
        """Settings as canonical JSON (sorted keys), so dict order never changes the key."""
        return self.add_text("settings", json.dumps(dict(settings), sort_keys=True, default=str))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


# --- writing ------------------------------------------------------------------------


@dataclass
class SplitArrays:
    """One split ready to write: three int32 [N, S] arrays and the counts the arrays cannot tell.

    ``documents`` counts real documents (conversations), not the padding "documents";
    ``padding_tokens`` counts pad positions.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray
    documents: int
    padding_tokens: int
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # more int32 [N, S] arrays (preference pairs: segments)

    def stats(self) -> dict[str, int]:
        sequences, seq_len = self.input_ids.shape
        return {
            "sequences": int(sequences),
            "documents": int(self.documents),
            "tokens": int(sequences * seq_len - self.padding_tokens),
            "trained_tokens": int(np.count_nonzero(self.labels != IGNORE_INDEX)),
            "padding_tokens": int(self.padding_tokens),
        }

    def check(self, name: str, seq_len: int) -> None:
        for array_name in ARRAY_NAMES:
            array = getattr(self, array_name)
            if array.ndim != 2 or array.shape[1] != seq_len:
                raise ValueError(
                    f"{name}.{array_name}: shape {array.shape}, expected [N, {seq_len}]"
                )
            if array.shape != self.input_ids.shape:
                raise ValueError(f"{name}.{array_name}: shape {array.shape} != input_ids")
        for array_name, array in self.extra.items():
            if array_name in ARRAY_NAMES or array.shape != self.input_ids.shape:
                raise ValueError(f"{name}.{array_name}: an extra array must be new and shaped like input_ids")


@dataclass
class StreamedSplit:
    """One split written block by block, never whole in memory (bounded-memory preparation):
    ``blocks()`` yields (input_ids, labels, positions) int32 [n, S] blocks, rows in order, that
    together make ``sequences`` rows.  Its counts are known before it is written."""

    sequences: int
    seq_len: int
    documents: int
    tokens: int
    trained_tokens: int
    blocks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]] = field(repr=False)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # or, instead of ``blocks``: (the three files in ARRAY_NAMES' order, where row 0 starts in each)
    # -> rows written, each row ``r`` at ``start + r * seq_len * 4`` (int32, C order: several processes may write)
    write_rows: Callable[[list[Path], int], int] | None = field(default=None, repr=False)

    def stats(self) -> dict[str, int]:
        return {"sequences": int(self.sequences), "documents": int(self.documents), "tokens": int(self.tokens),
                "trained_tokens": int(self.trained_tokens),
                "padding_tokens": int(self.sequences * self.seq_len - self.tokens)}

    def check(self, name: str, seq_len: int) -> None:
        if self.seq_len != seq_len:
            raise ValueError(f"{name}: rows of {self.seq_len} tokens, expected {seq_len}")

    def write(self, folder: Path, name: str) -> None:
        """The three ``.npy`` files, the header first and then each block as it comes (np.load reads them)."""
        files = [open(folder / f"{name}.{array_name}.npy", "wb") for array_name in ARRAY_NAMES]
        try:
            for fh in files:
                np.lib.format.write_array_header_1_0(
                    fh, {"descr": np.dtype(np.int32).str, "fortran_order": False, "shape": (self.sequences, self.seq_len)})
            written = 0
            if self.write_rows is not None:
                starts = {fh.tell() for fh in files}
                for fh in files:
                    fh.flush()  # the headers on disk before the rows are written beside them
                if len(starts) != 1:
                    raise ValueError(f"{name}: headers of different lengths")
                written = self.write_rows([folder / f"{name}.{array_name}.npy" for array_name in ARRAY_NAMES],
                                          starts.pop())
            for block in self.blocks() if self.write_rows is None else ():
                for fh, array in zip(files, block):
                    fh.write(np.ascontiguousarray(array, dtype=np.int32).tobytes())
                written += len(block[0])
            if written != self.sequences:
                raise ValueError(f"{name}: {written} rows written, {self.sequences} expected")
        finally:
            for fh in files:
                fh.close()


def cache_dir_for(cache_root: Path, key: str) -> Path:
    return Path(cache_root) / key


def lookup(cache_root: Path, key: str) -> Path | None:
    """The cache directory for ``key`` if a complete one of this version exists."""
    directory = cache_dir_for(cache_root, key)
    try:
        meta = read_meta(directory)
    except (OSError, ValueError):
        return None
    if meta.get("version") != CACHE_VERSION or meta.get("key") != key:
        return None
    return directory


def write_cache(
    cache_root: Path,
    key: str,
    splits: Mapping[str, SplitArrays | StreamedSplit],
    *,
    seq_len: int,
    packing: bool,
    pad_id: int,
    eos_id: int | None,
    extra_meta: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``splits`` under ``<cache_root>/<key>`` atomically; returns the directory.

    ``extra_files``: text files written beside the arrays (``{name: text}``, e.g. a prompt method's
    records with the columns its rewards read), read back with :func:`read_extra_file`.
    Built in a temporary sibling folder and renamed into place. If another process finished
    the same key first, its copy is kept (same key, same content) and ours is discarded.
    """
    if "train" not in splits:
        raise ValueError("a cache needs a 'train' split")
    for name, split in splits.items():
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        split.check(name, seq_len)

    cache_root = Path(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_dir_for(cache_root, key)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=cache_root))
    try:
        for name, split in splits.items():
            if isinstance(split, StreamedSplit):
                split.write(tmp, name)
                continue
            for array_name in ARRAY_NAMES:
                array = np.ascontiguousarray(getattr(split, array_name), dtype=np.int32)
                np.save(tmp / f"{name}.{array_name}.npy", array, allow_pickle=False)
            for array_name, array in split.extra.items():
                np.save(tmp / f"{name}.{array_name}.npy", np.ascontiguousarray(array, dtype=np.int32), allow_pickle=False)
        for file_name, text in (extra_files or {}).items():
            if "/" in file_name or file_name in (META_FILE,) or file_name.endswith(".npy"):
                raise ValueError(f"extra file {file_name!r}: a plain name beside the arrays, not one of theirs")
            (tmp / file_name).write_text(text, encoding="utf-8")
        meta = {
            **dict(extra_meta or {}),
            "version": CACHE_VERSION,
            "key": key,
            "seq_len": int(seq_len),
            "packing": bool(packing),
            "pad_id": int(pad_id),
            "eos_id": None if eos_id is None else int(eos_id),
            "splits": {name: split.stats() for name, split in splits.items()},
            "extra_arrays": sorted({array_name for split in splits.values() for array_name in split.extra}),
            "extra_files": sorted(extra_files or {}),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        os.chmod(tmp, 0o777 & ~current_umask())
        try:
            os.rename(tmp, final)
        except OSError:
            if lookup(cache_root, key) is None:
                # A stale, incomplete directory of the same name: replace it.
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# --- reading ------------------------------------------------------------------------


def read_meta(cache_dir: Path) -> dict[str, Any]:
    path = Path(cache_dir) / META_FILE
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def read_extra_file(cache_dir: Path, name: str) -> str:
    """A text file :func:`write_cache` wrote beside the arrays (``extra_files``)."""
    return (Path(cache_dir) / name).read_text(encoding="utf-8")


@dataclass
class TokenSplit:
    """One split of a cache, memory-mapped: rows are read from disk only when touched."""

    name: str
    input_ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray
    meta: dict[str, Any] = field(repr=False)
    extra: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # meta["extra_arrays"]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def stats(self) -> dict[str, int]:
        return self.meta["splits"][self.name]


def open_split(cache_dir: Path, split: str = "train") -> TokenSplit:
    """Memory-map ``split`` of the cache at ``cache_dir``; FileNotFoundError if it is absent."""
    cache_dir = Path(cache_dir)
    meta = read_meta(cache_dir)
    if split not in meta.get("splits", {}):
        raise FileNotFoundError(f"{cache_dir}: no {split!r} split (has {sorted(meta.get('splits', {}))})")
    arrays = {
        name: np.load(cache_dir / f"{split}.{name}.npy", mmap_mode="r", allow_pickle=False)
        for name in ARRAY_NAMES
    }
    extra = {
        name: np.load(cache_dir / f"{split}.{name}.npy", mmap_mode="r", allow_pickle=False)
        for name in meta.get("extra_arrays", [])
    }
    return TokenSplit(name=split, meta=meta, extra=extra, **arrays)


def has_split(cache_dir: Path, split: str) -> bool:
    try:
        return split in read_meta(cache_dir).get("splits", {})
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class RankData:
    """A prepared cache as the ranks see it."""

    cache_dir: Path
    seq_len: int
    train_rows: int
    val_rows: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_val(self) -> bool:
        return self.val_rows > 0

    @classmethod
    def from_cache(cls, cache_dir: Path) -> "RankData":
        cache_dir = Path(cache_dir).absolute()
        meta = read_meta(cache_dir)
        splits = meta.get("splits", {})
        return cls(
            cache_dir=cache_dir,
            seq_len=int(meta["seq_len"]),
            train_rows=int(splits.get("train", {}).get("sequences", 0)),
            val_rows=int(splits.get("val", {}).get("sequences", 0)),
            meta=meta,
        )
