"""``inspect-logs`` as library calls: read a log (file, stdin, run dir), judge it, follow it live.

The CLI module only maps flags onto :func:`inspect_input` / :func:`follow`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Optional

from trnqwen.contract.metrics_stream import StreamReader
from trnqwen.errors import CheckFailed, UsageError
from trnqwen.logs.identity import with_identity
from trnqwen.logs.judge import Finding, judge
from trnqwen.logs.engine import CHUNK_SIZE, LogParser, parse
from trnqwen.logs.patterns import no_peak_flops
from trnqwen.logs.record import ParsedLog
from trnqwen.logs.sources import LogInput, RunContext, run_context
from trnqwen.logs.stream import StreamSteps, read_into, run_method, stream_of
from trnqwen.rundir import RunRecord


@dataclass
class Inspection:
    log: ParsedLog
    ctx: RunContext
    findings: list[Finding]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


# compressed logs: magic bytes -> (name, the standard library module that reads it); zstd has none
_COMPRESSED = {b"\x1f\x8b": ("gzip", "gzip"), b"BZh": ("bzip2", "bz2"), b"\xfd7zXZ\x00": ("xz", "lzma"),
               b"\x28\xb5\x2f\xfd": ("zstd", None)}


def _compression(head: bytes) -> Optional[tuple[str, Optional[str]]]:
    found = next((kind for magic, kind in _COMPRESSED.items() if head.startswith(magic)), None)
    if found is not None and found[1] is None:
        raise UsageError("the log is zstd-compressed, which trnqwen cannot read", hint="decompress it first: zstd -d FILE.zst")
    return found


def _read(stream: BinaryIO, label: str, chunk_size: int) -> ParsedLog:
    """Parse a log stream to its end (bounded memory, one process), gzip/bzip2/xz decompressed as
    it is read."""
    import importlib
    import lzma
    import zlib

    kind = None
    try:
        found = _compression(stream.peek(6)[:6]) if hasattr(stream, "peek") else None
        kind = found and found[0]
        return parse(importlib.import_module(found[1]).open(stream) if found else stream, label, chunk_size=chunk_size)
    except EOFError:
        raise UsageError(f"{label} is a cut-off {kind} file (it ends before its end-of-stream marker)",
                         hint="copy the whole file again, or pass the uncompressed log") from None
    except (OSError, zlib.error, lzma.LZMAError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        if kind:  # gzip.BadGzipFile and friends are OSErrors too: corrupt data, not a read failure
            raise UsageError(f"{label} is not valid {kind} data: {why}",
                             hint="pass the log itself, or a complete .gz/.bz2/.xz of it") from None
        if not isinstance(exc, OSError):
            raise
        raise CheckFailed(f"could not read {label}: {why}", hint="check the file and try again") from None


def read_log(inp: LogInput, *, stdin: Optional[BinaryIO] = None, chunk_size: int = CHUNK_SIZE, live: bool = False) -> ParsedLog:
    """Parse the whole log (read-only, binary, bounded memory; gzip, bzip2 and xz decompressed)
    and refuse what is not a log (``live``: the run is still starting, an empty log is fine); a
    run directory's metrics stream gives the steps and validations (:mod:`trnqwen.logs.stream`)."""
    if live and inp.path is not None and not inp.path.exists():  # a starting run has no train.log yet
        log = ParsedLog(source=inp.label)
        read_into(log, inp.run_dir, inp.record)
        return log
    if inp.is_stdin:
        log = _read(stdin if stdin is not None else sys.stdin.buffer, inp.label, chunk_size)
    else:
        try:
            fh = open(inp.path, "rb")
        except IsADirectoryError:
            raise UsageError(f"{inp.label} is a directory", hint="pass a log file or a run directory") from None
        except OSError as exc:
            raise UsageError(f"cannot open {inp.label}: {exc.strerror or exc}", hint="check the path and its permissions") from None
        with fh:
            log = _read(fh, inp.label, chunk_size)
    streamed = read_into(log, inp.run_dir, inp.record)
    check_readable(log, live=live or streamed)
    return log


def check_readable(log: ParsedLog, *, live: bool = False) -> None:
    """Clear messages (usage errors: the input is not a log) for an empty, binary or foreign
    file; ``live`` (run.json says the run is starting or running): empty or not yet recognizable
    is fine, the judge says it is starting."""
    if log.bytes_read == 0 and not live:
        raise UsageError(f"{log.source} is empty", hint="the run may not have started yet; check the path or use --follow")
    if log.looks_binary:
        raise UsageError(f"{log.source} does not look like a text log ({log.nul_bytes} NUL bytes, {log.invalid_utf8_lines} "
                         "non-UTF-8 line(s))", hint="pass the training log (train.log or torchrun's output; .gz, .bz2 and .xz "
                         "are read too), not a binary file")
    if log.recognized_lines == 0 and not live:
        raise UsageError(f"{log.source} has no torchtitan or torchrun log lines ({log.lines} line(s) read)",
                         hint="pass the output of a torchtitan run (e.g. <run dir>/train.log)")


def inspect_input(inp: LogInput, *, expect_layers: Optional[int] = None, vocab_size: Optional[int] = None,
                  finetune: Optional[bool] = None, stdin: Optional[BinaryIO] = None) -> Inspection:
    rec = inp.record
    log = read_log(inp, stdin=stdin, live=rec is not None and rec.status in ("created", "running") and rec.ended_at is None)
    return judge_log(log, inp, expect_layers=expect_layers, vocab_size=vocab_size, finetune=finetune)


def judge_log(log: ParsedLog, inp: Optional[LogInput], *, expect_layers: Optional[int] = None,
              vocab_size: Optional[int] = None, finetune: Optional[bool] = None) -> Inspection:
    ctx = run_context(inp, expect_layers=expect_layers, vocab_size=vocab_size, finetune=finetune)
    ctx = with_identity(log, ctx)
    return Inspection(log=log, ctx=ctx, findings=judge(log, ctx))


# ---------------------------------------------------------------------------------------------
# --follow


def _record_ended(inp: LogInput) -> bool:
    try:
        return inp.run_dir is not None and RunRecord.load(inp.run_dir).status not in ("created", "running")
    except Exception:  # being rewritten (atomic rename) or gone: try again next poll
        return False


def follow(inp: LogInput, *, on_step: Callable[[dict], None], poll_s: float = 0.5, idle_timeout_s: float = 600.0,
           sleep: Callable[[float], None] = time.sleep, chunk_size: int = 1 << 20,
           on_validation: Optional[Callable[[dict], None]] = None, **judge_kw) -> Inspection:
    """Watch a growing log: report each new step through ``on_step`` and each validation through
    ``on_validation`` (a step's ``mfu`` is None when torchtitan knew no peak for the device);
    stop when the run record says the run ended, when a log without a record shows the run
    finished or failed, after ``idle_timeout_s`` with no new bytes (then the result has a
    ``stalled`` error finding), or on Ctrl-C (KeyboardInterrupt returns what was read).
    Memory stays bounded: the parser keeps per-step records, not lines."""
    path, stdin = inp.path, inp.is_stdin
    kind = None
    if not stdin:
        with contextlib.suppress(OSError), open(path, "rb") as probe:
            kind = _compression(probe.read(6))
    if kind:
        raise UsageError(f"{inp.label} is {kind[0]}-compressed: a compressed log does not grow", hint="drop --follow to read it")
    emitter = _Emitter(on_step, on_validation)
    parser = LogParser(inp.label)
    stream = StreamSteps(run_method(inp.record))  # the run's metrics stream, once it has one
    reader = None
    idle_since = time.monotonic()
    stalled: Optional[float] = None
    fh = sys.stdin.buffer if stdin else None  # stdin: read to its end, each block's steps reported
    try:
        while True:
            if fh is None and path.exists():
                fh = open(path, "rb")
            grew = False
            if fh is not None:
                try:
                    truncated = not stdin and os.fstat(fh.fileno()).st_size < fh.tell()
                except OSError:
                    truncated = False
                if truncated:  # or replaced: start over
                    parser = LogParser(inp.label)
                    emitter = _Emitter(on_step, on_validation)
                    fh.seek(0)
                grew = _drain(fh, parser, chunk_size, (lambda: emitter.emit(parser.log, parser.current_steps())) if stdin else None) > 0
            if reader is None and stream_of(inp.run_dir) is not None:
                reader = StreamReader(stream_of(inp.run_dir))
            new = reader.poll() if reader is not None else []
            stream.add(new)
            grew = grew or bool(new)
            if any(rec.kind == "step" for rec in stream.records):
                emitter.emit(parser.log, stream.steps(), stream.validations())
            elif fh is not None:
                emitter.emit(parser.log, parser.current_steps())
            if stdin:  # at its end
                break
            now = time.monotonic()
            if grew:
                idle_since = now
            ended = parser.log.completed_line or parser.log.torchrun_failure.get("summary_line")  # a log without a record
            if _record_ended(inp) or (inp.run_dir is None and ended):
                # one last read for lines written just before the record was updated
                if fh is not None:
                    _drain(fh, parser, chunk_size)
                break
            if now - idle_since > idle_timeout_s:
                stalled = now - idle_since
                break
            sleep(poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        if fh is not None and not stdin:
            fh.close()
    log = parser.close()
    streamed = read_into(log, inp.run_dir, inp.record)
    emitter.emit(log, log.steps)
    if stdin:
        check_readable(log)
    elif log.bytes_read == 0 and stalled is None and not streamed:
        raise CheckFailed(f"{inp.label} stayed empty", hint="is the run writing to this file?")
    result = judge_log(log, inp, **judge_kw) if log.bytes_read or streamed else Inspection(log, run_context(inp), [])
    if stalled is not None:
        where = f"after step {max(log.steps)}" if log.steps else "before any step"
        result.findings.insert(0, Finding(
            "error", "stalled",
            f"no new log line for {stalled:.0f} s (--idle-timeout {idle_timeout_s:g}) {where}, and the run had not ended: "
            "stopped following. Is it hung? (check its processes; a long silent phase such as Neuron compilation "
            "needs a larger --idle-timeout)", [log.lines] if log.lines else []))
    return result


def _drain(fh: BinaryIO, parser: LogParser, chunk_size: int, each: Optional[Callable[[], None]] = None) -> int:
    """Feed ``parser`` what ``fh`` has now (``each`` after every block); the bytes read."""
    n = 0
    read = getattr(fh, "read1", fh.read)
    while block := read(chunk_size):
        n += len(block)
        parser.feed(block)
        if each is not None:
            each()
    return n


class _Emitter:
    """Calls ``on_step`` for steps above the last one reported, ``on_validation`` for new
    validation results, in order."""

    def __init__(self, on_step: Callable[[dict], None], on_validation: Optional[Callable[[dict], None]]):
        self.on_step, self.on_validation = on_step, on_validation
        self.printed = self.validations = 0  # the last step reported, the validations reported

    def emit(self, log: ParsedLog, steps, validations: Optional[list] = None) -> None:
        vals = log.validations if validations is None else validations
        pending = vals[self.validations:] if self.on_validation is not None else []
        self.validations = len(vals)
        no_mfu = no_peak_flops(log) is not None
        top = max(steps) if steps else self.printed
        new = sorted(s for s in steps if s > self.printed) if top > self.printed else []
        # in step order: a validation after step N is reported after step N's line
        k = 0
        for step in new:
            while k < len(pending) and pending[k]["step"] < step:
                self.on_validation(pending[k])
                k += 1
            rec = steps[step]
            if log.values.get(step):  # the metrics stream's other values, by name
                rec = {**rec, **log.values[step]}
            self.on_step(dict(rec, mfu=None) if no_mfu else rec)
        for v in pending[k:]:
            self.on_validation(v)
        self.printed = max(self.printed, top)
