"""``trnqwen eval`` on an ORPO run's preference pairs: which answer does each model prefer?

The held-out pairs are scored by every preference method's scorer
(:func:`trnqwen.methods.pair_scores.score_pairs`: each side's summed log-prob and token count).
ORPO compares *mean* token log-probs, so per model:

* **preference accuracy**: the share of pairs whose chosen answer has the higher mean token log-prob;
* **margin**: the mean of (mean log p chosen - mean log p rejected);
* **log odds ratio**: the mean of log sigmoid(log odds) (the term ORPO's lambda weighs);
* **ORPO loss**: the mean of -mean log p chosen - lambda x log sigmoid(log odds) (lambda from the run);
* **chosen-answer loss** (eval's ``loss``): mean NLL per token over the chosen answers.

No rewards against the base: ORPO has no reference model.  torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any, Optional

from trnqwen.methods.pair_scores import HEAD_CHUNK, EvalData, PairScores, score_pairs

REWARD_FIELDS = ("reward_accuracy", "reward_margin")  # eval's table columns: None (no reference)
FIELDS = ("pairs", "preference_accuracy", "margin", "log_odds_ratio", "orpo_loss", *REWARD_FIELDS)
SUMMARY_FIELDS = ("log_odds_ratio", "orpo_loss")  # what the fine-tune's last line keeps
# eval's table: its columns after accuracy and margin ((header, field, format)) and its title's note
TABLE_COLUMNS = (("log odds ratio", "log_odds_ratio", ".4f"), ("ORPO loss", "orpo_loss", ".4f"))


def table_note(method_settings: dict[str, Any]) -> str:
    return f"mean token log-probs, reference-free; lambda {method_settings.get('orpo_lambda')}"


def settings(run_config: Optional[dict], defaults: dict[str, Any]) -> dict[str, Any]:
    """What the loss is computed with, as eval.json names it: the run's lambda (run.json), else the default."""
    config = run_config or {}
    return {"orpo_lambda": float(config.get("orpo_lambda") or defaults["orpo_lambda"])}


def score(model, data: EvalData, *, batch_size: int, static_shapes: bool = False, head_chunk: int = HEAD_CHUNK) -> PairScores:
    """Eval's entry point: :func:`~trnqwen.methods.pair_scores.score_pairs`."""
    return score_pairs(model, data, batch_size=batch_size, static_shapes=static_shapes, head_chunk=head_chunk)


def numbers(scores: PairScores, reference: Optional[PairScores], method_settings: dict[str, Any]) -> dict[str, Any]:
    """Eval's entry point: the result row's fields (``reference``, the base's scores, is not used)."""
    del reference
    return preference_numbers(scores, lam=float(method_settings["orpo_lambda"]))


def preference_numbers(scores: PairScores, *, lam: float) -> dict[str, Any]:
    """The result row's preference fields (:data:`FIELDS`) from mean token log-probs."""
    import numpy as np
    import torch

    from trnqwen.methods.orpo.loss import orpo_terms

    out: dict[str, Any] = {"pairs": len(scores), **{k: None for k in REWARD_FIELDS}}
    if len(scores) == 0:
        return {**out, "preference_accuracy": float("nan"), "margin": float("nan"), "log_odds_ratio": None,
                "orpo_loss": None}
    means = scores.means()
    margins = means[:, 0] - means[:, 1]
    terms = orpo_terms(torch.from_numpy(np.ascontiguousarray(scores.logps, dtype=np.float64)),
                       torch.from_numpy(np.ascontiguousarray(scores.counts, dtype=np.float64)), lam=lam)
    out.update(preference_accuracy=float(np.mean(margins > 0)), margin=float(np.mean(margins)),
               log_odds_ratio=float(terms.log_odds_ratio.mean()), orpo_loss=float(terms.losses.mean()))
    return out
