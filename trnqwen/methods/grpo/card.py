"""The model card's section for a GRPO run (``Method.card``): trnqwen eval's held-out prompts."""

from __future__ import annotations

from typing import Any, Callable, Optional

INTRO = ("Each model answers every held-out prompt once, greedily; the run's reward functions score the answers. "
         "Mean reward: the mean total reward; pass@1: the share of prompts whose answer the rewards that can tell "
         "(e.g. `accuracy`) call right.")


def card(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]]) -> list[str]:
    """The section's markdown lines: one row per checkpoint (prompts, mean reward, pass@1, change against the base)."""
    on = f" on {eval_dataset}" if eval_dataset else ""
    lines = ["", f"## Held-out prompts (`trnqwen eval`{on})", "", INTRO, "",
             "| checkpoint | prompts | mean reward | pass@1 | vs base |", "|---|---|---|---|---|"]
    for r in eval_results:
        delta = r.get("reward_vs_base")
        cells = [r.get("checkpoint"), r.get("prompts"), num(r.get("mean_reward")), num(r.get("pass_at_1")),
                 None if delta is None else f"{delta:+.4f}"]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return lines
