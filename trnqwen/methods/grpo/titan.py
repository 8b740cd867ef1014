"""GRPO inside torchtitan ranks (native): the rollout, the rewards, the advantages, the loss, its values.

The generated config module sets ``config.loss = grpo_loss_config(...)``, points the dataloader at
:func:`titan_rows` (one prompt per row, from :mod:`trnqwen.methods.grpo.prompt_cache`) and passes
:class:`GRPOHook` to trnqwen's trainer (``trnqwen_config(config, hooks=[GRPOHook(...)])``, the hook
protocol of :mod:`trnqwen.runtime.trainer`).  At each step that samples (every step; with
``num_iterations`` N, steps 1, N + 1, ...), ``batches`` takes the step's prompt batches (one per
gradient-accumulation micro-batch) from the dataloader before torchtitan's first forward, and for each:

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
4. the batch becomes the prompt + completion rows (``[prompts x G, seq_len]``: the prompt, its
   completion, then padding), what torchtitan's train step reads instead of the prompts;
5. with ``kl_beta`` > 0 the starting weights' log-probs of the completions, with ``num_iterations``
   > 1 the sampling policy's (:mod:`trnqwen.methods.grpo.reference`: one no-grad forward each).

The rollout is held (:mod:`trnqwen.methods.grpo.replay`, kept by checkpoints when it is reused) and
handed out again at the steps that reuse it, the prompt stream left alone.  ``on_batch`` gives the
loss (:class:`GRPOLoss`) each micro-batch's completion targets, advantages and those log-probs:
:func:`~trnqwen.methods.grpo.loss.policy_loss` on that forward.

``step_values`` / ``log_lines``: reward mean/std, each function's mean, the share of groups with
no signal, completion lengths and the share cut, kl, entropy, the clip ratio, rollout and update
seconds, over every rank, to TensorBoard/W&B, the metrics stream (``grpo/...``) and one
``[GRPO] step:`` line (:mod:`trnqwen.methods.grpo.log_lines`).  With ``log_completions`` rank 0
appends that many prompt/completion/reward rows per step to ``completions.jsonl`` in the run
directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import torch
from torchtitan.components.loss import BaseLoss
from torchtitan.config import CompileConfig

from trnqwen.contract import metrics_stream
from trnqwen.methods.grpo import loss as arith
from trnqwen.methods.grpo.log_lines import format_line
from trnqwen.methods.grpo.reference import StartingWeights, completion_logps
from trnqwen.methods.grpo.replay import Rollouts, RolloutState, Staged
from trnqwen.runtime.trainer import TrainerHook

if TYPE_CHECKING:
    from torchtitan.trainer import Trainer

IGNORE_INDEX = -100
KEYS = ("grpo_row", "grpo_prompt_mask")  # what a GRPO prompt batch carries beside input/positions
COMPLETIONS_FILE = "completions.jsonl"  # --log-completions: in the run directory
ROLLOUT_KEY = "grpo_rollout"  # the checkpoint's state of the rollout being reused (num_iterations > 1)


def titan_rows(dataset):
    """The torchtitan dataloader's rows of a prompt cache (``TokenCacheDataLoader.Config.rows``):
    the prompt (from position 0), its mask and its row number (the record its rewards read)."""
    import numpy as np

    from trnqwen.runtime.token_stream import read_row

    split = dataset.split
    while not dataset.stream.exhausted():
        row = dataset.stream.advance()
        if row is None:
            raise RuntimeError("GRPO reads its prompts in an endless stream: a fill row has no prompt")
        ids, labels, positions = read_row(split, row)
        mask = np.asarray(split.extra["prompt_mask"][row], dtype=np.int64)
        yield ({"input": torch.from_numpy(ids), "positions": torch.from_numpy(positions),
                "grpo_prompt_mask": torch.from_numpy(mask), "grpo_row": torch.tensor(int(row))},
               torch.from_numpy(labels))


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


class GRPOLoss(BaseLoss):
    """torchtitan loss: GRPO's clipped surrogate on the staged rows (module doc); ``labels`` unused."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        loss_type: str = "dapo"
        epsilon: float = 0.2
        epsilon_high: float = 0.2
        temperature: float = 1.0
        max_completion_length: int = 64
        beta: float = 0.0
        """The KL term's weight (``--kl-beta``, TRL's ``beta``): the rollout then carries the reference's log-probs."""
        settings: str = "{}"
        """The hook's settings, JSON (:func:`trnqwen.methods.grpo.plan.hook_settings`): the rollout, the rewards, the data."""

    def __init__(self, config: Config, *, compile_config: Optional[CompileConfig] = None) -> None:
        del compile_config
        self.config = config
        self.staged: Optional[dict[str, Any]] = None
        self.sums: Optional[torch.Tensor] = None  # [SUMS..., tokens, clipped-token count]

    def stage(self, *, targets: torch.Tensor, advantages: torch.Tensor, global_tokens: float, micro_batches: int,
              old_logps: Optional[torch.Tensor] = None, ref_logps: Optional[torch.Tensor] = None) -> None:
        """The next forward's rollout: each completion token's target (-100 elsewhere), each row's
        advantage, the step's completion tokens over every rank (dapo) and its micro-batches (the rest);
        the sampling policy's log-probs (``num_iterations`` > 1) and the reference's (``beta`` > 0),
        ``[rows, seq_len]`` aligned with ``targets``."""
        self.staged = {"targets": targets, "advantages": advantages, "global_tokens": global_tokens,
                       "micro_batches": micro_batches, "old_logps": old_logps, "ref_logps": ref_logps}

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        del labels, global_valid_tokens, kwargs
        batch, self.staged = self.staged, None
        if batch is None:
            raise RuntimeError("the GRPO loss ran without its rollout: the batch did not come from a prompt cache")
        c = self.config
        targets = batch["targets"].to(pred.device)
        # torchtitan's labels are shifted already: logits at t score the target at t
        logps, entropy = arith.token_logps(pred, targets.clamp(min=0), temperature=c.temperature)
        mask = (targets != IGNORE_INDEX).to(logps.dtype)
        old, ref = (batch[k].to(logps.device) if batch.get(k) is not None else None for k in ("old_logps", "ref_logps"))
        terms = arith.policy_loss(
            logps, batch["advantages"].to(logps.device), mask, loss_type=c.loss_type, old_logps=old, ref_logps=ref,
            beta=c.beta, epsilon=c.epsilon,
            epsilon_high=c.epsilon_high, entropy=entropy, micro_batches=batch["micro_batches"],
            global_tokens=batch["global_tokens"], max_completion_length=c.max_completion_length,
        )
        row = torch.stack([*(terms.sums[k].detach().float() for k in arith.SUMS), terms.tokens.float()])
        self.sums = row if self.sums is None else self.sums + row.to(self.sums.device)
        return terms.loss, {}

    def take_sums(self) -> Optional[torch.Tensor]:
        sums, self.sums = self.sums, None
        return sums


def grpo_loss_config(*, loss_type: str, epsilon: float, epsilon_high: float, temperature: float,
                     max_completion_length: int, settings: dict[str, Any], beta: float = 0.0) -> GRPOLoss.Config:
    """The loss config for the generated module (its :class:`GRPOHook` goes in ``config.hooks``)."""
    return GRPOLoss.Config(loss_type=loss_type, epsilon=epsilon, epsilon_high=epsilon_high, temperature=temperature,
                           max_completion_length=max_completion_length, beta=beta,
                           settings=json.dumps(settings, sort_keys=True))


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


class GRPOHook(TrainerHook):
    """GRPO's trainer hook (module doc); its settings are the plan's, carried by the loss config."""

    name = "grpo"
    method = True

    def __init__(self) -> None:
        # no parameters: tyro (torchtitan's config parser) rebuilds each hook from its constructor's
        # defaults; the settings ride on the loss config (GRPOLoss.Config.settings), read in on_init
        self.values: dict[str, Any] = {}
        self.rollouts = Rollouts()
        self.starting: Optional[StartingWeights] = None  # kl_beta > 0: the reference's weights
        self.rows: list[torch.Tensor] = []  # each micro-batch's gathered per-completion values, this step
        self.rollout_s = 0.0
        self.update_from: Optional[float] = None
        self.update_s = 0.0
        self.last: Optional[dict[str, float]] = None

    # --- set-up -------------------------------------------------------------------------------

    def on_init(self, trainer: Trainer) -> None:
        from transformers import AutoTokenizer

        from trnqwen.methods.grpo import prompt_cache
        from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings
        from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

        if not isinstance(trainer.loss_fn, GRPOLoss):
            return
        self.values = s = json.loads(trainer.loss_fn.config.settings)
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
        root = trainer.model_parts[0]
        # hf-v5: torchtitan's wrapper holds the transformers causal LM (which generates with its own
        # cache); its root holds the FSDP-sharded embeddings and lm_head
        inner = getattr(root, "model", None)
        hf = inner is not None and hasattr(inner, "generation_config")
        if hf:
            _fsdp_root_ready(root)
        self.generator = InProcessGenerator(
            model=inner if hf else root, weights_root=root if hf else None,
            settings=SamplingSettings(max_completion_length=s["max_completion_length"], temperature=s["temperature"],
                                      top_p=s["top_p"], prompt_bucket=s["room"]),
            pad_id=self.pad_id, eos_ids=sorted(eos), seed=int(s["seed"]), rank=self.rank, kind="hf" if hf else "titan",
        )
        self.rollouts = Rollouts(int(s.get("num_iterations", 1)))
        self.completions_path = None
        stream = os.environ.get(metrics_stream.PATH_ENV)  # the run directory's metrics.jsonl (rank 0 writes it)
        if s.get("log_completions") and self.rank == 0 and stream:
            self.completions_path = os.path.join(os.path.dirname(stream), COMPLETIONS_FILE)

    def after_checkpoint_load(self, trainer: Trainer) -> None:
        """``kl_beta`` > 0: the reference's weights, the model's now at step 0 (a resumed run: reloaded)."""
        if not isinstance(trainer.loss_fn, GRPOLoss) or not trainer.loss_fn.config.beta:
            return
        model = trainer.model_parts[0]
        self.starting = StartingWeights.capture(model) if trainer.step == 0 else StartingWeights.reload(model, trainer)

    def checkpoint_states(self, trainer: Trainer) -> dict[str, Any]:
        """``num_iterations`` > 1: the rollout being reused, kept by a checkpoint (a resumed run goes on with it)."""
        if not isinstance(trainer.loss_fn, GRPOLoss) or self.rollouts.num_iterations == 1:
            return {}
        rows = int(trainer.config.training.local_batch_size) * int(self.values["num_generations"])
        return {ROLLOUT_KEY: RolloutState(
            self.rollouts, rank=self.rank, micro_batches=max(1, int(getattr(trainer, "gradient_accumulation_steps", 1))),
            rows=rows, seq_len=int(trainer.config.training.seq_len), world_rows=self.world * rows,
            width=len(self.rewards.names) + 4)}

    # --- each step's micro-batches ---------------------------------------------------------------

    def batches(self, trainer: Trainer, batches: Iterable) -> Iterable:
        if not isinstance(getattr(trainer, "loss_fn", None), GRPOLoss):
            return batches
        return self._rollout_batches(trainer, batches)

    def _rollout_batches(self, trainer: Trainer, prompt_batches: Iterable) -> Iterator:
        """Each step's micro-batches: at a step that samples (:meth:`Rollouts.due`) the step's prompt
        batches, all of them rolled out and scored before the first forward (TRL's generation batch:
        the advantages' "batch" statistics and dapo's token count span the whole step); at the others,
        the held rollout again (``num_iterations``), the prompt stream left where it is."""
        accumulation = max(1, int(getattr(trainer, "gradient_accumulation_steps", 1)))
        upstream = iter(prompt_batches)
        while True:
            step = trainer.step
            if self.rollouts.due(step):
                fetched = []
                for _ in range(accumulation):
                    try:
                        fetched.append(next(upstream))
                    except StopIteration:
                        return
                began = time.perf_counter()
                self.rollouts.fill(step, self._rollout(trainer, [batch for batch, _labels in fetched]))
                self.rollout_s += time.perf_counter() - began
            self.update_from = time.perf_counter()
            for micro, item in enumerate(self.rollouts.items):
                self.rows.append(item.rows)
                yield item.batch(micro)

    def on_batch(self, trainer: Trainer, input_dict: dict, mode: str) -> None:
        if "grpo_micro" not in input_dict:
            return
        micro = int(input_dict.pop("grpo_micro"))
        if mode != "train" or not isinstance(trainer.loss_fn, GRPOLoss):
            return
        item = self.rollouts.items[micro]
        trainer.loss_fn.stage(targets=item.targets, advantages=item.advantages, global_tokens=self.rollouts.tokens,
                              micro_batches=self.world * len(self.rollouts.items), old_logps=item.old_logps,
                              ref_logps=item.ref_logps)

    def _rollout(self, trainer: Trainer, prompt_batches: list[dict]) -> list[Staged]:
        """The step's prompt batches (one per micro-batch) as scored completion rows for the loss:
        completions sampled, rewarded, advantages (groups; "batch": over the whole step, every rank),
        then, with ``num_iterations`` > 1 or ``kl_beta`` > 0, the old policy's and the reference's log-probs."""
        s = self.values
        g = int(s["num_generations"])
        parts = [self._sample(trainer, batch, micro) for micro, batch in enumerate(prompt_batches)]
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
            self._keep_completions(trainer.step, part["records"], part["completions"], part["local"][:, -3],
                                   part["advantages"])
        temperature = float(s["temperature"])
        if self.starting is not None:  # the reference first: the swap leaves the trained weights as they were
            with self.starting.swapped_in():
                for item in items:
                    item.ref_logps = completion_logps(trainer, item.seq, item.targets, temperature=temperature)
        if self.rollouts.num_iterations > 1:
            for item in items:
                item.old_logps = completion_logps(trainer, item.seq, item.targets, temperature=temperature)
        return items

    def _sample(self, trainer: Trainer, input_dict: dict, micro: int) -> dict[str, Any]:
        """One micro-batch's prompts: completions sampled (seeded by seed, step, rank, micro-batch),
        scored, every rank's per-completion values gathered, the prompt + completion rows made."""
        rows = input_dict.pop("grpo_row").cpu()
        prompt_mask = input_dict.pop("grpo_prompt_mask").cpu()
        s = self.values
        g, room = int(s["num_generations"]), int(s["room"])
        ids = input_dict["input"].cpu()
        seq_len = ids.shape[1]
        lengths = prompt_mask.sum(-1)
        left = torch.full((ids.shape[0], room), self.pad_id, dtype=torch.long)
        left_mask = torch.zeros_like(left)
        for i, n in enumerate(lengths.tolist()):
            left[i, room - n:] = ids[i, :n]
            left_mask[i, room - n:] = 1
        rollout = self.generator.generate_padded(left, left_mask, num_generations=g, step=trainer.step, micro=micro)
        completions = rollout.completion_lists()
        records = [self.records[int(r)] for r in rows.tolist() for _ in range(g)]
        scores = self._score(trainer, records, completions)
        # every rank's completions: rewards (for "batch" scaling and the step's values), lengths, cut
        local = torch.cat([scores.per_func, scores.total[:, None], rollout.completion_lengths.float()[:, None],
                           rollout.is_truncated.float()[:, None]], dim=1)
        prompts = [ids[i, : int(n)] for i, n in enumerate(lengths.tolist())]
        seq, targets = completion_rows(prompts, completions, g, seq_len, self.pad_id)
        return {"local": local, "gathered": _gather_rows(local), "seq": seq, "targets": targets, "records": records,
                "completions": completions}

    def _score(self, trainer: Trainer, records: list[dict], completions: list[list[int]]):
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
                                        trainer_state=_State(trainer.step))
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

    def step_values(self, trainer: Trainer, mode: str) -> dict[str, float]:
        loss = getattr(trainer, "loss_fn", None)
        if mode != "train" or not isinstance(loss, GRPOLoss) or not self.rows:
            self.last = None
            return {}
        if self.update_from is not None:
            self.update_s = time.perf_counter() - self.update_from
        rows, self.rows = torch.cat(self.rows), []
        sums = loss.take_sums()
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
        self.last = values
        return values

    def log_lines(self, step: int, mode: str) -> list[str]:
        return [format_line(step, self.last)] if self.last and mode == "train" else []

    def describe(self) -> dict[str, str]:
        names = self.rewards.names if hasattr(self, "rewards") else []
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
            **{f"rewards/{name}": f"mean of reward function {name}" for name in names},
        }


def _fsdp_root_ready(root: torch.nn.Module) -> None:
    """FSDP2 finds its root at the first forward of the root module; a rollout that calls the
    wrapped transformers model first would make each of its sharded children a root of its own
    (``FSDP requires a single root module``): the root's state is set up now, as its forward would."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return
    if isinstance(root, FSDPModule):
        root._get_fsdp_state()._lazy_init()


@dataclass
class _State:
    """What TRL hands reward functions as ``trainer_state`` (they read ``global_step``)."""

    global_step: int


def _number(x) -> Optional[float]:
    value = float(x)
    return value if value == value else None
