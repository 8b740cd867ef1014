"""DPO's arithmetic, one copy for every backend (torchtitan ranks and the Trainer).

The pair rows, their segment log-prob sums, the per-pair terms and their meter are every
preference method's (:mod:`trnqwen.methods.pairs`).  Here:

* :func:`pair_terms` turns policy and reference log-probs into the per-pair loss (``sigmoid``:
  -log sigmoid(beta * margin), ``ipo``: (margin' - 1/(2 beta))^2 on per-token means) and the
  rewards beta * (log pi - log ref);
* :func:`terms_fn`: that loss from a forward's segment sums and the batch's reference log-probs;
* :func:`titan_rows`: the torchtitan dataloader's rows of a DPO cache, with their reference log-probs.

The reference log-probs come from the same function on the starting weights, so before any
update the policy equals the reference and every pair's sigmoid loss is exactly ln 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trnqwen.methods import pairs
from trnqwen.methods.dpo.settings import LOSS_TYPES
from trnqwen.methods.pairs import PairTerms

KEYS = ("dpo_targets", "dpo_segments", "dpo_ref")  # what a DPO batch carries beside input/positions
METRICS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")
TERMS = PairTerms  # DPO's per-pair values: the loss and the rewards (what its meter sums)


def pair_terms(policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor, *, beta: float,
               loss_type: str) -> PairTerms:
    """Per-pair loss and rewards for the pairs present (both sides have targets)."""
    present = pairs.present(counts)
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


def terms_fn(*, beta: float, loss_type: str) -> pairs.TermsFn:
    """The loss of a forward (:func:`trnqwen.methods.pairs.batch_terms`): the batch's stored values
    are the pairs' reference log-probs."""
    return lambda sums, counts, reference: pair_terms(sums, reference, counts, beta=beta, loss_type=loss_type)


def missing_reference(reference_dir: str) -> str:
    """What a row without reference log-probs lacks (the run stops naming the row)."""
    return (f"reference log-probs in {reference_dir}: the reference pass covered the rows of the steps this run "
            "was started with")


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a DPO cache (``TokenCacheDataLoader.Config.rows``): the
    pair fields beside input/positions, one label per pair (:class:`~trnqwen.methods.dpo.titan.DPOHook`
    takes them out)."""
    from trnqwen.dataset.reference import open_reference

    reference = open_reference(dataset.reference_dir, dataset.split.name)  # written by the reference pass
    yield from pairs.titan_rows(dataset, KEYS, reference, missing=missing_reference(dataset.reference_dir))
