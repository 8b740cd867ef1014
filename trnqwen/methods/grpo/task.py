"""The bundled verifiable task's reward (``trnqwen/data/tiny_sums``, :mod:`trnqwen.data.sums_recipe`):
what a GRPO run without ``--dataset`` is scored by.

:func:`number` has TRL's reward signature: per completion, the share of its visible characters
that are digits (a dense signal: answering in digits at all is rewarded), plus 1 when its first
number is the record's ``answer``.  So the reward lies in [0, 2]: 2 is the right number alone.  A completion is right (``trnqwen
eval``'s pass@1) strictly above 1 (``number.pass_threshold``): the right number scores 1 plus its
digits' share, while wrong digits alone ("2222") score exactly 1.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from trnqwen.methods.grpo.rewards import content

REWARD = "trnqwen.methods.grpo.task:number"  # the --reward value of the bundled task
_NUMBER = re.compile(r"-?\d+")


def number_score(text: str, answer: Optional[str]) -> float:
    visible = "".join(text.split())
    share = sum(c.isdigit() for c in visible) / len(visible) if visible else 0.0
    found = _NUMBER.search(text)
    right = found is not None and answer is not None and found.group() == str(answer).strip()
    return share + (1.0 if right else 0.0)


def number(completions, answer, **kwargs) -> list[float]:
    """TRL's signature: ``completions`` (strings or one-message lists) and the ``answer`` column."""
    return [number_score(content(c), a) for c, a in zip(completions, answer)]


number.pass_threshold = math.nextafter(1.0, 2.0)  # strictly above 1: the right number (eval's pass@1)
