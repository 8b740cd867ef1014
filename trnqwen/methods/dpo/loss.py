"""DPO's arithmetic, one copy for every backend (torchtitan ranks and the Trainer).

The pair rows, their segment log-prob sums and the per-pair meter are every preference method's
(:mod:`trnqwen.methods.pairs`).  Here:

* :func:`pair_terms` turns policy and reference log-probs into the per-pair loss (``sigmoid``:
  -log sigmoid(beta * margin), ``ipo``: (margin' - 1/(2 beta))^2 on per-token means) and the
  rewards beta * (log pi - log ref);
* :class:`Meter` sums rewards, accuracy and pairs over a step (or a validation pass) for the log;
* :func:`titan_rows`: the torchtitan dataloader's rows of a DPO cache, with their reference log-probs.

The reference log-probs come from the same function on the starting weights, so before any
update the policy equals the reference and every pair's sigmoid loss is exactly ln 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from trnqwen.methods import pairs
from trnqwen.methods.dpo.settings import LOSS_TYPES

KEYS = ("dpo_targets", "dpo_segments", "dpo_ref")  # what a DPO batch carries beside input/positions
METRICS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")


@dataclass
class PairTerms:
    losses: torch.Tensor  # [n] per present pair
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def pair_terms(policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor, *, beta: float,
               loss_type: str) -> PairTerms:
    """Per-pair loss and rewards for the pairs present (both sides have targets)."""
    present = (counts[..., 0] > 0) & (counts[..., 1] > 0)
    pol, ref, n = policy[present], reference[present].to(policy.dtype), counts[present]
    if loss_type == "ipo":  # IPO compares per-token means (as the paper and TRL do)
        pol, ref = pol / n, ref / n
    chosen = beta * (pol[:, 0] - ref[:, 0])
    rejected = beta * (pol[:, 1] - ref[:, 1])
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(chosen - rejected)
    elif loss_type == "ipo":
        logits = (pol[:, 0] - ref[:, 0]) - (pol[:, 1] - ref[:, 1])
        losses = (logits - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"DPO loss type must be one of {LOSS_TYPES}, not {loss_type!r}")
    return PairTerms(losses, chosen.detach(), rejected.detach())


class Meter(pairs.Meter):
    """Rewards, accuracy and loss summed over a step (or a validation pass): reduced across ranks
    once, at log time."""

    def __init__(self) -> None:
        super().__init__(("rewards_chosen", "rewards_rejected", "accuracy", "loss"))

    def add(self, terms: PairTerms) -> None:
        self.add_values({"rewards_chosen": terms.chosen_rewards, "rewards_rejected": terms.rejected_rewards,
                         "accuracy": (terms.chosen_rewards > terms.rejected_rewards).float(),
                         "loss": terms.losses})

    def reduce(self, all_reduce=None) -> Optional[dict[str, float]]:
        values = super().reduce(all_reduce)
        if values is not None:
            values["margin"] = values["rewards_chosen"] - values["rewards_rejected"]
        return values


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a DPO cache (``TokenCacheDataLoader.Config.rows``): the
    pair fields beside input/positions, one label per pair (:class:`~trnqwen.methods.dpo.titan.DPOHook`
    takes them out)."""
    from trnqwen.dataset.reference import open_reference

    split = dataset.split
    reference = open_reference(dataset.reference_dir, split.name)  # written by the reference pass
    for row, (ids, positions, targets, segments, ref, markers) in pairs.read_pairs(split, dataset.stream, reference):
        if np.isnan(ref).any():
            raise RuntimeError(
                f"row {row} of the {split.name} split has no reference log-probs in {dataset.reference_dir}: "
                "the reference pass covered the rows of the steps this run was started with"
            )
        yield pairs.titan_sample(ids, positions, markers, dict(zip(KEYS, (targets, segments, ref))))
