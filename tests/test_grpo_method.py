"""GRPO as a method of the registry, without torchrun (the real runs: test_grpo_e2e.py).

* its settings are RunConfig's (flags, env, TOML) with TRL's names where free; ``--reward`` repeats;
* ``trnqwen data --method grpo`` previews the prompts (kept, room, the rewards' columns, a rendered
  prompt); a bad record is exit 2 naming its line;
* planning refuses what GRPO does not do yet, and checks the rewards before any rank starts;
* the prompt cache: one row per prompt, the rows the ranks read give back each prompt and its record;
* the ``[GRPO]`` line round-trips; the judge's rules; the ranks' usage-error lines;
* the bundled task is what its recipe writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error, run_cli
from trnqwen.errors import UsageError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("grpo-unit") / "tiny-qwen3")


def _cfg(**kw):
    from trnqwen.config import RunConfig

    base = dict(method="grpo", backend="native", model="builtin:tiny-qwen3", seq_len=64, max_completion_length=16)
    return RunConfig(**{**base, **kw})


def test_grpo_is_a_registered_method_with_its_own_settings(monkeypatch):
    from trnqwen.config import RunConfig
    from trnqwen.methods import registry

    method = registry.get("grpo")
    assert method.data == "prompts" and method.prompts and "grpo" in registry.names_for_data("prompts")
    cfg = RunConfig(method="grpo", reward=["accuracy", "format:0.5"], num_generations=8, kl_beta=0.0)
    assert cfg.reward == ["accuracy", "format:0.5"] and cfg.data_kind == "prompts"
    assert RunConfig(method="grpo", reward="accuracy,my.mod:f:2").reward == ["accuracy", "my.mod:f:2"]
    with pytest.raises(ValueError):
        RunConfig(method="grpo", num_generations=1)  # a group needs two completions
    with pytest.raises(ValueError):
        RunConfig(method="grpo", loss_type="ppo")


def test_data_previews_the_prompts(tiny):
    r = run_cli("data", "--method", "grpo", "--assets", str(tiny), "--seq-len", "64", "--max-completion-length", "16",
                "--json")
    assert r.code == 0, r.text
    report = json.loads(r.out)
    assert report["records"] == report["kept"] == 48 and report["dropped"] == 0, report
    assert report["room"] == 48 and report["columns"] == ["answer"], report
    assert report["sample"]["text"].endswith("<|im_start|>assistant\n"), report["sample"]


def test_data_names_a_bad_prompt_record(tiny, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n{"question": "no prompt"}\n')
    r = run_cli("data", str(data), "--method", "grpo", "--assets", str(tiny), "--seq-len", "64",
                "--max-completion-length", "16")
    assert_clean_error(r, code=2, contains="prompts.jsonl line 2")


def test_train_without_a_reward_for_your_dataset_is_a_usage_error(tiny, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    r = run_cli("train", "--method", "grpo", "--backend", "native", "--assets", str(tiny), "--model",
                "builtin:tiny-qwen3", "--device", "cpu", "--seq-len", "64", "--max-completion-length", "16",
                "--dataset", str(data), "--finetune", "--dry-run")
    assert_clean_error(r, code=2, contains="needs at least one --reward")


@pytest.mark.parametrize("change, says", [
    ({"backend": "hf-trainer", "kl_beta": 0.04}, "hf-trainer takes no --kl-beta, --num-iterations or --global-batch-size"),
    ({"backend": "hf-trainer", "num_iterations": 2}, "hf-trainer takes no --kl-beta, --num-iterations"),
    ({"backend": "hf-trainer", "global_batch_size": 16}, "--global-batch-size yet"),
    ({"val_every": 5, "val_split": 0.1}, "--val-every"),
    ({"epsilon": 0.2, "epsilon_high": 0.1}, "--epsilon-high"),
    ({"seq_len": 16}, "no room"),
    ({"reward": ["no_such_module_xyz:f"]}, "cannot import no_such_module_xyz"),
    ({"reward": ["spelling"]}, "unknown built-in reward"),
])
def test_planning_refuses_what_grpo_does_not_do(tiny, change, says):
    from trnqwen.methods.grpo.plan import plan

    with pytest.raises(UsageError) as err:
        plan(_cfg(**change), tiny, None, device_type="cpu", dp_degree=2, steps=2, validates=False)
    assert says in str(err.value), str(err.value)


def test_the_plan_renders_the_loss_rows_and_hook(tiny, tmp_path):
    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.plan import plan

    cfg = _cfg()
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path)
    planned = plan(cfg, tiny, data, device_type="cpu", dp_degree=2, steps=2, validates=False)
    text = "\n".join(planned.config_lines)
    assert "grpo_loss_config(loss_type='dapo'" in text and "titan_rows" in text, text
    assert planned.hooks == ["GRPOHook()"] and planned.settings["room"] == 48
    assert planned.settings["rewards"] == ["trnqwen.methods.grpo.task:number"]  # the bundled task's
    assert "beta=0.0," in text and planned.settings["num_iterations"] == 1
    # the KL term, rollouts reused and gradient accumulation are planned, not refused
    tuned = plan(_cfg(kl_beta=0.04, num_iterations=2, global_batch_size=16), tiny, data, device_type="cpu",
                 dp_degree=2, steps=2, validates=False)
    assert "beta=0.04," in "\n".join(tuned.config_lines) and tuned.settings["num_iterations"] == 2
    assert "KL to the starting weights x 0.04" in tuned.note and "trained on for 2 steps" in tuned.note


def test_on_neuron_the_plan_says_which_graphs_a_step_compiles(tiny, tmp_path):
    """Every shape is fixed (prompts padded to the room, completions to the maximum, the decoding's
    keys/values one buffer), so the preflight can name each graph: prefill, decode, update, and the
    no-grad log-prob forward only when the KL term or rollout reuse needs it; a CPU plan says nothing of it."""
    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.plan import compiled_shapes, plan

    cfg = _cfg(local_batch_size=2, num_generations=4)
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path)
    on_neuron = plan(cfg, tiny, data, device_type="neuron", dp_degree=64, steps=2, validates=False).note
    assert "GRPO compiles 3 graphs once (fixed shapes): prefill [2, 48], decode [8, 1] over [8, 64], update [8, 64]" in on_neuron
    assert "compiles" not in plan(cfg, tiny, data, device_type="cpu", dp_degree=2, steps=2, validates=False).note
    for extra in ({"kl_beta": 0.04}, {"num_iterations": 2}):
        shapes = compiled_shapes(_cfg(local_batch_size=2, num_generations=4, **extra))
        assert [name for name, _ in shapes] == ["prefill", "decode", "update", "log-probs"] and shapes[-1][1] == (8, 64)


def test_nki_moe_plans_grpo_into_torchtitan_neurons_config(tmp_path, neuron_double):
    """nki-moe's ranks run torchtitan's trainer on torchtitan-neuron's Qwen3-MoE (here its test
    double, on torchtitan's own MoE config): the generated module carries GRPO's loss, prompt rows
    and hook as on native, and the preflight names the graphs a Neuron run compiles."""
    from tests.moe_fixtures import write_tiny_moe
    from tests.test_recipes import TRN2, load_config
    from trnqwen.methods.grpo.titan import GRPOLoss
    from trnqwen.train.recipes import build_job

    assets = write_tiny_moe(tmp_path / "tiny-moe")
    cfg = _cfg(backend="nki-moe", model="tiny-moe", assets_dir=assets, moe_layers=2, num_experts=8, top_k=2)
    job = build_job(cfg, TRN2, None, check_runtime=False)
    assert "GRPOHook()" in job.config_module_text and "titan_rows" in job.config_module_text
    config = load_config(job.config_module_text, job.config_fn, tmp_path)
    assert neuron_double.CALLS[-1]["flavor"] == "30B-A3B" and len(config.model_spec.model.layers) == 2
    assert isinstance(config.loss, GRPOLoss.Config) and config.loss.loss_type == "dapo"
    assert [type(h).__name__ for h in config.hooks][-1] == "GRPOHook"
    assert config.dataloader.rows == "trnqwen.methods.grpo.titan:titan_rows"
    assert any("GRPO compiles 3 graphs once" in note for note in job.notes), job.notes


def test_the_prompt_cache_rows_give_back_each_prompt_and_its_record(tiny, tmp_path):
    from transformers import AutoTokenizer

    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.runtime.titan_data import TokenCacheDataset

    cfg = _cfg()
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path)
    assert prompt_cache.prepare(cfg, tiny, cache_root=tmp_path).cache_dir == data.cache_dir  # found by its key
    assert data.train_rows == 48 and data.meta["method"] == "grpo"
    records = prompt_cache.read_records(data.cache_dir)
    assert len(records) == 48 and records[0]["where"].endswith("sums.jsonl line 1") and records[0]["columns"] == {"answer": "17"}
    tok = AutoTokenizer.from_pretrained(tiny)
    dataset = TokenCacheDataset(str(data.cache_dir), seq_len=64, dp_rank=1, dp_world_size=2,
                                rows="trnqwen.methods.grpo.titan:titan_rows")
    seen = []
    for sample, labels in dataset:
        row = int(sample["grpo_row"])
        n = int(sample["grpo_prompt_mask"].sum())
        text = tok.decode(sample["input"][:n].tolist())
        expected = tok.apply_chat_template(records[row]["prompt"], tokenize=False, add_generation_prompt=True)
        assert text == expected and int((labels != -100).sum()) == 1
        seen.append(row)
        if len(seen) == 3:
            break
    assert seen == [1, 3, 5]  # rank 1 of 2 reads every other row


def test_the_grpo_line_round_trips():
    from trnqwen.methods.grpo.log_lines import READERS, format_line, parse_line

    values = {"reward": 0.25, "reward_std": 0.5, "frac_reward_zero_std": 0.125, "completion_length": 12.5,
              "completion_length_max": 16.0, "clipped_ratio": 0.0625, "kl": 0.0, "entropy": 7.25, "clip_ratio": 0.0,
              "rollout_s": 1.5, "update_s": 0.25, "completions": 32.0, "rewards/number": 0.25}
    line = format_line(3, values)
    step, back = parse_line("[rank0]:" + line)
    assert step == 3 and back == values, (line, back)
    m = READERS[0].regex.search(line)
    assert READERS[0].read(m).values == values


def _facts(rewards, *, zero=0.0, cut=0.0, kl=0.0, failure=None):
    steps = {i + 1: {"reward": r, "reward_std": 0.2, "frac_reward_zero_std": zero, "clipped_ratio": cut, "kl": kl,
                     "line": i + 1} for i, r in enumerate(rewards)}
    notes = {"reward_failure": {"message": failure, "line": 9}} if failure else {}
    return {"run_config": {"method": "grpo"}, "lines": {"steps": steps, "notes": notes}}


def test_the_judges_rules():
    from trnqwen.methods.grpo.judge import rules

    codes = lambda facts: {f[1] for f in rules(facts)}  # noqa: E731
    assert codes(_facts([0.1, 0.2, 0.4, 0.6])) == set()
    assert codes(_facts([0.3, 0.3, 0.3, 0.3])) == {"grpo-reward-flat"}
    assert "grpo-no-signal" in codes(_facts([0.1, 0.2, 0.4, 0.6], zero=0.8))
    assert "grpo-truncated" in codes(_facts([0.1, 0.2, 0.4, 0.6], cut=0.9))
    assert "grpo-kl-high" in codes(_facts([0.1, 0.2, 0.4, 0.6], kl=math.inf))
    failed = rules(_facts([], failure="reward function 'f' raised KeyError on x.jsonl line 2"))
    assert [f[:2] for f in failed] == [("error", "grpo-reward-failed")] and "x.jsonl line 2" in failed[0][2]
    assert rules({"run_config": {"method": "dpo"}, "lines": {}}) == []


def test_the_ranks_usage_error_lines_are_read_back():
    from trnqwen.contract.rank_errors import find_usage_error, usage_lines

    lines = ["[rank0]: step 1", *("[rank0]:" + x for x in usage_lines("reward function 'f' raised\nKeyError", "fix it"))]
    assert find_usage_error(lines) == ("reward function 'f' raised KeyError", "fix it")
    assert find_usage_error(["nothing here"]) is None


def test_the_bundled_task_is_what_its_recipe_writes():
    from trnqwen.data import sums_recipe
    from trnqwen.methods.grpo.task import number, number_score

    for name, text in sums_recipe.texts().items():
        assert sums_recipe.sums_path(name).read_text() == text, name
    assert number_score("17", "17") == 2.0 and number_score("no", "17") == 0.0
    assert number([[{"role": "assistant", "content": "1 7"}]], answer=["17"]) == [1.0]


def test_the_loss_on_the_prompt_completion_rows_is_trls_on_the_rollout(tiny):
    """The hook's rows (prompt, completion, padding; shifted targets) scored by GRPOLoss give the
    loss TRL computes on the rollout's own layout (left-padded prompt | completion, logits[:, P-1:-1]),
    for every loss type: the rows and targets line up token for token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trnqwen.methods.grpo import loss as arith
    from trnqwen.methods.grpo.generate import InProcessGenerator, SamplingSettings
    from trnqwen.methods.grpo.rollout import completion_rows
    from trnqwen.methods.grpo.titan import GRPOLoss

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 2 + 3?", "Name a colour, please")]
    g, c, seq_len = 3, 8, 32
    rollout = InProcessGenerator(model, SamplingSettings(c, 1.0, prompt_bucket=16), tok.pad_token_id,
                                 [tok.eos_token_id], seed=3, kind="hf").generate(prompts, num_generations=g, step=1)
    completions = rollout.completion_lists()
    advantages = torch.linspace(-1.0, 1.0, len(completions))
    with torch.no_grad():
        full = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
        mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
        logits = model(input_ids=full, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        p = rollout.prompt_ids.shape[1]
        trl_logps, trl_entropy = arith.token_logps(logits[:, p - 1:-1], rollout.completion_ids)
        seq, targets = completion_rows([torch.tensor(x) for x in prompts], completions, g, seq_len, tok.pad_token_id)
        pred = model(input_ids=seq, position_ids=torch.arange(seq_len).expand_as(seq)).logits
        ours, _ = arith.token_logps(pred, targets.clamp(min=0))
    completion_mask = rollout.completion_mask.float()
    per_row_trl = (trl_logps * completion_mask).sum(-1)
    per_row = (ours * (targets != -100)).sum(-1)
    assert torch.allclose(per_row, per_row_trl, atol=1e-4), (per_row, per_row_trl)  # the same tokens, scored alike
    trl_entropy_sum = float((trl_entropy * completion_mask).sum())
    for loss_type in arith.LOSS_TYPES:
        want = arith.policy_loss(trl_logps, advantages, rollout.completion_mask.float(), loss_type=loss_type,
                                 max_completion_length=c).loss
        loss = GRPOLoss(GRPOLoss.Config(loss_type=loss_type, max_completion_length=c))
        loss.stage(targets=targets, advantages=advantages, global_tokens=float(rollout.completion_mask.sum()),
                   micro_batches=1)
        got, _ = loss(pred, None)
        assert abs(float(got) - float(want)) < 1e-5, (loss_type, float(got), float(want))
        sums = loss.take_sums()  # kl, entropy, clip sums, tokens: the loss's meter saw the completion tokens
        assert float(sums[-1]) == float(completion_mask.sum()) and abs(float(sums[1]) - trl_entropy_sum) < 1e-3


MY_REWARDS = '''
def broken(prompts, completions, answer, **kwargs):
    return [1.0 / (int(a) - 17) for a in answer]


def first_token(prompts, completions, completion_ids, **kwargs):
    return [float(ids[0] % 7) for ids in completion_ids]
'''


def _hook_on_a_batch(tiny, tmp_path, **overrides):
    """GRPOHook and GRPOLoss in this process, on torchtitan's native tiny Qwen3 and the bundled prompts'
    cache: a stand-in for the trainer holding what the hook reads (model_parts, loss_fn, step)."""
    from types import SimpleNamespace

    import torch

    from tests.test_grpo_generate import build_native
    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.plan import hook_settings
    from trnqwen.methods.grpo.titan import GRPOHook, GRPOLoss, grpo_loss_config
    from trnqwen.runtime.titan_data import TokenCacheDataset

    cfg = _cfg(num_generations=4, **overrides)
    data = prompt_cache.prepare(cfg, tiny, cache_root=tmp_path)
    rewards = list(cfg.reward) or ["trnqwen.methods.grpo.task:number"]
    config = grpo_loss_config(loss_type="dapo", epsilon=0.2, epsilon_high=0.2, temperature=1.0, max_completion_length=16,
                              settings=hook_settings(cfg, tiny, data, rewards))
    model = build_native(tiny, trainable=True)
    trainer = SimpleNamespace(model_parts=[model], loss_fn=GRPOLoss(config), step=1, gradient_accumulation_steps=1)
    hook = GRPOHook()
    hook.on_init(trainer)
    samples = iter(TokenCacheDataset(str(data.cache_dir), seq_len=64, rows="trnqwen.methods.grpo.titan:titan_rows"))
    batch = [next(samples)[0] for _ in range(2)]
    input_dict = {k: torch.stack([s[k] for s in batch]) for k in batch[0]}
    return hook, trainer, model, input_dict


def _through_hook(hook, trainer, input_dict) -> dict:
    """The prompt batch through the hook as torchtitan's train step takes it: the batches the hook
    hands on instead (the rollout's rows), then ``on_batch`` (the loss staged)."""
    batch, _labels = next(iter(hook.batches(trainer, iter([(input_dict, None)]))))
    hook.on_batch(trainer, batch, "train")
    return batch


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_the_hook_turns_prompts_into_scored_completion_rows(tiny, tmp_path, scale, monkeypatch):
    import torch

    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)  # a reward with signal in (nearly) every group: the first token's id mod 7
    hook, trainer, model, input_dict = _hook_on_a_batch(tiny, tmp_path / "cache", scale_rewards=scale,
                                                        reward=["my_rewards.py:first_token"])
    input_dict = _through_hook(hook, trainer, input_dict)
    assert set(input_dict) == {"input", "positions"}  # the prompt fields never reach the model
    assert input_dict["input"].shape == (8, 64)  # 2 prompts x G 4, one seq_len row each
    staged = trainer.loss_fn.staged
    assert staged["advantages"].shape == (8,) and torch.isfinite(staged["advantages"]).all()
    assert staged["global_tokens"] == float((staged["targets"] != -100).sum())
    positions = input_dict["positions"]
    pred = model(input_dict["input"], positions, model.get_attention_masks(positions))
    loss, _ = trainer.loss_fn(pred, None)
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    values = hook.step_values(trainer, "train")
    assert values["completions"] == 8 and 0 < values["completion_length"] <= 16 and values["kl"] == 0.0
    assert all(math.isfinite(v) for v in values.values()), values
    assert hook.log_lines(1, "train")[0].startswith("[GRPO] step: 1  reward: ")


def test_a_failing_reward_stops_the_hook_with_the_usage_error_lines(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)
    hook, trainer, _model, input_dict = _hook_on_a_batch(tiny, tmp_path / "cache", reward=["my_rewards.py:broken"])
    with pytest.raises(SystemExit) as stop:
        _through_hook(hook, trainer, input_dict)
    assert stop.value.code == 2
    out = capsys.readouterr().out.splitlines()
    error = [line for line in out if line.startswith("[trnqwen] usage error: reward function 'broken'")]
    assert error and "ZeroDivisionError" in error[0] and "sums.jsonl line 1" in error[0], out
    assert trainer.loss_fn.staged is None  # nothing staged: no update follows
