"""The ``[GRPO]`` log lines, written by the ranks and read by inspect-logs (one home for both).

Each logged step of a GRPO run is followed by::

    [GRPO] step: 3  reward: 0.412300  reward_std: 0.201000  frac_reward_zero_std: 0.1250  completion_length: 12.5
      completion_length_max: 16  clipped_ratio: 0.0625  kl: 0.000000  entropy: 7.123400  clip_ratio: 0.0000
      rollout_s: 1.23  update_s: 0.45  completions: 32  rewards/number: 0.412300

(one line; each reward function's mean last, ``rewards/<name>``).  A separate line, not more
columns on torchtitan's step line, as DPO's.  :data:`READERS` say what a line is for inspect-logs;
:func:`summary` (``--json``'s ``grpo`` key) and :func:`rows` (the table's GRPO rows) work on what
it kept (``facts``); the judge's rules are :mod:`trnqwen.methods.grpo.judge`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from trnqwen.contract.method_lines import LineReader, MethodLine
from trnqwen.output import number

MARK = "[GRPO]"
FIELDS = ("reward", "reward_std", "frac_reward_zero_std", "completion_length", "completion_length_max",
          "clipped_ratio", "kl", "entropy", "clip_ratio", "rollout_s", "update_s", "completions")
_FORMATS = {"completion_length_max": ".0f", "completions": ".0f", "rollout_s": ".3f", "update_s": ".3f",
            "frac_reward_zero_std": ".4f", "clipped_ratio": ".4f", "clip_ratio": ".4f"}
_NUM = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf)"
LINE_RE = re.compile(r"\[GRPO\] step:\s*(?P<step>\d+)\s+(?P<rest>.*)$")
_PAIR_RE = re.compile(r"(?P<name>[A-Za-z_][\w/.-]*):\s*(?P<value>" + _NUM + r")")


def format_line(step: int, values: dict[str, float]) -> str:
    parts = [f"{k}: {values[k]:{_FORMATS.get(k, '.6f')}}" for k in FIELDS if k in values]
    parts += [f"{k}: {v:.6f}" for k, v in values.items() if k.startswith("rewards/")]
    return f"{MARK} step: {step}  " + "  ".join(parts)


def parse_line(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """(step, values) of a ``[GRPO] step:`` line, else None."""
    if MARK not in line:
        return None
    m = LINE_RE.search(line)
    return (int(m.group("step")), _values(m)) if m else None


def _values(m: "re.Match[str]") -> dict[str, float]:
    return {p.group("name"): float(p.group("value")) for p in _PAIR_RE.finditer(m.group("rest"))}


def read_step(m: "re.Match[str]") -> MethodLine:
    return MethodLine("step", _values(m), step=int(m.group("step")))


# a reward function that failed in the ranks (contract/rank_errors.py's line): the judge's error
FAILURE_RE = re.compile(r"\[trnqwen\] usage error: (?P<message>reward function .*)$")


def read_failure(m: "re.Match[str]") -> MethodLine:
    return MethodLine("note", {"message": m.group("message").strip()}, name="reward_failure")


READERS = (
    LineReader("grpo", LINE_RE, read_step, (MARK,)),
    LineReader("grpo-reward-failure", FAILURE_RE, read_failure, ("[trnqwen] usage error: reward function",)),
)


def reward_failure(facts: dict[str, Any]) -> Optional[dict]:
    return ((facts.get("lines") or {}).get("notes") or {}).get("reward_failure")


# --- on what inspect-logs kept (facts: plain data) ----------------------------------------------


def steps(facts: dict[str, Any]) -> dict[int, dict]:
    return (facts.get("lines") or {}).get("steps") or {}


def is_run(facts: dict[str, Any]) -> bool:
    return bool(steps(facts)) or reward_failure(facts) is not None or ((facts.get("run_config") or {}).get("method")) == "grpo"


def _clean(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def summary(facts: dict[str, Any]) -> Optional[dict]:
    """``--json``'s ``grpo`` key: the first and last logged steps' values and the reward's change."""
    if not is_run(facts):
        return None
    logged = steps(facts)
    if not logged:
        return {"steps_logged": 0, "first_step": None, "last_step": None, "reward_change": None}
    first, last = min(logged), max(logged)
    pick = lambda s: {"step": s, **{k: _clean(v) for k, v in logged[s].items() if k != "line"}}  # noqa: E731
    change = None
    if isinstance(logged[first].get("reward"), float) and isinstance(logged[last].get("reward"), float):
        change = logged[last]["reward"] - logged[first]["reward"]
    return {"steps_logged": len(logged), "first_step": pick(first), "last_step": pick(last), "reward_change": _clean(change)}


def rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """The human table's GRPO rows."""
    info = summary(facts)
    if not info or not info["steps_logged"]:
        return [("GRPO", "no [GRPO] step lines")] if info else []
    first, last = info["first_step"], info["last_step"]

    return [
        ("GRPO reward", f"step {first['step']}: {number(first.get('reward'))} -> step {last['step']}: {number(last.get('reward'))}"),
        ("GRPO last step", f"no-signal groups {number(last.get('frac_reward_zero_std'), '.2f')}, length "
         f"{number(last.get('completion_length'), '.1f')} (max {number(last.get('completion_length_max'), '.0f')}, cut "
         f"{number(last.get('clipped_ratio'), '.2f')}), kl {number(last.get('kl'))}, entropy {number(last.get('entropy'))}, "
         f"rollout {number(last.get('rollout_s'), '.2f')} s / update {number(last.get('update_s'), '.2f')} s"),
    ]
