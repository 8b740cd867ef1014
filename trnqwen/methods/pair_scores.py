"""Every preference method's held-out scorer (``trnqwen eval`` on pairs): each pair's summed
log-probability of the chosen and of the rejected answer, with the training's own arithmetic (the
rows through :func:`trnqwen.methods.pairs.batch_from_rows`, the sums through
:func:`~trnqwen.methods.pairs.segment_logps`).  A method's ``eval_report`` turns the scores into its
numbers.  Light to import: numpy and torch inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

EvalData = Any  # trnqwen.evaluate.data.EvalData: split, pairs_per_row, len() (handed in by eval)
HEAD_CHUNK = 4096  # trained positions per LM-head + cross-entropy chunk: eval passes its own (evaluate.model)


@dataclass
class ChosenLoss:
    tokens: int
    loss_sum: float

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else float("nan")


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

    def means(self):
        """Mean token log-prob of each side, [pairs, 2] (what ORPO-style methods compare)."""
        return self.logps / self.counts


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


def card_section(eval_results: list[dict[str, Any]], eval_dataset: Optional[str], num: Callable[[Any], Optional[str]], *,
                 intro: str, columns: Sequence[tuple[str, str]]) -> list[str]:
    """A preference method's model-card section (``Method.card``): ``intro`` (what the numbers
    mean), then one row per checkpoint of trnqwen eval's held-out pairs: checkpoint, pairs,
    ``columns`` ((header, result key), each formatted by ``num``), and the change against the base."""
    on = f" on {eval_dataset}" if eval_dataset else ""
    headers = ["checkpoint", "pairs", *(h for h, _ in columns), "vs base"]
    lines = ["", f"## Held-out preference pairs (`trnqwen eval`{on})", "", intro, "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in eval_results:
        delta = r.get("delta_vs_base")
        cells = [r.get("checkpoint"), r.get("pairs"), *(num(r.get(key)) for _, key in columns),
                 None if delta is None else f"{delta:+.4f}"]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return lines
