"""torchtitan's training step line, written and read in one place.

``step: 12  loss:  2.25000  grad_norm:  0.8125  memory: 21.50GiB(89.58%)  tps: 123,456  tflops: 1,234.50  mfu: 42.50%  lr: 0.0001``

The trailing ``lr:`` (the learning rate the step trained with, 10 significant digits) is trnqwen's:
the ranks append it to torchtitan's line (:mod:`trnqwen.runtime.lr_log`) and the Trainer backend
prints it; lines without it (older logs, plain torchtitan) read as before, ``lr`` None.

:func:`format_step_line` writes it (the hf-trainer backend prints torchtitan's line so every
backend's log reads the same); :func:`parse_step_line` reads it back, with or without ANSI
colours (torchtitan's ``Color`` codes glued to each key) and torchrun prefixes.  Both sides live
here so a change to the layout is one edit, and ``tests/test_hf_trainer.py`` checks the round trip.
This module imports nothing heavy: the rank process and the CLI both load it.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Optional

# ESC [ ... m colour codes (torchtitan's Color class) and any other CSI sequence.
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUM = r"[-+]?(?:[0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|NaN|inf|Inf|INF|NAN)"

STEP_FIELDS = ("step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu", "lr")
VALIDATION_FIELDS = ("loss", "memory_gib", "memory_pct", "tps")

STEP_RE = re.compile(
    r"step:\s*(?P<step>\d+)"
    r"(?:\s+loss:\s*(?P<loss>" + NUM + r"))?"
    r"(?:\s+grad_norm:\s*(?P<grad_norm>" + NUM + r"))?"
    r"(?:\s+memory:\s*(?P<memory_gib>" + NUM + r")\s*GiB(?:\s*\(\s*(?P<memory_pct>" + NUM + r")\s*%\s*\))?)?"
    r"(?:\s+tps:\s*(?P<tps>" + NUM + r"))?"
    r"(?:\s+tflops:\s*(?P<tflops>" + NUM + r"))?"
    r"(?:\s+mfu:\s*(?:(?P<mfu>" + NUM + r")\s*%|N/A))?"
    r"(?:\s*(?:\x1b\[[0-9;]*m)?\s+lr:\s*(?P<lr>" + NUM + r"))?"
)
VALIDATE_RE = re.compile(
    r"validate step:\s*(?P<step>\d+)"
    r"(?:\s+loss:\s*(?P<loss>" + NUM + r"))?"
    r"(?:\s+memory:\s*(?P<memory_gib>" + NUM + r")\s*GiB(?:\s*\(\s*(?P<memory_pct>" + NUM + r")\s*%\s*\))?)?"
    r"(?:\s+tps:\s*(?P<tps>" + NUM + r"))?"
)

# A method's own validation line (``[NAME] validate step: 3  ...``), read by that method's reader.
METHOD_VALIDATE_RE = re.compile(r"\[[A-Za-z][\w-]*\] validate step:")


def format_step_line(
    step: int,
    loss: float,
    grad_norm: float,
    memory_gib: float,
    memory_pct: float,
    tps: float,
    tflops: float,
    mfu: Optional[float],
    lr: Optional[float] = None,
) -> str:
    """One step line, character for character torchtitan's (colours off), then ``lr:`` when given."""
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return (
        f"step: {step:2}  "
        f"loss: {loss:8.5f}  "
        f"grad_norm: {grad_norm:7.4f}  "
        f"memory: {memory_gib:5.2f}GiB"
        f"({memory_pct:.2f}%)  "
        f"tps: {round(tps):,}  "
        f"tflops: {tflops:,.2f}  "
        f"mfu: {mfu_str}"
    ) + (lr_text(lr) if lr is not None else "")


def lr_text(lr: float) -> str:
    """The ``lr:`` column appended to a step line (enough digits to compare backends exactly)."""
    return f"  lr: {lr:.10g}"


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
    fast = fast_step(line, i)
    if fast is not None:
        return fast
    text = strip_ansi(line)
    i = text.find("step:")
    while i >= 0:
        before = text[i - 1] if i else " "
        if not (before.isalnum() or before == "_"):
            m = STEP_RE.match(text, i)
            if m is not None and m.group("loss") is not None:
                if text[max(0, i - 9):i].rstrip().endswith("validate"):
                    return None
                return _fields(m, STEP_FIELDS[1:])
        i = text.find("step:", i + 1)
    return None


def step_key_glued_ok(line: str, i: int) -> bool:
    """``line[i:]`` starts with ``step:``: nothing but a colour code ("\x1b[31mstep:") may be
    glued to it."""
    if i and (line[i - 1].isalnum() or line[i - 1] == "_"):
        j = line.rfind("\x1b[", max(0, i - 24), i)
        if line[i - 1] != "m" or j < 0 or line[j + 2:i - 1].strip("0123456789;"):
            return False
    return True


def fast_step(line: str, i: int) -> Optional[dict]:
    """torchtitan 0.3.0's exact layout (``line[i:]`` starts with ``step:``), split on whitespace
    (colour codes stay glued to the keys); None for anything else, which then goes through the
    regex."""
    if not step_key_glued_ok(line, i):
        return None
    tok = line[i:].split()
    lr = None
    if len(tok) == 16 and tok[14].endswith("lr:"):
        try:
            lr = float(tok[15])
        except ValueError:
            return None
        tok = tok[:14]
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
            "lr": lr,
        }
    except ValueError:
        return None


def parse_validation_line(line: str) -> Optional[dict]:
    """``validate step: N  loss: X  memory: ...  tps: N`` -> dict, else None (also for the
    ``[NAME] validate step:`` line that follows it, a method's own: :data:`METHOD_VALIDATE_RE`)."""
    if "validate step:" not in line or METHOD_VALIDATE_RE.search(line):
        return None
    text = strip_ansi(line)
    m = VALIDATE_RE.match(text, text.find("validate step:"))
    if m is None:
        return None
    return _fields(m, VALIDATION_FIELDS)
