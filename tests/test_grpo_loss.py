"""GRPO's advantages and loss equal TRL's ``GRPOTrainer`` on the same batch, for every loss type.

TRL's own code runs: a real ``GRPOTrainer`` on the tiny Qwen3, whose rollouts come from its
``rollout_func`` hook (fixed prompts and completions, so both sides see the same tokens), scores
them with two TRL-style reward functions (weights, ``None`` answers, a group of equal rewards, a
completion no function scores), computes advantages (``_generate_and_score_completions``) and the
loss (``_compute_loss``).  trnqwen's side takes the same token ids through the model's plain
logits and :mod:`trnqwen.methods.grpo.loss`.  Compared within 1e-5: advantages, loss, the
gradient it gives every weight, and the logged kl / entropy / clip ratios.  The policy is moved
off its starting weights after the rollout, so importance ratios (``num_iterations=2``), the KL to
the reference (``beta > 0``) and clipping are all exercised; every loss type runs with both.  The
reference is the ranks' own: the starting weights kept by
:class:`~trnqwen.methods.grpo.reference.StartingWeights` and swapped into the moved model for one forward.

The micro-batch/rank normalisers are checked on their own: a step split into micro-batches sums
to the loss of the whole batch where TRL's objective is global (dapo, dr_grpo, grpo with equal
micro-batches) and to TRL's own per-micro-batch value with gradient accumulation.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

G = 4  # generations per prompt
C = 12  # max_completion_length
TEMPERATURE = 0.7
PROMPTS = [
    [{"role": "user", "content": "What is 2 plus 3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
]
# per completion (prompt-major: p0g0..p0g3, p1g0..p1g3): reward function outputs (None = not scored)
REWARD_A = [1.0, 0.25, 1.0, None, 0.5, 0.5, 0.5, 0.5]  # group 2: all equal (no signal)
REWARD_B = [None, 2.0, None, None, None, None, None, None]  # completion 3: no function scores it
WEIGHTS = [1.0, 0.5]


def reward_a(prompts, completions, completion_ids, **kwargs):
    return list(REWARD_A[: len(completions)])


def reward_b(prompts, completions, completion_ids, answer, **kwargs):
    assert len(answer) == len(completions)  # the record's other columns arrive as lists
    return list(REWARD_B[: len(completions)])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("grpo-loss") / "tiny-qwen3")


@pytest.fixture(scope="module")
def batch(tiny):
    """The fixed rollout: prompt ids (rendered with the chat template) and completion ids of
    different lengths, some closed by <|im_end|>, some cut at C."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    prompt_ids = [tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True) for p in PROMPTS]
    prompt_ids = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompt_ids]
    gen = torch.Generator().manual_seed(7)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    lengths = [5, C, 3, 9, C, 7, 1, 10]
    completions = []
    for n in lengths:
        ids = torch.randint(10, 1500, (n,), generator=gen).tolist()
        if n < C:
            ids[-1] = eos
        completions.append(ids)
    rows = [prompt_ids[i // G] for i in range(len(completions))]
    return {"tok": tok, "prompt_ids": rows, "completion_ids": completions, "eos": eos}


def _trainer(tiny, batch, tmp_path, **config):
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from datasets import Dataset

    def rollout(prompts, trainer):
        assert len(prompts) == len(batch["completion_ids"])
        return {"prompt_ids": batch["prompt_ids"], "completion_ids": batch["completion_ids"],
                "logprobs": [[0.0] * len(c) for c in batch["completion_ids"]]}

    # float32 throughout (GRPOConfig defaults to bf16 autocast, also on CPU): the arithmetic is compared, not rounding
    config = {"per_device_train_batch_size": 2 * G, **config}
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                      num_generations=G, max_completion_length=C, temperature=TEMPERATURE, reward_weights=WEIGHTS,
                      logging_steps=1, save_strategy="no", bf16=False, **config)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS)])
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_a, reward_b], args=args, train_dataset=data,
                          processing_class=batch["tok"], rollout_func=rollout)
    trainer.model.train()
    # what the Trainer's loop sets for each accumulation window (one micro-batch per step here)
    trainer.current_gradient_accumulation_steps = config.get("gradient_accumulation_steps", 1)
    return trainer


def _perturb(model, seed: int = 3, scale: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _padded(batch, width: int):
    """trnqwen's fixed shapes: prompts left-padded, completions right-padded to ``width``."""
    pad = batch["tok"].pad_token_id
    p_len = max(len(p) for p in batch["prompt_ids"])
    prompt = torch.full((len(batch["prompt_ids"]), p_len), pad)
    prompt_mask = torch.zeros_like(prompt)
    for i, p in enumerate(batch["prompt_ids"]):
        prompt[i, p_len - len(p):] = torch.tensor(p)
        prompt_mask[i, p_len - len(p):] = 1
    comp = torch.full((len(batch["completion_ids"]), width), pad)
    comp_mask = torch.zeros_like(comp)
    for i, c in enumerate(batch["completion_ids"]):
        comp[i, : len(c)] = torch.tensor(c)
        comp_mask[i, : len(c)] = 1
    return prompt, prompt_mask, comp, comp_mask


def _logps(model, prompt, prompt_mask, comp, comp_mask, *, grad: bool):
    from trnqwen.methods.grpo.loss import token_logps

    ids = torch.cat([prompt, comp], 1)
    mask = torch.cat([prompt_mask, comp_mask], 1)
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=ids, attention_mask=mask).logits
        return token_logps(logits[:, prompt.shape[1] - 1: -1], comp, temperature=TEMPERATURE)


def _rewards():
    """The rewards through trnqwen's RewardSet (the same TRL-style functions, by dotted path), checked
    against the weighted sum TRL makes: NaN-sum over functions, NaN where no function scored."""
    from trnqwen.methods.grpo.rewards import BuiltinOptions, RewardSet, parse_rewards

    specs = parse_rewards([f"{__name__}:reward_a:{WEIGHTS[0]}", f"{__name__}:reward_b:{WEIGHTS[1]}"])
    n = len(REWARD_A)
    scores = RewardSet.build(specs, BuiltinOptions()).score(
        [PROMPTS[i // G] for i in range(n)], [[{"role": "assistant", "content": "x"}]] * n, [[1]] * n,
        {"answer": [str(i // G) for i in range(n)]}, [f"record {i // G}" for i in range(n)])
    plain = []
    for a, b in zip(REWARD_A, REWARD_B):
        parts = [w * v for w, v in zip(WEIGHTS, (a, b)) if v is not None]
        plain.append(sum(parts) if parts else math.nan)
    assert torch.allclose(scores.total, torch.tensor(plain), equal_nan=True)
    return scores.total


CASES = [
    dict(loss_type="grpo", scale_rewards="group", beta=0.0, num_iterations=1),
    dict(loss_type="grpo", scale_rewards="batch", beta=0.04, num_iterations=2),
    dict(loss_type="dr_grpo", scale_rewards="none", beta=0.04, num_iterations=2),
    dict(loss_type="dr_grpo", scale_rewards="group", beta=0.1, num_iterations=1),
    dict(loss_type="dapo", scale_rewards="group", beta=0.04, num_iterations=2, epsilon_high=0.28),
    dict(loss_type="dapo", scale_rewards="none", beta=0.0, num_iterations=2),
    dict(loss_type="bnpo", scale_rewards="group", beta=0.0, num_iterations=1),
    dict(loss_type="bnpo", scale_rewards="batch", beta=0.04, num_iterations=2, epsilon=0.1, epsilon_high=0.3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_advantages_loss_gradient_and_metrics_equal_trls(tiny, batch, tmp_path, case):
    from trnqwen.methods.grpo.loss import group_advantages, policy_loss, reduce_metrics
    from trnqwen.methods.grpo.reference import StartingWeights

    trainer = _trainer(tiny, batch, tmp_path, **case)
    model = trainer.model
    prompt, prompt_mask, comp, comp_mask = _padded(batch, C)

    # the rollout: TRL scores it (advantages; old log-probs when num_iterations > 1) ...
    inputs = [{"prompt": PROMPTS[i // G], "answer": str(i // G)} for i in range(2 * G)]
    out = trainer._generate_and_score_completions(inputs)
    assert ("old_per_token_logps" in out) == (case["num_iterations"] > 1)
    # ... and trnqwen's side the same rollout, on the same starting weights: the old policy's log-probs
    # now, the starting weights kept (the ranks' StartingWeights) for the reference's
    old = _logps(model, prompt, prompt_mask, comp, comp_mask, grad=False)[0] if case["num_iterations"] > 1 else None
    starting = StartingWeights.capture(model) if case["beta"] else None
    adv = group_advantages(_rewards(), G, scale_rewards=case["scale_rewards"])
    assert torch.allclose(adv.advantages, out["advantages"], atol=1e-5, rtol=0), (adv.advantages, out["advantages"])
    assert adv.advantages[3] == 0  # the completion nobody scored moves nothing
    if case["scale_rewards"] != "batch":  # the second group's rewards are all equal: no signal
        assert adv.is_std_zero[4:].all() and not adv.is_std_zero[:4].any()

    _perturb(model)  # the policy has moved since the rollout: ratios != 1, KL > 0
    ref = None
    if starting is not None:  # the starting weights swapped in for the reference forward, the moved ones back after
        moved = [p.detach().clone() for p in model.parameters()]
        with starting.swapped_in():
            ref = _logps(model, prompt, prompt_mask, comp, comp_mask, grad=False)[0]
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), moved))

    model.zero_grad()
    trl_loss = trainer._compute_loss(model, out)
    trl_loss.backward()
    trl_grads = [p.grad.clone() for p in model.parameters()]
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    model.zero_grad()
    logps, entropy = _logps(model, prompt, prompt_mask, comp, comp_mask, grad=True)
    terms = policy_loss(logps, adv.advantages, comp_mask, loss_type=case["loss_type"], old_logps=old,
                        ref_logps=ref, beta=case["beta"], epsilon=case.get("epsilon", 0.2),
                        epsilon_high=case.get("epsilon_high"), entropy=entropy,
                        global_tokens=int(comp_mask.sum()), max_completion_length=C)
    terms.loss.backward()

    assert abs(terms.loss.item() - trl_loss.item()) < 1e-5, (terms.loss.item(), trl_loss.item())
    worst = max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), trl_grads))
    scale = max(g.abs().max().item() for g in trl_grads)
    assert scale > 1e-4 and worst < 1e-5, (worst, scale)
    ours = reduce_metrics({k: v.item() for k, v in terms.sums.items()}, terms.tokens.item())
    for name in ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean") + (
            ("kl",) if case["beta"] else ()):
        assert abs(ours[name] - trl_metrics[name]) < 1e-5, (name, ours[name], trl_metrics[name])
    if case["beta"]:
        assert ours["kl"] > 0  # the reference is the starting weights, not the moved policy
    if case["num_iterations"] > 1:
        assert ours["clip_ratio/region_mean"] > 0  # the perturbation clips some tokens: the clip path ran
        assert abs(torch.nan_to_num(terms.seq_clip_high).max().item() - trl_metrics["clip_ratio/high_max"]) < 1e-5
        assert abs(torch.nan_to_num(terms.seq_clip_low, nan=1.0).min().item() - trl_metrics["clip_ratio/low_min"]) < 1e-5


def test_group_statistics_on_their_own():
    from trnqwen.methods.grpo.loss import group_advantages

    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, math.nan, 5.0])
    got = group_advantages(rewards, 2, scale_rewards="none")
    assert got.advantages.tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # NaN left out of its group's mean
    assert got.is_std_zero.tolist() == [False, False, True, True, False, False]  # one value: std NaN, not 0
    scaled = group_advantages(rewards, 2)
    assert abs(scaled.advantages[1].item() - 1.0 / (math.sqrt(2.0) + 1e-4)) < 1e-6
    with pytest.raises(ValueError):
        group_advantages(rewards, 4)
    with pytest.raises(ValueError):
        group_advantages(rewards, 2, scale_rewards="std")


def _split_batch(seed=0, b=8, t=6):
    gen = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(b, t, generator=gen) * 3).requires_grad_(True)
    old = logps.detach() + torch.randn(b, t, generator=gen) * 0.3
    ref = logps.detach() + torch.randn(b, t, generator=gen) * 0.3
    adv = torch.randn(b, generator=gen)
    lengths = torch.tensor([6, 2, 5, 1, 6, 3, 4, 6])
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo", "grpo"])
def test_micro_batches_over_ranks_sum_to_the_whole_batch_loss(loss_type):
    """Four micro-batches (2 accumulation steps x 2 ranks) of two completions: their shares sum to
    the loss of the whole batch, and so do their gradients."""
    from trnqwen.methods.grpo.loss import policy_loss

    logps, old, ref, adv, mask = _split_batch()
    kw = dict(loss_type=loss_type, beta=0.05, epsilon_high=0.28, max_completion_length=8)
    whole = policy_loss(logps, adv, mask, old_logps=old, ref_logps=ref, **kw).loss
    (g_whole,) = torch.autograd.grad(whole, logps)
    total = sum(policy_loss(logps[i:i + 2], adv[i:i + 2], mask[i:i + 2], old_logps=old[i:i + 2], ref_logps=ref[i:i + 2],
                            micro_batches=4, global_tokens=int(mask.sum()), **kw).loss for i in range(0, 8, 2))
    (g_parts,) = torch.autograd.grad(total, logps)
    assert abs(total.item() - whole.item()) < 1e-6
    assert torch.allclose(g_parts, g_whole, atol=1e-7)


def test_bnpo_averages_the_micro_batches_token_means():
    """bnpo normalises each micro-batch by its own tokens (TRL: 'results may vary with the local
    batch size'): the step is the mean of the micro-batches' token means."""
    from trnqwen.methods.grpo.loss import policy_loss

    logps, old, ref, adv, mask = _split_batch(1)
    parts = [policy_loss(logps[i:i + 4], adv[i:i + 4], mask[i:i + 4], loss_type="bnpo", old_logps=old[i:i + 4])
             for i in (0, 4)]
    shares = [policy_loss(logps[i:i + 4], adv[i:i + 4], mask[i:i + 4], loss_type="bnpo", old_logps=old[i:i + 4],
                          micro_batches=2) for i in (0, 4)]
    assert abs(sum(s.loss.item() for s in shares) - (parts[0].loss.item() + parts[1].loss.item()) / 2) < 1e-7


def test_gradient_accumulation_matches_trls_share(tiny, batch, tmp_path):
    """With 2 accumulation steps TRL divides grpo's micro-batch loss by 2 and dapo's by the
    generation batch's tokens: the same shares as ours with micro_batches=2 / global_tokens."""
    from trnqwen.methods.grpo.loss import group_advantages, policy_loss

    for loss_type in ("grpo", "dapo"):
        trainer = _trainer(tiny, batch, tmp_path / loss_type, loss_type=loss_type, gradient_accumulation_steps=2,
                           per_device_train_batch_size=G)
        inputs = [{"prompt": PROMPTS[i // G], "answer": str(i // G)} for i in range(2 * G)]
        out = trainer._generate_and_score_completions(inputs)
        prompt, prompt_mask, comp, comp_mask = _padded(batch, C)
        adv = group_advantages(_rewards(), G).advantages
        for half in (slice(0, G), slice(G, 2 * G)):
            width = out["completion_ids"].shape[1]
            micro = {k: (v[half] if torch.is_tensor(v) and v.dim() and v.shape[0] == 2 * G else v) for k, v in out.items()}
            trl = trainer._compute_loss(trainer.model, micro).item()
            logps, _ = _logps(trainer.model, prompt[half], prompt_mask[half], comp[half, :width], comp_mask[half, :width],
                              grad=False)
            ours = policy_loss(logps, adv[half], comp_mask[half, :width], loss_type=loss_type, micro_batches=2,
                               global_tokens=int(comp_mask.sum())).loss.item()
            assert abs(ours - trl) < 1e-5, (loss_type, ours, trl)


def test_token_logps_and_entropy_against_a_plain_computation():
    from trnqwen.methods.grpo.loss import token_logps

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 3), generator=gen)
    logps, ent = token_logps(logits, targets, temperature=0.5)
    for b in range(2):
        for t in range(3):
            z = [x / 0.5 for x in logits[b, t].tolist()]
            lse = math.log(sum(math.exp(v) for v in z))
            assert abs(logps[b, t].item() - (z[targets[b, t]] - lse)) < 1e-5
            assert abs(ent[b, t].item() + sum(math.exp(v - lse) * (v - lse) for v in z)) < 1e-5
    with pytest.raises(ValueError):
        from trnqwen.methods.grpo.loss import policy_loss

        policy_loss(logps, torch.zeros(2), torch.ones(2, 3), beta=0.1)
