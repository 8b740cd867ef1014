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
* :func:`method_rows` / :func:`titan_rows`: those rows with a method's own batch fields by name (the
  torchtitan dataloader's rows; the Trainer's are in :mod:`trnqwen.methods.pair_hf_trainer`);
* :class:`PairTerms` is what a method's loss gives per pair (loss, rewards, its own values) and
  :func:`batch_terms` computes it from a forward and the batch's fields, on every backend;
* :class:`Meter` sums per-pair values over a step (or a validation pass), reduced across ranks
  once, at log time; :class:`PairMeter` sums a method's :class:`PairTerms` (means, margin, accuracy).

The batch each trainer sees keeps the trainer's own accounting right: its ``labels`` mark one
position per pair (:func:`pair_markers`), so "valid tokens" = pairs and torchtitan's
``sum / global_valid_tokens`` (the Trainer's ``num_items_in_batch``) makes the loss the mean
over every pair of every rank.  A method never imports another method: what two of them share
lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

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


def method_rows(split, stream, keys: Sequence[str], stored: Optional[np.ndarray] = None, *, missing: str = ""):
    """A rank's rows as ``(ids, positions, markers, fields)``: ``fields`` the method's arrays named by
    ``keys`` (targets, segments, stored per-pair values).  With ``missing`` (where the stored values
    come from), a row whose stored values are NaN stops the run naming it."""
    for row, (ids, positions, targets, segments, values, markers) in read_pairs(split, stream, stored):
        if missing and np.isnan(values).any():
            raise RuntimeError(f"row {row} of the {split.name} split has no {missing}")
        yield ids, positions, markers, dict(zip(keys, (targets, segments, values)))


def titan_rows(dataset, keys: Sequence[str], stored: Optional[np.ndarray] = None, *, missing: str = ""):
    """The torchtitan dataloader's rows of a preference cache (``TokenCacheDataLoader.Config.rows``):
    the method's fields beside input/positions, one label per pair (its trainer hook takes them out)."""
    for ids, positions, markers, named in method_rows(dataset.split, dataset.stream, keys, stored, missing=missing):
        yield titan_sample(ids, positions, markers, named)


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


@dataclass
class PairTerms:
    """A preference loss for the pairs present, one entry per pair: what every backend's loss sums
    and every meter logs.  A method's own per-pair values are the fields of its subclass."""

    losses: torch.Tensor  # [n] (with grad)
    chosen_rewards: torch.Tensor  # detached
    rejected_rewards: torch.Tensor


# the method's loss from a forward's segment sums: (sums [B, P, 2], counts [B, P, 2], stored [B, P, 2]) -> terms
TermsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], PairTerms]


def batch_terms(logits: torch.Tensor, batch_fields: Sequence[torch.Tensor], terms: TermsFn) -> PairTerms:
    """A method's terms from one forward: ``batch_fields`` its batch's (targets, segments, stored
    per-pair values, whose shape gives the row's pair slots), moved next to the logits."""
    targets, segments, stored = (t.to(logits.device) for t in batch_fields)
    sums, counts = segment_logps(logits, targets, segments, stored.shape[1])
    return terms(sums, counts, stored)


class PairMeter(Meter):
    """A method's :class:`PairTerms` summed over a step (or a validation pass): the rewards, their
    accuracy, the loss and the method's own per-pair values (the fields of ``terms_cls`` beyond
    :class:`PairTerms`'s); ``reduce`` adds the margin."""

    def __init__(self, terms_cls: type = PairTerms) -> None:
        base = {f.name for f in fields(PairTerms)}
        self.own = tuple(f.name for f in fields(terms_cls) if f.name not in base)
        super().__init__((*self.own, "rewards_chosen", "rewards_rejected", "accuracy", "loss"))

    def add(self, terms: PairTerms) -> None:
        self.add_values({**{name: getattr(terms, name) for name in self.own},
                         "rewards_chosen": terms.chosen_rewards, "rewards_rejected": terms.rejected_rewards,
                         "accuracy": (terms.chosen_rewards > terms.rejected_rewards).float(),
                         "loss": terms.losses})

    def reduce(self, all_reduce=None) -> Optional[dict[str, float]]:
        values = super().reduce(all_reduce)
        if values is not None:
            values["margin"] = values["rewards_chosen"] - values["rewards_rejected"]
        return values


def sum_over_ranks(tensor: torch.Tensor) -> None:
    """All-reduce (sum) across the ranks when a process group is up; nothing otherwise."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
