"""``trnqwen eval`` on preference pairs (a DPO run's cache): which answer does each model prefer?

For every held-out pair the model's summed log-probability of the chosen answer and of the
rejected one, computed with the training's own arithmetic: the rows come through
:func:`trnqwen.methods.pairs.batch_from_rows` and the sums through
:func:`~trnqwen.methods.pairs.segment_logps` (chosen and rejected sit side by side in one row,
each attending only to itself).  From them, per model:

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

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ChosenLoss:
    tokens: int
    loss_sum: float

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else float("nan")

EvalData = Any  # trnqwen.evaluate.data.EvalData: split, pairs_per_row, len() (handed in by eval)
HEAD_CHUNK = 4096  # trained positions per LM-head + cross-entropy chunk: eval passes its own (evaluate.model)

REWARD_FIELDS = ("reward_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected", "dpo_loss")
SUMMARY_FIELDS = ("reward_accuracy", "reward_margin", "dpo_loss")  # what the fine-tune's last line keeps
FIELDS = ("pairs", "preference_accuracy", "margin", *REWARD_FIELDS)  # what each result row adds


@dataclass
class PairScores:
    """One model on every held-out pair, in cache order: numpy float64 [pairs, 2] (chosen, rejected)."""

    logps: Any  # summed target log-probs
    counts: Any  # target tokens per side

    def __len__(self) -> int:
        return int(self.logps.shape[0])

    def chosen_loss(self) -> ChosenLoss:
        """NLL per token over the chosen answers: eval's loss of this data."""
        return ChosenLoss(tokens=int(self.counts[:, 0].sum()), loss_sum=float(-self.logps[:, 0].sum()))


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


def score_pairs(model, data: EvalData, *, batch_size: int, static_shapes: bool = False,
                head_chunk: int = HEAD_CHUNK) -> PairScores:
    """Summed log-probs of each pair's chosen and rejected answer (pairs whose both sides have targets).

    Shapes as :func:`trnqwen.evaluate.model.score`: ``[batch_size, seq_len]`` batches; off Neuron
    only the target positions go through the LM head, row by row in chunks."""
    import numpy as np
    import torch

    from trnqwen.methods.pairs import batch_from_rows, segment_logps

    pairs_per_row, n = data.pairs_per_row, len(data)
    device = model.device
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    sums_out, counts_out = [], []
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            rows = [r if r < n else None for r in range(start, start + batch_size)]  # None: a fill row
            ids, positions, targets, segments, _, _ = (
                torch.from_numpy(a).to(device) for a in batch_from_rows(data.split, rows, None, pairs_per_row))
            hidden = decoder(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
            if static_shapes:
                sums, counts = segment_logps(head(hidden), targets, segments, pairs_per_row)
            else:
                sums = torch.zeros((len(rows), pairs_per_row, 2), dtype=torch.float32, device=device)
                counts = torch.zeros_like(sums)
                for b in range(len(rows)):
                    keep = segments[b] >= 0
                    h, t, s = hidden[b][keep], targets[b][keep], segments[b][keep]
                    for lo in range(0, t.numel(), head_chunk):
                        part_sums, part_counts = segment_logps(
                            head(h[lo:lo + head_chunk])[None], t[lo:lo + head_chunk][None], s[lo:lo + head_chunk][None],
                            pairs_per_row)
                        sums[b] += part_sums[0]
                        counts[b] += part_counts[0]
            real = sum(r is not None for r in rows)
            sums_out.append(sums[:real].double().cpu().numpy())
            counts_out.append(counts[:real].cpu().numpy())
    sums_all = np.concatenate(sums_out).reshape(-1, 2)
    counts_all = np.concatenate(counts_out).reshape(-1, 2)
    present = (counts_all[:, 0] > 0) & (counts_all[:, 1] > 0)  # a row's unused slots hold nothing
    return PairScores(logps=sums_all[present], counts=counts_all[present].astype(np.int64))


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
