"""``trnqwen eval`` on preference pairs (a DPO run's cache): which answer does each model prefer?

For every held-out pair the model's summed log-probability of the chosen answer and of the
rejected one, computed with the training's own arithmetic: the scores come from
:func:`trnqwen.methods.pair_scores.score_pairs` (every preference method's scorer: chosen and
rejected sit side by side in one row, each attending only to itself).  From them, per model:

* **preference accuracy**: the share of pairs where the chosen answer gets the higher log-prob;
* **margin**: the mean of (log p chosen - log p rejected);
* **chosen-answer loss**: mean NLL per token over the chosen answers (did quality hold?);

and for a tuned model, against the base as the reference (what DPO optimised, ``beta`` from the
run): the implicit rewards ``beta * (log pi - log pi_ref)``, their accuracy and margin, and the
DPO loss, through :func:`~trnqwen.methods.dpo.loss.pair_terms`.  Identical weights give reward
margin 0 and loss ln 2, as DPO's step 1 does.  The base's sums are kept as numbers, so base and
tuned never sit in memory together.  torch is imported inside the functions.

``trnqwen eval`` (:mod:`trnqwen.evaluate.run`) reaches this module through ``Method.eval_report``
and hands it its pieces (the held-out data, the LM-head chunk); a method never imports evaluate/.
:func:`settings` names what the rewards are computed with (the run's beta and loss).
"""

from __future__ import annotations

from typing import Any, Optional

from trnqwen.methods.pair_scores import HEAD_CHUNK, EvalData, PairScores, score_pairs

REWARD_FIELDS = ("reward_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected", "dpo_loss")
SUMMARY_FIELDS = ("reward_accuracy", "reward_margin", "dpo_loss")  # what the fine-tune's last line keeps
FIELDS = ("pairs", "preference_accuracy", "margin", *REWARD_FIELDS)  # what each result row adds
# eval's table: its columns after accuracy and margin ((header, field, format)) and its title's note
TABLE_COLUMNS = (("reward accuracy", "reward_accuracy", ".4f"), ("reward margin", "reward_margin", "+.4f"))


def table_note(method_settings: dict[str, Any]) -> str:
    return f"rewards against the base, beta {method_settings.get('beta')}"


def settings(run_config: Optional[dict], defaults: dict[str, Any]) -> dict[str, Any]:
    """What the rewards are computed with, as eval.json names it: the run's (run.json), else the defaults."""
    config = run_config or {}
    return {"beta": float(config.get("beta") or defaults["beta"]),
            "dpo_loss": str(config.get("dpo_loss") or defaults["dpo_loss"])}


def score(model, data: EvalData, *, batch_size: int, static_shapes: bool = False, head_chunk: int = HEAD_CHUNK) -> PairScores:
    """Eval's entry point: :func:`score_pairs`."""
    return score_pairs(model, data, batch_size=batch_size, static_shapes=static_shapes, head_chunk=head_chunk)


def numbers(scores: PairScores, reference: Optional[PairScores], method_settings: dict[str, Any]) -> dict[str, Any]:
    """Eval's entry point: the result row's fields (:func:`preference_numbers` with the run's settings)."""
    return preference_numbers(scores, reference, beta=method_settings["beta"], loss_type=method_settings["dpo_loss"])


def preference_numbers(scores: PairScores, reference: Optional[PairScores], *, beta: float, loss_type: str) -> dict[str, Any]:
    """The result row's preference fields (:data:`FIELDS`); the reward fields are None without a
    reference (the base itself, or ``--no-base``)."""
    import numpy as np

    margins = scores.logps[:, 0] - scores.logps[:, 1]
    out: dict[str, Any] = {
        "pairs": len(scores),
        "preference_accuracy": float(np.mean(margins > 0)) if len(scores) else float("nan"),
        "margin": float(np.mean(margins)) if len(scores) else float("nan"),
        **{name: None for name in REWARD_FIELDS},
    }
    if reference is None or len(scores) == 0:
        return out
    if reference.counts.shape != scores.counts.shape or not (reference.counts == scores.counts).all():
        return out  # not the same pairs (cannot happen for one data set): no rewards rather than wrong ones
    import torch

    from trnqwen.methods.dpo.loss import pair_terms

    def as_pairs(array):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))[:, None, :]  # [pairs, P=1, 2]

    terms = pair_terms(as_pairs(scores.logps), as_pairs(reference.logps), as_pairs(scores.counts),
                       beta=beta, loss_type=loss_type)
    chosen, rejected = terms.chosen_rewards, terms.rejected_rewards
    out.update(
        reward_accuracy=float((chosen > rejected).double().mean()),
        reward_margin=float((chosen - rejected).mean()),
        rewards_chosen=float(chosen.mean()),
        rewards_rejected=float(rejected.mean()),
        dpo_loss=float(terms.losses.mean()),
    )
    return out
