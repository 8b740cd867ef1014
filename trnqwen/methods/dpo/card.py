"""The model card's section for a DPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from functools import partial

from trnqwen.methods.pair_scores import card_section

INTRO = ("Preference accuracy: the share of pairs whose chosen answer the model gives the higher log-probability; "
         "margin: mean log p(chosen) - log p(rejected); rewards: DPO's implicit rewards against the base model; "
         "chosen-answer loss: mean NLL per token of the chosen answers.")
COLUMNS = (("preference accuracy", "preference_accuracy"), ("margin", "margin"), ("reward accuracy", "reward_accuracy"),
           ("reward margin", "reward_margin"), ("chosen-answer loss", "loss"))


# Method.card: card(eval_results, eval_dataset, num) -> the section's markdown lines
card = partial(card_section, intro=INTRO, columns=COLUMNS)
