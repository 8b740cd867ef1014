"""Parse torchtitan 0.3.0 log lines (with or without ANSI colours and torchrun prefixes)."""

from __future__ import annotations

import math
import re
from typing import Optional

# ESC [ ... m colour codes (torchtitan's Color class) and any other CSI sequence.
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:[0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|NaN|inf|Inf|INF|NAN)"

STEP_FIELDS = ("step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops", "mfu")

_STEP_RE = re.compile(
    r"(?<![A-Za-z_])step:\s*(?P<step>\d+)"
    r"(?:\s+loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:\s+grad_norm:\s*(?P<grad_norm>" + _NUM + r"))?"
    r"(?:\s+memory:\s*(?P<memory_gib>" + _NUM + r")\s*GiB\s*(?:\(\s*(?P<memory_pct>" + _NUM + r")\s*%\s*\))?)?"
    r"(?:\s+tps:\s*(?P<tps>" + _NUM + r"))?"
    r"(?:\s+tflops:\s*(?P<tflops>" + _NUM + r"))?"
    r"(?:\s+mfu:\s*(?:(?P<mfu>" + _NUM + r")\s*%|N/A))?"
)


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


def _fields_from_match(m: "re.Match[str]") -> dict:
    out: dict = {"step": int(m.group("step"))}
    for name in STEP_FIELDS[1:]:
        out[name] = to_number(m.group(name))
    if out["tps"] is not None and math.isfinite(out["tps"]) and out["tps"] == int(out["tps"]):
        out["tps"] = int(out["tps"])
    return out


def parse_step_line(line: str) -> Optional[dict]:
    """The metrics of one training step line, or None when ``line`` is not one.

    Returns ``{"step", "loss", "grad_norm", "memory_gib", "memory_pct", "tps", "tflops",
    "mfu"}``: ``step`` an int, the rest floats (``tps`` an int when whole) or None when the
    field is absent or ``N/A``.  Validation lines (``validate step:``) are not step lines.
    Works with ANSI colour codes and torchrun prefixes (``[rank0]:``, ``[default0]:``).
    """
    if "step:" not in line:
        return None
    text = strip_ansi(line)
    m = _STEP_RE.search(text)
    if m is None or m.group("loss") is None:
        return None
    if text[max(0, m.start() - 9):m.start()].rstrip().endswith("validate"):
        return None
    return _fields_from_match(m)
