"""GRPO planned (launcher side): what a ``--method grpo`` run is, refused where it cannot run yet.

The plan checks the rewards before any rank starts (each ``--reward`` parsed, your functions
imported: a typo or an import error is exit 2 here, not in the ranks), fixes the prompt room
(``seq_len - max_completion_length``) and renders the torchtitan config module's lines: the loss,
the dataloader's prompt rows and :class:`~trnqwen.methods.grpo.titan.GRPOHook` with its settings;
the hf-trainer ranks' :class:`~trnqwen.methods.grpo.hf_trainer.GRPOHooks` get the same settings
and the loss's (``MethodPlan.settings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from trnqwen.config import RunConfig
from trnqwen.dataset.cache import RankData
from trnqwen.errors import UsageError
from trnqwen.methods.base import MethodPlan

NAME = "grpo"
BACKENDS = ("native", "hf-v5", "nki-moe", "hf-trainer")
IMPORTS = ["from trnqwen.methods.grpo.titan import GRPOHook, grpo_loss_config"]
ROWS = "trnqwen.methods.grpo.titan:titan_rows"  # the torchtitan dataloader's row reader


def reward_values(cfg: RunConfig) -> list[str]:
    """The ``--reward`` values; without any: the bundled task's reward when the data is the bundled
    task, else a ``UsageError`` (a dataset of yours needs rewards of yours)."""
    from trnqwen.methods.grpo.task import REWARD

    if cfg.reward:
        return list(cfg.reward)
    if not cfg.dataset:
        return [REWARD]
    raise UsageError("--method grpo needs at least one --reward for your dataset",
                     hint="e.g. --reward accuracy (the answer/solution column, checked as maths), --reward format, "
                          "or your own: --reward my_rewards.py:brevity (TRL's signature)")


def check(cfg: RunConfig) -> None:
    """Refuse what GRPO does not do here yet, with what to do instead."""
    if cfg.backend not in BACKENDS:
        raise UsageError(f"--method grpo runs on --backend {', '.join(BACKENDS)}, not {cfg.backend}",
                         hint="pick one of those (docs/rl.md)")
    if cfg.backend == "hf-trainer" and (cfg.kl_beta or cfg.num_iterations > 1 or cfg.global_batch_size):
        # the reference's log-probs, the rollout's reuse and a step's rollout spanning its accumulation steps
        # are the torchtitan hook's (titan.py) for now
        raise UsageError("--method grpo on --backend hf-trainer takes no --kl-beta, --num-iterations or "
                         "--global-batch-size yet", hint="drop them, or use --backend native or hf-v5 (docs/rl.md)")
    if cfg.val_every:
        raise UsageError("--val-every has no GRPO validation yet (a held-out reward)",
                         hint="drop --val-every; measure held-out prompts after training (docs/rl.md)")
    if cfg.tp != 1:
        raise UsageError("--method grpo runs with --tp 1 for now", hint="drop --tp")
    if cfg.seq_len <= cfg.max_completion_length:
        raise UsageError(f"--max-completion-length {cfg.max_completion_length} leaves no room for a prompt in "
                         f"--seq-len {cfg.seq_len}", hint="raise --seq-len or lower --max-completion-length")
    if cfg.epsilon_high is not None and cfg.epsilon_high < cfg.epsilon:
        raise UsageError(f"--epsilon-high {cfg.epsilon_high:g} is below --epsilon {cfg.epsilon:g}",
                         hint="clip-higher means epsilon_high >= epsilon (DAPO uses 0.28 with 0.2)")


def check_rewards(values: list[str], cfg: RunConfig) -> None:
    """Each reward parsed and your functions imported now (a ``RewardError``, exit 2, names the bad one)."""
    from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

    RewardSet.build(parse_rewards(values), BuiltinOptions(max_completion_length=cfg.max_completion_length))


def compiled_shapes(cfg: RunConfig) -> list[tuple[str, tuple[int, ...]]]:
    """What a GRPO step runs the model on, each a graph Neuron compiles once (every shape is fixed:
    prompts padded to the room, completions to the maximum, the decoding's keys and values a
    ``[rows, seq_len]`` buffer): the prompts' prefill, one new token per row over the buffer, the
    update's forward and backward, and a no-grad forward for the reference's or the sampling
    policy's log-probs when ``--kl-beta`` or ``--num-iterations`` asks for them."""
    prompts, room = cfg.local_batch_size, cfg.seq_len - cfg.max_completion_length
    rows = prompts * cfg.num_generations
    shapes = [("prefill", (prompts, room)), ("decode", (rows, 1)), ("update", (rows, cfg.seq_len))]
    if cfg.kl_beta or cfg.num_iterations > 1:
        shapes.append(("log-probs", (rows, cfg.seq_len)))
    return shapes


def graphs_note(cfg: RunConfig) -> str:
    """The preflight's line on compilation: how many graphs, of which shapes."""
    shapes = compiled_shapes(cfg)
    parts = []
    for name, shape in shapes:
        over = f" over [{shape[0]}, {cfg.seq_len}]" if name == "decode" else ""  # the keys/values it attends
        parts.append(f"{name} [{', '.join(map(str, shape))}]{over}")
    return f"GRPO compiles {len(shapes)} graphs once (fixed shapes): {', '.join(parts)}"


def hook_settings(cfg: RunConfig, assets_dir: Path, rank_data: RankData, rewards: list[str]) -> dict[str, Any]:
    """What :class:`~trnqwen.methods.grpo.titan.GRPOHook` is built with (plain values)."""
    return {
        "num_generations": cfg.num_generations, "max_completion_length": cfg.max_completion_length,
        "room": cfg.seq_len - cfg.max_completion_length, "temperature": cfg.temperature, "top_p": cfg.top_p,
        "rewards": rewards, "scale_rewards": cfg.scale_rewards, "seed": cfg.seed,
        "num_iterations": cfg.num_iterations, "kl_beta": cfg.kl_beta,
        "log_completions": cfg.log_completions, "assets_dir": str(Path(assets_dir).absolute()),
        "trust_remote_code": bool(cfg.trust_remote_code),
        "cache_dir": str(rank_data.cache_dir), "pad_id": int(rank_data.meta.get("pad_id", 0)),
    }


def plan(cfg: RunConfig, assets_dir: Path, rank_data: Optional[RankData], *, device_type: str, dp_degree: int, steps: int,
         validates: bool) -> Optional[MethodPlan]:
    """The plan of a GRPO run (refusals raise); None without its prompt cache (nothing to plan yet)."""
    del dp_degree, steps, validates
    if getattr(cfg, "method", None) != NAME:
        return None
    check(cfg)
    rewards = reward_values(cfg)
    check_rewards(rewards, cfg)
    if rank_data is None:
        return None
    settings = hook_settings(cfg, assets_dir, rank_data, rewards)
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    lines = [
        "# GRPO: each step the hook samples num_generations completions per prompt from the current policy,",
        "# scores them with the reward functions, and the loss is the clipped surrogate on their group advantages.",
        f"config.loss = grpo_loss_config(loss_type={cfg.loss_type!r}, epsilon={cfg.epsilon!r}, "
        f"epsilon_high={eps_high!r}, temperature={cfg.temperature!r}, max_completion_length={cfg.max_completion_length!r},",
        f"    beta={cfg.kl_beta!r}, settings={settings!r})",
        f"config.dataloader.rows = {ROWS!r}",
    ]
    # the hf-trainer ranks' hooks get the loss's settings beside the rollout's (torchtitan's: the loss config)
    loss = {"loss_type": cfg.loss_type, "epsilon": cfg.epsilon, "epsilon_high": eps_high}
    return MethodPlan(
        method=NAME, imports=list(IMPORTS), config_lines=lines, hooks=["GRPOHook()"], settings={**settings, **loss},
        note=(f"GRPO: {cfg.num_generations} completions per prompt (at most {cfg.max_completion_length} tokens, "
              f"temperature {cfg.temperature:g}), rewards {', '.join(rewards)}; {cfg.loss_type} loss, epsilon "
              f"{cfg.epsilon:g}/{eps_high:g}, advantages scaled by the {cfg.scale_rewards} std"
              + (f", KL to the starting weights x {cfg.kl_beta:g}" if cfg.kl_beta else "")
              + (f", each rollout trained on for {cfg.num_iterations} steps" if cfg.num_iterations > 1 else "")
              + (f"; {graphs_note(cfg)}" if device_type == "neuron" else "")),
    )
