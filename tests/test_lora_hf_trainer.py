"""LoRA on the hf-trainer backend: peft on the Transformers model, trnqwen's adapter init, the
trainable check, the PEFT export, resume.

Fast tests build the tiny Qwen3 in this process and run the real peft / transformers code.  Slow
tests (real torchrun, 2 ranks, the bundled chat set through the launcher's token cache):

* native and hf-trainer LoRA, 3 steps, the same LR schedule: step 1 within 1e-4 relative, steps
  2-3 within 0.5% (the adapters start equal: A from ``adapter_init``, B zero);
* 1 step at ``--lr 1e-12``: the exported A is trnqwen's ``adapter_init`` (B still ~0), the
  ``[LoRA]`` line is logged, no model shards are written;
* an uninterrupted 4-step run, the same run preempted after step 2 and resumed: steps 3-4 equal;
  the trained adapter loads into plain peft with no missing and no unexpected adapter key.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest

from tests.helpers import run_subprocess
from trnqwen.contract.hf_trainer_spec import HFTrainerSpec, SpecError, spec_from_argv, spec_to_argv
from trnqwen.adapters.lora.plan import HF_TRAINER_MODULE
from trnqwen.contract.lora import LOG_LINE_RE, LoraSpec

SPEC = LoraSpec(rank=4, alpha=8.0, dropout=0.0, targets=("q_proj", "v_proj", "down_proj"), seed=7,
                base_model="builtin:tiny-qwen3")
ALL = LoraSpec(rank=16, alpha=32.0, dropout=0.0,
               targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), seed=42,
               base_model="builtin:tiny-qwen3")


# --- the spec and the recipe ----------------------------------------------------------------------


def _spec(**over) -> HFTrainerSpec:
    base = dict(assets_dir="/a/tiny", model="builtin:tiny-qwen3", steps=3, seq_len=128, finetune=True,
                checkpoint_dir="/c", export_hf=True, output_dir="/r")
    return HFTrainerSpec(**{**base, **over}).validate()


def test_the_lora_spec_travels_to_the_ranks_as_flags():
    spec = _spec(lora=SPEC.to_json(), lora_module=HF_TRAINER_MODULE)
    back = spec_from_argv(spec_to_argv(spec))
    assert back == spec and back.lora_spec() == SPEC and back.lora_module == HF_TRAINER_MODULE
    assert _spec().lora_spec() is None


@pytest.mark.parametrize("over, words", [
    (dict(lora="{not json", lora_module=HF_TRAINER_MODULE), "LoRA spec as JSON"),
    (dict(lora=json.dumps({"rank": 4}), lora_module=HF_TRAINER_MODULE), "LoRA spec as JSON"),
    (dict(lora=SPEC.to_json(), lora_module=HF_TRAINER_MODULE, tp=2), "--tp 1 only"),
    (dict(lora=SPEC.to_json()), "lora needs lora_module"),  # the ranks import the adapter's code by name
])
def test_bad_lora_specs_are_refused(over, words):
    with pytest.raises(SpecError, match=words):
        _spec(**over)


def _cfg(tmp_path, **over):
    from trnqwen.config import resolve_config
    from trnqwen.fetch.builtin import write_tiny_qwen3

    assets = tmp_path / "assets"
    if not assets.exists():
        write_tiny_qwen3(assets)
    values = dict(backend="hf-trainer", model="builtin:tiny-qwen3", finetune=True, nproc_per_node=2, steps=3,
                  seq_len=128, assets_dir=assets, checkpoint_dir=tmp_path / "ck", lora=True, seed=5,
                  lora_targets="q_proj,v_proj", lora_rank=8)
    values.update(over)
    return resolve_config(values, environ={}).config


def test_recipe_passes_the_lora_spec_and_says_what_is_trained(tmp_path):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

    job = build_hf_trainer_job(_cfg(tmp_path), DeviceInfo(type="cpu", count=1), tmp_path / "run")
    lora = spec_from_argv(job.entry_args).lora_spec()
    assert spec_from_argv(job.entry_args).lora_module == HF_TRAINER_MODULE
    assert lora == LoraSpec(rank=8, alpha=16.0, dropout=0.0, targets=("q_proj", "v_proj"), seed=5,
                            base_model="builtin:tiny-qwen3")
    note = next(n for n in job.notes if n.startswith("LoRA rank 8"))
    assert "targets q_proj,v_proj on hf-trainer" in note and "the export is a PEFT adapter" in note
    # r x (in + out) per adapted projection: 8 x (q 128+128, v 128+64) x 4 layers
    assert "14,336 trainable" in note
    plain = build_hf_trainer_job(_cfg(tmp_path, lora=False), DeviceInfo(type="cpu", count=1), tmp_path / "run")
    assert spec_from_argv(plain.entry_args).lora is None


def test_recipe_refuses_lora_with_tensor_parallelism_before_anything_runs(tmp_path):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.errors import UsageError
    from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

    cfg = _cfg(tmp_path, tp=2, nproc_per_node=2)
    with pytest.raises(UsageError, match="--tp 2 with --lora") as info:
        build_hf_trainer_job(cfg, DeviceInfo(type="neuron", count=2), tmp_path / "run", check_runtime=False)
    assert "--tp 1" in info.value.hint
    assert not (tmp_path / "run").exists()


def test_recipe_keeps_a_moe_models_experts_frozen(tmp_path):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

    cfg = _cfg(tmp_path, lora_targets="all-linear")
    config = json.loads((cfg.resolved_assets_dir / "config.json").read_text())
    config.update(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    (cfg.resolved_assets_dir / "config.json").write_text(json.dumps(config))
    job = build_hf_trainer_job(cfg, DeviceInfo(type="cpu", count=1), tmp_path / "run")
    assert spec_from_argv(job.entry_args).lora_spec().targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert any("gate_proj, up_proj, down_proj out of reach" in n for n in job.notes)


# --- in the rank: peft, the init, the check, the export -------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("lora-hft") / "tiny-qwen3")


def _base(tiny: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


def test_attach_initialises_every_adapter_from_the_seed_and_module_name(tiny):
    import torch

    from trnqwen.contract.peft_adapter import adapter_init
    from trnqwen.adapters.lora import hf_trainer as hl

    model, initialised = hl.attach(_base(tiny), SPEC)
    modules = list(hl.adapter_modules(model))
    assert initialised == len(modules) == 4 * 3  # 4 layers x (q, v, down)
    paths = {p for p, _, _ in modules}
    assert "model.layers.1.self_attn.q_proj" in paths and "model.layers.0.mlp.down_proj" in paths
    for path, a, b in modules:
        assert torch.equal(a.detach(), adapter_init(SPEC.seed, path, tuple(a.shape)))
        assert not b.detach().any()
    # only the adapters train; the base is frozen
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * initialised
    # the same seed and names give the same A on a second build (independent of torch's RNG)
    torch.manual_seed(1234)
    again, _ = hl.attach(_base(tiny), SPEC)
    assert all(torch.equal(a1, a2) for (_, a1, _), (_, a2, _) in zip(modules, hl.adapter_modules(again)))


def test_check_trainable_logs_full_counts_and_refuses_a_trainable_base(tiny):
    import torch

    from trnqwen.adapters.lora import hf_trainer as hl

    model, initialised = hl.attach(_base(tiny), ALL)
    adapters = [p for p in model.parameters() if p.requires_grad]
    line, problem = hl.check_trainable(model, torch.optim.AdamW(adapters), ALL, initialised=initialised, rank=1)
    assert problem is None
    m = LOG_LINE_RE.search(line)
    assert m is not None, line
    assert (m["trainable"], m["total"], m["adapters"], m["initialised"]) == ("155,648", "1,205,632", "28", "28")
    assert line.endswith("(rank 1)")

    embed = model.get_input_embeddings().weight
    _, problem = hl.check_trainable(model, torch.optim.AdamW([*adapters, embed]), ALL, initialised=initialised, rank=0)
    assert problem == "1 non-adapter parameter(s) would be trained, e.g. base_model.model.model.embed_tokens.weight"
    _, problem = hl.check_trainable(model, torch.optim.AdamW(adapters[1:]), ALL, initialised=initialised, rank=0)
    assert problem.startswith("1 adapter weight(s) are not in the optimizer")
    _, problem = hl.check_trainable(model, torch.optim.AdamW(adapters), ALL, initialised=3, rank=0)
    assert problem == "3 of 28 adapters were initialised"


def test_the_callback_stops_before_step_1_when_the_base_is_trainable(tiny, tmp_path):
    """A real Trainer: the check runs once the optimizer exists, and no step is taken."""
    import torch
    from transformers import Trainer, TrainingArguments

    from trnqwen.adapters.lora import hf_trainer as hl

    model, initialised = hl.attach(_base(tiny), ALL)
    model.get_input_embeddings().weight.requires_grad_(True)  # what the check is there to catch
    lines: list[str] = []
    rows = [{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 2
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=1, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows,
                      callbacks=[hl.callback(ALL, initialised=initialised, rank=0, log=lines.append)])
    with pytest.raises(RuntimeError, match=r"^\[LoRA\] refusing to train: 1 non-adapter parameter"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert len(lines) == 1 and LOG_LINE_RE.search(lines[0])


def test_export_writes_the_peft_adapter_with_the_other_backends_key_names(tiny, tmp_path):
    import torch
    from safetensors.torch import load_file

    from trnqwen.adapters.lora import hf_trainer as hl

    model, _ = hl.attach(_base(tiny), SPEC)
    with torch.no_grad():
        for _, _, b in hl.adapter_modules(model):
            b.normal_()  # a trained adapter: B no longer zero
    written = hl.export(model, SPEC, tmp_path / "step-3", rank=0)
    tensors = load_file(tmp_path / "step-3" / "adapter_model.safetensors")
    assert sorted(tensors) == written and len(tensors) == 2 * 12
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert {t.dtype for t in tensors.values()} == {torch.float32}
    for path, a, b in hl.adapter_modules(model):
        assert torch.equal(tensors[f"base_model.model.{path}.lora_A.weight"], a.detach())
        assert torch.equal(tensors[f"base_model.model.{path}.lora_B.weight"], b.detach())
    config = json.loads((tmp_path / "step-3" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"] and config["r"] == 4
    assert not list((tmp_path / "step-3").glob("model*.safetensors*"))  # an adapter, not a model
    assert hl.export(model, SPEC, tmp_path / "other", rank=1) is None and not (tmp_path / "other").exists()


# --- real runs ------------------------------------------------------------------------------------

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "2", "--seq-len", "128",
        "--finetune", "--lora"]


def _chat() -> str:
    from trnqwen.data import chat_recipe

    return str(chat_recipe.chat_path())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("lora-hft-e2e")
    fetched = run_subprocess("fetch", "builtin:tiny-qwen3", cwd=work, timeout=300)
    assert fetched.code == 0, fetched.text
    return work


def _train(work: Path, *args: str, env: dict | None = None):
    return run_subprocess("train", *args, cwd=work, env={"XDG_CACHE_HOME": str(work / "cache"), **(env or {})},
                          timeout=600)


def _last(work: Path) -> Path:
    runs = work / ".trnqwen" / "runs"
    return runs / (runs / "LAST").read_text().strip()


def _losses(run_dir: Path) -> dict[int, float]:
    from trnqwen.contract.stepline import parse_step_line

    text = (run_dir / "train.log").read_text(errors="replace")
    return {m["step"]: m["loss"] for m in map(parse_step_line, text.splitlines()) if m}


@pytest.mark.slow
def test_each_rank_logs_the_lora_line_and_the_export_is_the_initialised_adapter(work):
    """One step at lr 1e-12: the exported A is still trnqwen's init, B still ~0."""
    import torch

    from trnqwen.contract.peft_adapter import adapter_init, read_adapter

    r = _train(work, *TINY, "--backend", "hf-trainer", "--steps", "1", "--lr", "1e-12", "--checkpoint-dir", "init")
    assert r.code == 0, r.text[-3000:]
    run_dir, export = _last(work), work / "init" / "hf" / "step-1"
    lines = [m for m in map(LOG_LINE_RE.search, (run_dir / "train.log").read_text(errors="replace").splitlines()) if m]
    assert lines and all(m["trainable"] == "155,648" and m["total"] == "1,205,632" for m in lines), lines
    assert lines[0]["adapters"] == lines[0]["initialised"] == "28"
    ranks = {line.rsplit("(rank ", 1)[1] for path in run_dir.rglob("stdout.log")
             for line in path.read_text(errors="replace").splitlines() if LOG_LINE_RE.search(line)}
    assert ranks == {"0)", "1)"}  # every rank logs it (the console shows rank 0)
    assert not list(export.glob("model*.safetensors*")) and not (export / "config.json").exists()
    assert (export / "tokenizer_config.json").is_file()  # the launcher completed the adapter folder
    config, modules = read_adapter(export)
    assert config["peft_type"] == "LORA" and config["r"] == 16 and len(modules) == 28
    for path, (a, b) in modules.items():
        assert torch.allclose(a, adapter_init(42, path, tuple(a.shape)), rtol=0, atol=1e-9), path
        assert b.abs().max() < 1e-9, path


@pytest.mark.slow
def test_resume_is_exact_and_the_adapter_loads_into_plain_peft(work):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    args = [*TINY, "--backend", "hf-trainer", "--steps", "4", "--lr", "2e-3", "--dataset", _chat()]
    base = _train(work, *args, "--checkpoint-dir", "rs-base")
    assert base.code == 0, base.text[-3000:]
    expected = _losses(_last(work))
    stopped = _train(work, *args, "--checkpoint-dir", "rs", env={"TRNQWEN_FAULT_PREEMPT_AT_STEP": "2"})
    assert stopped.code == 138, stopped.text[-3000:]
    assert (work / "rs" / "resume" / "checkpoint-2" / "dcp" / ".metadata").is_file()
    resumed = _train(work, "--resume")
    assert resumed.code == 0, resumed.text[-3000:]
    losses = _losses(_last(work))
    assert sorted(losses) == [1, 2, 3, 4]
    assert all(abs(losses[s] - expected[s]) <= 1e-5 * abs(expected[s]) for s in (3, 4)), (losses, expected)
    # the resumed run's adapter is the uninterrupted run's
    a, b = (load_file(work / d / "hf" / "step-4" / "adapter_model.safetensors") for d in ("rs", "rs-base"))
    assert sorted(a) == sorted(b) and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)

    # plain peft: every adapter key lands on a module, none is left over
    folder = work / "rs" / "hf" / "step-4"
    model = AutoModelForCausalLM.from_pretrained(work / "assets" / "hf" / "tiny-qwen3", dtype=torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = PeftModel.from_pretrained(model, folder)
        result = peft_model.load_adapter(folder, adapter_name="again")
    assert not [w for w in caught if "key" in str(w.message).lower()], [str(w.message) for w in caught]
    assert [k for k in result.missing_keys if "lora_" in k] == [] and result.unexpected_keys == []
    loaded = {n: p for n, p in peft_model.named_parameters() if ".lora_" in n and ".default." in n}
    assert len(loaded) == len(a) and any(t.abs().max() > 0 for k, t in a.items() if "lora_B" in k)
    for key, tensor in a.items():
        assert torch.equal(loaded[key.replace(".weight", ".default.weight")], tensor), key
    assert math.isfinite(losses[4]) and losses[4] < losses[1]
