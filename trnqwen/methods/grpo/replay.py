"""GRPO's rollout buffer inside the ranks: one step's scored completions, reused ``num_iterations`` times.

TRL's ``GRPOTrainer`` generates a whole generation batch (every gradient-accumulation micro-batch of
an optimizer step) at once, then trains on it for ``num_iterations`` (mu) optimizer steps, importance
ratios against the log-probs the policy had when it sampled them (``old_logps``, computed once at
rollout time when mu > 1).  :class:`Rollouts` is that buffer: filled at steps ``1, mu + 1, 2 mu + 1,
...`` (:meth:`Rollouts.due`) with :meth:`~trnqwen.methods.grpo.rollout.GroupRollout.rollout`'s
micro-batches (:class:`~trnqwen.methods.grpo.rollout.Staged`), handed to the loss in order every step
until the next fill.  While it is reused, the prompt stream is not read (TRL's sampler repeats the same
prompts for those steps): a run of S steps reads S / mu prompt batches.

A checkpoint keeps the buffer (:class:`RolloutState`, a DCP ``Stateful`` of fixed-shape tensors
under this rank's key, as :class:`trnqwen.runtime.resume_state.RankRNG`), so a run resumed between
two fills trains on the very completions the uninterrupted run did.  A checkpoint written by another
world size cannot restore a rank's buffer: the resumed run rolls out afresh at its first step.
"""

from __future__ import annotations

from typing import Any

import torch

from trnqwen.methods.grpo.rollout import IGNORE_INDEX, Staged


class Rollouts:
    """The rollout being trained on: its step and its micro-batches (module doc)."""

    def __init__(self, num_iterations: int = 1) -> None:
        self.num_iterations = max(1, int(num_iterations))
        self.step = 0  # the step it was sampled at (0: none yet)
        self.items: list[Staged] = []

    def due(self, step: int) -> bool:
        """Whether ``step`` samples a new rollout (steps 1, mu + 1, ...; or nothing held)."""
        return not self.items or (step - 1) % self.num_iterations == 0 or step - self.step >= self.num_iterations

    def fill(self, step: int, items: list[Staged]) -> None:
        self.step, self.items = step, list(items)

    @property
    def tokens(self) -> float:
        """Completion tokens of the whole rollout (every micro-batch, every rank): dapo's normaliser."""
        return float(sum(item.tokens for item in self.items))


class RolloutState:
    """A DCP ``Stateful``: this rank's :class:`Rollouts` as tensors of the run's fixed shapes
    (``micro_batches`` x ``rows`` x ``seq_len``; ``width`` per-completion values x every rank's rows)."""

    def __init__(self, rollouts: Rollouts, *, rank: int, micro_batches: int, rows: int, seq_len: int,
                 world_rows: int, width: int) -> None:
        self.rollouts = rollouts
        self.key = f"rank_{rank}"
        self.shape = (micro_batches, rows, seq_len)
        self.rows_shape = (micro_batches, world_rows, width)

    def state_dict(self) -> dict[str, Any]:
        a, r, s = self.shape
        items = self.rollouts.items
        full = len(items) == a
        state = {
            "step": torch.tensor([self.rollouts.step if full else 0], dtype=torch.int64),
            "seq": torch.zeros(self.shape, dtype=torch.long),
            "targets": torch.full(self.shape, IGNORE_INDEX, dtype=torch.long),
            "advantages": torch.zeros((a, r), dtype=torch.float32),
            "rows": torch.zeros(self.rows_shape, dtype=torch.float32),
            "tokens": torch.zeros(a, dtype=torch.float64),
            "has": torch.zeros(2, dtype=torch.int64),  # old, ref
            "old": torch.zeros(self.shape, dtype=torch.float32),
            "ref": torch.zeros(self.shape, dtype=torch.float32),
        }
        if full:
            for m, item in enumerate(items):
                state["seq"][m] = item.seq
                state["targets"][m] = item.targets
                state["advantages"][m] = item.advantages.float()
                state["rows"][m] = item.rows.float()
                state["tokens"][m] = item.tokens
                for i, (name, value) in enumerate((("old", item.old_logps), ("ref", item.ref_logps))):
                    if value is not None:
                        state[name][m] = value.float()
                        state["has"][i] = 1
        return {self.key: state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get(self.key)
        if not state or int(state["step"][0]) <= 0:
            return
        has_old, has_ref = (bool(v) for v in state["has"].tolist())
        items = [Staged(seq=state["seq"][m].clone(), targets=state["targets"][m].clone(),
                        advantages=state["advantages"][m].clone(), rows=state["rows"][m].clone(),
                        tokens=float(state["tokens"][m]),
                        old_logps=state["old"][m].clone() if has_old else None,
                        ref_logps=state["ref"][m].clone() if has_ref else None)
                 for m in range(self.shape[0])]
        self.rollouts.fill(int(state["step"][0]), items)
