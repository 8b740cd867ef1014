"""A run's metrics stream (:mod:`trnqwen.contract.metrics_stream`) as a log's steps and validations.

trnqwen's own runs write ``<run dir>/metrics.jsonl``: every value of every step and validation by
name.  When a run directory has one, its steps and validations come from it (the last record of a
step wins, as in the stream's own reader) and the text log gives what only it has (overrides,
tracebacks, the model's identity, preemption and resume marks, the ``[LoRA]`` line...).  A step
keeps its text log line where the log has that step, so findings still point at lines.

Every value beyond the step line's reaches ``--json``, ``--csv``, the table, the plot and
``--follow`` by name, with no list of names here: a value named ``<method>/<name>`` of a run whose
method is ``<method>`` (the stream's header, else run.json) is shown as ``<name>`` (``<method>/margin``
is ``margin``, as the method's own text line calls it), any other name as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trnqwen.contract.metrics_stream import FILE_NAME, STEP_CORE, VALIDATION_CORE, Record, StreamReader, latest
from trnqwen.logs.record import ParsedLog
from trnqwen.logs.steps import StepTable


def stream_of(run_dir: Optional[Path]) -> Optional[Path]:
    """The run's metrics stream, when it has one."""
    path = Path(run_dir) / FILE_NAME if run_dir is not None else None
    return path if path is not None and path.is_file() else None


class StreamSteps:
    """The records read so far (:meth:`add`), as step rows and validation records."""

    def __init__(self, method: Optional[str] = None):
        self.method = method
        self.records: list[Record] = []

    def add(self, records: list[Record]) -> None:
        for rec in records:
            if rec.kind == "header" and rec.meta.get("method"):
                self.method = str(rec.meta["method"])
        self.records.extend(records)

    def name(self, name: str, core: tuple) -> str:
        head, _, tail = name.partition("/")
        return tail if self.method and head == self.method and tail and tail not in core else name

    def steps(self, lines: Optional[dict] = None) -> dict[int, dict]:
        """step -> row: the core values, then the others by name (``line``: the text log's)."""
        out = {}
        for step, rec in latest(self.records, "step").items():
            row = {"step": step, **{k: rec.values.get(k) for k in STEP_CORE}}
            tps = row.get("tps")
            if isinstance(tps, float) and tps.is_integer():
                row["tps"] = int(tps)
            row.update((self.name(k, STEP_CORE), v) for k, v in rec.values.items() if k not in STEP_CORE)
            row["line"] = (lines or {}).get(step)
            out[step] = row
        return out

    def validations(self) -> list[dict]:
        return [{"step": step, **{k: rec.values.get(k) for k in VALIDATION_CORE},
                 **{self.name(k, VALIDATION_CORE): v for k, v in rec.values.items() if k not in VALIDATION_CORE},
                 "line": None} for step, rec in latest(self.records, "validation").items()]

    def apply(self, log: ParsedLog, path: Path) -> None:
        """Replace ``log``'s steps and validations with the stream's."""
        steps = self.steps({row["step"]: row["line"] for row in log.steps.rows()})
        table = StepTable()
        names: dict[str, None] = {}
        values = {}
        for step, row in steps.items():
            table.append(row)
            if extra := {k: v for k, v in row.items() if k not in STEP_CORE and k not in ("step", "line")}:
                values[step] = extra
                names.update(dict.fromkeys(extra))
        log.steps, log.values, log.value_names = table, values, list(names)
        text = {v["step"]: v for v in log.validations}  # what only the text log's lines have (their line, a method's own)
        log.validations = [{"line": None, **text.get(v["step"], {}), **{k: x for k, x in v.items() if k != "line"}}
                           for v in self.validations()]
        log.metrics_stream = str(path)


def run_method(record) -> Optional[str]:
    """The method run.json's config names (the stream's header says it too)."""
    cfg = getattr(record, "config", None)
    return cfg.get("method") if isinstance(cfg, dict) and isinstance(cfg.get("method"), str) else None


def read_into(log: ParsedLog, run_dir: Optional[Path], record=None) -> bool:
    """Steps and validations from the run's stream, when it has one with any step; True then."""
    path = stream_of(run_dir)
    if path is None:
        return False
    stream = StreamSteps(run_method(record))
    stream.add(StreamReader(path).poll())
    if not any(rec.kind == "step" for rec in stream.records):
        return False
    stream.apply(log, path)
    return True
