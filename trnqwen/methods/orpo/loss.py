"""ORPO's arithmetic, one copy for every backend (Hong et al. 2024, "ORPO: Monolithic Preference
Optimization without Reference Model"; TRL's ORPOTrainer, axolotl's ``rl: orpo``).

Per pair, from the policy's own forward only (no reference model, so no reference pass):

* ``logp_c``, ``logp_r``: the mean token log-probability of the chosen and the rejected answer
  (only the answers' targets, as the chat mask marks them; :func:`trnqwen.methods.pairs.segment_logps`);
* ``log_odds = (logp_c - logp_r) - (log(1 - e^logp_c) - log(1 - e^logp_r))``;
* ``loss = -logp_c - lambda * log sigmoid(log_odds)``: the chosen answer's NLL plus the odds-ratio
  term.

The step's loss is the mean over its pairs (TRL takes the NLL as a token mean over the batch's
chosen answers; a pair mean keeps every pair's weight equal across ranks and gradient
accumulation, as DPO's loss does here: one marker label per pair).  Rewards are ``lambda * logp``
(TRL's), accuracy the share of pairs whose chosen reward is higher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trnqwen.methods import pairs
from trnqwen.methods.pairs import PairTerms

# what an ORPO batch carries beside input/positions (``orpo_slots``: zeros [pairs per row, 2], whose
# shape gives the loss the row's pair slots without reading a value off the device)
KEYS = ("orpo_targets", "orpo_segments", "orpo_slots")
# the values logged each step, named as in the metrics stream (without the "orpo/" prefix)
METRICS = ("nll", "log_odds_ratio", "log_odds", "rewards_chosen", "rewards_rejected", "margin", "accuracy")
_LN_HALF = -0.6931471805599453


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate at both ends (Maechler 2012): log(-expm1(x)) near 0,
    log1p(-exp(x)) far below it."""
    return torch.where(x > _LN_HALF, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


@dataclass
class OrpoTerms(PairTerms):
    """The loss and rewards (``lambda * logp``) per pair, and ORPO's own values (what its meter sums)."""

    nll: torch.Tensor  # -logp_c
    log_odds: torch.Tensor
    log_odds_ratio: torch.Tensor  # log sigmoid(log_odds)


TERMS = OrpoTerms


def orpo_terms(sums: torch.Tensor, counts: torch.Tensor, *, lam: float) -> OrpoTerms:
    """Per-pair ORPO loss and its parts for the pairs present, from the segment sums and counts
    (``[..., 2]``: chosen, rejected)."""
    keep = pairs.present(counts)
    mean = sums[keep] / counts[keep]
    chosen, rejected = mean[:, 0], mean[:, 1]
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    nll = -chosen
    return OrpoTerms(losses=nll - lam * ratio, chosen_rewards=lam * chosen.detach(),
                     rejected_rewards=lam * rejected.detach(), nll=nll.detach(), log_odds=log_odds.detach(),
                     log_odds_ratio=ratio.detach())


def terms_fn(*, lam: float) -> pairs.TermsFn:
    """The loss of a forward (:func:`trnqwen.methods.pairs.batch_terms`); the batch's stored values
    (zeros) only give the row's pair slots."""
    return lambda sums, counts, _slots: orpo_terms(sums, counts, lam=lam)


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a preference cache for ORPO (``TokenCacheDataLoader.Config.rows``):
    the pairs' targets, segments and slots beside input/positions, one label per pair (:class:`~trnqwen.methods.orpo.titan.ORPOHook`
    takes them out).  No stored per-pair values: ORPO has no reference."""
    yield from pairs.titan_rows(dataset, KEYS)
