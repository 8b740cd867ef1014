"""The model card's section for an ORPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from typing import Any, Callable, Optional

from trnqwen.methods.pair_scores import card_section

INTRO = ("Trained with ORPO (reference-free). Preference accuracy: the share of pairs whose chosen answer has the "
         "higher mean token log-probability; margin: mean of (mean log p(chosen) - mean log p(rejected)); log odds "
         "ratio: mean log sigmoid(log odds); chosen-answer loss: mean NLL per token of the chosen answers.")
COLUMNS = (("preference accuracy", "preference_accuracy"), ("margin", "margin"), ("log odds ratio", "log_odds_ratio"),
           ("ORPO loss", "orpo_loss"), ("chosen-answer loss", "loss"))


def card(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]]) -> list[str]:
    """Markdown lines: preference accuracy, margin, log odds ratio and ORPO loss of base and tuned, the
    loss on the chosen answers (``num`` formats a number as the rest of the card does)."""
    return card_section(eval_results, eval_dataset, num, intro=INTRO, columns=COLUMNS)
