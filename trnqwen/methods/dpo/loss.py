"""DPO's arithmetic, one copy for every backend (torchtitan ranks and the Trainer).

A DPO row (:mod:`trnqwen.dataset.preference`) holds whole pairs side by side; ``segments`` says,
for every target position, which pair slot and side it belongs to (``2 * slot + side``).  From a
forward pass:

* :func:`segment_logps` sums each segment's token log-probabilities: ``[B, P, 2]`` (chosen,
  rejected) plus the target counts, with ``F.cross_entropy`` (no ``[B, S, V]`` log-softmax copy);
* :func:`pair_terms` turns policy and reference log-probs into the per-pair loss (``sigmoid``:
  -log sigmoid(beta * margin), ``ipo``: (margin' - 1/(2 beta))^2 on per-token means) and the
  rewards beta * (log pi - log ref);
* :class:`Meter` sums rewards, accuracy and pairs over a step (or a validation pass) for the log.

The reference log-probs come from the same function on the starting weights, so before any
update the policy equals the reference and every pair's sigmoid loss is exactly ln 2.

The batch each trainer sees keeps the trainer's own accounting right: its ``labels`` mark one
position per pair (:func:`pair_markers`), so "valid tokens" = pairs and torchtitan's
``sum / global_valid_tokens`` is the mean over every pair of every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from trnqwen.methods.dpo.settings import LOSS_TYPES

IGNORE_INDEX = -100
KEYS = ("dpo_targets", "dpo_segments", "dpo_ref")  # what a DPO batch carries beside input/positions
METRICS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")


def pair_markers(segments: np.ndarray) -> np.ndarray:
    """Labels with one non-ignored position per pair: the first target of each chosen segment."""
    markers = np.full(segments.shape, IGNORE_INDEX, dtype=np.int64)
    flat = segments.reshape(-1, segments.shape[-1]) if segments.ndim > 1 else segments[None]
    out = markers.reshape(flat.shape)
    for r in range(flat.shape[0]):
        row = flat[r]
        chosen = np.flatnonzero((row >= 0) & (row % 2 == 0))
        if len(chosen):
            first = np.unique(row[chosen], return_index=True)[1]
            out[r, chosen[first]] = 0
    return markers


def segment_logps(logits: torch.Tensor, targets: torch.Tensor, segments: torch.Tensor, pairs_per_row: int):
    """(sums [B, P, 2], counts [B, P, 2]) of target log-probs per pair slot and side (float32)."""
    if hasattr(logits, "full_tensor"):  # a DTensor (vocab-sharded logits under TP): gather once
        logits = logits.full_tensor()
    b, s, v = logits.shape
    token = -F.cross_entropy(
        logits.reshape(b * s, v).float(), targets.reshape(-1).long(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    seg = segments.reshape(-1).long()
    valid = seg >= 0
    width = 2 * pairs_per_row
    index = (torch.arange(b, device=seg.device).repeat_interleave(s) * width + seg.clamp(min=0))[valid]
    sums = torch.zeros(b * width, dtype=torch.float32, device=token.device).index_add(0, index, token[valid])
    counts = torch.zeros(b * width, dtype=torch.float32, device=token.device).index_add(
        0, index, torch.ones_like(token[valid]))
    return sums.view(b, pairs_per_row, 2), counts.view(b, pairs_per_row, 2)


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


class Meter:
    """Sums over a step (or a validation pass): reduced across ranks once, at log time."""

    def __init__(self) -> None:
        self.device = None  # where the sums live (the logits' device): the collective runs there
        self.reset()

    def reset(self) -> None:
        self.totals: Optional[torch.Tensor] = None  # [chosen, rejected, correct, pairs, loss]

    def add(self, terms: PairTerms) -> None:
        row = torch.stack([
            terms.chosen_rewards.sum(), terms.rejected_rewards.sum(),
            (terms.chosen_rewards > terms.rejected_rewards).sum().to(terms.chosen_rewards.dtype),
            torch.tensor(float(terms.losses.numel()), device=terms.losses.device),
            terms.losses.detach().sum(),
        ]).float()
        self.totals = row if self.totals is None else self.totals + row
        self.device = row.device

    def reduce(self, all_reduce=None) -> Optional[dict[str, float]]:
        """The means (over every rank's pairs when ``all_reduce`` sums a tensor across ranks)."""
        # a rank that saw no pair this time still joins the sum, on the device the collective needs
        totals = self.totals if self.totals is not None else torch.zeros(5, dtype=torch.float32, device=self.device)
        if all_reduce is not None:
            totals = totals.clone()
            all_reduce(totals)
        self.reset()
        pairs = float(totals[3])
        if pairs <= 0:
            return None
        chosen, rejected = float(totals[0]) / pairs, float(totals[1]) / pairs
        return {"rewards_chosen": chosen, "rewards_rejected": rejected, "margin": chosen - rejected,
                "accuracy": float(totals[2]) / pairs, "pairs": pairs, "loss": float(totals[4]) / pairs}


def batch_from_rows(split, rows: list, reference: Optional[np.ndarray], pairs_per_row: int):
    """(input_ids, positions, targets, segments, ref [B, P, 2], markers) int64/float32 numpy arrays.

    ``rows`` may hold None (a fill row: pads, nothing trained); ``reference`` None = zeros (the
    reference pass itself)."""
    from trnqwen.runtime.token_stream import read_row

    seq_len = split.seq_len
    ids, pos, tgt, seg, ref = [], [], [], [], []
    for row in rows:
        input_ids, labels, positions = read_row(split, row)
        ids.append(input_ids)
        pos.append(positions)
        tgt.append(labels)
        if row is None:
            seg.append(np.full(seq_len, -1, dtype=np.int64))
            ref.append(np.zeros((pairs_per_row, 2), dtype=np.float32))
        else:
            seg.append(np.asarray(split.extra["segments"][row], dtype=np.int64))
            ref.append(np.zeros((pairs_per_row, 2), dtype=np.float32) if reference is None
                       else np.asarray(reference[row], dtype=np.float32))
    segments = np.stack(seg)
    return (np.stack(ids), np.stack(pos), np.stack(tgt), segments, np.stack(ref), pair_markers(segments))


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a DPO cache (``TokenCacheDataLoader.Config.rows``): the
    pair fields beside input/positions, one label per pair (``runtime/dpo.py`` takes them out)."""
    from trnqwen.dataset.reference import open_reference

    split, stream = dataset.split, dataset.stream
    reference = open_reference(dataset.reference_dir, split.name)  # written by the reference pass
    per_row = int(split.meta["pairs_per_row"][split.name])
    while not stream.exhausted():
        row = stream.advance()
        ids, positions, targets, segments, ref, markers = batch_from_rows(split, [row], reference, per_row)
        if np.isnan(ref).any():
            raise RuntimeError(
                f"row {row} of the {split.name} split has no reference log-probs in {dataset.reference_dir}: "
                "the reference pass covered the rows of the steps this run was started with"
            )
        yield (
            {"input": torch.from_numpy(ids[0]), "positions": torch.from_numpy(positions[0]),
             "dpo_targets": torch.from_numpy(targets[0]), "dpo_segments": torch.from_numpy(segments[0]),
             "dpo_ref": torch.from_numpy(ref[0])},
            torch.from_numpy(markers[0]),
        )
