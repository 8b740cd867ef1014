"""The model card's section for an ORPO run (``Method.card``): trnqwen eval's held-out pairs."""

from __future__ import annotations

from functools import partial

from trnqwen.methods.pair_scores import card_section

INTRO = ("Trained with ORPO (reference-free). Preference accuracy: the share of pairs whose chosen answer has the "
         "higher mean token log-probability; margin: mean of (mean log p(chosen) - mean log p(rejected)); log odds "
         "ratio: mean log sigmoid(log odds); chosen-answer loss: mean NLL per token of the chosen answers.")
COLUMNS = (("preference accuracy", "preference_accuracy"), ("margin", "margin"), ("log odds ratio", "log_odds_ratio"),
           ("ORPO loss", "orpo_loss"), ("chosen-answer loss", "loss"))


# Method.card: card(eval_results, eval_dataset, num) -> the section's markdown lines
card = partial(card_section, intro=INTRO, columns=COLUMNS)
