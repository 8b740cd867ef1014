"""The per-step series as compact columns, not a dict per step.

A 200k-step log held as one dict per step costs about 120 MB and a second of allocation; as
``array`` columns it is 16 MB, and the judge and the JSON writer read whole columns (numpy views,
no copy).  :class:`StepTable` still answers like the old ``{step: record}`` dict
(``log.steps[3]["loss"]``, ``3 in log.steps``, ``max(log.steps)``), building a row on demand.

Rows keep the last value of each step (a restarted run logs a step twice) in step order.
A missing value (a field absent from the line, ``mfu: N/A``) is NaN in its column and its row
index is in ``missing[field]``, so it reads back as None, never as NaN.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping
from typing import Iterator, Optional

from trnqwen.contract.stepline import STEP_FIELDS

VALUE_FIELDS = STEP_FIELDS[1:]  # float columns
_NAN = float("nan")


def _tps(v: float):
    return int(v) if v.is_integer() else v


class StepTable(Mapping):
    """step -> record (a dict with ``STEP_FIELDS`` and ``line``)."""

    def __init__(self) -> None:
        self.step = array("q")
        self.line = array("q")  # 0: no log line (a step of the metrics stream the text log lacks)
        self.cols: dict[str, array] = {name: array("d") for name in VALUE_FIELDS}
        self.missing: dict[str, set] = {name: set() for name in VALUE_FIELDS}
        self._ordered = True  # steps strictly increasing, no duplicates

    # -- writing -------------------------------------------------------------------------------

    def append(self, rec: dict) -> None:
        """One record (from the per-line parser)."""
        line = rec.get("line")
        self.extend([rec["step"]], [line if isinstance(line, int) and line > 0 else 0],
                    {name: [rec.get(name)] for name in VALUE_FIELDS})

    def extend(self, steps: list, lines: list, values: dict) -> None:
        """Many rows at once: equally long lists of each column (None: absent)."""
        n = len(self.step)
        if n and steps[0] <= self.step[-1] or any(a >= b for a, b in zip(steps, steps[1:])):
            self._ordered = False
        self.step.extend(steps)
        self.line.extend(lines)
        for name in VALUE_FIELDS:
            col = values[name]
            if None in col:
                self.missing[name].update(n + i for i, v in enumerate(col) if v is None)
                col = [_NAN if v is None else v for v in col]
            self.cols[name].extend(col)

    def compact(self) -> None:
        """Keep the last row of each step, in step order."""
        if self._ordered:
            return
        last = {s: i for i, s in enumerate(self.step)}  # each step's last row
        keep = [last[s] for s in sorted(last)]
        remap = {old: new for new, old in enumerate(keep)}
        self.step = array("q", (self.step[i] for i in keep))
        self.line = array("q", (self.line[i] for i in keep))
        for name in VALUE_FIELDS:
            col = self.cols[name]
            self.cols[name] = array("d", (col[i] for i in keep))
            self.missing[name] = {remap[i] for i in self.missing[name] if i in remap}
        self._ordered = True

    # -- reading -------------------------------------------------------------------------------

    def value(self, name: str, i: int):
        """Row ``i``'s ``name`` as the old records held it (None when absent; tps int when whole)."""
        if name == "step":
            return self.step[i]
        if i in self.missing[name]:
            return None
        v = self.cols[name][i]
        return _tps(v) if name == "tps" else v

    def row(self, i: int) -> dict:
        return {**{name: self.value(name, i) for name in STEP_FIELDS}, "line": self.line[i] or None}

    def index(self, step: int) -> Optional[int]:
        self.compact()
        i = bisect_left(self.step, step)
        return i if i < len(self.step) and self.step[i] == step else None

    def rows(self) -> Iterator[dict]:
        self.compact()
        return (self.row(i) for i in range(len(self.step)))

    def np(self, name: str):
        """A column as a numpy array (a view, no copy); ``step``/``line`` as int64."""
        import numpy as np

        self.compact()
        col, dtype = (getattr(self, name), np.int64) if name in ("step", "line") else (self.cols[name], np.float64)
        return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype)

    def present(self, name: str):
        """Boolean numpy mask: the value was logged (not absent / N/A)."""
        import numpy as np

        mask = np.ones(len(self.step), dtype=bool)
        mask[list(self.missing[name])] = False
        return mask

    def finite(self, name: str):
        """(row indices, values) of the rows whose ``name`` was logged and is finite (numpy)."""
        import numpy as np

        values = self.np(name)
        rows = np.flatnonzero(np.isfinite(values))
        return rows, values[rows]

    def __getitem__(self, step: int) -> dict:
        i = self.index(step)
        if i is None:
            raise KeyError(step)
        return self.row(i)

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.index(step) is not None

    def __iter__(self) -> Iterator[int]:
        self.compact()
        return iter(self.step)

    def __len__(self) -> int:
        self.compact()
        return len(self.step)
