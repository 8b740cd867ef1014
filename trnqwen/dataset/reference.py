"""Reference log-probs (a preference method's starting weights), stored with the token cache they were computed on (numpy only).

``<cache_dir>/reference/<key>/``::

    meta.json        {"key", "splits": {name: {"rows", "pairs_per_row", "computed"}}, "seconds", ...}
    <split>.npy      float32 [rows, pairs_per_row, 2]: summed log-probs of (chosen, rejected);
                     rows past ``computed`` are NaN (a short run computes only the rows it reads)

Rows are computed as a prefix: a run of S steps reads rows ``0 .. S x global batch - 1`` of its
first epoch, in cache order, so a short run on a big set pays only for what it trains on, and a
later run from the same weights that reads further extends the prefix before its step 1.

The key (the method's plan: its ``reference_key``) names the starting weights and everything that
changes their numbers (backend, layout, precision), so a second run from the same weights on the
same cache reuses the pass, a resumed run finds its own, and other weights never match.  Written
under a temporary name and renamed: a reader never sees half a reference.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

REFERENCE_DIR = "reference"
META = "meta.json"


def reference_dir(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / REFERENCE_DIR / key


def read_meta(directory: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((Path(directory) / META).read_text())
    except (OSError, ValueError):
        return None


def prefix_rows(n_rows: int, steps: int, rows_per_step: int) -> int:
    """Rows of the first epoch a run of ``steps`` reads (all of them once it passes an epoch)."""
    return min(int(n_rows), int(steps) * int(rows_per_step))


def computed_rows(directory: Path) -> dict[str, int]:
    """Per split, how many leading rows hold reference log-probs (none when there is no reference)."""
    meta = read_meta(directory) or {}
    return {name: int(info.get("computed", info.get("rows", 0))) for name, info in meta.get("splits", {}).items()
            if (Path(directory) / f"{name}.npy").is_file()}


def is_complete(directory: Path, needed: dict[str, int]) -> bool:
    have = computed_rows(directory)
    return all(have.get(name, 0) >= rows for name, rows in needed.items())


def open_reference(directory: Path, split: str) -> np.ndarray:
    return np.load(Path(directory) / f"{split}.npy", mmap_mode="r", allow_pickle=False)


def write_reference(directory: Path, arrays: dict[str, np.ndarray], computed: dict[str, int], meta: dict[str, Any]) -> Path:
    """Write every split's array and the meta atomically (a complete folder or none)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name[:16]}.", suffix=".tmp", dir=directory.parent))
    try:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
        splits = {name: {"rows": int(a.shape[0]), "pairs_per_row": int(a.shape[1]), "computed": int(computed[name])}
                  for name, a in arrays.items()}
        (tmp / META).write_text(json.dumps({**meta, "key": directory.name, "splits": splits}, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        if directory.exists():
            shutil.rmtree(directory)  # a shorter prefix, extended now (its rows are in ``arrays``)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
