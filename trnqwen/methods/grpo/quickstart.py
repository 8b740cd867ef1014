"""The quickstart's GRPO stage: on-policy RL on the bundled verifiable task, after the chat stage.

It trains ``--method grpo`` on the bundled sums (``trnqwen/data/tiny_sums``, scored by the task's
own reward, :func:`trnqwen.methods.grpo.task.number`) from the snapshot the chat stage starts from,
native backend, the real launcher, short completions (the settings of ``tests/test_grpo_e2e.py``).
Then it checks what a user would: ``trnqwen eval`` on the run (the bundled held-out prompts, each
answered greedily by the base and by the export) says the tuned model earns a clearly higher mean
reward than the model it started from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

# the quickstart's own pieces (its RunInfo, its StageFailed, eval's before/after) are handed in by
# trnqwen/quickstart/stages.py: a method never imports quickstart/ or evaluate/
RunInfo = Any

STAGE = "GRPO"
WHAT = "RL on the bundled sums, {steps} steps, held-out reward before/after"
GRPO_STEPS = 12
GRPO_LR = 1e-2
SEQ_LEN, COMPLETION = 64, 16
PROMPTS_PER_STEP = 8  # whatever the rank count: 4 completions each
MARGIN = 0.1  # held-out mean reward, tuned minus base (the task's reward lies in [0, 2])


def stage_settings(chat_settings: dict[str, Any], ranks: int) -> dict[str, Any]:
    """RunConfig values of the stage: the bundled prompts (no ``dataset``) and their bundled
    held-out file (no ``val_split``), :data:`PROMPTS_PER_STEP` prompts a step over ``ranks``; no
    validation during the run (the eval after it measures the held-out prompts)."""
    return {**chat_settings, "method": "grpo", "dataset": None, "val_split": 0.0, "val_every": None,
            "steps": GRPO_STEPS, "lr": GRPO_LR, "seq_len": SEQ_LEN, "max_completion_length": COMPLETION,
            "local_batch_size": max(1, PROMPTS_PER_STEP // ranks)}


def judge_run(info: RunInfo, *, device: str, fail: Callable[..., Exception],
              before_after: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(the stage's line, its numbers); raises ``fail(stage, message, hint=...)`` (the quickstart's
    StageFailed) when the held-out mean reward did not rise by :data:`MARGIN`;
    ``before_after(run_dir, device=...)`` is eval's before/after of the run."""
    StageFailed = fail
    # the tiny model answers fastest on one thread (two on 2 shared cores spin more than they decode)
    got = before_after(Path(info.run_dir or ""), device=device, threads=1)
    if got is None or "error" in got or "reward" not in got:
        raise StageFailed(STAGE, got["line"] if got else f"run {info.run_dir} has no held-out prompts to evaluate")
    reward = got["reward"]
    before, after = reward["reward_before"], reward["reward_after"]
    if not (isinstance(before, float) and isinstance(after, float) and after >= before + MARGIN):
        raise StageFailed(STAGE, f"the held-out mean reward did not rise by {MARGIN}: {before} -> {after}",
                          hint=f"trnqwen eval {info.run_dir}")
    return (f"held-out mean reward (greedy) base {before:.3f} -> tuned {after:.3f}, pass@1 "
            f"{reward['pass_before']:.3f} -> {reward['pass_after']:.3f} on {reward['prompts']} prompts", dict(reward))
