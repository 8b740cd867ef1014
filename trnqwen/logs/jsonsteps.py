"""``--json``'s ``steps`` array: the row dicts' rules (:func:`step_rows`) and the streaming
encoder that writes the same text column-wise (:class:`StepRowsJSON`).

The encoder never builds a dict per step: each column becomes a list of JSON texts (C-level
``map``; a column that repeats formats each distinct value once, and a column of one value is
merged into the key texts around it), and a batch of rows is one ``str.join`` over the columns
interleaved with those texts.  Rows that are not plain finite numbers (NaN/Inf, absent values, filled-in steps) go
through :func:`_step_row` and ``json.dumps``.  The text equals ``json.dumps(step_rows(log))``.
(Encoding half of the rows in a forked child was tried: on two cores the copy-on-write faults
on both sides cost what it saved.)
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any, Iterator

from trnqwen.logs.record import ParsedLog
from trnqwen.logs.stepline import STEP_FIELDS

def _num(x: Any) -> Any:
    """JSON-safe number: NaN/Inf become null (JSON has no such numbers; see ``nonfinite``)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _nonfinite_name(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _step_row(s: dict) -> dict:
    row = {name: _num(s.get(name)) for name in STEP_FIELDS}
    bad = {name: _nonfinite_name(s[name]) for name in STEP_FIELDS
           if isinstance(s.get(name), float) and not math.isfinite(s[name])}
    if bad:
        row["nonfinite"] = bad
    row["line"] = s.get("line")
    if s.get("source"):
        row["source"] = s["source"]
    return row


def step_rows(log: ParsedLog) -> list[dict]:
    """``--json`` steps: numbers or null; a NaN/Inf value is null plus ``nonfinite``
    ``{"loss": "nan"}``; ``line`` is the log line (null when filled in from TensorBoard)."""
    return [_step_row(s) for s in log.steps.rows()]


def _json_number(v: float, name: str) -> str:
    """json.dumps of a finite column value as the row dict holds it (tps an int when whole)."""
    return repr(int(v)) if name == "tps" and v.is_integer() else repr(v)


class StepRowsJSON:
    """The ``steps`` array of ``--json`` as text chunks (:meth:`chunks`), equal to
    ``json.dumps(step_rows(log))``."""

    BATCH = 16384
    # before each value of a row: '{"step": ', ', "loss": ', ... ', "line": '
    _KEYS = ["{" + f'"{STEP_FIELDS[0]}": '] + [f', "{name}": ' for name in (*STEP_FIELDS[1:], "line")]

    def __init__(self, log: ParsedLog):
        self.table = log.steps

    def chunks(self) -> Iterator[str]:
        import numpy as np

        t = self.table
        n = len(t)
        slow = set(t.source)
        for name in STEP_FIELDS[1:]:
            slow.update(np.flatnonzero(~np.isfinite(t.np(name))).tolist())
        yield "["
        for lo in range(0, n, self.BATCH):
            yield self._batch(lo, min(n, lo + self.BATCH), slow)
        yield "]"

    @staticmethod
    def _texts(col, name: str) -> list:
        """The JSON text of each value of ``col`` (NaN rows are rewritten by the caller).  A
        column whose values repeat (memory, tps, tflops, mfu, grad norm: a sample of 256 says)
        formats each distinct bit pattern once and takes the texts by index (numpy's unique on
        the bits, so -0.0 keeps its own text); a column of distinct values (loss, lr) formats each."""
        import numpy as np

        values = np.frombuffer(col, np.float64)
        if len(set(col[:256])) == min(256, len(col)):
            uniq, inverse = values, None
        else:
            bits, inverse = np.unique(values.view(np.int64), return_inverse=True)
            uniq = bits.view(np.float64)
        if name == "tps" and bool(((np.abs(uniq) < 2.0**53) & (np.trunc(uniq) == uniq)).all()):  # whole: int texts
            texts = list(map(int.__repr__, uniq.astype(np.int64).tolist()))
        elif name == "tps":
            texts = list(map(_json_number, uniq.tolist(), repeat(name)))
        else:
            texts = list(map(float.__repr__, uniq.tolist()))
        if inverse is None:
            return texts
        return np.array(texts, dtype=object)[inverse.reshape(-1)].tolist()

    def _batch(self, lo: int, hi: int, slow: set) -> str:
        import json

        import numpy as np

        t = self.table
        rows = hi - lo
        # the row as texts that are the same on every row (keys, columns of one value), merged,
        # and columns (lists of texts): '{"step": ', steps, ', "loss": ', losses, ...
        layout: list = [self._KEYS[0], list(map(int.__repr__, t.step[lo:hi]))]
        for key, name in zip(self._KEYS[1:], STEP_FIELDS[1:]):
            col = t.cols[name][lo:hi]
            first = col[0]
            bits = np.frombuffer(col, np.int64)
            if (bits == bits[0]).all():  # one value, bit for bit (0.0 and -0.0 print differently)
                layout.append(key + _json_number(first, name))
                continue
            layout.append(key)
            layout.append(self._texts(col, name))
        layout += [self._KEYS[-1], list(map(int.__repr__, t.line[lo:hi]))]
        merged: list = []
        for item in layout:
            if isinstance(item, str) and merged and isinstance(merged[-1], str):
                merged[-1] += item
            else:
                merged.append(item)
        width = len(merged)  # texts per row
        parts = [""] * (width * rows)
        for k, item in enumerate(merged):
            if isinstance(item, str):
                parts[k::width] = [item] * rows if k else ["}, " + item] * rows  # a row closes the one before
            else:
                parts[k::width] = item
        parts[0] = merged[0]  # the batch's first row: no row before it to close
        for i in sorted(x for x in slow if lo <= x < hi):
            r = (i - lo) * width
            parts[r:r + width] = [("}, " if r else "") + json.dumps(_step_row(t.row(i)))[:-1]] + [""] * (width - 1)
        return (", " if lo else "") + "".join(parts) + "}"
