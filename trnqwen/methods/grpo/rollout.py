"""GRPO's rollout, backend-neutral: one home for what every backend's ranks do with a step's batches
of prompts, shared by the torchtitan hook (:mod:`trnqwen.methods.grpo.titan`) and the Transformers
Trainer (:mod:`trnqwen.methods.grpo.hf_trainer`).

* :func:`read_prompts`: a prompt cache's rows in the rank's order (the prompt from position 0, its
  mask, its row number: the record its rewards read);
* :class:`GroupRollout` (one per rank), :meth:`~GroupRollout.rollout`: a training step's prompt
  batches (one per gradient-accumulation micro-batch), all of them before the step's first forward
  (TRL's generation batch: the advantages' "batch" statistics and dapo's token count span the step):

  1. the rank's prompts (left-padded to the fixed room ``seq_len - max_completion_length``) get
     ``num_generations`` completions each from the current policy
     (:class:`~trnqwen.methods.grpo.generate.InProcessGenerator`, sampling seeded by (seed, step,
     rank, micro-batch): a resumed run draws the same completions);
  2. the reward functions score them (:class:`~trnqwen.methods.grpo.rewards.RewardSet`, TRL's
     signature); a function that raises or returns the wrong thing stops every rank, before any
     update, with the ``[trnqwen] usage error:`` line naming it and the record (exit 2:
     :mod:`trnqwen.contract.rank_errors`);
  3. each group's rewards become advantages (:func:`~trnqwen.methods.grpo.loss.group_advantages`;
     ``scale_rewards="batch"`` gathers every rank's rewards of the whole step first);
  4. each batch becomes the prompt + completion rows (:class:`Staged`: ``[prompts x G, seq_len]``,
     the prompt, its completion, then padding; each completion token's target, each row's advantage);
     what a backend adds to them (the torchtitan hook: the sampling policy's and the reference's
     log-probs, the rollout's reuse) is the backend's;

* :func:`staged_loss`: :func:`~trnqwen.methods.grpo.loss.policy_loss` on that forward's logits, and
  the sums its values are made of;
* :meth:`~GroupRollout.training_on` (each step, the rollout it trains on: fresh or held) and
  :meth:`~GroupRollout.step_values`: reward mean/std, each function's mean, the share of groups with
  no signal, completion lengths and the share cut, kl, entropy, the clip ratio, rollout and update
  seconds, over every rank (the metrics stream's ``grpo/...``, the ``[GRPO]`` line); with
  ``log_completions`` rank 0 appends that many prompt/completion/reward rows per step to
  ``completions.jsonl`` in the run directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from trnqwen.contract import metrics_stream
from trnqwen.methods.grpo import loss as arith

IGNORE_INDEX = -100
COMPLETIONS_FILE = "completions.jsonl"  # --log-completions: in the run directory


def read_prompts(split, stream):
    """``(ids, labels, positions, prompt_mask, row)`` (numpy int64, the row an int) of each prompt
    the rank's stream reads, in its order (an endless stream: a prompt cache has no fill rows)."""
    import numpy as np

    from trnqwen.runtime.token_stream import read_row

    while not stream.exhausted():
        row = stream.advance()
        if row is None:
            raise RuntimeError("GRPO reads its prompts in an endless stream: a fill row has no prompt")
        ids, labels, positions = read_row(split, row)
        yield ids, labels, positions, np.asarray(split.extra["prompt_mask"][row], dtype=np.int64), int(row)


def completion_rows(prompts: list[torch.Tensor], completions: list[list[int]], num_generations: int, seq_len: int,
                    pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, targets)`` ``[prompts x G, seq_len]``: each row its prompt, one of its completions
    (prompt-major), then ``pad_id``; ``targets[t]`` is the completion token input ``t`` predicts
    (torchtitan's shifted labels), -100 off the completion.  Positions are ``0 .. seq_len-1``:
    one document per row, the padding after it (causal: it changes nothing before it)."""
    rows = len(completions)
    seq = torch.full((rows, seq_len), int(pad_id), dtype=torch.long)
    targets = torch.full((rows, seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, tokens in enumerate(completions):
        prompt = prompts[i // num_generations]
        completion = torch.as_tensor(tokens, dtype=torch.long)
        p, m = prompt.numel(), completion.numel()
        if p + m > seq_len:
            raise ValueError(f"prompt {p} + completion {m} tokens do not fit the {seq_len}-token row")
        seq[i, :p] = prompt
        seq[i, p:p + m] = completion
        targets[i, p - 1:p + m - 1] = completion
    return seq, targets


@dataclass
class Staged:
    """One micro-batch of a rollout, ready for the forward and the loss (``R`` = prompts x G rows of
    ``S`` tokens)."""

    seq: torch.Tensor  # [R, S] prompt, completion, padding
    targets: torch.Tensor  # [R, S] the completion token input t predicts (where its logits are), -100 elsewhere
    advantages: torch.Tensor  # [R]
    rows: torch.Tensor  # [W x R, F + 4] every rank's per-completion values (rewards..., total, length, cut, zero std)
    tokens: float  # completion tokens of this micro-batch over every rank
    old_logps: Optional[torch.Tensor] = None  # [R, S] the sampling policy's (num_iterations > 1)
    ref_logps: Optional[torch.Tensor] = None  # [R, S] the starting weights' (kl_beta > 0)

    def positions(self) -> torch.Tensor:
        """``[R, S]`` ``0 .. S-1``: one document per row from position 0 (the padding after it
        changes nothing before it)."""
        n_rows, seq_len = self.seq.shape
        return torch.arange(seq_len, dtype=torch.long).expand(n_rows, seq_len).contiguous()

    def batch(self, micro: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """torchtitan's ``(input_dict, labels)`` of this micro-batch, ``grpo_micro`` naming it."""
        return ({"input": self.seq.clone(), "positions": self.positions(), "grpo_micro": torch.tensor(micro)},
                self.targets.clone())


def staged_loss(pred: torch.Tensor, *, targets: torch.Tensor, advantages: torch.Tensor, global_tokens: float,
                micro_batches: int, loss_type: str, epsilon: float, epsilon_high: float, temperature: float,
                max_completion_length: int, old_logps: Optional[torch.Tensor] = None,
                ref_logps: Optional[torch.Tensor] = None, beta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, sums)``: this micro-batch's share of the step's loss on the staged rows' logits
    ``pred`` (shifted already: logits at t score the target at t), and its ``[SUMS..., tokens]``
    row (what :meth:`GroupRollout.step_values` makes the kl, entropy and clip values of).
    ``old_logps`` / ``ref_logps`` (``[rows, seq_len]``, aligned with ``targets``): the sampling
    policy's and the reference's, for :func:`~trnqwen.methods.grpo.loss.policy_loss` (None: on-policy, no KL)."""
    targets = targets.to(pred.device)
    logps, entropy = arith.token_logps(pred, targets.clamp(min=0), temperature=temperature)
    mask = (targets != IGNORE_INDEX).to(logps.dtype)
    old, ref = (x.to(logps.device) if x is not None else None for x in (old_logps, ref_logps))
    terms = arith.policy_loss(
        logps, advantages.to(logps.device), mask, loss_type=loss_type, old_logps=old, ref_logps=ref, beta=beta,
        epsilon=epsilon, epsilon_high=epsilon_high, entropy=entropy, micro_batches=micro_batches,
        global_tokens=global_tokens, max_completion_length=max_completion_length,
    )
    row = torch.stack([*(terms.sums[k].detach().float() for k in arith.SUMS), terms.tokens.float()])
    return terms.loss, row


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Every rank's ``[N, K]`` rows (the same N on each), concatenated in rank order."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return local
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return torch.cat(out)


class GroupRollout:
    """One rank's GRPO rollouts, rewards and step values (module doc).  ``settings``: the plan's
    (:func:`trnqwen.methods.grpo.plan.hook_settings`); ``model``: what generates (an HF causal LM,
    ``kind="hf"``, or torchtitan's native decoder, ``"titan"``); ``weights_root``: the module whose
    FSDP weights are gathered for the rollout when it is not ``model`` itself."""

    def __init__(self, settings: dict[str, Any], *, model: torch.nn.Module, kind: str,
                 weights_root: Optional[torch.nn.Module] = None) -> None:
        from transformers import AutoTokenizer

        from trnqwen.methods.grpo import prompt_cache
        from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings
        from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

        self.values = s = dict(settings)
        self.tokenizer = AutoTokenizer.from_pretrained(s["assets_dir"], trust_remote_code=bool(s.get("trust_remote_code")))
        self.records = prompt_cache.read_records(s["cache_dir"])
        self.conversational = bool(self.records) and isinstance(self.records[0]["prompt"], list)
        self.rewards = RewardSet.build(parse_rewards(s["rewards"]),
                                       BuiltinOptions(max_completion_length=s["max_completion_length"]))
        vocab = self.tokenizer.get_vocab()
        eos = {i for i in (vocab.get("<|im_end|>"), self.tokenizer.eos_token_id) if i is not None}
        self.pad_id = int(s["pad_id"])
        dist = _dist()
        self.rank = dist.get_rank() if dist is not None else 0
        self.world = dist.get_world_size() if dist is not None else 1
        self.generator = InProcessGenerator(
            model=model, weights_root=weights_root,
            settings=SamplingSettings(max_completion_length=s["max_completion_length"], temperature=s["temperature"],
                                      top_p=s["top_p"], prompt_bucket=s["room"]),
            pad_id=self.pad_id, eos_ids=sorted(eos), seed=int(s["seed"]), rank=self.rank, kind=kind,
        )
        self.completions_path = None
        stream = os.environ.get(metrics_stream.PATH_ENV)  # the run directory's metrics.jsonl (rank 0 writes it)
        if s.get("log_completions") and self.rank == 0 and stream:
            self.completions_path = os.path.join(os.path.dirname(stream), COMPLETIONS_FILE)
        self.rows: list[torch.Tensor] = []  # each micro-batch's gathered per-completion values, this step
        self.rollout_s = 0.0
        self.update_from: Optional[float] = None
        self.update_s = 0.0

    # --- each step that samples ---------------------------------------------------------------

    def rollout(self, step: int, prompt_batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[Staged]:
        """Training step ``step``'s (1-based: the step being trained) prompt batches, one per
        micro-batch, each ``(ids, prompt_mask, rows)`` (``ids`` ``[B, seq_len]``: the prompt from
        position 0, ``prompt_mask`` 1 on it; ``rows``: their cache rows), as their scored prompt +
        completion rows for the loss (module doc): completions sampled, rewarded, advantages
        (groups; "batch": over the whole step, every rank)."""
        s = self.values
        g = int(s["num_generations"])
        parts = [self._sample(step, *batch, micro=micro) for micro, batch in enumerate(prompt_batches)]
        if s["scale_rewards"] == "batch":
            every = torch.cat([part["gathered"][:, -3] for part in parts])
            adv_all = arith.group_advantages(every, g, scale_rewards="batch")
            n, width = parts[0]["local"].shape[0], parts[0]["gathered"].shape[0]
            for m, part in enumerate(parts):
                mine = adv_all.advantages[m * width:(m + 1) * width]
                part["advantages"] = mine[self.rank * n:(self.rank + 1) * n]
                part["zero_std"] = adv_all.is_std_zero[m * width:(m + 1) * width]
        else:
            for part in parts:
                adv = arith.group_advantages(part["local"][:, -3], g, scale_rewards=s["scale_rewards"])
                part["advantages"] = adv.advantages
                part["zero_std"] = _gather_rows(adv.is_std_zero.float()[:, None])[:, 0].bool()
        items = []
        for part in parts:
            seq, targets = part["seq"], part["targets"]
            global_tokens = torch.tensor([float((targets != IGNORE_INDEX).sum())])
            dist = _dist()
            if dist is not None and self.world > 1:
                dist.all_reduce(global_tokens)
            items.append(Staged(seq=seq, targets=targets, advantages=part["advantages"],
                                rows=torch.cat([part["gathered"], part["zero_std"].float()[:, None]], dim=1),
                                tokens=float(global_tokens)))
            self._keep_completions(step, part["records"], part["completions"], part["local"][:, -3],
                                   part["advantages"])
        return items

    def _sample(self, step: int, ids: torch.Tensor, prompt_mask: torch.Tensor, rows: torch.Tensor, *,
                micro: int) -> dict[str, Any]:
        """One micro-batch's prompts: completions sampled (seeded by seed, step, rank, micro-batch),
        scored, every rank's per-completion values gathered, the prompt + completion rows made."""
        s = self.values
        g, room = int(s["num_generations"]), int(s["room"])
        ids, prompt_mask, rows = ids.cpu(), prompt_mask.cpu(), rows.cpu()
        seq_len = ids.shape[1]
        lengths = prompt_mask.sum(-1)
        left = torch.full((ids.shape[0], room), self.pad_id, dtype=torch.long)
        left_mask = torch.zeros_like(left)
        for i, n in enumerate(lengths.tolist()):
            left[i, room - n:] = ids[i, :n]
            left_mask[i, room - n:] = 1
        rollout = self.generator.generate_padded(left, left_mask, num_generations=g, step=step, micro=micro)
        completions = rollout.completion_lists()
        records = [self.records[int(r)] for r in rows.tolist() for _ in range(g)]
        scores = self._score(step, records, completions)
        # every rank's completions: rewards (for "batch" scaling and the step's values), lengths, cut
        local = torch.cat([scores.per_func, scores.total[:, None], rollout.completion_lengths.float()[:, None],
                           rollout.is_truncated.float()[:, None]], dim=1)
        prompts = [ids[i, : int(n)] for i, n in enumerate(lengths.tolist())]
        seq, targets = completion_rows(prompts, completions, g, seq_len, self.pad_id)
        return {"local": local, "gathered": _gather_rows(local), "seq": seq, "targets": targets, "records": records,
                "completions": completions}

    # --- each step ----------------------------------------------------------------------------

    def training_on(self, items: list[Staged], rollout_s: float) -> None:
        """The step trains on ``items`` (a fresh rollout or a held one): their rows join the step's
        values, ``rollout_s`` its rollout seconds (0 at a step that reuses one); the update's clock
        starts now."""
        self.rows.extend(item.rows for item in items)
        self.rollout_s += rollout_s
        self.update_from = time.perf_counter()

    def _score(self, step: int, records: list[dict], completions: list[list[int]]):
        """The rewards of this rank's completions; a reward function's failure stops every rank
        (they agree first: the same step, before any update) with the usage-error lines."""
        from trnqwen.contract.rank_errors import usage_lines
        from trnqwen.methods.grpo.rewards import RewardError, as_completions

        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        columns: dict[str, list] = {}
        for name in dict.fromkeys(k for r in records for k in r["columns"]):
            columns[name] = [r["columns"].get(name) for r in records]
        failure = None
        scores = None
        try:
            scores = self.rewards.score([r["prompt"] for r in records], as_completions(texts, self.conversational),
                                        completions, columns, [r["where"] for r in records],
                                        trainer_state=_State(step))
        except RewardError as exc:
            failure = (exc.message, exc.hint)
        dist = _dist()
        failed = torch.tensor([1 if failure else 0])
        if dist is not None and self.world > 1:
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if int(failed) and self.world > 1:
                every: list = [None] * self.world
                dist.all_gather_object(every, failure)
                failure = next(f for f in every if f)
        if int(failed):
            for line in usage_lines(*failure):
                print(line, flush=True)
            sys.stdout.flush()
            raise SystemExit(2)
        return scores

    def _keep_completions(self, step: int, records, completions, totals, advantages) -> None:
        if self.completions_path is None:
            return
        keep = int(self.values["log_completions"])
        texts = self.tokenizer.batch_decode(completions[:keep], skip_special_tokens=True)
        with open(self.completions_path, "a", encoding="utf-8") as fh:
            for i, text in enumerate(texts):
                fh.write(json.dumps({"step": step, "record": records[i]["where"], "prompt": records[i]["prompt"],
                                     "completion": text, "reward": _number(totals[i]),
                                     "advantage": _number(advantages[i])}) + "\n")

    # --- each logged step ---------------------------------------------------------------------

    def step_values(self, sums: Optional[torch.Tensor]) -> dict[str, float]:
        """The step's values over every rank (every rank calls it: it all-reduces), from the
        micro-batches' rows and the loss's ``sums`` (:func:`staged_loss`'s rows, summed); {} when no
        rollout ran this step."""
        if not self.rows:
            return {}
        if self.update_from is not None:
            self.update_s = time.perf_counter() - self.update_from
        rows, self.rows = torch.cat(self.rows), []
        n_sums = len(arith.SUMS) + 1
        timing = torch.tensor([self.rollout_s, self.update_s])
        packed = torch.cat([sums.cpu() if sums is not None else torch.zeros(n_sums), timing])
        dist = _dist()
        if dist is not None and self.world > 1:
            dist.all_reduce(packed)
        metrics = arith.reduce_metrics({k: float(packed[i]) for i, k in enumerate(arith.SUMS)}, float(packed[n_sums - 1]))
        f = len(self.rewards.names)
        g = int(self.values["num_generations"])
        totals = rows[:, f]
        values = {
            "reward": float(torch.nanmean(totals)),
            "reward_std": float(arith.nanstd(totals)) if totals.numel() > 1 else 0.0,
            **{f"rewards/{name}": float(torch.nanmean(rows[:, i])) for i, name in enumerate(self.rewards.names)},
            "frac_reward_zero_std": float(rows[::g, f + 3].mean()),
            "completion_length": float(rows[:, f + 1].mean()),
            "completion_length_max": float(rows[:, f + 1].max()),
            "clipped_ratio": float(rows[:, f + 2].mean()),
            "kl": metrics["kl"],
            "entropy": metrics["entropy"],
            "clip_ratio": metrics["clip_ratio/region_mean"],
            "rollout_s": float(packed[-2]) / self.world,
            "update_s": float(packed[-1]) / self.world,
            "completions": float(rows.shape[0]),
        }
        self.rollout_s = 0.0
        return values


def describe(reward_names: list[str]) -> dict[str, str]:
    """What each of :meth:`GroupRollout.step_values`' values is (TensorBoard/W&B descriptions)."""
    return {
        "reward": "mean total reward of the step's completions",
        "reward_std": "standard deviation of the step's total rewards",
        "frac_reward_zero_std": "share of groups whose rewards are all equal (no signal)",
        "completion_length": "mean completion length, tokens",
        "completion_length_max": "longest completion, tokens",
        "clipped_ratio": "share of completions cut at max_completion_length",
        "kl": "mean KL to the starting weights per completion token (kl_beta > 0)",
        "entropy": "mean policy entropy per completion token",
        "clip_ratio": "share of completion tokens whose importance ratio was clipped",
        "rollout_s": "seconds generating and scoring (mean over ranks)",
        "update_s": "seconds of the forward, backward and optimizer step after the rollout (mean over ranks)",
        "completions": "completions of the step, every rank",
        **{f"rewards/{name}": f"mean of reward function {name}" for name in reward_names},
    }


@dataclass
class _State:
    """What TRL hands reward functions as ``trainer_state`` (they read ``global_step``)."""

    global_step: int


def _number(x) -> Optional[float]:
    value = float(x)
    return value if value == value else None
