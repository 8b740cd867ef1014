"""The model card's section for an ORPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from typing import Any, Callable, Optional


def card(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]]) -> list[str]:
    """Markdown lines: preference accuracy, margin, log odds ratio and ORPO loss of base and tuned, the
    loss on the chosen answers (``num`` formats a number as the rest of the card does)."""
    on = f" on {eval_dataset}" if eval_dataset else ""
    lines = ["", f"## Held-out preference pairs (`trnqwen eval`{on})", "",
             "Trained with ORPO (reference-free). Preference accuracy: the share of pairs whose chosen answer has the "
             "higher mean token log-probability; margin: mean of (mean log p(chosen) - mean log p(rejected)); log odds "
             "ratio: mean log sigmoid(log odds); chosen-answer loss: mean NLL per token of the chosen answers.", "",
             "| checkpoint | pairs | preference accuracy | margin | log odds ratio | ORPO loss | chosen-answer loss | vs base |",
             "|---|---|---|---|---|---|---|---|"]
    for r in eval_results:
        delta = r.get("delta_vs_base")
        cells = [r.get("checkpoint"), r.get("pairs"), num(r.get("preference_accuracy")), num(r.get("margin")),
                 num(r.get("log_odds_ratio")), num(r.get("orpo_loss")), num(r.get("loss")),
                 None if delta is None else f"{delta:+.4f}"]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return lines
