"""GRPO's Trainer (``methods/grpo/hf_trainer.py``) in this process, without torchrun (the real
2-rank run against native's: ``test_grpo_e2e.py``).

* the hooks' rows are the prompt cache's (prompt, mask, row; no labels: the Trainer counts no items);
* one ``training_step`` under ``--lora`` (peft's model, as ``adapters/lora/hf_trainer.attach`` makes
  it) rolls out from base + adapter, and its gradients are the torchtitan loss's
  (:class:`~trnqwen.methods.grpo.titan.GRPOLoss`) on the same rollout: the adapters' B get a
  gradient, the base none; the step's values and ``[GRPO]`` line follow.
"""

from __future__ import annotations

import math

from tests.test_grpo_method import MY_REWARDS, _cfg, tiny  # noqa: F401  (the module-scoped tiny model fixture)


def test_a_trainer_step_rolls_out_from_the_adapter_with_the_torchtitan_losss_gradients(tiny, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from trnqwen.contract.hf_trainer_spec import HFTrainerSpec
    from trnqwen.contract.lora import LoraSpec
    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.hf_trainer import GRPOHooks
    from trnqwen.methods.grpo.log_lines import format_line
    from trnqwen.methods.grpo.plan import plan
    from trnqwen.methods.grpo.rollout import GroupRollout
    from trnqwen.methods.grpo.titan import GRPOLoss
    from trnqwen.adapters.lora import hf_trainer as hf_trainer_lora
    from trnqwen.runtime.hf_trainer_data import cache_trainer_class, rank_loader

    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)  # a reward with signal in (nearly) every group: the first token's id mod 7
    cfg = _cfg(num_generations=4, backend="hf-trainer", loss_type="grpo", reward=["my_rewards.py:first_token"])
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path / "cache")
    planned = plan(cfg, tiny, data, device_type="cpu", dp_degree=1, steps=1, validates=False)
    assert planned.settings["loss_type"] == "grpo" and planned.settings["epsilon_high"] == cfg.epsilon
    hooks = GRPOHooks(planned.settings)
    spec = HFTrainerSpec(assets_dir=str(tiny), cache_dir=str(data.cache_dir), seq_len=64, local_batch_size=2, steps=1,
                         seed=cfg.seed)
    train, val = hooks.datasets(spec, rank=0, world=1)
    assert val is None
    batch = next(iter(rank_loader(train, 2)))
    assert set(batch) == {"input_ids", "position_ids", "grpo_prompt_mask", "grpo_row"}  # no labels: no item count

    lora = LoraSpec(rank=4, alpha=8, dropout=0.0, targets=("q_proj", "v_proj"), seed=cfg.seed, base_model="tiny")
    model, _ = hf_trainer_lora.attach(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), lora)
    quiet = lambda *_: None  # noqa: E731
    trainer_cls = hooks.trainer_class(cache_trainer_class(Trainer, batch_size=2, log_validation=quiet), log_validation=quiet)
    trainer = trainer_cls(model=model, train_dataset=train, args=TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=2, report_to="none",
        remove_unused_columns=False, disable_tqdm=True))
    trainer.current_gradient_accumulation_steps = 1  # what the Trainer's loop sets before its steps
    loss = trainer.training_step(trainer.model, dict(batch))
    assert trainer.grpo.generator.model is model  # the rollout sampled from base + adapter
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads), sorted(grads)  # the base stays frozen
    assert any("lora_B" in n and float(g.abs().sum()) > 0 for n, g in grads.items())  # B (zero) moves first

    # the torchtitan hook's loss on the same rollout (the same seed, step and rank draw the same completions)
    model.zero_grad()
    [staged] = GroupRollout(planned.settings, model=model, kind="hf").rollout(
        1, [(batch["input_ids"], batch["grpo_prompt_mask"], batch["grpo_row"])])
    titan = GRPOLoss(GRPOLoss.Config(loss_type="grpo", epsilon=cfg.epsilon, epsilon_high=cfg.epsilon,
                                     temperature=cfg.temperature, max_completion_length=16))
    titan.stage(targets=staged.targets, advantages=staged.advantages, global_tokens=staged.tokens,
                micro_batches=1)
    want, _ = titan(model(input_ids=staged.seq, position_ids=staged.positions(), use_cache=False).logits, None)
    want.backward()
    assert abs(float(loss) - float(want)) < 1e-6, (float(loss), float(want))
    for name, grad in grads.items():
        assert torch.allclose(grad, model.get_parameter(name).grad, atol=1e-6), name

    values = trainer.grpo.step_values(trainer.take_grpo_sums())
    assert values["completions"] == 8 and 0 < values["completion_length"] <= 16 and values["kl"] == 0.0, values
    assert all(math.isfinite(v) for v in values.values()), values
    assert format_line(1, values).startswith("[GRPO] step: 1  reward: ")
