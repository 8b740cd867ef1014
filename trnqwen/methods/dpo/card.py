"""The model card's section for a DPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from typing import Any, Callable, Optional


def card(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]]) -> list[str]:
    """Markdown lines: accuracy and margin of base and tuned, the rewards against the base, the
    loss on the chosen answers (``num`` formats a number as the rest of the card does)."""
    on = f" on {eval_dataset}" if eval_dataset else ""
    lines = ["", f"## Held-out preference pairs (`trnqwen eval`{on})", "",
             "Preference accuracy: the share of pairs whose chosen answer the model gives the higher log-probability; "
             "margin: mean log p(chosen) - log p(rejected); rewards: DPO's implicit rewards against the base model; "
             "chosen-answer loss: mean NLL per token of the chosen answers.", "",
             "| checkpoint | pairs | preference accuracy | margin | reward accuracy | reward margin | chosen-answer loss | vs base |",
             "|---|---|---|---|---|---|---|---|"]
    for r in eval_results:
        delta = r.get("delta_vs_base")
        cells = [r.get("checkpoint"), r.get("pairs"), num(r.get("preference_accuracy")), num(r.get("margin")),
                 num(r.get("reward_accuracy")), num(r.get("reward_margin")), num(r.get("loss")),
                 None if delta is None else f"{delta:+.4f}"]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return lines
