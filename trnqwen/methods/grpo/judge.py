"""The judge's rules about a GRPO run (``Method.judge``), on plain data (``facts``: see
:mod:`trnqwen.methods.dpo.judge`; GRPO's lines: :mod:`trnqwen.methods.grpo.log_lines`).

* error ``grpo-reward-failed``: a reward function raised or returned something that is not one
  number per completion (the ranks' ``[trnqwen] usage error: reward function ...`` line);
* warning ``grpo-reward-flat``: over at least :data:`MIN_STEPS` logged steps the mean reward of the
  last half is not above the first half's by :data:`FLAT_SHARE` of the reward's std (nothing learnt:
  the learning rate, the reward, or groups without signal);
* warning ``grpo-no-signal``: in most steps most groups' rewards were all equal (advantage 0: no
  gradient): a harder/easier task split, a denser reward, more generations;
* warning ``grpo-truncated``: most completions were cut at ``--max-completion-length``;
* warning ``grpo-kl-high``: the KL to the starting weights passed :data:`KL_HIGH` (``kl_beta`` > 0).
"""

from __future__ import annotations

import math
from typing import Any

from trnqwen.methods.grpo.log_lines import is_run, reward_failure, steps

MIN_STEPS = 4
FLAT_SHARE = 0.05
MOSTLY = 0.5
KL_HIGH = 1.0


def _mean(values: list[float]) -> float:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def rules(facts: dict[str, Any]) -> list[tuple]:
    """(severity, code, message, lines) about a GRPO run."""
    if not is_run(facts):
        return []
    out: list[tuple] = []
    failure = reward_failure(facts)
    if failure is not None:
        out.append(("error", "grpo-reward-failed", f"a reward function failed: {failure['message']}",
                    [failure.get("line", "")]))
    logged = steps(facts)
    if not logged:
        return out
    order = sorted(logged)
    last = logged[order[-1]]
    line = [last.get("line", "")]
    rewards = [logged[s].get("reward") for s in order]
    if len(order) >= MIN_STEPS:
        half = len(order) // 2
        early, late = _mean(rewards[:half]), _mean(rewards[-half:])
        spread = _mean([logged[s].get("reward_std") for s in order])
        if math.isfinite(early) and math.isfinite(late) and late - early <= FLAT_SHARE * (spread if spread > 0 else 1.0):
            out.append(("warning", "grpo-reward-flat",
                        f"mean reward did not rise: {early:.4f} over the first {half} logged steps, {late:.4f} over the "
                        f"last {half}; check the learning rate, the reward functions and the groups' signal", line))
    no_signal = [logged[s].get("frac_reward_zero_std") for s in order]
    if sum(1 for v in no_signal if isinstance(v, (int, float)) and v > MOSTLY) > len(order) / 2:
        out.append(("warning", "grpo-no-signal",
                    f"in most steps most groups had equal rewards (mean share {_mean(no_signal):.2f}): their advantage is 0 "
                    "and they teach nothing; use a denser reward, more --num-generations or prompts of the right difficulty",
                    line))
    cut = _mean([logged[s].get("clipped_ratio") for s in order])
    if math.isfinite(cut) and cut > MOSTLY:
        out.append(("warning", "grpo-truncated",
                    f"{cut:.0%} of completions were cut at --max-completion-length (no end of turn): raise it, or "
                    "add the length reward", line))
    kl = last.get("kl")
    if isinstance(kl, (int, float)) and (not math.isfinite(kl) or kl > KL_HIGH):
        out.append(("warning", "grpo-kl-high", f"KL to the starting weights is {kl:.4g} at step {order[-1]}: the policy "
                    "is running away; lower the learning rate or raise --kl-beta", line))
    return out
