"""The ``[DPO]`` log lines, written by the ranks and read by inspect-logs (one home for both).

Each logged step of a DPO run is followed by::

    [DPO] step: 3  rewards/chosen: 0.012340  rewards/rejected: -0.004560  margin: 0.016900  accuracy: 0.7500  pairs: 8

and each validation by ``[DPO] validate step: 3  ...  loss: 0.690000  pairs: 12``; before step 1
the reference pass says what it did (``[DPO] reference log-probs: computed ...`` or ``reused``).
A separate line, not more columns on the step line: the step line stays torchtitan's (its fast
parsers and every other tool that reads it are unchanged), and a run without DPO has none.
"""

from __future__ import annotations

import re
from typing import Optional

MARK = "[DPO]"
FIELDS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")
_NUM = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf)"
LINE_RE = re.compile(
    r"\[DPO\] (?P<validate>validate )?step:\s*(?P<step>\d+)\s+rewards/chosen:\s*(?P<rewards_chosen>" + _NUM + r")"
    r"\s+rewards/rejected:\s*(?P<rewards_rejected>" + _NUM + r")\s+margin:\s*(?P<margin>" + _NUM + r")"
    r"\s+accuracy:\s*(?P<accuracy>" + _NUM + r")(?:\s+loss:\s*(?P<loss>" + _NUM + r"))?"
    r"(?:\s+pairs:\s*(?P<pairs>\d+))?"
)
REFERENCE_RE = re.compile(r"\[DPO\] reference log-probs: (?P<how>computed|reused)\b(?P<rest>.*)")


def format_line(step: int, metrics: dict[str, float], *, validate: bool = False) -> str:
    text = (
        f"{MARK} {'validate ' if validate else ''}step: {step}  rewards/chosen: {metrics['rewards_chosen']:.6f}  "
        f"rewards/rejected: {metrics['rewards_rejected']:.6f}  margin: {metrics['margin']:.6f}  "
        f"accuracy: {metrics['accuracy']:.4f}"
    )
    if validate:
        text += f"  loss: {metrics['loss']:.6f}"
    return text + f"  pairs: {int(metrics['pairs'])}"


def parse_line(line: str) -> Optional[tuple[bool, int, dict[str, float]]]:
    """(is validation, step, metrics) of a ``[DPO]`` step line, else None."""
    if MARK not in line:
        return None
    m = LINE_RE.search(line)
    if m is None:
        return None
    values = {name: float(m.group(name)) for name in FIELDS}
    if m.group("loss") is not None:
        values["loss"] = float(m.group("loss"))
    if m.group("pairs") is not None:
        values["pairs"] = float(m.group("pairs"))
    return bool(m.group("validate")), int(m.group("step")), values


def reference_line(how: str, detail: str) -> str:
    return f"{MARK} reference log-probs: {how} {detail}"
