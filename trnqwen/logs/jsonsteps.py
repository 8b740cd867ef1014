"""``--json``'s ``steps`` array: the row dicts' rules (:func:`step_rows`) and the streaming
encoder that writes the same text column-wise (:class:`StepRowsJSON`).

The encoder never builds a dict per step: each column becomes a list of JSON texts (C-level
``map``; a column that repeats formats each distinct value once, and a column of one value is
merged into the key texts around it), and a batch of rows is one ``str.join`` over the columns
interleaved with those texts.  Rows that are not plain finite numbers (NaN/Inf, absent values, filled-in steps) go
through :func:`_step_row` and ``json.dumps``.  The text equals ``json.dumps(step_rows(log))``.
A DPO run's rows also carry its ``[DPO]`` values (:data:`trnqwen.logs.dpo.FIELDS`, after ``lr``);
other runs' rows are as they were.
A long array (:data:`SPLIT_ROWS`) is made in two halves at once, the second in a forked child
that writes it itself (:meth:`StepRowsJSON.write`, :mod:`trnqwen.logs.halves`): 0.24 s -> 0.15 s
on the 200k-step benchmark log.  (Sending the child's half back through a pipe had cost what the
second core saved.)
"""

from __future__ import annotations

import math
from array import array
from itertools import repeat
from typing import Any, Iterator

from trnqwen.methods.dpo import log_lines as dpo
from trnqwen.logs.record import ParsedLog
from trnqwen.logs.stepline import STEP_FIELDS

_NAN = float("nan")
SPLIT_ROWS = 50_000  # from here the text is made in two processes at once (about 9 MB of JSON)


def _num(x: Any) -> Any:
    """JSON-safe number: NaN/Inf become null (JSON has no such numbers; see ``nonfinite``)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _nonfinite_name(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def row_fields(log: ParsedLog) -> tuple[str, ...]:
    """The value keys of a ``--json`` step row: the step line's, then a DPO run's ``[DPO]`` values."""
    return (*STEP_FIELDS, *(dpo.FIELDS if dpo.step_values(log) else ()))


def _with_dpo(log: ParsedLog, s: dict) -> dict:
    """A step table row with its step's ``[DPO]`` values (None where the step logged none)."""
    values = dpo.step_values(log).get(s["step"], {})
    return {**s, **{name: values.get(name) for name in dpo.FIELDS}}


def _step_row(s: dict, fields: tuple[str, ...] = STEP_FIELDS) -> dict:
    row = {name: _num(s.get(name)) for name in fields}
    bad = {name: _nonfinite_name(s[name]) for name in fields
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
    fields = row_fields(log)
    if fields == STEP_FIELDS:
        return [_step_row(s) for s in log.steps.rows()]
    return [_step_row(_with_dpo(log, s), fields) for s in log.steps.rows()]


def _json_number(v: float, name: str) -> str:
    """json.dumps of a finite column value as the row dict holds it (tps an int when whole)."""
    return repr(int(v)) if name == "tps" and v.is_integer() else repr(v)


class StepRowsJSON:
    """The ``steps`` array of ``--json`` as text chunks (:meth:`chunks`), equal to
    ``json.dumps(step_rows(log))``."""

    BATCH = 16384

    def __init__(self, log: ParsedLog):
        self.log = log
        self.table = log.steps
        self.fields = row_fields(log)
        # before each value of a row: '{"step": ', ', "loss": ', ... ', "line": '
        self._KEYS = ["{" + f'"{self.fields[0]}": '] + [f', "{name}": ' for name in (*self.fields[1:], "line")]
        self.cols: dict = {}

    def chunks(self) -> Iterator[str]:
        slow = self._prepare()
        yield "["
        yield from self._rows(0, len(self.table), slow)
        yield "]"

    def write(self, out) -> None:
        """Write the array to ``out``; a long one (:data:`SPLIT_ROWS`) with a descriptor, on a
        machine with a core to spare, in two halves made at once (:mod:`trnqwen.logs.halves`)."""
        from trnqwen.logs import halves, parallel

        n = len(self.table)
        if n < SPLIT_ROWS or not halves.usable(out) or not parallel.cores_to_spare():
            for text in self.chunks():
                out.write(text)
            return
        slow = self._prepare()
        mid = n // 2
        out.write("[")
        halves.write(out, lambda: self._rows(0, mid, slow), lambda: self._rows(mid, n, slow))
        out.write("]")

    def _prepare(self) -> set:
        """Take the columns; the rows that are not plain finite numbers (written one by one)."""
        import numpy as np

        t = self.table
        self.cols = {name: t.cols[name] for name in STEP_FIELDS[1:]}
        if self.fields != STEP_FIELDS:  # a DPO run: its values as columns by step (NaN: none logged)
            values = dpo.step_values(self.log)
            for name in self.fields[len(STEP_FIELDS):]:
                self.cols[name] = array("d", (values[s].get(name, _NAN) if s in values else _NAN for s in t.step))
        slow = set(t.source)
        for name in self.fields[1:]:
            col = self.cols[name]
            slow.update(np.flatnonzero(~np.isfinite(np.frombuffer(col, np.float64) if len(col) else np.zeros(0))).tolist())
        return slow

    def _rows(self, lo: int, hi: int, slow: set) -> Iterator[str]:
        """Rows ``lo``..``hi`` as text (after a row before them: starting with ", ")."""
        for at in range(lo, hi, self.BATCH):
            yield self._batch(at, min(hi, at + self.BATCH), slow)

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
        for key, name in zip(self._KEYS[1:], self.fields[1:]):
            col = self.cols[name][lo:hi]
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
            row = t.row(i) if self.fields == STEP_FIELDS else _with_dpo(self.log, t.row(i))
            parts[r:r + width] = [("}, " if r else "") + json.dumps(_step_row(row, self.fields))[:-1]] + [""] * (width - 1)
        return (", " if lo else "") + "".join(parts) + "}"
