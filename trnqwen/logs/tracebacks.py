"""Following a crash through the log: Python tracebacks per rank (ranks interleave, so each rank
has its own open traceback) and torchrun's failure summary.  Results go to
``ParsedLog.tracebacks`` and ``ParsedLog.torchrun_failure``; :func:`trnqwen.logs.judge.root_cause`
reads them."""

from __future__ import annotations

from typing import Optional

from trnqwen.logs.patterns import EXC_LINE_RE, HEADER_RE, TR_EXIT_RE, TR_RANK_RE, TRACEBACK_START
from trnqwen.logs.record import ParsedLog


class Tracebacks:
    """Open traceback state per rank; a traceback ends at its exception line (the first line
    indented no deeper than ``Traceback (most recent call last):`` that is not a frame) or at the
    next torchtitan log line."""

    def __init__(self, log: ParsedLog):
        self.log = log
        self._state: dict[Optional[int], dict] = {}

    def any_open(self) -> bool:
        return any(s.get("open") for s in self._state.values())

    def is_open(self, rank: Optional[int]) -> bool:
        return bool(self._state.get(rank, {}).get("open"))

    def open(self, rank: Optional[int], body: str, lineno: int) -> None:
        state = self._state.setdefault(rank, {"count": 0})
        if not state.get("open"):
            state["count"] += 1
        state.update(open=True, indent=len(body) - len(body.lstrip()), start=state.get("start") or lineno)

    def line(self, rank: Optional[int], body: str, lineno: int) -> bool:
        """Consume a line of ``rank``'s open traceback; False when the traceback ended before it
        (the line is then read as an ordinary line)."""
        state = self._state[rank]
        stripped = body.strip()
        indent = len(body) - len(body.lstrip())
        if not stripped or indent > state["indent"] or stripped.startswith((TRACEBACK_START, "File ", "^", "~")):
            return True  # a frame, or a chained traceback's first line
        if "[titan]" in body and HEADER_RE.search(body):
            self._close(rank, state, None, None)
            return False
        if stripped.startswith(("The above exception was", "During handling of the above exception")):
            return True
        # the exception line
        self._close(rank, state, stripped, lineno)
        return True

    def close_all(self) -> None:
        for rank, state in self._state.items():
            if state.get("open"):
                self._close(rank, state, None, None)

    def _close(self, rank: Optional[int], state: dict, text: Optional[str], lineno: Optional[int]) -> None:
        state["open"] = False
        entry = self.log.tracebacks.setdefault(rank, {"count": 0, "first_root": None, "last": None, "start": None})
        entry["count"] = state.get("count", 1)
        entry["start"] = entry["start"] or state.get("start")
        if text is not None:
            entry["last"] = rec = {"line": lineno, "text": text[:500]}
            entry["first_root"] = entry["first_root"] or rec
            self.log.recognized_lines += 1


class TorchrunSummary:
    """torchrun's closing report (``... FAILED``, ``Root Cause (first observed failure):``,
    ``rank :``, ``exitcode :``, ``traceback :``), read from unprefixed lines."""

    def __init__(self, log: ParsedLog):
        self.log = log
        self._in_root_cause = False

    def line(self, stripped: str, lineno: int) -> bool:
        """True when ``stripped`` belongs to the summary."""
        fail = self.log.torchrun_failure
        if stripped.startswith("Root Cause (first observed failure)"):
            self._in_root_cause = True
            fail["root_cause_line"] = lineno
            return True
        if stripped.endswith(" FAILED") and not stripped.startswith("["):
            fail.setdefault("summary_line", lineno)
            return True
        if self._in_root_cause:
            if stripped.startswith("===="):
                self._in_root_cause = False
                return True
            for regex, key in ((TR_RANK_RE, "root_cause_rank"), (TR_EXIT_RE, "exitcode")):
                if m := regex.match(stripped):
                    fail[key] = int(m.group(1))
                    return True
            if EXC_LINE_RE.match(stripped):
                fail["error"] = stripped[:500]
            return True
        return False
