"""The streaming engine: raw bytes in (any chunking), a :class:`~trnqwen.logs.record.ParsedLog` out.

Input comes in binary chunks and is cut at newlines; lines are capped at ``max_line`` bytes, so a
2 GB line costs no more memory than a short one.  Every line is read one by one (:meth:`LogParser._line`)
with one exception, for logs where every rank prints its step lines (a by-hand torchrun of 8 or 64
ranks; trnqwen's own launcher keeps rank 0's): once the primary rank (rank 0, or the unprefixed
stream) is known, a span of about 16 KB that holds only step lines behind the prefix of a rank
already seen (:meth:`LogParser._quiet`: as many ``step:`` and ``loss:`` as lines, no validation)
is summarized as the per-line reader would record it: the other ranks' lines counted, each rank's
last step and its highest memory above 90%; the primary rank's exact step lines are checked per
batch and converted per column (:meth:`_step_columns`).  A span with anything else is read line by
line, and from a traceback or a resume on, the rest of the region too.

What each line means lives elsewhere: the step line in :mod:`~trnqwen.contract.stepline`, every other
kind in :mod:`~trnqwen.logs.patterns`, tracebacks and torchrun's summary in
:mod:`~trnqwen.logs.tracebacks`.  This module only routes lines to them.
"""

from __future__ import annotations

import io
import re
from itertools import compress, count, repeat
from operator import lt
from typing import BinaryIO, Optional, Union

from trnqwen.logs.patterns import (
    APPLIED_RE, B_PREFIX_RE, C10_RE, FAILED_RE, GLOG_LEVELS, GLOG_RE, HEADER_RE, NO_REPLACEMENT_RE, PYWARN_RE, TRACEBACK_START,
    LineAt, info_table, normalize, parse_override_line, read_info_line, split_prefix,
)
from trnqwen.logs.record import HIGH_MEMORY_PCT, ParsedLog, first_rank
from trnqwen.contract.stepline import ANSI_RE, parse_step_line, parse_validation_line
from trnqwen.logs.tracebacks import Tracebacks, TorchrunSummary

MAX_LINE = 1 << 20  # bytes kept of any one line
PERCENT_RE = re.compile(rb"(?:^| )([^ %]*)%[^ ]*")  # each token's text before its first %
HIGH_RE = re.compile(rb"GiB\((?:9|100)")  # a memory percent of 90 or more (a search: 3x faster than two `in`s)
COLOURED_STEP_RE = re.compile(rb"\x1b\[[0-9;]{0,20}mstep:")  # a colour code glued to step: (as fast_step allows)
RESUMED_RE = re.compile(r"\[trnqwen\] resumed run \S+ from step (\d+)")
PREEMPTED_RE = re.compile(r"\[trnqwen\] preempted: (.+?) at step (\d+)")
CHUNK_SIZE = 1 << 20  # a block read at a time (bigger blocks fall out of the CPU cache)
SPAN = 1 << 14  # bytes of a region checked at once for step lines only (_quiet); any other, line by line
MAX_KEPT = 200  # distinct warnings / error lines kept
NUL_SCAN_BYTES = 1 << 20  # NUL bytes are counted in the first MiB (binary-file detection)


def _fail():
    raise ValueError


def _numbers(tokens: tuple) -> list:
    """Step-line numbers with thousands commas (``1,234.5``), as ``float(t.replace(b",", b""))``
    reads each: the column's commas dropped at once."""
    out = b" ".join(tokens).replace(b",", b"").split()
    if len(out) != len(tokens):  # a token of commas only
        raise ValueError
    return list(map(float, out))


def _percents(tokens: tuple) -> list:
    """The mfu column (``4.83%`` and a colour code, or ``N/A``) as fast_step reads each: None for
    N/A, else the number before ``%``; the column at once when every token has a ``%``."""
    text = b" ".join(tokens)
    found = PERCENT_RE.findall(text) if b"N/A" not in text else ()
    if len(found) == len(tokens):
        return list(map(float, found))
    return [None if m.startswith(b"N/A") else float(m[: m.find(b"%")]) for m in tokens]


def parse(data: Union[bytes, str, BinaryIO], source: str = "", *, chunk_size: int = CHUNK_SIZE,
          max_line: int = MAX_LINE) -> ParsedLog:
    """Parse a whole log (bytes, text, or a binary stream read to its end) in bounded memory."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    parser = LogParser(source, max_line=max_line)
    read = (getattr(stream, "read1", None) if chunk_size < 65536 else None) or stream.read
    while block := read(chunk_size):
        parser.feed(block)
    return parser.close()


class LogParser:
    """Feed raw bytes in any chunking; ``close()`` returns the :class:`ParsedLog`.  ``summarize``
    False reads every line one by one (the reference the tests hold the summary to)."""

    summarize = True

    def __init__(self, source: str = "", *, max_line: int = MAX_LINE):
        self.log = ParsedLog(source=source)
        self.max_line = max(64, int(max_line))
        self.lineno = 0  # the last line read
        self.rank_prefix: dict[int, bytes] = {}  # rank -> its torchrun prefix as bytes
        self._rank_of: dict[bytes, int] = {}  # and back
        self._carry = b""
        self._skipping: Optional[bytes] = None  # head of an overlong line being skipped
        self._primary_decided = False
        self._primary_prefix: Optional[bytes] = None
        self._pending: dict[Optional[int], list[dict]] = {}
        self._last_primary_step: Optional[int] = None
        self._tracebacks = Tracebacks(self.log)
        self._torchrun = TorchrunSummary(self.log)
        self._info = info_table()  # the informational lines, the registered methods' with them
        self.closed = False

    # -- byte level ---------------------------------------------------------------------------

    def feed(self, block: bytes) -> None:
        if not block:
            return
        log = self.log
        if log.bytes_read < NUL_SCAN_BYTES:
            log.nul_bytes += block.count(b"\x00", 0, NUL_SCAN_BYTES - log.bytes_read)
        log.bytes_read += len(block)
        if self._skipping is not None:
            nl = block.find(b"\n")
            if nl < 0:
                return
            head, self._skipping = self._skipping, None
            self.lineno += 1
            log.overlong_lines.append(self.lineno)
            self._line(self.lineno, head)
            block = block[nl + 1:]
        last_nl = block.rfind(b"\n")
        if last_nl < 0:
            self._carry += block
        else:
            self._region(b"".join((self._carry, memoryview(block)[:last_nl])))  # one copy, not two
            self._carry = block[last_nl + 1:]
        if len(self._carry) > self.max_line:
            self._skipping = self._carry[: self.max_line]
            self._carry = b""

    def current_steps(self) -> dict[int, dict]:
        """Steps so far, for a live view (before the primary rank is settled: the lowest rank's)."""
        if self._primary_decided or not self._pending:
            return self.log.steps
        return {rec["step"]: rec for rec in self._pending[first_rank(self._pending)]}

    def close(self) -> ParsedLog:
        if self.closed:
            return self.log
        self.closed = True
        tail = self._carry if self._skipping is None else self._skipping  # the last line, with no newline
        if tail or self._skipping is not None:
            self.lineno += 1
            if self._skipping is not None:
                self.log.overlong_lines.append(self.lineno)
            self.log.ends_mid_line = True
            self._line(self.lineno, tail)
            self._skipping, self._carry = None, b""
        self._decide_primary()
        self.log.lines = self.lineno
        self._tracebacks.close_all()
        return self.log

    def _region(self, buf: bytes) -> None:
        """The whole lines of ``buf`` (newline-separated, none after the last)."""
        base = self.lineno + 1
        pp = self._primary_prefix
        if pp is None or not self.summarize or self._tracebacks.any_open():
            self._each(buf.split(b"\n"), base)
            return
        known = tuple(self.rank_prefix.values())
        high = HIGH_RE.search(buf) is not None
        check = b"validate" in buf or not buf.isascii()
        lineno = base
        primary: list = []  # (line, bytes behind the prefix) of the primary rank, read in runs (_primaries)
        start = 0
        while start <= len(buf):
            end = buf.find(b"\n", start + SPAN)  # a span: about SPAN bytes, cut after a line
            span = buf[start:] if end < 0 else buf[start:end]
            quiet = self._quiet(span, known, primary, lineno, high, check)
            if quiet:
                lineno += quiet
            else:  # line by line; from a crash or a resume on (they change how the lines after read), the rest
                self._primaries(primary)
                rest = b"Traceback" in span or b"[trnqwen] resumed" in span
                if rest and start:
                    self.lineno = lineno - 1
                    self._last_steps(buf[:start - 1])
                lines = (buf[start:] if rest else span).split(b"\n")
                self._each(lines, lineno)
                if rest:
                    return
                lineno += len(lines)
            start = len(buf) + 1 if end < 0 else end + 1
        self._primaries(primary)
        self.lineno = lineno - 1
        self._last_steps(buf)

    def _quiet(self, span: bytes, known: tuple, primary: list, lineno: int, high: bool, check: bool) -> int:
        """A span of only step lines, each behind the prefix of a rank already seen: the other ranks'
        lines summarized, the primary rank's queued, and its line count returned; 0 (anything else
        in it): read it line by line."""
        lines = span.split(b"\n")
        if not (len(span) <= self.max_line and span.count(b"step:") == len(lines) == span.count(b"loss:")
                and all(map(bytes.startswith, lines, repeat(known)))
                and not (check and (b"validate" in span or not span.isascii()))):
            return 0
        pp = self._primary_prefix
        mine = list(map(bytes.startswith, lines, repeat(pp)))
        heads = [raw[len(pp):] for raw in compress(lines, mine)]
        self.log.recognized_lines += len(lines) - len(heads)
        if high:
            self._high_memory(lines, lineno)
        primary.extend(zip(compress(count(lineno), mine), heads))
        return len(lines)

    def _primaries(self, batch: list) -> None:
        """The primary rank's queued lines of a region, in order: as columns when every one is
        torchtitan's exact step line (what :func:`~trnqwen.contract.stepline.fast_step` reads), else
        one by one."""
        if not batch:
            return
        pp = self._primary_prefix
        raws = [raw for _, raw in batch]
        text = b"\n".join(raws)
        n = len(raws)
        if not (text.count(b"step:") == n == text.count(b"loss:") and text.isascii() and b"validate" not in text
                and b"\r" not in text and pp not in text and max(map(len, raws)) + len(pp) <= self.max_line
                and text.count(b" step:") + len(COLOURED_STEP_RE.findall(text)) == n  # nothing but a colour glued to step:
                and self._step_columns(batch)):
            for lineno, raw in batch:
                self._line(lineno, pp + raw)
        batch.clear()

    def _step_columns(self, run: list) -> bool:
        """Step lines of the primary rank (from ``step:`` on) as columns, as fast_step reads each;
        False (nothing read) when one line is off its layout."""
        try:
            rows = [raw[raw.find(b"step:"):].split() for _, raw in run]
            width = len(rows[0])
            if width not in (14, 16) or set(map(len, rows)) != {width}:
                raise ValueError
            cols = list(zip(*rows))
            for k, key in ((2, b"loss:"), (4, b"grad_norm:"), (6, b"memory:"), (8, b"tps:"), (10, b"tflops:"),
                           (12, b"mfu:"), *(((14, b"lr:"),) if width == 16 else ())):
                if not all(map(bytes.endswith, set(cols[k]), repeat(key))):  # the distinct keys (one colour each)
                    raise ValueError
            mem = [m.partition(b"GiB(") for m in cols[7]]
            tps = _numbers(cols[9])
            values = {
                "loss": list(map(float, cols[3])), "grad_norm": list(map(float, cols[5])),
                "memory_gib": [float(a) for a, g, _ in mem if g or _fail()],
                "memory_pct": [float(b[: b.index(b"%")]) for _, _, b in mem],
                "tps": [int(t) if t.is_integer() else t for t in tps],
                "tflops": _numbers(cols[11]),
                "mfu": _percents(cols[13]),
                "lr": list(map(float, cols[15])) if width == 16 else [None] * len(rows),
            }
            steps = list(map(int, cols[1]))
        except ValueError:
            return False
        lines = [lineno for lineno, _ in run]
        log = self.log
        log.recognized_lines += len(steps)
        last = self._last_primary_step
        if last is not None and steps[0] <= last or not all(map(lt, steps, steps[1:])):
            for step, line in zip(steps, lines):
                if last is not None and step <= last:
                    log.restarts.append(line)
                last = step
        self._last_primary_step = steps[-1]
        rank = log.primary_rank
        self.note_rank_step(rank, steps[-1], lines[-1])
        pct = values["memory_pct"]
        top = max(filter(HIGH_MEMORY_PCT.__le__, pct), default=None)  # the first maximum, as _step keeps it
        if top is not None:
            i = pct.index(top)
            self.note_memory(rank, steps[i], values["memory_gib"][i], top, lines[i])
        log.steps.extend(steps, lines, values)
        return True

    def _each(self, lines: list, base: int) -> None:
        for lineno, raw in enumerate(lines, base):
            self._line(lineno, raw)
            if not self._primary_decided and self._pending and self._ready_to_decide(lineno):
                self._decide_primary()
        self.lineno = base + len(lines) - 1

    def _high_memory(self, lines: list, base: int) -> None:
        """Summarized step lines above 90% memory: each rank's first highest (as :meth:`_step`)."""
        high = self.log.rank_high_memory
        for lineno, raw in enumerate(lines, base):
            g = raw.find(b"GiB(")
            if g < 0:
                continue
            try:
                pct = float(raw[g + 4: raw.index(b"%", g)])
            except ValueError:
                pct = None
            if pct is not None and pct < HIGH_MEMORY_PCT:
                continue
            rank = self._rank_of.get(raw[: raw.index(b"]:") + 2])
            if rank == self.log.primary_rank:  # its lines are read as steps (_primaries)
                continue
            prev = high.get(rank)
            if pct is None or prev is None or pct > prev["pct"]:
                rank, body = split_prefix(raw.decode("ascii"))
                rec = parse_step_line(body)
                if rec is not None and (rec.get("memory_pct") or 0) >= HIGH_MEMORY_PCT:
                    self.note_memory(rank, rec["step"], rec.get("memory_gib"), rec["memory_pct"], lineno)

    def _last_steps(self, buf: bytes) -> None:
        """Each other rank's last step line in ``buf`` (summarized lines included); ``buf``'s last
        line is ``self.lineno``."""
        for rank, prefix in self.rank_prefix.items():
            if rank == self.log.primary_rank:
                continue
            end = len(buf)
            while True:
                at = buf.rfind(b"\n" + prefix, 0, end)
                if at < 0 and not buf.startswith(prefix):
                    break
                stop = buf.find(b"\n", at + 1)
                _, body = split_prefix(buf[at + 1: len(buf) if stop < 0 else stop].decode("utf-8", "replace"))
                if "loss:" in body and "step:" in body and "validate step:" not in body:
                    rec = parse_step_line(body)
                    if rec is not None:
                        self.note_rank_step(rank, rec["step"], self.lineno - buf.count(b"\n", at + 1))
                        break
                if at < 0:
                    break
                end = at

    def _ready_to_decide(self, lineno: int) -> bool:
        steps = {rec["step"] for recs in self._pending.values() for rec in recs[:2]}
        first_line = min(recs[0]["line"] for recs in self._pending.values())
        return len(steps) > 1 or lineno - first_line > 4096

    # -- line level ----------------------------------------------------------------------------

    def _line(self, lineno: int, raw: bytes) -> None:
        log = self.log
        if len(raw) > self.max_line:
            raw = raw[: self.max_line]
            if not log.overlong_lines or log.overlong_lines[-1] != lineno:
                log.overlong_lines.append(lineno)
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            log.invalid_utf8_lines += 1
            if log.first_invalid_utf8_line is None:
                log.first_invalid_utf8_line = lineno
        rank, body = split_prefix(text)
        if rank is not None and rank not in log.ranks:
            log.ranks.add(rank)
            pm = B_PREFIX_RE.match(raw)
            if pm is not None and rank not in self.rank_prefix:
                self.rank_prefix[rank] = pm.group(0)
                self._rank_of[pm.group(0)] = rank
        tb_open = self._tracebacks.is_open(rank)
        if not tb_open and "loss:" in body and "step:" in body and "validate step:" not in body:
            rec = parse_step_line(body)
            if rec is not None:
                log.recognized_lines += 1
                self._step(lineno, rank, rec)
                return
        if "\x1b" in body:
            body = ANSI_RE.sub("", body)
        if "[trnqwen] " in body and self._trnqwen_mark(lineno, rank, body):
            return
        if tb_open:
            if self._tracebacks.line(rank, body, lineno):
                return
        header = HEADER_RE.search(body) if "[titan]" in body else None
        if header is not None:
            log.recognized_lines += 1
            self._message(lineno, rank, header.group("level"), header.group("msg"))
            return
        stripped = body.strip()
        if not stripped:
            return
        if stripped.startswith(TRACEBACK_START):
            log.recognized_lines += 1
            self._tracebacks.open(rank, body, lineno)
            return
        g = GLOG_RE.match(stripped) or C10_RE.match(stripped)
        if g is not None:
            log.recognized_lines += 1
            self._message(lineno, rank, GLOG_LEVELS[g.group("level")], g.group("msg"), glog=True)
            return
        w = PYWARN_RE.match(stripped)
        if w is not None:
            log.recognized_lines += 1
            self._warning(lineno, f"{w.group('cat')}: {w.group('msg')}")
            return
        if rank is None and self._torchrun.line(stripped, lineno):
            log.recognized_lines += 1
            return
        # A line without torchtitan's header (another logger, a bare print): still look for
        # the structured content.
        if self._message(lineno, rank, None, body):
            log.recognized_lines += 1

    def _trnqwen_mark(self, lineno: int, rank: Optional[int], body: str) -> bool:
        """trnqwen's own resume/preemption lines (trnqwen.train.resume, trnqwen.runtime.resume_state):
        a resumed run is one run with resumes, not a restart."""
        m = RESUMED_RE.search(body)
        if m is not None and rank is None:
            self.log.resumes.append({"from_step": int(m.group(1)), "line": lineno})
            # The processes start again: what describes the set-up (overrides applied, ranks, the
            # world size) is the new attempt's; steps and findings so far stay.
            log = self.log
            log.overrides, log.applied, log.override_no_match = {}, {}, []
            log.world_size_hints, log.ranks, log.rank_last_step = {}, set(), {}
            # the stopped attempt's end (torchrun's SignalException, a crash) was dealt with by resuming
            log.tracebacks, log.torchrun_failure, log.override_calls = {}, {}, {}
            self._tracebacks, self._torchrun = Tracebacks(log), TorchrunSummary(log)
        else:
            m = PREEMPTED_RE.search(body)
            if m is None or rank not in (None, 0):
                return False
            self.log.preempted.append({"step": int(m.group(2)), "signal": m.group(1), "line": lineno})
        self.log.recognized_lines += 1
        return True

    def _message(self, lineno: int, rank: Optional[int], level: Optional[str], msg: str, glog: bool = False) -> bool:
        """Interpret one message; True when it was something known."""
        log = self.log
        if "step:" in msg:
            if "validate step:" in msg:
                rec = parse_validation_line(msg)
                if rec is not None:
                    if self._is_primary(rank):
                        rec["line"] = lineno
                        log.validations.append(rec)
                    return True
            else:
                rec = parse_step_line(msg)
                if rec is not None:
                    self._step(lineno, rank, rec)
                    return True
        if "[Override]" in msg:
            rec = parse_override_line(msg)
            if rec is not None:
                rec["line"] = lineno
                log.overrides.setdefault(rank, []).append(rec)
                return True
        if "override(s)" in msg:
            m = APPLIED_RE.search(msg)
            if m is not None:
                log.applied.setdefault(rank, []).append((int(m.group(1)), lineno))
                return True
        if level in ("WARNING", "WARN"):
            m = NO_REPLACEMENT_RE.search(msg)
            if m is not None and self._is_primary(rank):
                log.override_no_match.append({"imports": m.group("imports"), "line": lineno})
            if not glog or not msg.strip().startswith("*****"):
                self._warning(lineno, msg)
            if "Ran out of data" in msg and self._is_primary(rank):
                log.ran_out_of_data_line = lineno
            return True
        if level in ("ERROR", "CRITICAL", "FATAL"):
            self._error(lineno, rank, msg)
            if glog:
                fm = FAILED_RE.search(msg)
                if fm is not None:
                    log.torchrun_failure.setdefault("failed", []).append(
                        {"local_rank": int(fm.group("rank")), "exitcode": int(fm.group("code")), "line": lineno})
            return True
        known = read_info_line(log, msg, LineAt(lineno, rank, self._is_primary(rank)), self._info)
        # Bare lines: only structured content counts as recognized.
        return known if level is None and not glog else True

    def _warning(self, lineno: int, msg: str) -> None:
        log = self.log
        if not msg.strip():
            return
        log.warning_count += 1
        key = normalize(msg)
        entry = log.warnings.get(key)
        if entry is None:
            if len(log.warnings) >= MAX_KEPT:
                return
            entry = log.warnings[key] = {"text": msg.strip()[:500], "count": 0, "line": lineno}
        entry["count"] += 1

    def _error(self, lineno: int, rank: Optional[int], msg: str) -> None:
        log = self.log
        log.error_count += 1
        if len(log.errors) < MAX_KEPT:
            log.errors.append({"line": lineno, "rank": rank, "text": msg.strip()[:500]})

    # -- steps and ranks -----------------------------------------------------------------------

    def _is_primary(self, rank: Optional[int]) -> bool:
        if not self._primary_decided:
            return rank is None or rank == 0 or rank == min(self.log.ranks, default=rank)
        return rank == self.log.primary_rank

    def _step(self, lineno: int, rank: Optional[int], rec: dict) -> None:
        rec["line"] = lineno
        if rank is not None:
            self.note_rank_step(rank, rec["step"], lineno)
            pct = rec.get("memory_pct")
            if pct is not None and pct >= HIGH_MEMORY_PCT:
                self.note_memory(rank, rec["step"], rec.get("memory_gib"), pct, lineno)
        if not self._primary_decided:
            self._pending.setdefault(rank, []).append(rec)
        elif rank == self.log.primary_rank:
            self._store_primary(rec)

    def _store_primary(self, rec: dict) -> None:
        last = self._last_primary_step
        if last is not None and rec["step"] <= last:
            self.log.restarts.append(rec["line"])
        self._last_primary_step = rec["step"]
        self.log.steps.append(rec)

    def _decide_primary(self) -> None:
        if self._primary_decided or not self._pending:
            return
        primary = first_rank(self._pending)
        log = self.log
        log.primary_rank = primary
        for rec in self._pending[primary]:
            self._store_primary(rec)
        self._pending.clear()
        self._primary_decided = True
        self._primary_prefix = None if primary is None else self.rank_prefix.get(primary)

    def note_rank_step(self, rank: int, step: int, lineno: int) -> None:
        prev = self.log.rank_last_step.get(rank)
        if prev is None or lineno >= prev[1]:
            self.log.rank_last_step[rank] = (step, lineno)

    def note_memory(self, rank: int, step: int, gib: Optional[float], pct: Optional[float], lineno: int) -> None:
        if pct is None:
            return
        prev = self.log.rank_high_memory.get(rank)
        if prev is None or pct > prev["pct"]:
            self.log.rank_high_memory[rank] = {"pct": pct, "gib": gib, "step": step, "line": lineno}
