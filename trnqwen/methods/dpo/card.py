"""The model card's section for a DPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from typing import Any, Callable, Optional

from trnqwen.methods.pair_scores import card_section

INTRO = ("Preference accuracy: the share of pairs whose chosen answer the model gives the higher log-probability; "
         "margin: mean log p(chosen) - log p(rejected); rewards: DPO's implicit rewards against the base model; "
         "chosen-answer loss: mean NLL per token of the chosen answers.")
COLUMNS = (("preference accuracy", "preference_accuracy"), ("margin", "margin"), ("reward accuracy", "reward_accuracy"),
           ("reward margin", "reward_margin"), ("chosen-answer loss", "loss"))


def card(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]]) -> list[str]:
    """Markdown lines: accuracy and margin of base and tuned, the rewards against the base, the
    loss on the chosen answers (``num`` formats a number as the rest of the card does)."""
    return card_section(eval_results, eval_dataset, num, intro=INTRO, columns=COLUMNS)
