"""The line kinds torchtitan, torchrun and torch print, other than the step line
(:mod:`trnqwen.contract.stepline`): one regex each, and for the informational lines a table.

To read a new informational line, add one :class:`LinePattern` to ``_OWN_LINES`` (a regex
and a small function that stores what it matched in :class:`~trnqwen.logs.record.ParsedLog`),
and the field it fills to ``ParsedLog``.  A training method's own lines are its folder's
(``Method.log_lines``): the table (:func:`info_table`) takes them from the registry and keeps
what they say in ``ParsedLog.method_lines``.  The streaming engine (:mod:`trnqwen.logs.engine`)
tries the table, in order, on every INFO-level or bare line that is not a step, validation,
``[Override]`` or warning/error line; the first pattern whose handler does not return False wins.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress
from typing import Callable, NamedTuple, Optional

from trnqwen.contract.lora import LOG_LINE_RE as LORA_RE, LOG_MARK as LORA_TAG, read_log_line
from trnqwen.contract.method_lines import MethodLine
from trnqwen.contract.override_calls import CALLS_RE, CALLS_TAG
from trnqwen.contract.stepline import strip_ansi, to_number
from trnqwen.logs.record import MethodLines, ParsedLog
from trnqwen.methods import registry as methods
from trnqwen.methods.base import load

# torchrun's per-rank prefix: "[{role}{idx}]:" (role "rank" with --role rank, else "default").
PREFIX_RE = re.compile(r"\[([A-Za-z][A-Za-z_-]{0,31})(\d{1,6})\]:")
B_PREFIX_RE = re.compile(rb"\[([A-Za-z][A-Za-z_-]{0,31})(\d{1,6})\]:")
# torchtitan's logger format: "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s".
HEADER_RE = re.compile(r"\[titan\]\s+(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?)\s+-\s+(?P<logger>\S+)\s+-\s+"
                       r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+-\s?(?P<msg>.*)$")
# glog-style lines from torch's C++ and torchrun ("W1129 09:54:40.879000 10898 file.py:982] msg").
GLOG_RE = re.compile(r"(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\s]+\] ?(?P<msg>.*)$")
C10_RE = re.compile(r"\[(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d[^\]]*\] ?(?P<msg>.*)$")
GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
PYWARN_RE = re.compile(r"\S+:\d+: (?P<cat>[A-Z]\w*Warning): (?P<msg>.*)$")

# [Override] NAME: FQN OLD -> NEW[ with k=v, ...]  (NAME is nki_rope in the recipe era, the
# factory's import path module.function in torchtitan 0.3.0)
OVERRIDE_RE = re.compile(r"\[Override\]\s+(?P<name>[^:\s]+):\s+(?P<fqn>\S+)\s+(?P<old>\S+)\s+->\s+(?P<new>\S+?)"
                         r"(?:\s+with\s+(?P<kwargs>.*))?\s*$")
APPLIED_RE = re.compile(r"Applied (\d+) override\(s\)")
LAYER_RE = re.compile(r"(?:^|\.)layers(?:\.|\[)(\d+)\]?(?:\.|$)")
NO_REPLACEMENT_RE = re.compile(r"override\.imports=(?P<imports>.*?) produced no replacements")

# torchrun's failure summary ("Root Cause (first observed failure):" ... "rank : 1 (local_rank: 1)")
TR_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
TR_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
FAILED_RE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+)")
EXC_LINE_RE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Fault)\b(?::.*)?$")
TRACEBACK_START = "Traceback (most recent call last)"


def split_prefix(text: str) -> tuple[Optional[int], str]:
    """``"[rank3]:msg"`` -> (3, "msg"); a line without a torchrun prefix -> (None, text)."""
    if text.startswith("["):
        m = PREFIX_RE.match(text)
        if m is not None:
            end = m.end()
            # torchrun can stack its prefix on a line the child already prefixed ("[rank0]:[rank0]:W1129 ...")
            while text.startswith(m.group(0), end):
                end += len(m.group(0))
            return int(m.group(2)), text[end:]
    return None, text


def parse_override_line(line: str) -> Optional[dict]:
    """An ``[Override] NAME: FQN OLD -> NEW`` line -> {name, fqn, old, new, layer, kwargs}."""
    if "[Override]" not in line:
        return None
    m = OVERRIDE_RE.search(strip_ansi(line))
    if m is None:
        return None
    layer_m = LAYER_RE.search(m.group("fqn"))
    return {**m.groupdict(), "layer": int(layer_m.group(1)) if layer_m else None}


def normalize(msg: str) -> str:
    """A message with its numbers masked, so repeated warnings group together."""
    return re.sub(r"\d+", "N", msg.strip())[:300]


# ---------------------------------------------------------------------------------------------
# informational lines: one row of INFO_LINES each


class LineAt(NamedTuple):
    """Where a message was read: its 1-based line, its rank (None: no torchrun prefix), and
    whether that rank is the primary one (rank 0 or the unprefixed stream)."""

    lineno: int
    rank: Optional[int]
    primary: bool


@dataclass(frozen=True)
class LinePattern:
    """``regex`` is searched in the message (ANSI codes and torchrun prefix removed); on a match
    ``store(log, match, at)`` records it.  ``store`` returning False means "not this line after
    all" and the next pattern is tried.  ``needle``: substrings one of which the regex cannot
    match without (matched against the lower-cased message when ``lower``); every pattern has
    them, since :func:`read_info_line` tries a message only against the patterns whose needles
    it holds."""

    name: str
    regex: re.Pattern[str]
    store: Callable[[ParsedLog, re.Match[str], LineAt], Optional[bool]]
    needle: tuple[str, ...] = ()
    lower: bool = False


def _checkpoint(kind: str) -> Callable[[ParsedLog, re.Match[str], LineAt], None]:
    def store(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
        if not at.primary:
            return
        ev: dict = {"kind": kind, "line": at.lineno, "text": m.string.strip()[:500]}
        gd = m.groupdict()
        ev.update((key, kind(gd[key])) for key, kind in (("path", str), ("step", int), ("seconds", float)) if gd.get(key))
        log.checkpoint_events.append(ev)

    return store


def _mesh(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
    dims = dict(re.findall(r"(\w+)=(-?\d+)", m.group("dims")))
    log.world_size_hints["mesh"] = math.prod(max(1, int(dims.get(key, 1))) for key in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))


def _keep(name: str, value: Callable[[re.Match[str], LineAt], object], *, primary: bool = False, first: bool = False):
    """A store that sets the log's ``name`` to ``value(match, at)``; ``primary``: only from the primary
    rank; ``first``: only while it is unset (a resumed log keeps its first attempt's)."""
    def store(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
        if (at.primary or not primary) and not (first and getattr(log, name)):
            setattr(log, name, value(m, at))

    return store


def _launcher_world(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
    log.world_size_hints.setdefault("launcher", int(m.group(1)))


def _model_size(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
    log.model_name, log.model_flavor, log.model_params = m.group("name"), m.group("flavor"), int(m.group("params").replace(",", ""))


def _building(log: ParsedLog, m: re.Match[str], at: LineAt) -> Optional[bool]:
    if m.group("name") == "device":
        return False
    log.model_name = log.model_name or m.group("name")
    log.model_flavor = log.model_flavor or m.group("flavor")
    _model_args(log, m.group("args") or "")
    return None


def _model_args(log: ParsedLog, text: str) -> None:
    if v := _VOCAB_ARG_RE.search(text):
        log.vocab_size = log.vocab_size or int(v.group(1))
    if n := _LAYERS_ARG_RE.search(text):
        log.num_layers = log.num_layers or int(n.group(1))


def _override_calls(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
    """``[OverrideCalls] NAME: calls=C fallbacks=F modules=M rank=R step=S[ reason: TEXT]``
    (:mod:`trnqwen.runtime.override_calls`), kept per override and rank (the line's own rank)."""
    rec = {**{k: int(m.group(k)) for k in ("calls", "fallbacks", "modules", "step")},
           "reason": m.group("reason") or None, "line": at.lineno}
    log.override_calls.setdefault(m.group("name"), {})[int(m.group("rank"))] = rec


def _lora(log: ParsedLog, m: re.Match[str], at: LineAt) -> None:
    """``[LoRA] trainable N of M parameters (P%), rank R, ... initialised K (rank X)``
    (:func:`trnqwen.contract.lora.log_line`), kept per process rank: the torchrun prefix's, else the
    line's own ``(rank X)``."""
    process, rec = read_log_line(m.string)
    log.lora[at.rank if at.rank is not None else process] = {**rec, "line": at.lineno}


def keep_method_line(log: ParsedLog, method: str, line: MethodLine, lineno: int) -> None:
    """One of a method's lines (the primary rank's): a step's values and a note go to
    ``log.method_lines[method]``; a validation's join the validation record of that step (the
    last one), else make one."""
    if line.kind == "validation":
        rec = log.validations[-1] if log.validations and log.validations[-1]["step"] == line.step else None
        if rec is None:
            rec = {"step": line.step, "loss": line.loss, "memory_gib": None, "memory_pct": None, "tps": None, "line": lineno}
            log.validations.append(rec)
        rec.update(line.values)
        return
    kept = log.method_lines.setdefault(method, MethodLines())
    if line.kind == "step":
        kept.steps[line.step] = {**line.values, "line": lineno}
    else:
        kept.notes[line.name] = {**line.values, "line": lineno}


def _method_line(method: str, read: Callable[[re.Match[str]], Optional[MethodLine]]):
    def store(log: ParsedLog, m: re.Match[str], at: LineAt) -> Optional[bool]:
        line = read(m)
        if line is None:
            return False
        if at.primary:
            keep_method_line(log, method, line, at.lineno)
        return None

    return store


def _method_patterns(declared: tuple[tuple[str, str], ...]) -> tuple[LinePattern, ...]:
    """The training methods' line readers ((name, ``Method.log_lines``): that module's ``READERS``)."""
    return tuple(LinePattern(r.name, r.regex, _method_line(name, r.read), r.needle)
                 for name, module in declared for r in load(module).READERS)


# torchtitan's get_peak_flops on a device it has no table entry for (a WARNING line, kept in
# ParsedLog.warnings): its MFU is then against an A100's peak (no_peak_flops below)
NO_PEAK_FLOPS_RE = re.compile(r"Peak flops undefined for: (.+?), fallback to")


def no_peak_flops(log: ParsedLog) -> Optional[str]:
    """The device torchtitan knew no peak FLOPS for (``Peak flops undefined for: CPU (x86_64),
    fallback to A100``): its MFU is then against another device's peak and means nothing (0.00%
    on CPU).  None when the log does not say so."""
    for entry in log.warnings.values():
        m = NO_PEAK_FLOPS_RE.search(entry["text"])
        if m is not None:
            return m.group(1)
    return None

_CKPT = ("checkpoint", "safetensors")
# model args / HF config printed in the log: "vocab_size=151936", "'vocab_size': 151936", "n_layers=36"
_VOCAB_ARG_RE = re.compile(r"""\bvocab(?:_size|ulary size)['"]?\s*[:=]\s*(\d{3,8})\b""", re.IGNORECASE)
_LAYERS_ARG_RE = re.compile(r"""\b(?:n_layers|num_hidden_layers|num_layers)['"]?\s*[:=]\s*(\d{1,4})\b""")

_OWN_LINES: tuple[LinePattern, ...] = (
    LinePattern("checkpoint-load", re.compile(r"Loading (?:from )?HF safetensors from (?:--[\w.]+: )?(?P<path>\S+)"), _checkpoint("load"), _CKPT, True),
    LinePattern("checkpoint-load", re.compile(r"Loading the checkpoint from (?P<path>\S+?)\.?$"), _checkpoint("load"), _CKPT, True),
    LinePattern("checkpoint-loaded", re.compile(r"Finished loading the checkpoint in (?P<seconds>[\d.]+) seconds"), _checkpoint("loaded"), _CKPT, True),
    LinePattern("checkpoint-fresh", re.compile(r"No checkpoint was provided, this is a fresh start"), _checkpoint("fresh"), _CKPT, True),
    LinePattern("checkpoint-save", re.compile(r"Saving a (?:model only|full) checkpoint (?:in \S+ )?at last step, step (?P<step>\d+)"), _checkpoint("save"), _CKPT, True),
    LinePattern("checkpoint-saved", re.compile(r"Last step checkpoint completed in (?P<seconds>[\d.]+)s"), _checkpoint("saved"), _CKPT, True),
    LinePattern("checkpoint-saved", re.compile(r"Finished (?:saving|staging) the checkpoint in (?P<seconds>[\d.]+) seconds"), _checkpoint("saved"), _CKPT, True),
    LinePattern("checkpoint-active", re.compile(r"Checkpointing active\. Checkpoints will be loaded from and saved to (?P<path>\S+)"), _checkpoint("active"), _CKPT, True),
    LinePattern("checkpoint-save", re.compile(r"^(?:Saving|Staging) the checkpoint\."), _checkpoint("save"), _CKPT, True),
    LinePattern("checkpoint-seed", re.compile(r"Created seed checkpoint"), _checkpoint("seed"), _CKPT, True),
    LinePattern("mesh", re.compile(r"Building device mesh with parallelism: (?P<dims>.*)$"), _mesh, ("device mesh",)),
    LinePattern("trainer", re.compile(
        r"Trainer is initialized with local batch size (?P<local_batch>\d+), global batch size (?P<global_batch>-?\d+), "
        r"gradient accumulation steps (?P<grad_accum>\d+), sequence length (?P<seq_len>\d+), total steps (?P<steps>\d+)"
        r"(?: \(warmup (?P<warmup>\d+)\))?"),
        lambda log, m, at: log.trainer.update({k: int(v) for k, v in m.groupdict().items() if v is not None}), ("Trainer is initialized",)),
    # "Building qwen3 4B", "Building qwen3 4B with Qwen3ModelArgs(...)"; torchtitan 0.2.x: "Building qwen3
    # 4Bwith {" (model args as JSON on the following lines, read by the "vocab" pattern)
    LinePattern("model", re.compile(r"^\s*Building (?P<name>[\w.\-/]+) (?P<flavor>[\w.\-]+)(?:\s*$| ?with (?P<args>.*)$)"),
                _building, ("Building ",)),
    LinePattern("job", re.compile(r"Starting job: (.+)$"), _keep("job_description", lambda m, at: m.group(1).strip()[:300], first=True),
                ("Starting job: ",)),
    LinePattern("vocab", _VOCAB_ARG_RE, lambda log, m, at: _model_args(log, m.string), ("vocab",), True),
    LinePattern("layers", _LAYERS_ARG_RE, lambda log, m, at: _model_args(log, m.string), ("n_layers", "num_layers")),
    LinePattern("model-size", re.compile(r"Model (?P<name>\S+) (?P<flavor>\S+) size: (?P<params>[\d,]+) total parameters"), _model_size, (" total parameters",)),
    LinePattern("torchtitan-version", re.compile(r"torchtitan version: (?P<version>\S+)"),
                _keep("torchtitan_version", lambda m, at: m.group("version")), ("torchtitan version: ",)),
    LinePattern("start-step", re.compile(r"Training starts at step (\d+)"),
                _keep("start_step", lambda m, at: int(m.group(1)), primary=True, first=True), ("Training starts at step ",)),
    LinePattern("completed", re.compile(r"Training completed"), _keep("completed_line", lambda m, at: at.lineno, primary=True),
                ("Training completed",)),
    # torchtitan's torch.compile lines (distributed/compile.py, components/loss.py), the Neuron compiler's
    LinePattern("compiled", re.compile(r"with torch\.compile|Compiler status PASS|neuronx-cc compil"),
                _keep("compiled_line", lambda m, at: at.lineno, first=True), ("torch.compile", "Compiler status", "neuronx-cc")),
    LinePattern("peak-flops", re.compile(r"Peak FLOPS used for computing MFU: (\S+)"),
                lambda log, m, at: log.trainer.setdefault("peak_flops", to_number(m.group(1))), ("Peak FLOPS used",)),
    LinePattern("override-calls", CALLS_RE, _override_calls, (CALLS_TAG,)),
    LinePattern("lora", LORA_RE, _lora, (LORA_TAG,)),
)
_LAST_LINES = (  # after the methods' lines: their needles are common words
    LinePattern("world-size", re.compile(r"(?:world[ _]size|WORLD_SIZE|nproc_per_node)\s*[:=]\s*(\d+)", re.IGNORECASE), _launcher_world,
                ("world size", "world_size", "nproc_per_node"), True),
    LinePattern("world-size", re.compile(r"(?:launching|starting|with) (\d+) ranks?\b", re.IGNORECASE), _launcher_world, (" rank",), True),
)


class InfoTable(NamedTuple):
    """The informational lines, in order, with every needle (lower-cased) and the patterns (indices)
    that need it: a message is tried only against the patterns whose needles it holds, in order
    (each pattern's regex needs one of its needles: tests/test_inspect_logs.py pins that), not
    against all 30 (a chatty log's other lines cost 16 us each that way)."""

    patterns: tuple[LinePattern, ...]
    by_needle: dict[str, list[int]]
    screen: tuple[str, ...]  # the needles, sorted


@lru_cache(maxsize=8)
def _info_table(declared: tuple[tuple[str, str], ...]) -> InfoTable:
    patterns = (*_OWN_LINES, *_method_patterns(declared), *_LAST_LINES)
    by_needle: dict[str, list[int]] = {}
    for i, pat in enumerate(patterns):
        for n in pat.needle:
            by_needle.setdefault(n.lower(), []).append(i)
    return InfoTable(patterns, by_needle, tuple(sorted(by_needle)))


def info_table() -> InfoTable:
    """The table for the methods the registry lists now (a parser takes it once, when it starts)."""
    return _info_table(tuple((m.name, m.log_lines) for m in methods.methods() if m.log_lines))


INFO_LINES, _, SCREEN = info_table()  # the built-in methods' table


def read_info_line(log: ParsedLog, msg: str, at: LineAt, table: InfoTable) -> bool:
    """Try ``table``'s patterns on one message; True when one of them took it."""
    lowered = msg.lower()
    held = list(compress(table.screen, map(lowered.__contains__, table.screen)))
    # only the patterns whose needles the message holds can match it (none for most messages), in order
    for i in sorted({i for n in held for i in table.by_needle[n]}) if held else ():
        pat = table.patterns[i]
        hay = lowered if pat.lower else msg
        if not any(n in hay for n in pat.needle):
            continue
        m = pat.regex.search(msg)
        if m is not None and pat.store(log, m, at) is not False:
            return True
    return False
