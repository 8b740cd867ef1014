"""``trnqwen eval`` on a GRPO run's held-out prompts: how much reward does each model earn?

Each model answers every held-out prompt once, greedily (no sampling: the same answer every
time, so base and tuned are compared on their most likely answers), with at most the run's
``max_completion_length`` tokens, through GRPO's own generator
(:class:`~trnqwen.methods.grpo.generate.InProcessGenerator`, ``do_sample=False``).  The answers
are scored by the run's reward set (:class:`~trnqwen.methods.grpo.rewards.RewardSet`: the same
``--reward`` functions and weights, TRL's signature).  Per model:

* **mean reward**: the mean total reward of its answers (prompts no function scored left out);
* **pass@1**: the share of prompts whose greedy answer is right, as the reward functions that can
  tell say (a ``pass_threshold`` on the function: the built-in ``accuracy`` reward 1, the bundled
  task's right number); None when no function in the set can tell;
* each function's mean (``rewards``), the mean answer length in tokens and the share cut at the
  maximum (``truncated``); for a tuned model, ``reward_vs_base``: its mean reward minus the base's.

The held-out prompts are the run's ``val`` split of its prompt cache
(:mod:`trnqwen.methods.grpo.prompt_cache`), or ``--dataset`` prompts through the same pipeline.
``trnqwen eval`` (:mod:`trnqwen.evaluate.run`) reaches this module through ``Method.eval_report``
and hands it the held-out data (:class:`trnqwen.evaluate.data.EvalData`); a method never imports
evaluate/.  Besides the entry points every report has (``settings``, ``score``, ``numbers``,
``FIELDS``, ``SUMMARY_FIELDS``, ``TABLE_COLUMNS``, ``table_note``) it declares what differs from a
preference report: ``loss`` (None: prompts have no answers of their own to score a loss on),
``answers`` (a few answers side by side), ``say``, ``summary_line``, ``table`` and
``before_after``.  torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from trnqwen.output import number

EvalData = Any  # trnqwen.evaluate.data.EvalData: split (the prompt cache's split), source, tokenizer_dir
ANSWERS = 3  # answers shown side by side without --generate
FIELDS = ("prompts", "mean_reward", "pass_at_1", "reward_vs_base", "rewards", "completion_length", "truncated")
SUMMARY_FIELDS = ("mean_reward", "pass_at_1", "reward_vs_base")  # what the fine-tune's last line keeps
TABLE_COLUMNS = (("mean reward", "mean_reward", ".4f"), ("pass@1", "pass_at_1", ".4f"),
                 ("vs base", "reward_vs_base", "+.4f"), ("length", "completion_length", ".1f"),
                 ("cut", "truncated", ".2f"))


def table_note(method_settings: dict[str, Any]) -> str:
    return (f"greedy answers of at most {method_settings.get('max_completion_length')} tokens, rewards "
            f"{', '.join(method_settings.get('rewards') or [])}")


def reward_values(config: dict[str, Any]) -> list[str]:
    """The run's ``--reward`` values: recorded, else the bundled task's reward (a run without
    ``--dataset`` trained on the bundled task)."""
    from trnqwen.methods.grpo.task import REWARD

    values = list(config.get("reward") or [])
    return values or [REWARD]


def settings(run_config: Optional[dict], defaults: dict[str, Any]) -> dict[str, Any]:
    """What the answers are generated and scored with, as eval.json names it: the run's (run.json),
    else the defaults."""
    config = run_config or {}
    return {"rewards": reward_values(config),
            "max_completion_length": int(config.get("max_completion_length") or defaults["max_completion_length"])}


@dataclass
class HeldOutAnswers:
    """One model's greedy answer to every held-out prompt, in cache order."""

    records: list[dict[str, Any]]  # the prompt cache's records ("where", "prompt", "columns")
    texts: list[str]  # each answer decoded (special tokens dropped)
    ids: list[list[int]]  # each answer's tokens up to and including its end of turn
    truncated: list[bool]  # no end of turn within max_completion_length
    totals: Any = None  # numpy [N] total reward (NaN: no function scored it), set by numbers()
    per_func: Any = None  # numpy [N, F] each function's reward (NaN: it said None)
    passed: Any = None  # numpy bool [N] or None
    names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


def _prompt_ids(data: EvalData) -> list[list[int]]:
    import numpy as np

    mask = np.asarray(data.split.extra["prompt_mask"]).astype(bool)
    ids = np.asarray(data.input_ids)
    return [ids[i][mask[i]].tolist() for i in range(len(ids))]


def score(model, data: EvalData, *, batch_size: int, static_shapes: bool = False, head_chunk: int = 0) -> HeldOutAnswers:
    """Eval's entry point: every held-out prompt answered greedily, ``batch_size`` prompts at a time,
    each batch left-padded to the run's prompt room (one shape for every batch)."""
    del static_shapes, head_chunk  # generation has one shape anyway (the prompt room, the completion length)
    from transformers import AutoTokenizer

    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings

    tokenizer = AutoTokenizer.from_pretrained(str(data.tokenizer_dir), trust_remote_code=data.trust_remote_code)
    records = prompt_cache.read_records(data.source, data.split_name)
    prompts = _prompt_ids(data)
    if len(records) != len(prompts):
        raise ValueError(f"{data.source}: {len(prompts)} prompt rows but {len(records)} records")
    completion = int(data.split.meta.get("max_completion_length") or 64)
    room = data.seq_len - completion
    vocab = tokenizer.get_vocab()
    eos = sorted({i for i in (vocab.get("<|im_end|>"), tokenizer.eos_token_id) if i is not None})
    pad = int(data.pad_id)
    generator = InProcessGenerator(model, SamplingSettings(max_completion_length=completion, do_sample=False,
                                                           prompt_bucket=room), pad, eos, kind="hf", gather_weights=False)
    ids: list[list[int]] = []
    truncated: list[bool] = []
    for start in range(0, len(prompts), batch_size):
        rollout = generator.generate(prompts[start:start + batch_size], num_generations=1)
        ids += rollout.completion_lists()
        truncated += [bool(t) for t in rollout.is_truncated]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return HeldOutAnswers(records=records, texts=[t.strip() for t in texts], ids=ids, truncated=truncated)


def reward_set(method_settings: dict[str, Any]):
    from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

    return RewardSet.build(parse_rewards(method_settings["rewards"]),
                           BuiltinOptions(max_completion_length=int(method_settings["max_completion_length"])))


def reward_scores(held: HeldOutAnswers, rewards) -> None:
    """The run's rewards on ``held`` (kept on it: ``totals``, ``per_func``, ``passed``, ``names``)."""
    import numpy as np

    from trnqwen.methods.grpo.rewards import as_completions

    records = held.records
    conversational = bool(records) and isinstance(records[0]["prompt"], list)
    columns = {name: [r["columns"].get(name) for r in records] for name in dict.fromkeys(k for r in records for k in r["columns"])}
    scores = rewards.score([r["prompt"] for r in records], as_completions(held.texts, conversational), held.ids,
                           columns, [r["where"] for r in records])
    per_func = scores.per_func.double().numpy()
    held.totals, held.per_func, held.names = scores.total.double().numpy(), per_func, list(scores.names)
    thresholds = rewards.pass_thresholds()
    judged = [i for i, t in enumerate(thresholds) if t is not None]
    if judged:  # right when every function that can tell says so
        held.passed = np.all([per_func[:, i] >= thresholds[i] for i in judged], axis=0)


def numbers(scores: HeldOutAnswers, reference: Optional[HeldOutAnswers], method_settings: dict[str, Any]) -> dict[str, Any]:
    """Eval's entry point: the result row's fields (:data:`FIELDS`)."""
    import numpy as np

    if scores.totals is None:
        reward_scores(scores, reward_set(method_settings))
    scored = scores.totals[np.isfinite(scores.totals)]
    mean = float(scored.mean()) if scored.size else float("nan")
    out: dict[str, Any] = {
        "prompts": len(scores),
        "mean_reward": mean,
        "pass_at_1": float(np.mean(scores.passed)) if scores.passed is not None and len(scores) else None,
        "reward_vs_base": None,
        "rewards": {name: _finite(np.nanmean(scores.per_func[:, i]) if np.isfinite(scores.per_func[:, i]).any() else None)
                    for i, name in enumerate(scores.names)},
        "completion_length": float(np.mean([len(i) for i in scores.ids])) if len(scores) else float("nan"),
        "truncated": float(np.mean(scores.truncated)) if len(scores) else float("nan"),
    }
    if reference is not None and reference.totals is not None and len(reference) == len(scores):
        base = reference.totals[np.isfinite(reference.totals)]
        if base.size and scored.size:
            out["reward_vs_base"] = mean - float(base.mean())
    return out


def _finite(value: Optional[float]) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def loss(scores: HeldOutAnswers) -> None:
    """No held-out loss: prompts carry no answers of their own (the report is the rewards)."""
    return None


def completion_tokens(scores: HeldOutAnswers) -> int:
    """The tokens the model wrote (the report's ``tokens``)."""
    return sum(len(i) for i in scores.ids)


def answers(scores: HeldOutAnswers, limit: int) -> list[tuple[str, str, str]]:
    """The first ``limit`` prompts' (prompt as the user wrote it, the record's answer or solution
    column, this model's answer): shown side by side, base against tuned."""
    from trnqwen.methods.grpo.rewards import ANSWER_COLUMNS

    out = []
    for record, text in list(zip(scores.records, scores.texts))[:limit]:
        prompt = record["prompt"]
        if isinstance(prompt, list):
            users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
            prompt = users[-1] if users else ""
        reference = next((record["columns"][c] for c in ANSWER_COLUMNS if record["columns"].get(c) is not None), "")
        out.append((str(prompt), str(reference), text))
    return out


def say(row: dict[str, Any]) -> str:
    """The progress line of one model."""
    return (f"mean reward {number(row.get('mean_reward'), finite=True)}, pass@1 {number(row.get('pass_at_1'), finite=True)} "
            f"on {row.get('prompts')} held-out prompts (greedy)")


def summary_line(base: dict[str, Any], tuned: dict[str, Any]) -> str:
    """``held-out reward before 0.0312 -> after 0.9875 (+0.9563), pass@1 0.0000 -> 0.1250 on 16 prompts (greedy)``,
    from two JSON result rows."""
    before, after = base.get("mean_reward"), tuned.get("mean_reward")
    delta = after - before if isinstance(before, (int, float)) and isinstance(after, (int, float)) else None
    line = f"held-out reward before {number(before, finite=True)} -> after {number(after, finite=True)}"
    if delta is not None and math.isfinite(delta):
        line += f" ({delta:+.4f})"
    if tuned.get("pass_at_1") is not None:
        line += f", pass@1 {number(base.get('pass_at_1'), finite=True)} -> {number(tuned.get('pass_at_1'), finite=True)}"
    return line + f" on {tuned.get('prompts', 0):,} prompts (greedy)"


def table(results: Sequence[dict[str, Any]], method_settings: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """(title note, headers, rows) of eval's table: checkpoint, prompts, then :data:`TABLE_COLUMNS`."""
    headers = ["checkpoint", "prompts", *(h for h, _, _ in TABLE_COLUMNS)]
    rows = [[str(r.get("checkpoint")), f"{r.get('prompts', 0):,}",
             *("" if r.get(name) is None else number(r.get(name), spec, finite=True) for _, name, spec in TABLE_COLUMNS)]
            for r in results]
    return "held-out prompts", headers, rows


def before_after(base: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """What the fine-tune's last line keeps (``validation_before_after``'s ``reward``)."""
    return {"prompts": tuned.get("prompts"), "reward_before": base.get("mean_reward"),
            "reward_after": tuned.get("mean_reward"), "pass_before": base.get("pass_at_1"),
            "pass_after": tuned.get("pass_at_1"), "line": summary_line(base, tuned)}
