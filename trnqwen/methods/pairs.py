"""What every preference-pair method shares (DPO, ORPO): the pair rows, their log-probs, a meter.

A preference row (:mod:`trnqwen.dataset.preference`) holds whole pairs side by side; ``segments``
says, for every target position, which pair slot and side it belongs to (``2 * slot + side``).
From a forward pass:

* :func:`segment_logps` sums each segment's token log-probabilities: ``[B, P, 2]`` (chosen,
  rejected) plus the target counts, with ``F.cross_entropy`` (no ``[B, S, V]`` log-softmax copy);
* :func:`batch_from_rows` reads cache rows as arrays (ids, positions, targets, segments, stored
  per-pair values such as DPO's reference log-probs, the pair markers);
* :func:`read_pairs` walks a rank's stream of rows (the torchtitan dataloader's and the
  Trainer's row readers build their batches from it);
* :class:`Meter` sums per-pair values over a step (or a validation pass), reduced across ranks
  once, at log time.

The batch each trainer sees keeps the trainer's own accounting right: its ``labels`` mark one
position per pair (:func:`pair_markers`), so "valid tokens" = pairs and torchtitan's
``sum / global_valid_tokens`` (the Trainer's ``num_items_in_batch``) makes the loss the mean
over every pair of every rank.  A method never imports another method: what two of them share
lives here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from trnqwen.dataset.cache import TokenSplit

IGNORE_INDEX = -100


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


def present(counts: torch.Tensor) -> torch.Tensor:
    """The pair slots that hold a pair (both sides have targets): a row's unused slots hold nothing."""
    return (counts[..., 0] > 0) & (counts[..., 1] > 0)


def pairs_per_row(split: TokenSplit) -> int:
    return int(split.meta["pairs_per_row"][split.name])


def batch_from_rows(split, rows: list, stored: Optional[np.ndarray], per_row: int):
    """(input_ids, positions, targets, segments, stored [B, P, 2], markers) int64/float32 numpy arrays.

    ``rows`` may hold None (a fill row: pads, nothing trained); ``stored`` holds per-pair values
    kept beside the cache (DPO's reference log-probs), None = zeros."""
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
            ref.append(np.zeros((per_row, 2), dtype=np.float32))
        else:
            seg.append(np.asarray(split.extra["segments"][row], dtype=np.int64))
            ref.append(np.zeros((per_row, 2), dtype=np.float32) if stored is None
                       else np.asarray(stored[row], dtype=np.float32))
    segments = np.stack(seg)
    return (np.stack(ids), np.stack(pos), np.stack(tgt), segments, np.stack(ref), pair_markers(segments))


def read_pairs(split, stream, stored: Optional[np.ndarray] = None) -> Iterator[tuple[Optional[int], tuple]]:
    """A rank's rows of a preference split, in its stream's order (every backend's rule,
    :mod:`trnqwen.runtime.token_stream`): ``(row, (ids, positions, targets, segments, stored,
    markers))`` with each array one row's (no batch axis)."""
    per_row = pairs_per_row(split)
    while not stream.exhausted():
        row = stream.advance()
        arrays = batch_from_rows(split, [row], stored, per_row)
        yield row, tuple(a[0] for a in arrays)


def titan_sample(ids: np.ndarray, positions: np.ndarray, labels: np.ndarray, fields: dict[str, np.ndarray]):
    """One torchtitan sample ``(input_dict, labels)``: the method's fields beside input/positions
    (its trainer hook takes them out before the forward), the pair markers as labels."""
    return ({"input": torch.from_numpy(ids), "positions": torch.from_numpy(positions),
             **{k: torch.from_numpy(v) for k, v in fields.items()}}, torch.from_numpy(labels))


def trainer_sample(ids: np.ndarray, positions: np.ndarray, labels: np.ndarray, fields: dict[str, np.ndarray]) -> dict:
    """One Trainer row: ``labels``/``shift_labels`` mark one position per pair (its
    ``num_items_in_batch`` counts pairs), the method's fields beside them."""
    return {"input_ids": torch.from_numpy(ids), "position_ids": torch.from_numpy(positions),
            "labels": torch.from_numpy(labels), "shift_labels": torch.from_numpy(labels),
            **{k: torch.from_numpy(v) for k, v in fields.items()}}


class Meter:
    """Sums of per-pair values over a step (or a validation pass) and the pair count; reduced
    across ranks once, at log time, into means over every rank's pairs."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)
        self.device = None  # where the sums live (the logits' device): the collective runs there
        self.reset()

    def reset(self) -> None:
        self.totals: Optional[torch.Tensor] = None  # [sum of each field..., pairs]

    def add_values(self, values: dict[str, torch.Tensor]) -> None:
        """``values``: one 1-D tensor per field, one entry per present pair."""
        first = values[self.fields[0]]
        row = torch.stack([
            *(values[f].detach().float().sum() for f in self.fields),
            torch.tensor(float(first.numel()), dtype=torch.float32, device=first.device),
        ])
        self.totals = row if self.totals is None else self.totals + row
        self.device = row.device

    def reduce(self, all_reduce=None) -> Optional[dict[str, float]]:
        """The means (over every rank's pairs when ``all_reduce`` sums a tensor across ranks) and
        ``pairs``; None when no rank saw a pair."""
        # a rank that saw no pair this time still joins the sum, on the device the collective needs
        totals = (self.totals if self.totals is not None
                  else torch.zeros(len(self.fields) + 1, dtype=torch.float32, device=self.device))
        if all_reduce is not None:
            totals = totals.clone()
            all_reduce(totals)
        self.reset()
        pairs = float(totals[-1])
        if pairs <= 0:
            return None
        return {**{f: float(totals[i]) / pairs for i, f in enumerate(self.fields)}, "pairs": pairs}


def sum_over_ranks(tensor: torch.Tensor) -> None:
    """All-reduce (sum) across the ranks when a process group is up; nothing otherwise."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
