"""``trnqwen eval`` on preference pairs (a DPO run's cache): which answer does each model prefer?

For every held-out pair the model's summed log-probability of the chosen answer and of the
rejected one, computed with the training's own arithmetic: the rows come through
:func:`trnqwen.runtime.dpo_loss.batch_from_rows` and the sums through
:func:`~trnqwen.runtime.dpo_loss.segment_logps` (chosen and rejected sit side by side in one row,
each attending only to itself).  From them, per model:

* **preference accuracy**: the share of pairs where the chosen answer gets the higher log-prob;
* **margin**: the mean of (log p chosen - log p rejected);
* **chosen-answer loss**: mean NLL per token over the chosen answers (did quality hold?);

and for a tuned model, against the base as the reference (what DPO optimised, ``beta`` from the
run): the implicit rewards ``beta * (log pi - log pi_ref)``, their accuracy and margin, and the
DPO loss, through :func:`~trnqwen.runtime.dpo_loss.pair_terms`.  Identical weights give reward
margin 0 and loss ln 2, as DPO's step 1 does.  The base's sums are kept as numbers, so base and
tuned never sit in memory together.  torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trnqwen.evaluate.data import EvalData
from trnqwen.evaluate.model import HEAD_CHUNK, LossResult

REWARD_FIELDS = ("reward_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected", "dpo_loss")
FIELDS = ("pairs", "preference_accuracy", "margin", *REWARD_FIELDS)  # what each result row adds


@dataclass
class PairScores:
    """One model on every held-out pair, in cache order: numpy float64 [pairs, 2] (chosen, rejected)."""

    logps: Any  # summed target log-probs
    counts: Any  # target tokens per side

    def __len__(self) -> int:
        return int(self.logps.shape[0])

    def chosen_loss(self) -> LossResult:
        """NLL per token over the chosen answers."""
        return LossResult(tokens=int(self.counts[:, 0].sum()), loss_sum=float(-self.logps[:, 0].sum()))


def score_pairs(model, data: EvalData, *, batch_size: int, static_shapes: bool = False) -> PairScores:
    """Summed log-probs of each pair's chosen and rejected answer (pairs whose both sides have targets).

    Shapes as :func:`trnqwen.evaluate.model.score`: ``[batch_size, seq_len]`` batches; off Neuron
    only the target positions go through the LM head, row by row in chunks."""
    import numpy as np
    import torch

    from trnqwen.runtime.dpo_loss import batch_from_rows, segment_logps

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
                    for lo in range(0, t.numel(), HEAD_CHUNK):
                        part_sums, part_counts = segment_logps(
                            head(h[lo:lo + HEAD_CHUNK])[None], t[lo:lo + HEAD_CHUNK][None], s[lo:lo + HEAD_CHUNK][None],
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

    from trnqwen.runtime.dpo_loss import pair_terms

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
