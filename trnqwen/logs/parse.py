"""Parse torchtitan 0.3.0 logs: every line kind it prints, with or without ANSI colours and
torchrun prefixes (``[rank0]:``, ``[default0]:``), ranks interleaved.

Two entry points:

* :func:`parse_step_line` - one step line to a dict of numbers (the launcher's live status line).
* :class:`LogParser` - a streaming parser fed raw bytes (``feed`` / ``close``) that builds a
  :class:`ParsedLog`; :func:`parse_file` / :func:`parse_stream` wrap it.

Speed and memory: input is read in binary chunks (16 MiB) and split on newlines; lines are capped
at ``max_line`` bytes, so a 2 GB line costs no more memory than a short one.  Once the primary
rank (rank 0, or the unprefixed stream) is known, the step lines of the *other* ranks are not
decoded one by one: their loss and grad norm are global (all-reduced, identical on every rank),
and what differs per rank is read in bulk - the last step of each rank from the tail of each chunk
and memory above :data:`HIGH_MEMORY_PCT` from a byte-level regex over the chunk.  Every other line
(start-up, overrides, checkpoints, warnings, tracebacks) goes through the per-line parser, which
gives the same result as the bulk path (a test checks both ways agree).
"""

from __future__ import annotations

import math
import re
from itertools import repeat
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Optional

# ---------------------------------------------------------------------------------------------
# line-level patterns

# ESC [ ... m colour codes (torchtitan's Color class) and any other CSI sequence.
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:[0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|NaN|inf|Inf|INF|NAN)"

STEP_FIELDS = ("step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu")

_STEP_RE = re.compile(
    r"step:\s*(?P<step>\d+)"
    r"(?:\s+loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:\s+grad_norm:\s*(?P<grad_norm>" + _NUM + r"))?"
    r"(?:\s+memory:\s*(?P<memory_gib>" + _NUM + r")\s*GiB(?:\s*\(\s*(?P<memory_pct>" + _NUM + r")\s*%\s*\))?)?"
    r"(?:\s+tps:\s*(?P<tps>" + _NUM + r"))?"
    r"(?:\s+tflops:\s*(?P<tflops>" + _NUM + r"))?"
    r"(?:\s+mfu:\s*(?:(?P<mfu>" + _NUM + r")\s*%|N/A))?"
)
_VALIDATE_RE = re.compile(
    r"validate step:\s*(?P<step>\d+)"
    r"(?:\s+loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:\s+memory:\s*(?P<memory_gib>" + _NUM + r")\s*GiB(?:\s*\(\s*(?P<memory_pct>" + _NUM + r")\s*%\s*\))?)?"
    r"(?:\s+tps:\s*(?P<tps>" + _NUM + r"))?"
)
# torchrun's per-rank prefix: "[{role}{idx}]:" (role "rank" with --role rank, else "default").
_PREFIX_RE = re.compile(r"\[([A-Za-z][A-Za-z_-]{0,31})(\d{1,6})\]:")
# torchtitan's logger format: "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s".
_HEADER_RE = re.compile(
    r"\[titan\]\s+(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?)\s+-\s+(?P<logger>\S+)\s+-\s+"
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+-\s?(?P<msg>.*)$"
)
# glog-style lines from torch's C++ and torchrun ("W1129 09:54:40.879000 10898 file.py:982] msg").
_GLOG_RE = re.compile(r"(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\s]+\] ?(?P<msg>.*)$")
_C10_RE = re.compile(r"\[(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d[^\]]*\] ?(?P<msg>.*)$")
_PYWARN_RE = re.compile(r"\S+:\d+: (?P<cat>[A-Z]\w*Warning): (?P<msg>.*)$")

# [Override] NAME: FQN OLD -> NEW[ with k=v, ...]  (NAME is nki_rope in the recipe era, the
# factory's import path module.function in torchtitan 0.3.0)
_OVERRIDE_RE = re.compile(
    r"\[Override\]\s+(?P<name>[^:\s]+):\s+(?P<fqn>\S+)\s+(?P<old>\S+)\s+->\s+(?P<new>\S+?)(?:\s+with\s+(?P<kwargs>.*))?\s*$"
)
_APPLIED_RE = re.compile(r"Applied (\d+) override\(s\)")
_LAYER_RE = re.compile(r"(?:^|\.)layers(?:\.|\[)(\d+)\]?(?:\.|$)")
_NO_REPLACEMENT_RE = re.compile(r"override\.imports=(?P<imports>.*?) produced no replacements")

_BUILDING_RE = re.compile(r"^Building (?P<name>[\w.\-/]+) (?P<flavor>[\w.\-]+)\s*$")
_MODEL_SIZE_RE = re.compile(r"Model (?P<name>\S+) (?P<flavor>\S+) size: (?P<params>[\d,]+) total parameters")
_MESH_RE = re.compile(r"Building device mesh with parallelism: (?P<dims>.*)$")
_TRAINER_RE = re.compile(
    r"Trainer is initialized with local batch size (?P<local_batch>\d+), global batch size (?P<global_batch>-?\d+), "
    r"gradient accumulation steps (?P<grad_accum>\d+), sequence length (?P<seq_len>\d+), total steps (?P<steps>\d+)"
    r"(?: \(warmup (?P<warmup>\d+)\))?"
)
_VERSION_RE = re.compile(r"torchtitan version: (?P<version>\S+)")
_STARTS_RE = re.compile(r"Training starts at step (\d+)")
_WORLD_RE = re.compile(r"(?:world[ _]size|WORLD_SIZE|nproc_per_node)\s*[:=]\s*(\d+)", re.IGNORECASE)
_RANKS_RE = re.compile(r"(?:launching|starting|with) (\d+) ranks?\b", re.IGNORECASE)
_PEAK_FLOPS_RE = re.compile(r"Peak FLOPS used for computing MFU: (\S+)")

_CKPT_PATTERNS: tuple[tuple[str, "re.Pattern[str]"], ...] = (
    ("load", re.compile(r"Loading (?:from )?HF safetensors from (?:--[\w.]+: )?(?P<path>\S+)")),
    ("load", re.compile(r"Loading the checkpoint from (?P<path>\S+?)\.?$")),
    ("loaded", re.compile(r"Finished loading the checkpoint in (?P<seconds>[\d.]+) seconds")),
    ("fresh", re.compile(r"No checkpoint was provided, this is a fresh start")),
    ("save", re.compile(r"Saving a (?:model only|full) checkpoint (?:in \S+ )?at last step, step (?P<step>\d+)")),
    ("saved", re.compile(r"Last step checkpoint completed in (?P<seconds>[\d.]+)s")),
    ("saved", re.compile(r"Finished (?:saving|staging) the checkpoint in (?P<seconds>[\d.]+) seconds")),
    ("active", re.compile(r"Checkpointing active\. Checkpoints will be loaded from and saved to (?P<path>\S+)")),
    ("save", re.compile(r"^(?:Saving|Staging) the checkpoint\.")),
    ("seed", re.compile(r"Created seed checkpoint")),
)

# torchrun's failure summary ("Root Cause (first observed failure):" ... "rank : 1 (local_rank: 1)")
_TR_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_TR_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_TR_TRACE_RE = re.compile(r"^\s*traceback\s*:\s*(.*)$")
_FAILED_RE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+)")
_EXC_LINE_RE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Fault)\b(?::.*)?$")

HIGH_MEMORY_PCT = 90.0
MAX_LINE = 1 << 20  # bytes kept of any one line
CHUNK_SIZE = 16 << 20
MAX_KEPT = 200  # distinct warnings / error lines kept
NUL_SCAN_BYTES = 1 << 20  # NUL bytes are counted in the first MiB (binary-file detection)
SUB_BLOCK = 1 << 20  # fast-path granularity: a sub-block with a stray line is picked line by line


# ---------------------------------------------------------------------------------------------
# small helpers


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def to_number(text: Optional[str]) -> Optional[float]:
    """``"1,234.5"`` -> 1234.5, ``"nan"`` -> nan; None/garbage -> None."""
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _fields(m: "re.Match[str]", names: Iterable[str]) -> dict:
    out: dict = {"step": int(m.group("step"))}
    for name in names:
        out[name] = to_number(m.group(name))
    tps = out.get("tps")
    if tps is not None and math.isfinite(tps) and tps == int(tps):
        out["tps"] = int(tps)
    return out


def split_prefix(text: str) -> tuple[Optional[int], str]:
    """``"[rank3]:msg"`` -> (3, "msg"); a line without a torchrun prefix -> (None, text)."""
    if text.startswith("["):
        m = _PREFIX_RE.match(text)
        if m is not None:
            end = m.end()
            # torchrun can stack its prefix on a line the child already prefixed ("[rank0]:[rank0]:W1129 ...")
            while text.startswith(m.group(0), end):
                end += len(m.group(0))
            return int(m.group(2)), text[end:]
    return None, text


def parse_step_line(line: str) -> Optional[dict]:
    """The metrics of one training step line, or None when ``line`` is not one.

    Returns ``{"step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops",
    "mfu"}``: ``step`` an int, the rest floats (``tps`` an int when whole) or None when the
    field is absent or ``N/A``.  Validation lines (``validate step:``) are not step lines.
    Works with ANSI colour codes and torchrun prefixes (``[rank0]:``, ``[default0]:``).
    """
    i = line.find("step:")
    if i < 0:
        return None
    if line[max(0, i - 12):i].rstrip().endswith("validate"):
        return None
    fast = _fast_step(line, i)
    if fast is not None:
        return fast
    text = strip_ansi(line)
    i = text.find("step:")
    while i >= 0:
        before = text[i - 1] if i else " "
        if not (before.isalnum() or before == "_"):
            m = _STEP_RE.match(text, i)
            if m is not None and m.group("loss") is not None:
                if text[max(0, i - 9):i].rstrip().endswith("validate"):
                    return None
                return _fields(m, STEP_FIELDS[1:])
        i = text.find("step:", i + 1)
    return None


def _fast_step(line: str, i: int) -> Optional[dict]:
    """torchtitan 0.3.0's exact layout, split on whitespace (colour codes stay glued to the
    keys); None for anything else, which then goes through the regex."""
    if i and (line[i - 1].isalnum() or line[i - 1] == "_"):
        # allowed only as the end of a colour code ("\x1b[31mstep:")
        j = line.rfind("\x1b[", max(0, i - 24), i)
        if line[i - 1] != "m" or j < 0 or line[j + 2:i - 1].strip("0123456789;"):
            return None
    tok = line[i:].split()
    if (
        len(tok) != 14
        or not tok[2].endswith("loss:")
        or not tok[4].endswith("grad_norm:")
        or not tok[6].endswith("memory:")
        or not tok[8].endswith("tps:")
        or not tok[10].endswith("tflops:")
        or not tok[12].endswith("mfu:")
    ):
        return None
    mem = tok[7]
    g = mem.find("GiB(")
    if g < 0:
        return None
    mfu = tok[13]
    e = mfu.find("%")
    try:
        tps = float(tok[9].replace(",", ""))
        return {
            "step": int(tok[1]),
            "loss": float(tok[3]),
            "grad_norm": float(tok[5]),
            "memory_gib": float(mem[:g]),
            "memory_pct": float(mem[g + 4: mem.index("%", g)]),
            "tps": int(tps) if tps.is_integer() else tps,
            "tflops": float(tok[11].replace(",", "")),
            "mfu": None if mfu.startswith("N/A") else float(mfu[:e]),
        }
    except ValueError:
        return None


def parse_validation_line(line: str) -> Optional[dict]:
    """``validate step: N  loss: X  memory: ...  tps: N`` -> dict, else None."""
    if "validate step:" not in line:
        return None
    text = strip_ansi(line)
    m = _VALIDATE_RE.match(text, text.find("validate step:"))
    if m is None:
        return None
    return _fields(m, ("loss", "memory_gib", "memory_pct", "tps"))


def parse_override_line(line: str) -> Optional[dict]:
    """An ``[Override] NAME: FQN OLD -> NEW`` line -> {name, fqn, old, new, layer, kwargs}."""
    if "[Override]" not in line:
        return None
    m = _OVERRIDE_RE.search(strip_ansi(line))
    if m is None:
        return None
    layer_m = _LAYER_RE.search(m.group("fqn"))
    return {
        "name": m.group("name"),
        "fqn": m.group("fqn"),
        "old": m.group("old"),
        "new": m.group("new"),
        "kwargs": m.group("kwargs"),
        "layer": int(layer_m.group(1)) if layer_m else None,
    }


def _normalize(msg: str) -> str:
    """A message with its numbers masked, so repeated warnings group together."""
    return re.sub(r"\d+", "N", msg.strip())[:300]


# ---------------------------------------------------------------------------------------------
# the result


@dataclass
class ParsedLog:
    """Everything read from one log.  Line numbers are 1-based."""

    source: str = ""
    bytes_read: int = 0
    lines: int = 0
    recognized_lines: int = 0
    ends_mid_line: bool = False
    overlong_lines: list[int] = field(default_factory=list)
    invalid_utf8_lines: int = 0
    first_invalid_utf8_line: Optional[int] = None
    nul_bytes: int = 0
    primary_rank: Optional[int] = None
    steps: dict[int, dict] = field(default_factory=dict)  # step -> record (+ "line")
    restarts: list[int] = field(default_factory=list)  # lines where the step counter went back
    validations: list[dict] = field(default_factory=list)
    overrides: dict[Optional[int], list[dict]] = field(default_factory=dict)  # rank -> override records
    applied: dict[Optional[int], list[tuple[int, int]]] = field(default_factory=dict)  # rank -> [(n, line)]
    override_no_match: list[dict] = field(default_factory=list)
    ranks: set = field(default_factory=set)  # ranks seen in prefixes
    world_size_hints: dict[str, int] = field(default_factory=dict)
    model_name: Optional[str] = None
    model_flavor: Optional[str] = None
    model_params: Optional[int] = None
    torchtitan_version: Optional[str] = None
    trainer: dict = field(default_factory=dict)  # local_batch, global_batch, seq_len, steps, warmup
    start_step: Optional[int] = None
    completed_line: Optional[int] = None
    ran_out_of_data_line: Optional[int] = None
    checkpoint_events: list[dict] = field(default_factory=list)
    warnings: dict[str, dict] = field(default_factory=dict)  # normalized -> {text, count, line, ranks}
    warning_count: int = 0
    errors: list[dict] = field(default_factory=list)  # ERROR-level lines {line, rank, text}
    error_count: int = 0
    tracebacks: dict[Optional[int], dict] = field(default_factory=dict)  # rank -> {first_root, ...}
    torchrun_failure: dict = field(default_factory=dict)
    rank_last_step: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (step, line)
    rank_high_memory: dict[int, dict] = field(default_factory=dict)  # rank -> {pct, gib, step, line}
    filled_steps: list[int] = field(default_factory=list)  # steps added from TensorBoard (no log line)

    @property
    def world_size(self) -> Optional[int]:
        """Best evidence of the rank count: mesh/launcher lines, else the ranks seen."""
        for key in ("mesh", "launcher", "structured_logs"):
            if key in self.world_size_hints:
                return self.world_size_hints[key]
        if self.ranks:
            return max(self.ranks) + 1
        return None

    @property
    def looks_binary(self) -> bool:
        if self.bytes_read == 0:
            return False
        return self.nul_bytes > max(8, self.bytes_read // 1000) or (
            self.recognized_lines == 0 and self.invalid_utf8_lines > max(1, self.lines // 3)
        )

    def step_list(self) -> list[dict]:
        return [self.steps[k] for k in sorted(self.steps)]

    def primary_overrides(self) -> list[dict]:
        if self.primary_rank in self.overrides:
            return self.overrides[self.primary_rank]
        if not self.overrides:
            return []
        keys = sorted(self.overrides, key=lambda r: (-1 if r is None else r))
        return self.overrides[keys[0]]


# ---------------------------------------------------------------------------------------------
# the streaming parser


def _indices(values: list, value: object, out: set) -> None:
    """Add every index of ``value`` in ``values`` to ``out`` (list.index runs in C)."""
    i = -1
    index = values.index
    try:
        while True:
            i = index(value, i + 1)
            out.add(i)
    except ValueError:
        pass

_B_MEM_HIGH = re.compile(rb"\((?:9\d|100)\.\d*%\)")  # "(93.25%)": above 90% (pct <= 100)
_B_PREFIX = re.compile(rb"\[([A-Za-z][A-Za-z_-]{0,31})(\d{1,6})\]:")
_B_STEP = re.compile(rb"step:\s*(\d+)")
_B_MEM = re.compile(rb"memory:\s*([0-9.,]+)\s*GiB\(([0-9.,]+)%\)")


class LogParser:
    """Feed raw bytes in any chunking; ``close()`` returns the :class:`ParsedLog`."""

    def __init__(self, source: str = "", *, max_line: int = MAX_LINE, fast: bool = True):
        self.log = ParsedLog(source=source)
        self.fast = fast
        self.max_line = max(64, int(max_line))
        self._carry = b""
        self._skipping: Optional[bytes] = None  # head of an overlong line being skipped
        self._lineno = 0
        self._primary_decided = False
        self._primary_prefix: Optional[bytes] = None
        self._pending: dict[Optional[int], list[dict]] = {}
        self._last_primary_step: Optional[int] = None
        self._tb: dict[Optional[int], dict] = {}  # open traceback state per rank
        self._in_root_cause = False
        self._rank_prefix: dict[int, bytes] = {}
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
            head = self._skipping
            self._skipping = None
            self._lineno += 1
            log.overlong_lines.append(self._lineno)
            self._line(self._lineno, head)
            block = block[nl + 1:]
            if not block:
                return
        first_nl = block.find(b"\n")
        if first_nl < 0:
            self._carry += block
        else:
            last_nl = block.rfind(b"\n")
            if self._carry:
                # the line that straddles two blocks, on its own (no copy of the whole block)
                head = self._carry + block[:first_nl]
                self._carry = b""
                self._region(head, 0, len(head))
                if last_nl > first_nl:
                    self._region(block, first_nl + 1, last_nl)
            else:
                self._region(block, 0, last_nl)
            self._carry = block[last_nl + 1:]
        if len(self._carry) > self.max_line:
            self._skipping = self._carry[: self.max_line]
            self._carry = b""

    def current_steps(self) -> dict[int, dict]:
        """Steps so far, for a live view (before the primary rank is settled: the lowest rank's)."""
        if self._primary_decided or not self._pending:
            return self.log.steps
        key = sorted(self._pending, key=lambda r: (-1 if r is None else r))[0]
        return {rec["step"]: rec for rec in self._pending[key]}

    def close(self) -> ParsedLog:
        if self.closed:
            return self.log
        self.closed = True
        if self._skipping is not None:
            self._lineno += 1
            self.log.overlong_lines.append(self._lineno)
            self.log.ends_mid_line = True
            self._line(self._lineno, self._skipping)
            self._skipping = None
        elif self._carry:
            self.log.ends_mid_line = True
            self._lineno += 1
            self._line(self._lineno, self._carry)
            self._carry = b""
        self._decide_primary()
        self.log.lines = self._lineno
        for rank, state in self._tb.items():
            if state.get("open"):
                self._close_traceback(rank, state, None, None)
        return self.log

    def _region(self, buf: bytes, start: int, end: int) -> None:
        """The whole lines in ``buf[start:end]`` (newline-separated, none after the last)."""
        base = self._lineno + 1
        if not self._primary_decided:
            # Line by line until the primary rank is known: step lines of a second step number
            # have appeared (every rank has logged the first), or enough lines have passed.
            pos = start
            lineno = base
            while True:
                stop = buf.find(b"\n", pos, end)
                last = stop < 0
                if last:
                    stop = end
                self._lineno = lineno
                self._line(lineno, buf[pos:stop])
                lineno += 1
                pos = stop + 1
                if self._pending and self._ready_to_decide(lineno - 1):
                    self._decide_primary()
                    if not last:
                        self._region_decided(buf, pos, end, lineno)
                    return
                if last:
                    return
        self._region_decided(buf, start, end, base)

    def _region_decided(self, buf: bytes, start: int, end: int, base: int) -> None:
        """Lines ``base``.. of ``buf[start:end]``; sets ``self._lineno`` to the last one."""
        prefix = self._primary_prefix
        if (
            prefix is None
            or not self.fast
            or any(s.get("open") for s in self._tb.values())
            or buf.find(b"Traceback (most recent call last)", start, end) >= 0
        ):
            self._slow(buf, start, end, base)
            return
        # Fast path.  Every line goes through _line except the step lines of other ranks
        # (lines with "loss:" that don't start with the primary rank's prefix), which are read
        # in bulk by _bulk_other_ranks.  A sub-block where every line is a step line (as many
        # "loss:" and "step:" as lines) needs only its primary lines, found with bytes.find;
        # otherwise the lines to feed are picked with C-level passes (map + list.index).
        feed = self._line
        needle = b"\n" + prefix
        pos = start
        lineno = base
        while pos <= end:
            sub_end = buf.find(b"\n", min(pos + SUB_BLOCK, end), end) if pos + SUB_BLOCK < end else -1
            if sub_end < 0:
                sub_end = end
            # Optimistically collect the primary rank's lines (bytes.find on "\n<prefix>"),
            # counting newlines on the way; the sub-block is "all step lines" when it has as
            # many "loss:" as lines.  (A line without "loss:" hidden by another line with two is
            # the one case this misses; torchtitan prints "loss:" once per step line.)
            picked = []
            if buf.startswith(prefix, pos):
                stop = buf.find(b"\n", pos, sub_end)
                picked.append((lineno, buf[pos: stop if stop >= 0 else sub_end]))
            at, at_line = pos, lineno
            hit = buf.find(needle, pos, sub_end)
            while hit >= 0:
                at_line += buf.count(b"\n", at, hit + 1)
                at = hit + 1
                stop = buf.find(b"\n", at, sub_end)
                picked.append((at_line, buf[at: stop if stop >= 0 else sub_end]))
                hit = buf.find(needle, at, sub_end)
            n = at_line - lineno + buf.count(b"\n", at, sub_end) + 1
            if buf.count(b"loss:", pos, sub_end) == n:
                step_line = self._primary_step_line
                for num, raw in picked:
                    step_line(num, raw)
            else:
                lines = buf[pos:sub_end].split(b"\n")
                take: set = set()
                _indices(list(map(bytes.find, lines, repeat(b"loss:"))), -1, take)
                _indices(list(map(bytes.startswith, lines, repeat(prefix))), True, take)
                for i in sorted(take):
                    feed(lineno + i, lines[i])
            lineno += n
            pos = sub_end + 1
        self._lineno = lineno - 1
        self._bulk_other_ranks(buf, start, end, base, prefix)

    def _primary_step_line(self, lineno: int, raw: bytes) -> None:
        """A primary-rank line in an all-step-lines sub-block: the step fast path, else _line."""
        if len(raw) <= self.max_line and b"validate step:" not in raw:
            try:
                text = raw[len(self._primary_prefix):].decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                i = text.find("step:")
                rec = _fast_step(text, i) if i >= 0 else None
                if rec is not None:
                    self.log.recognized_lines += 1
                    self._step(lineno, self.log.primary_rank, rec)
                    return
        self._line(lineno, raw)

    def _slow(self, buf: bytes, start: int, end: int, base: int) -> None:
        lines = buf[start:end].split(b"\n")
        self._lineno = base + len(lines) - 1
        for i, raw in enumerate(lines):
            self._line(base + i, raw)

    def _ready_to_decide(self, lineno: int) -> bool:
        steps = {rec["step"] for recs in self._pending.values() for rec in recs[:2]}
        first_line = min(recs[0]["line"] for recs in self._pending.values())
        return len(steps) > 1 or lineno - first_line > 4096

    @staticmethod
    def _other_step(raw: bytes, prefix: bytes) -> bool:
        return b"loss:" in raw and b"step:" in raw and raw.startswith(b"[") and not raw.startswith(prefix)

    def _bulk_other_ranks(self, buf: bytes, start: int, end: int, base: int, prefix: bytes) -> None:
        log = self.log
        # Last step of each non-primary rank: walk back from the region's end.
        wanted = {r for r in log.ranks if self._rank_prefix.get(r) != prefix}
        found: set = set()
        budget = 2 * len(wanted) + 64
        pos = end
        lineno = self._lineno  # the region's last line
        while budget > 0 and pos >= start:
            ls = buf.rfind(b"\n", start, pos) + 1 or start
            raw = buf[ls:pos]
            if self._other_step(raw, prefix):
                rank = self._bulk_step_rank(raw, lineno, found)
                if rank is not None:
                    found.add(rank)
            budget -= 1
            if wanted and wanted <= found:
                break
            pos = ls - 1
            lineno -= 1
        for rank in wanted - found:  # a rank quiet at the region's end: find its own last line
            pre = self._rank_prefix.get(rank)
            if pre is None:
                continue
            needle = b"\n" + pre
            stop_at = end
            while True:
                hit = buf.rfind(needle, start, stop_at)
                ls = hit + 1 if hit >= 0 else (start if buf.startswith(pre, start) else -1)
                if ls < 0:
                    break
                le = buf.find(b"\n", ls, end)
                raw = buf[ls: le if le >= 0 else end]
                if self._other_step(raw, prefix):
                    self._bulk_step_rank(raw, base + buf.count(b"\n", start, ls), found)
                    break
                if hit < 0:
                    break
                stop_at = hit
        # Memory above the threshold on any rank.
        for m in _B_MEM_HIGH.finditer(buf, start, end):
            ls = buf.rfind(b"\n", start, m.start()) + 1 or start
            le = buf.find(b"\n", m.end(), end)
            raw = buf[ls: le if le >= 0 else end]
            if not self._other_step(raw, prefix) or b"validate step:" in raw:
                continue
            pm = _B_PREFIX.match(raw)
            sm = _B_STEP.search(raw)
            mm = _B_MEM.search(raw)
            if pm and sm and mm:
                self._note_memory(
                    int(pm.group(2)), int(sm.group(1)), to_number(mm.group(1).decode()),
                    to_number(mm.group(2).decode()), base + buf.count(b"\n", start, ls),
                )

    def _bulk_step_rank(self, raw: bytes, lineno: int, found: set) -> Optional[int]:
        pm = _B_PREFIX.match(raw)
        if pm is None:
            return None
        rank = int(pm.group(2))
        if rank in found:
            return rank
        sm = _B_STEP.search(raw)
        if sm is None or b"validate step:" in raw:
            return None
        self._note_rank(rank, raw[: pm.end()])
        self._note_rank_step(rank, int(sm.group(1)), lineno)
        return rank

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
            pm = _B_PREFIX.match(raw)
            self._note_rank(rank, pm.group(0) if pm is not None else None)
        state = self._tb.get(rank)
        tb_open = state is not None and state.get("open")
        if not tb_open and "loss:" in body and "step:" in body and "validate step:" not in body:
            rec = parse_step_line(body)
            if rec is not None:
                log.recognized_lines += 1
                self._step(lineno, rank, rec)
                return
        if "\x1b" in body:
            body = ANSI_RE.sub("", body)
        if tb_open:
            if self._traceback_line(rank, state, body, lineno):
                return
        header = _HEADER_RE.search(body) if "[titan]" in body else None
        if header is not None:
            log.recognized_lines += 1
            self._message(lineno, rank, header.group("level"), header.group("msg"))
            return
        stripped = body.strip()
        if not stripped:
            return
        if stripped.startswith("Traceback (most recent call last)"):
            log.recognized_lines += 1
            self._open_traceback(rank, body, lineno)
            return
        g = _GLOG_RE.match(stripped) or _C10_RE.match(stripped)
        if g is not None:
            log.recognized_lines += 1
            level = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}[g.group("level")]
            self._message(lineno, rank, level, g.group("msg"), glog=True)
            return
        w = _PYWARN_RE.match(stripped)
        if w is not None:
            log.recognized_lines += 1
            self._warning(lineno, rank, f"{w.group('cat')}: {w.group('msg')}")
            return
        if rank is None and self._torchrun_summary(stripped, lineno):
            log.recognized_lines += 1
            return
        # A line without torchtitan's header (another logger, a bare print): still look for
        # the structured content.
        if self._message(lineno, rank, None, body):
            log.recognized_lines += 1

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
            m = _APPLIED_RE.search(msg)
            if m is not None:
                log.applied.setdefault(rank, []).append((int(m.group(1)), lineno))
                return True
        if level in ("WARNING", "WARN"):
            m = _NO_REPLACEMENT_RE.search(msg)
            if m is not None and self._first_for_rank(rank):
                log.override_no_match.append({"imports": m.group("imports"), "line": lineno})
            if not glog or not msg.strip().startswith("*****"):
                self._warning(lineno, rank, msg)
            if "Ran out of data" in msg and self._is_primary(rank):
                log.ran_out_of_data_line = lineno
            return True
        if level in ("ERROR", "CRITICAL", "FATAL"):
            self._error(lineno, rank, msg)
            if glog:
                fm = _FAILED_RE.search(msg)
                if fm is not None:
                    fail = log.torchrun_failure
                    fail.setdefault("failed", []).append(
                        {"local_rank": int(fm.group("rank")), "exitcode": int(fm.group("code")), "line": lineno}
                    )
            return True
        if level is None and not glog:
            # Bare lines: only structured content counts as recognized.
            return self._known_info(lineno, rank, msg, strict=True)
        self._known_info(lineno, rank, msg, strict=False)
        return True

    def _known_info(self, lineno: int, rank: Optional[int], msg: str, strict: bool) -> bool:
        log = self.log
        primary = self._is_primary(rank)
        if "checkpoint" in msg.lower() or "safetensors" in msg:
            for kind, pattern in _CKPT_PATTERNS:
                m = pattern.search(msg)
                if m is not None:
                    if primary:
                        ev = {"kind": kind, "line": lineno, "text": msg.strip()[:500]}
                        gd = m.groupdict()
                        if gd.get("path"):
                            ev["path"] = gd["path"]
                        if gd.get("step"):
                            ev["step"] = int(gd["step"])
                        if gd.get("seconds"):
                            ev["seconds"] = float(gd["seconds"])
                        log.checkpoint_events.append(ev)
                    return True
        m = _MESH_RE.search(msg)
        if m is not None:
            dims = dict(re.findall(r"(\w+)=(-?\d+)", m.group("dims")))
            size = 1
            for key in ("pp", "dp_replicate", "dp_shard", "cp", "tp"):
                size *= max(1, int(dims.get(key, 1)))
            log.world_size_hints["mesh"] = size
            return True
        m = _TRAINER_RE.search(msg)
        if m is not None:
            log.trainer.update({k: int(v) for k, v in m.groupdict().items() if v is not None})
            return True
        m = _BUILDING_RE.search(msg.strip())
        if m is not None and m.group("name") not in ("device",):
            log.model_name = log.model_name or m.group("name")
            log.model_flavor = log.model_flavor or m.group("flavor")
            return True
        m = _MODEL_SIZE_RE.search(msg)
        if m is not None:
            log.model_name = m.group("name")
            log.model_flavor = m.group("flavor")
            log.model_params = int(m.group("params").replace(",", ""))
            return True
        m = _VERSION_RE.search(msg)
        if m is not None:
            log.torchtitan_version = m.group("version")
            return True
        m = _STARTS_RE.search(msg)
        if m is not None:
            if primary:
                log.start_step = int(m.group(1))
            return True
        if "Training completed" in msg:
            if primary:
                log.completed_line = lineno
            return True
        m = _PEAK_FLOPS_RE.search(msg)
        if m is not None:
            log.trainer.setdefault("peak_flops", to_number(m.group(1)))
            return True
        m = _WORLD_RE.search(msg) or _RANKS_RE.search(msg)
        if m is not None:
            log.world_size_hints.setdefault("launcher", int(m.group(1)))
            return True
        return not strict

    def _warning(self, lineno: int, rank: Optional[int], msg: str) -> None:
        log = self.log
        if not msg.strip():
            return
        log.warning_count += 1
        key = _normalize(msg)
        entry = log.warnings.get(key)
        if entry is None:
            if len(log.warnings) >= MAX_KEPT:
                return
            entry = log.warnings[key] = {"text": msg.strip()[:500], "count": 0, "line": lineno, "ranks": set()}
        entry["count"] += 1
        if rank is not None and len(entry["ranks"]) < 4096:
            entry["ranks"].add(rank)

    def _error(self, lineno: int, rank: Optional[int], msg: str) -> None:
        log = self.log
        log.error_count += 1
        if len(log.errors) < MAX_KEPT:
            log.errors.append({"line": lineno, "rank": rank, "text": msg.strip()[:500]})

    # -- steps ---------------------------------------------------------------------------------

    def _is_primary(self, rank: Optional[int]) -> bool:
        if not self._primary_decided:
            return rank is None or rank == 0 or rank == min((r for r in self.log.ranks), default=rank)
        return rank == self.log.primary_rank

    def _first_for_rank(self, rank: Optional[int]) -> bool:
        return self._is_primary(rank)

    def _step(self, lineno: int, rank: Optional[int], rec: dict) -> None:
        rec["line"] = lineno
        if rank is not None:
            self._note_rank_step(rank, rec["step"], lineno)
            pct = rec.get("memory_pct")
            if pct is not None and pct >= HIGH_MEMORY_PCT:
                self._note_memory(rank, rec["step"], rec.get("memory_gib"), pct, lineno)
        if not self._primary_decided:
            self._pending.setdefault(rank, []).append(rec)
        elif rank == self.log.primary_rank:
            self._store_primary(rec)

    def _store_primary(self, rec: dict) -> None:
        last = self._last_primary_step
        if last is not None and rec["step"] <= last:
            self.log.restarts.append(rec["line"])
        self._last_primary_step = rec["step"]
        self.log.steps[rec["step"]] = rec

    def _decide_primary(self) -> None:
        if self._primary_decided or not self._pending:
            return
        keys = sorted(self._pending, key=lambda r: (-1 if r is None else r))
        primary = keys[0]
        log = self.log
        log.primary_rank = primary
        for rec in self._pending[primary]:
            self._store_primary(rec)
        self._pending.clear()
        self._primary_decided = True
        self._primary_prefix = None if primary is None else self._rank_prefix.get(primary)

    def _note_rank(self, rank: int, prefix: Optional[bytes]) -> None:
        if rank not in self.log.ranks:
            self.log.ranks.add(rank)
        if prefix and rank not in self._rank_prefix:
            self._rank_prefix[rank] = bytes(prefix)

    def _note_rank_step(self, rank: int, step: int, lineno: int) -> None:
        prev = self.log.rank_last_step.get(rank)
        if prev is None or lineno >= prev[1]:
            self.log.rank_last_step[rank] = (step, lineno)

    def _note_memory(self, rank: int, step: int, gib: Optional[float], pct: Optional[float], lineno: int) -> None:
        if pct is None:
            return
        prev = self.log.rank_high_memory.get(rank)
        if prev is None or pct > prev["pct"]:
            self.log.rank_high_memory[rank] = {"pct": pct, "gib": gib, "step": step, "line": lineno}

    # -- tracebacks ----------------------------------------------------------------------------

    def _open_traceback(self, rank: Optional[int], body: str, lineno: int) -> None:
        state = self._tb.setdefault(rank, {"count": 0})
        if not state.get("open"):
            state["count"] += 1
        state["open"] = True
        state["indent"] = len(body) - len(body.lstrip())
        state["start"] = state.get("start") or lineno
        state.setdefault("chain_start", lineno)
        state["frames"] = 0

    def _traceback_line(self, rank: Optional[int], state: dict, body: str, lineno: int) -> bool:
        """Consume a line of an open traceback; False when the traceback has ended before it."""
        stripped = body.strip()
        indent = len(body) - len(body.lstrip())
        if not stripped:
            return True
        if stripped.startswith("Traceback (most recent call last)"):
            state["frames"] = 0
            return True
        if indent > state["indent"] or stripped.startswith(("File ", "^", "~")):
            state["frames"] += 1
            return True
        if "[titan]" in body and _HEADER_RE.search(body):
            self._close_traceback(rank, state, None, None)
            return False
        if stripped.startswith(("The above exception was", "During handling of the above exception")):
            return True
        # the exception line
        self._close_traceback(rank, state, stripped, lineno)
        return True

    def _close_traceback(self, rank: Optional[int], state: dict, text: Optional[str], lineno: Optional[int]) -> None:
        state["open"] = False
        entry = self.log.tracebacks.setdefault(rank, {"count": 0, "first_root": None, "last": None, "start": None})
        entry["count"] = state.get("count", 1)
        entry["start"] = entry["start"] or state.get("start")
        if text is not None:
            rec = {"line": lineno, "text": text[:500]}
            if entry["first_root"] is None:
                entry["first_root"] = rec
            entry["last"] = rec
            self.log.recognized_lines += 1

    def _torchrun_summary(self, stripped: str, lineno: int) -> bool:
        fail = self.log.torchrun_failure
        if stripped.startswith("Root Cause (first observed failure)"):
            self._in_root_cause = True
            fail["root_cause_line"] = lineno
            return True
        if stripped.endswith(" FAILED") and not stripped.startswith("["):
            fail.setdefault("summary_line", lineno)
            fail.setdefault("entrypoint", stripped[: -len(" FAILED")])
            return True
        if self._in_root_cause:
            if stripped.startswith("===="):
                self._in_root_cause = False
                return True
            m = _TR_RANK_RE.match(stripped)
            if m is not None:
                fail["root_cause_rank"] = int(m.group(1))
                return True
            m = _TR_EXIT_RE.match(stripped)
            if m is not None:
                fail["exitcode"] = int(m.group(1))
                return True
            m = _TR_TRACE_RE.match(stripped)
            if m is not None:
                fail["traceback"] = m.group(1)[:500]
                return True
            if _EXC_LINE_RE.match(stripped):
                fail["error"] = stripped[:500]
            return True
        return False


# ---------------------------------------------------------------------------------------------
# convenience


def parse_stream(stream: BinaryIO, source: str = "", *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    """Parse a binary stream to the end in bounded memory."""
    parser = LogParser(source, max_line=max_line)
    read = getattr(stream, "read1", None) if chunk_size < 65536 else None
    read = read or stream.read
    while True:
        block = read(chunk_size)
        if not block:
            break
        parser.feed(block)
    return finalize(parser.close())


def parse_bytes(data: bytes, source: str = "<bytes>", *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    parser = LogParser(source, max_line=max_line)
    for i in range(0, len(data), chunk_size):
        parser.feed(data[i: i + chunk_size])
    return finalize(parser.close())


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_bytes(text.encode("utf-8", "surrogateescape"), source)


def parse_file(path, *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    with open(path, "rb") as fh:
        return parse_stream(fh, str(path), chunk_size=chunk_size, max_line=max_line)


def finalize(log: ParsedLog) -> ParsedLog:
    """Hook for post-processing a finished parse (kept for symmetry with follow mode)."""
    return log
