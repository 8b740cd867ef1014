"""GRPO's arithmetic, one copy for every backend: pure torch functions on tensors.

Public API (names are stable; the rank integration builds on them):

* :func:`token_logps` -> ``(logps, entropy)``: per-token log-probabilities of the completion
  tokens under ``logits / temperature`` (as TRL scores them), and the entropy of that
  distribution (a metric, no gradient);
* :func:`group_advantages` -> :class:`Advantages`: reward minus its group's mean, divided by the
  group's (``scale_rewards="group"``) or the whole batch's (``"batch"``) standard deviation + 1e-4,
  or not at all (``"none"``: Dr. GRPO); a reward of NaN (every reward function said None) is left
  out of the statistics and gets advantage 0;
* :func:`policy_loss` -> :class:`LossTerms`: the clipped surrogate per token (``epsilon``, and
  DAPO's clip-higher ``epsilon_high``), importance ratios against the rollout's log-probs
  (``old_logps``; None: on-policy, ratio 1 with its gradient), KL to a reference (the k3
  estimator ``exp(r - l) - (r - l) - 1`` times the ratio, TRL's bias-corrected KL, weighted by
  ``beta``), aggregated as ``loss_type``: ``grpo`` | ``dr_grpo`` | ``dapo`` | ``bnpo``;
* :func:`reduce_metrics`: the step's kl, entropy and clip ratios from :class:`LossTerms` sums
  (after the caller sums them over ranks and micro-batches).

The loss convention is torchtitan's (``sum / global_valid_tokens``, gradients summed over ranks):
:func:`policy_loss` returns this micro-batch's *share* of the step's loss, so that the sum over
every micro-batch of every rank is the objective TRL's ``GRPOTrainer`` optimises (its per-process
loss averaged over processes by DDP).  Per ``loss_type`` (``m`` = micro-batches in the optimizer
step over every rank = gradient-accumulation steps x data-parallel ranks):

* ``grpo``: mean over this micro-batch's completions of each one's token mean, / m;
* ``bnpo``: this micro-batch's token mean, / m;
* ``dr_grpo``: token sum / (completions in this micro-batch x max_completion_length), / m;
* ``dapo``: token sum / ``global_tokens`` (completion tokens in the whole step, every rank).

With one micro-batch on one rank each equals TRL's ``_compute_loss`` exactly
(``tests/test_grpo_loss.py`` compares them with TRL's own code).  Group statistics need whole
groups: pass :func:`group_advantages` the rewards of the whole generation batch (all ranks, for
``"batch"`` scaling), as TRL gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
STD_EPS = 1e-4  # TRL's: advantages / (std + 1e-4)
# the token sums LossTerms carries (reduce_metrics turns them into means)
SUMS = ("kl", "entropy", "clip_low", "clip_high", "clip_region")


def token_logps(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                entropy: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``([B, T] log p(target), [B, T] entropy or None)`` under ``softmax(logits / temperature)``
    in float32.  ``logits[:, t]`` scores ``targets[:, t]`` (shift before calling).  The entropy
    carries no gradient (it is only logged)."""
    if hasattr(logits, "full_tensor"):  # a DTensor (vocab-sharded logits under TP): gather once
        logits = logits.full_tensor()
    scaled = logits.float() / temperature
    norm = torch.logsumexp(scaled, dim=-1)
    logps = scaled.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1) - norm
    if not entropy:
        return logps, None
    with torch.no_grad():
        logp_all = scaled - norm.unsqueeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logps, ent


@dataclass
class Advantages:
    advantages: torch.Tensor  # [N] (0 where the reward is NaN)
    mean: torch.Tensor  # [N] the group's mean reward, per completion
    std: torch.Tensor  # [N] the std the advantages were (or, with "none", would be) scaled by
    is_std_zero: torch.Tensor  # [N] bool: the group's (batch's) rewards are all equal (no signal)


def nanstd(x: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Standard deviation ignoring NaNs, with Bessel's correction (NaN for fewer than 2 values)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim)
    count = (~torch.isnan(x)).sum(dim=dim)
    var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.full_like(var, float("nan")))
    return var.sqrt()


def group_advantages(rewards: torch.Tensor, num_generations: int, *, scale_rewards: str = "group") -> Advantages:
    """Group-relative advantages of ``rewards`` ``[N]`` (N = prompts x ``num_generations``, each
    prompt's completions next to each other; NaN = unscorable)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, not {scale_rewards!r}")
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not make groups of {num_generations}")
    rewards = rewards.float()
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif num_generations > 1:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    else:
        std = torch.zeros_like(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPS)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    return Advantages(torch.nan_to_num(advantages, nan=0.0), mean, std, is_std_zero)


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar with grad: this micro-batch's share of the step's loss (module doc)
    tokens: torch.Tensor  # completion tokens in this micro-batch (the mask's sum)
    sums: dict[str, torch.Tensor]  # SUMS over this micro-batch's tokens (detached)
    seq_clip_low: torch.Tensor  # [B] each completion's share of tokens clipped low (TRL's clip_ratio/low_min)
    seq_clip_high: torch.Tensor  # [B] ... clipped high (clip_ratio/high_max)


def policy_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    old_logps: Optional[torch.Tensor] = None,
    ref_logps: Optional[torch.Tensor] = None,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
    entropy: Optional[torch.Tensor] = None,
    micro_batches: int = 1,
    global_tokens: Optional[float] = None,
    max_completion_length: Optional[int] = None,
) -> LossTerms:
    """GRPO's loss on one micro-batch: ``logps``, ``old_logps``, ``ref_logps``, ``entropy``,
    ``mask`` ``[B, T]`` (completion positions), ``advantages`` ``[B]``.  ``micro_batches``,
    ``global_tokens`` (dapo; default: this micro-batch's) and ``max_completion_length``
    (dr_grpo; default: T) set the normaliser (module doc)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    if beta and ref_logps is None:
        raise ValueError("beta > 0 needs the reference log-probs (ref_logps)")
    keep = mask > 0
    mask = mask.to(logps.dtype)
    # padding positions carry no loss; zeroed first so a stray value there cannot make inf * 0 = NaN
    logps = torch.where(keep, logps, 0.0)
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.to(logps.dtype).unsqueeze(1)
    old = logps.detach() if old_logps is None else torch.where(keep, old_logps.to(logps.dtype), 0.0)
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if beta:
        ref = torch.where(keep, ref_logps.to(logps.dtype), 0.0)
        kl = (torch.exp(ref - logps) - (ref - logps) - 1) * ratio
        per_token = per_token + beta * kl
    else:
        kl = None

    tokens = mask.sum()
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / micro_batches
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / tokens.clamp(min=1.0) / micro_batches
    elif loss_type == "dr_grpo":
        length = per_token.shape[1] if max_completion_length is None else max_completion_length
        loss = (per_token * mask).sum() / (per_token.shape[0] * length) / micro_batches
    else:  # dapo
        total = tokens.detach() if global_tokens is None else torch.as_tensor(global_tokens, dtype=logps.dtype)
        loss = (per_token * mask).sum() / total.clamp(min=1.0)

    with torch.no_grad():
        low = ((ratio < 1 - eps_low) & (adv < 0)).to(logps.dtype)
        high = ((ratio > 1 + eps_high) & (adv > 0)).to(logps.dtype)
        region = torch.maximum(low, high)
        zero = logps.new_zeros(())
        sums = {
            "kl": (kl.detach() * mask).sum() if kl is not None else zero,
            "entropy": (entropy.to(logps.dtype) * mask).sum() if entropy is not None else zero,
            "clip_low": (low * mask).sum(),
            "clip_high": (high * mask).sum(),
            "clip_region": (region * mask).sum(),
        }
        per_seq = mask.sum(-1)
        seq_low = (low * mask).sum(-1) / per_seq
        seq_high = (high * mask).sum(-1) / per_seq
    return LossTerms(loss, tokens.detach(), sums, seq_low, seq_high)


def reduce_metrics(sums: dict[str, float], tokens: float) -> dict[str, float]:
    """Token means of :class:`LossTerms` ``sums`` (already summed over ranks and micro-batches):
    ``kl``, ``entropy``, ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``
    (TRL's names)."""
    n = max(float(tokens), 1.0)
    names = {"kl": "kl", "entropy": "entropy", "clip_low": "clip_ratio/low_mean",
             "clip_high": "clip_ratio/high_mean", "clip_region": "clip_ratio/region_mean"}
    return {names[k]: float(sums[k]) / n for k in SUMS}
