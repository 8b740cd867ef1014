"""The root cause of a failed run, read from torchrun's stream and the ranks' own logs.

The answer is one line: the exception that ends the first traceback of the rank torchrun names
as first to fail (torchrun's ``ChildFailedError`` and interrupts skipped), a command-line parse
error a rank printed without a traceback (torchtitan's flags are parsed by tyro: ``Unrecognized
options: ...``), or a known fatal runtime message (out of memory, NeuronCores busy, ...).
Pure text; used by :mod:`trnqwen.train.launcher`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional, Sequence

_RANK_PREFIX = re.compile(r"^\s*\[(?:[A-Za-z_]*\d+|[A-Za-z_]+)\]\s*:\s?")
_TRACEBACK_START = "Traceback (most recent call last):"
# Lines that mean something even without a traceback (device runtimes, the OOM killer).
_KNOWN_FATAL = re.compile(
    r"(NeuronCore\(s\) not available|Failed to alloc(ate)? DEVICE memory|NCC_E[A-Z]+\d+|NRT:nrt_init|"
    r"NEFF version mismatch|is not compatible with the installed aws-neuron|CUDA out of memory|"
    r"out of memory|Segmentation fault|Killed)"
)
_TORCHRUN_ROOT_CAUSE_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_TORCHRUN_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def clean_line(line: str) -> str:
    """A log line without ANSI colours and without the torchrun ``[rankN]:`` prefix."""
    from trnqwen.contract.stepline import strip_ansi

    text = strip_ansi(line).rstrip("\r\n")
    return _RANK_PREFIX.sub("", text, count=1)


def root_cause(lines: Iterable[str]) -> Optional[str]:
    """The first real error in a log: the exception line that ends the first traceback.

    torchrun's own traceback (``ChildFailedError``, which only says that a child failed) and
    ``KeyboardInterrupt`` are skipped.  Without any traceback, a known fatal runtime message
    (Neuron/CUDA out of memory, NeuronCores busy, ...) is the answer.
    """
    in_tb = False
    fatal: Optional[str] = None
    wrapper: Optional[str] = None  # torch.distributed.checkpoint wraps each rank's real error
    box: Optional[list[str]] = None  # a command-line parse error (tyro's box): no traceback, exit 2
    parse_error: Optional[str] = None
    # an item may hold several lines (a captured block): the answer is always one line
    for raw in (piece for item in lines for piece in item.splitlines()):
        text = clean_line(raw)
        line = text.strip()
        if not line:
            continue
        if parse_error is None and line.startswith("\u256d\u2500"):  # ╭─ Unrecognized options ───╮
            box = []
            continue
        if box is not None:
            if line.startswith("\u2570"):  # ╰───╯: the box ends
                parse_error, box = _parse_error_line(box), None
            else:
                box.append(line.strip("\u2502 "))  # │ ... │
            continue
        if line.startswith(_TRACEBACK_START):
            in_tb = True
            continue
        if in_tb:
            if text[:1] in (" ", "\t") or line.startswith(("^", "~")):
                continue  # a frame, its source line or a caret marker
            in_tb = False
            if line.startswith(("The above exception", "During handling of")):
                continue
            if "ChildFailedError" in line or line.startswith(("KeyboardInterrupt", "SystemExit")):
                continue
            if "CheckpointException" in line:  # the rank's own traceback follows it
                wrapper = wrapper or line
                continue
            return line
        if fatal is None and _KNOWN_FATAL.search(line) and "torch/distributed/elastic" not in line:
            fatal = line
    if box:  # a log cut off inside the box
        parse_error = _parse_error_line(box)
    return wrapper or parse_error or fatal


def _parse_error_line(box: list[str]) -> Optional[str]:
    """tyro's parse-error box (torchtitan's command line) as one line: what is wrong, and its suggestion.

    ``Unrecognized options: --metrics.log_freqq, 5 (perhaps you meant --metrics.log-freq)``.
    """
    rows = [row for row in box if row and not set(row) <= set("\u2500 ")]
    if not rows:
        return None
    first = rows[0]
    if "Perhaps you meant:" in rows:
        after = rows[rows.index("Perhaps you meant:") + 1:]
        guess = next((row.split()[0] for row in after if row.startswith("-")), None)
        if guess:
            first += f" (perhaps you meant {guess})"
    return first


def torchrun_root_cause(lines: Iterable[str]) -> tuple[Optional[str], Optional[str], Optional[int]]:
    """(global rank, local rank, exit code) that torchrun's failure summary names under "Root
    Cause (first observed failure)"; None for what it does not say."""
    rank = local_rank = exitcode = None
    after = False
    for raw in lines:
        line = clean_line(raw)
        if "Root Cause" in line:
            after = True
            continue
        if not after:
            continue
        m = _TORCHRUN_ROOT_CAUSE_RANK.search(line)
        if m and rank is None:
            rank, local_rank = m.group(1), m.group(2)
        m = _TORCHRUN_EXITCODE.search(line)
        if m and exitcode is None:
            exitcode = int(m.group(1))
    return rank, local_rank, exitcode


def rank_log_files(log_dir: Optional[Path], local_rank: Optional[str] = None) -> list[Path]:
    """The tee'd per-rank logs torchrun wrote under ``--log-dir`` (``.../attempt_N/<rank>/std*.log``)."""
    if log_dir is None or not Path(log_dir).is_dir():
        return []
    pattern = f"**/attempt_*/{local_rank}/std*.log" if local_rank is not None else "**/attempt_*/*/std*.log"
    # stderr first: that is where tracebacks go.
    return sorted(Path(log_dir).glob(pattern), key=lambda p: (p.parent.parent.name, p.parent.name, p.name != "stderr.log"))


def _cause_in_files(files: Iterable[Path]) -> Optional[str]:
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        cause = root_cause(text.splitlines())
        if cause:
            return cause
    return None


def failure_cause(stream_lines: Sequence[str], rank_log_dir: Optional[Path] = None) -> Optional[str]:
    """The root-cause line of a failed run.

    1. the rank torchrun saw fail first: its own tee'd log;
    2. the first traceback in the console stream (rank 0);
    3. any rank's log;
    4. no error text anywhere: what torchrun's summary says of that rank (:func:`silent_failure`).
    """
    rank, local_rank, exitcode = torchrun_root_cause(stream_lines)
    if local_rank is not None:
        cause = _cause_in_files(rank_log_files(rank_log_dir, local_rank))
        if cause:
            return cause
    return (root_cause(stream_lines) or _cause_in_files(rank_log_files(rank_log_dir))
            or silent_failure(rank, local_rank, exitcode, rank_log_dir))


def silent_failure(rank: Optional[str], local_rank: Optional[str], exitcode: Optional[int],
                   rank_log_dir: Optional[Path] = None) -> Optional[str]:
    """What torchrun's failure summary says of a rank that ended without any error text: which
    rank, its exit code or the signal that killed it, and the last line that rank logged (the
    place it stopped). None when torchrun printed no summary."""
    if rank is None or exitcode is None:
        return None
    if exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name}" + (" (the out-of-memory killer, or a kill -9)" if name == "SIGKILL" else "")
    else:
        how = f"exited with code {exitcode} without a Python error"
    last = _last_logged_line(rank_log_files(rank_log_dir, local_rank))
    return f"rank {rank} {how}" + (f"; the last line it logged: {last}" if last else "")


def _last_logged_line(files: Iterable[Path]) -> Optional[str]:
    """The newest non-blank, non-warning line of a rank's logs (stdout and stderr: the later wins)."""
    best: Optional[tuple[float, str]] = None
    for path in files:
        try:
            lines = [clean_line(x).strip() for x in path.read_text(errors="replace").splitlines()]
            mtime = path.stat().st_mtime
        except OSError:
            continue
        lines = [x for x in lines if x and "Warning" not in x and not x.startswith(("warnings.warn", "if ", "torch."))]
        if lines and (best is None or mtime > best[0]):
            best = (mtime, lines[-1][:300])
    return best[1] if best else None
