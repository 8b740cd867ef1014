"""GRPO's run settings: a sub-model of :class:`trnqwen.config.RunConfig` (flat names: ``--num-generations``,
``TRNQWEN_NUM_GENERATIONS``, ``num_generations`` in trnqwen.toml).

The names are TRL's ``GRPOConfig``'s where the flat namespace allows: ``beta`` is DPO's setting
here (default 0.1, above 0), so GRPO's KL weight is ``kl_beta`` (TRL's ``beta``); ``reward`` is
TRL's ``reward_funcs`` (``--reward``, repeatable, with an optional ``:WEIGHT``: TRL's
``reward_weights``).  ``enable_thinking`` is the data settings' own (the chat template's switch).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator

from trnqwen.settings import setting

GrpoLoss = Literal["grpo", "dr_grpo", "dapo", "bnpo"]  # methods/grpo/loss.py LOSS_TYPES
ScaleRewards = Literal["group", "batch", "none"]  # methods/grpo/loss.py SCALE_REWARDS


def _rewards(value: object) -> object:
    """``TRNQWEN_REWARD=accuracy,format:0.5`` (one string) -> a list; a list stays as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


Rewards = Annotated[list[str], BeforeValidator(_rewards)]


class GrpoSettings(BaseModel):
    num_generations: int = setting(
        4, ge=2, le=1024, panel="Method",
        help="GRPO: completions sampled per prompt (a group; its rewards' mean and std make the advantages).",
    )
    max_completion_length: int = setting(
        64, ge=1, le=1_000_000, panel="Method",
        help="GRPO: most tokens a completion may have (completions are padded to it: fixed shapes); the prompt "
        "gets --seq-len minus this.",
    )
    temperature: float = setting(
        1.0, gt=0.0, le=100.0, allow_inf_nan=False, panel="Method",
        help="GRPO: sampling temperature of the rollouts (the loss scores tokens at the same temperature).",
    )
    top_p: float = setting(
        1.0, gt=0.0, le=1.0, allow_inf_nan=False, panel="Method",
        help="GRPO: nucleus sampling: keep the most likely tokens whose probability reaches top_p (1: all).",
    )
    reward: Rewards = setting(
        default_factory=list, panel="Method", metavar="NAME[:WEIGHT]", env_note="comma-separated",
        help="GRPO: a reward function, repeatable, summed with its weight: accuracy, format, length, or your own "
        "with TRL's signature as package.module:function or path/to/file.py:function (TRL's reward_funcs). "
        "Without --dataset: the bundled task's reward.",
    )
    loss_type: GrpoLoss = setting(
        "dapo", panel="Method",
        help="GRPO: how the per-token loss is aggregated: dapo (tokens of the whole step, TRL's default), grpo "
        "(mean per completion), dr_grpo (per max length) or bnpo (tokens of the micro-batch).",
    )
    epsilon: float = setting(
        0.2, gt=0.0, lt=1.0, allow_inf_nan=False, panel="Method",
        help="GRPO: clipping range of the importance ratio (lower bound 1 - epsilon).",
    )
    epsilon_high: Optional[float] = setting(
        None, gt=0.0, le=10.0, allow_inf_nan=False, panel="Method", shown_default="epsilon",
        help="GRPO: upper clipping bound 1 + epsilon_high (DAPO's clip-higher, e.g. 0.28).",
    )
    kl_beta: float = setting(
        0.0, ge=0.0, le=100.0, allow_inf_nan=False, panel="Method",
        help="GRPO: weight of the KL to the starting weights (TRL's beta; 0, its default: no KL term and no "
        "reference forward). The reference is the starting weights swapped into the model for one forward per "
        "rollout (LoRA: the adapter switched off), no second model.",
    )
    num_iterations: int = setting(
        1, ge=1, le=1024, panel="Method",
        help="GRPO: optimizer steps on each rollout (TRL's num_iterations, mu): the importance ratio to the "
        "sampling policy's log-probs is clipped by --epsilon; the prompts are read once per mu steps.",
    )
    scale_rewards: ScaleRewards = setting(
        "group", panel="Method",
        help="GRPO: advantages divided by the group's reward std (group), the batch's (batch) or not at all "
        "(none: Dr. GRPO).",
    )
    log_completions: int = setting(
        0, ge=0, le=10_000, panel="Method",
        help="GRPO: prompt/completion/reward rows kept per step in the run directory (completions.jsonl; 0: none).",
    )
