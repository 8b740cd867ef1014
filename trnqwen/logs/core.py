"""``inspect-logs`` as library calls: read a log (file, stdin, run dir), judge it, follow it live.

The CLI module only maps flags onto :func:`inspect_input` / :func:`follow`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Optional

from trnqwen.errors import CheckFailed, UsageError
from trnqwen.logs.identity import with_identity
from trnqwen.logs.judge import Finding, judge
from trnqwen.logs.parallel import read_file
from trnqwen.logs.engine import CHUNK_SIZE, MAX_LINE, LogParser
from trnqwen.logs.record import ParsedLog
from trnqwen.logs.sources import LogInput, RunContext, fill_from_tensorboard, run_context


@dataclass
class Inspection:
    log: ParsedLog
    ctx: RunContext
    findings: list[Finding]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


def read_stream(stream: BinaryIO, label: str, *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    parser = LogParser(label, max_line=max_line)
    try:
        while True:
            block = stream.read(chunk_size)
            if not block:
                break
            parser.feed(block)
    except OSError as exc:
        raise CheckFailed(f"could not read {label}: {exc.strerror or exc}", hint="check the file and try again") from None
    return parser.close()


def read_log(inp: LogInput, *, stdin: Optional[BinaryIO] = None, chunk_size: int = CHUNK_SIZE) -> ParsedLog:
    """Parse the whole log (read-only, binary, bounded memory) and refuse what is not a log."""
    if inp.is_stdin:
        stream = stdin if stdin is not None else sys.stdin.buffer
        log = read_stream(stream, inp.label, chunk_size=chunk_size)
    else:
        try:
            fh = open(inp.path, "rb")
        except IsADirectoryError:
            raise UsageError(f"{inp.label} is a directory", hint="pass a log file or a run directory") from None
        except OSError as exc:
            raise UsageError(f"cannot open {inp.label}: {exc.strerror or exc}", hint="check the path and its permissions") from None
        with fh:
            try:
                log = read_file(fh, inp.label, chunk_size=chunk_size)  # big files: on every core
            except OSError as exc:
                raise CheckFailed(f"could not read {inp.label}: {exc.strerror or exc}", hint="check the file and try again") from None
    check_readable(log)
    return log


def check_readable(log: ParsedLog) -> None:
    """Clear messages for an empty, binary or foreign file."""
    if log.bytes_read == 0:
        raise CheckFailed(f"{log.source} is empty", hint="the run may not have started yet; check the path or use --follow")
    if log.looks_binary:
        raise CheckFailed(
            f"{log.source} does not look like a text log ({log.nul_bytes} NUL bytes, {log.invalid_utf8_lines} non-UTF-8 line(s))",
            hint="pass the training log (train.log or torchrun's output), not a binary file",
        )
    if log.recognized_lines == 0:
        raise CheckFailed(
            f"{log.source} has no torchtitan or torchrun log lines ({log.lines} line(s) read)",
            hint="pass the output of a torchtitan run (e.g. <run dir>/train.log)",
        )


def inspect_input(inp: LogInput, *, expect_layers: Optional[int] = None, vocab_size: Optional[int] = None,
                  finetune: Optional[bool] = None, stdin: Optional[BinaryIO] = None) -> Inspection:
    log = read_log(inp, stdin=stdin)
    return judge_log(log, inp, expect_layers=expect_layers, vocab_size=vocab_size, finetune=finetune)


def judge_log(log: ParsedLog, inp: Optional[LogInput], *, expect_layers: Optional[int] = None,
              vocab_size: Optional[int] = None, finetune: Optional[bool] = None) -> Inspection:
    ctx = run_context(inp, expect_layers=expect_layers, vocab_size=vocab_size, finetune=finetune)
    if ctx.structured and ctx.structured.get("world_size") and "mesh" not in log.world_size_hints:
        log.world_size_hints.setdefault("structured_logs", ctx.structured["world_size"])
    if ctx.tensorboard:
        fill_from_tensorboard(log, ctx.tensorboard)
    ctx = with_identity(log, ctx)
    return Inspection(log=log, ctx=ctx, findings=judge(log, ctx))


# ---------------------------------------------------------------------------------------------
# --follow


def _record_ended(inp: LogInput) -> bool:
    if inp.run_dir is None:
        return False
    from trnqwen.rundir import RunRecord

    try:
        rec = RunRecord.load(inp.run_dir)
    except Exception:  # being rewritten (atomic rename) or gone: try again next poll
        return False
    return rec.status not in ("created", "running")


def follow(inp: LogInput, *, on_step: Callable[[dict], None], poll_s: float = 0.5, idle_timeout_s: float = 600.0,
           sleep: Callable[[float], None] = time.sleep, chunk_size: int = 1 << 20,
           **judge_kw) -> Inspection:
    """Watch a growing log: report each new step through ``on_step``; stop when the run record
    says the run ended, when a log without a record shows the run finished or failed, after
    ``idle_timeout_s`` with no new bytes, or on Ctrl-C (KeyboardInterrupt returns what was read).
    Memory stays bounded: the parser keeps per-step records, not lines."""
    if inp.is_stdin:
        parser = LogParser(inp.label)
        stream = sys.stdin.buffer
        printed = 0
        try:
            while True:
                block = stream.read1(chunk_size) if hasattr(stream, "read1") else stream.read(chunk_size)
                if not block:
                    break
                parser.feed(block)
                printed = _emit(parser.current_steps(), printed, on_step)
        except KeyboardInterrupt:
            pass
        log = parser.close()
        _emit(log.steps, printed, on_step)
        check_readable(log)
        return judge_log(log, inp, **judge_kw)

    path = inp.path
    parser = LogParser(inp.label)
    printed = 0
    pos = 0
    idle_since = time.monotonic()
    fh = None
    try:
        while True:
            if fh is None and path.exists():
                fh = open(path, "rb")
            grew = False
            if fh is not None:
                try:
                    size = os.fstat(fh.fileno()).st_size
                except OSError:
                    size = pos
                if size < pos:  # truncated or replaced: start over
                    parser = LogParser(inp.label)
                    printed = 0
                    pos = 0
                    fh.seek(0)
                while True:
                    block = fh.read(chunk_size)
                    if not block:
                        break
                    pos += len(block)
                    parser.feed(block)
                    grew = True
                printed = _emit(parser.current_steps(), printed, on_step)
            now = time.monotonic()
            if grew:
                idle_since = now
            if _record_ended(inp) or (inp.run_dir is None and _log_says_ended(parser.log)):
                # one last read for lines written just before the record was updated
                if fh is not None:
                    while True:
                        block = fh.read(chunk_size)
                        if not block:
                            break
                        parser.feed(block)
                break
            if now - idle_since > idle_timeout_s:
                break
            sleep(poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        if fh is not None:
            fh.close()
    log = parser.close()
    _emit(log.steps, printed, on_step)
    if log.bytes_read == 0:
        raise CheckFailed(f"{inp.label} stayed empty", hint="is the run writing to this file?")
    return judge_log(log, inp, **judge_kw)


def _log_says_ended(log: ParsedLog) -> bool:
    return bool(log.completed_line or log.torchrun_failure.get("summary_line"))


def _emit(steps: dict, printed: int, on_step: Callable[[dict], None]) -> int:
    """Call ``on_step`` for steps above ``printed``; returns the new high-water mark."""
    if not steps:
        return printed
    top = max(steps)
    if top <= printed:
        return printed
    for step in sorted(s for s in steps if s > printed):
        on_step(steps[step])
    return top
