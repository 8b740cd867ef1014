"""GRPO, Group Relative Policy Optimization (Shao et al. 2024; TRL's ``GRPOTrainer``): prompts, the
model's own answers, rewards you write in Python.

Each step, every rank samples ``num_generations`` completions of each of its prompts from the
current policy, scores them with the reward functions, turns each group's rewards into advantages
and takes the clipped-surrogate step on the prompt + completion forward.  Everything GRPO is in
this folder (docs/rl.md):

* ``settings``: num_generations, max_completion_length, temperature, top_p, reward, loss_type,
  epsilon, epsilon_high, kl_beta, num_iterations, scale_rewards, log_completions;
* ``data``: TRL's prompt records (a string or messages, other columns kept for the rewards);
  ``prompt_cache``: them as the token cache the ranks read, and ``trnqwen data``'s preview;
* ``generate``: the rollouts (one small interface; the in-process generator with a KV cache);
* ``rewards``: ``--reward``: the built-ins and your own functions (TRL's signature);
* ``loss``: advantages and the clipped surrogate (TRL's arithmetic);
* ``plan``: refusals and the torchtitan config module's lines;
* ``rollout``: a step's rollout, rewards, advantages and rows, the loss on them, the step's values:
  every backend's one copy;
* ``titan``: the torchtitan ranks' loss and trainer hook (native, hf-v5);
  ``reference``: the starting weights' and the sampling policy's log-probs (kl_beta, num_iterations);
  ``replay``: the rollout reused for num_iterations steps (kept by checkpoints);
* ``hf_trainer``: the Transformers Trainer's (hf-trainer);
* ``log_lines``: the ``[GRPO]`` lines (written by the ranks, read by inspect-logs);
* ``judge``: the judge's rules (reward flat, groups without signal, completions cut, reward failure);
* ``task``: the bundled verifiable task's reward (``trnqwen/data/tiny_sums``);
* ``eval_report``: what ``trnqwen eval`` reports on held-out prompts (mean reward, pass@1, answers);
* ``card``: the model card's section; ``quickstart``: the quickstart's GRPO stage.
"""

from trnqwen.methods.base import Example, Method, Metric

METHOD = Method(
    name="grpo",
    help="prompts and reward functions: on-policy RL",
    data="prompts",
    settings="trnqwen.methods.grpo.settings:GrpoSettings",
    metrics=(
        Metric("grpo/reward", "reward", ".4f", status=True, panel="reward",
               help="mean total reward of the step's completions (every rank)"),
        Metric("grpo/reward_std", "reward std", ".4f", panel="reward",
               help="standard deviation of the step's completions' total rewards"),
        Metric("grpo/frac_reward_zero_std", "no-signal groups", ".2f", status=True, panel="reward:right",
               help="share of groups whose rewards are all equal (advantage 0: no signal)"),
        Metric("grpo/completion_length", "length", ".1f", panel="completions",
               help="mean completion length in tokens (up to and including the end of turn)"),
        Metric("grpo/completion_length_max", "length max", ".0f", panel="completions",
               help="longest completion of the step, tokens"),
        Metric("grpo/clipped_ratio", "cut", ".2f", panel="completions:right",
               help="share of completions cut at --max-completion-length (no end of turn)"),
        Metric("grpo/kl", "kl", ".4f", panel="policy", help="mean KL to the starting weights per token (kl_beta > 0)"),
        Metric("grpo/entropy", "entropy", ".4f", panel="policy", help="mean entropy of the policy per completion token"),
        Metric("grpo/clip_ratio", "clip", ".3f", panel="policy:right",
               help="share of completion tokens whose importance ratio was clipped"),
        Metric("grpo/completions", "completions", ".0f", help="completions sampled this step, every rank"),
        Metric("grpo/rollout_s", "rollout s", ".2f", panel="time", help="seconds generating and scoring this step"),
        Metric("grpo/update_s", "update s", ".2f", panel="time",
               help="seconds of the step after the rollout: forward, backward, optimizer"),
    ),
    lr=(1e-6, "default for GRPO (TRL's GRPOConfig)"),
    lora_lr=(1e-5, "default for LoRA GRPO"),
    token_loss=False,  # a policy-gradient loss: near 0 by construction, not ln(vocab)
    plan="trnqwen.methods.grpo.plan:plan",
    hf_trainer="trnqwen.methods.grpo.hf_trainer:GRPOHooks",
    judge="trnqwen.methods.grpo.judge:rules",
    log_lines="trnqwen.methods.grpo.log_lines",
    eval_report="trnqwen.methods.grpo.eval_report",
    quickstart="trnqwen.methods.grpo.quickstart",
    card="trnqwen.methods.grpo.card:card",
    prompts="trnqwen.methods.grpo.prompt_cache",
    docs="docs/rl.md",
    examples=(
        Example("train", "trnqwen train --finetune --method grpo --dataset prompts.jsonl --reward accuracy "
                "--reward my_rewards.py:brevity:0.5 --num-generations 8",
                "on-policy RL: G completions per prompt scored by your reward functions (docs/rl.md)"),
        Example("data", "trnqwen data prompts.jsonl --method grpo --max-completion-length 256",
                "prompts: kept/dropped, lengths against the room left for completions, one rendered prompt"),
    ),
)
