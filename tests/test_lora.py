"""LoRA: the config core, target mapping per backend, the adapter's init, its PEFT form and merge.

Fast tests with real torch / torchtitan / transformers / peft objects on CPU (no torchrun); the
end-to-end runs are in tests/test_lora_e2e.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error, run_subprocess
from trnqwen.contract import peft_adapter
from trnqwen.config import RunConfig
from trnqwen.errors import CheckFailed, UsageError
from trnqwen.contract import lora as contract_lora
from trnqwen.adapters.lora import plan as lora

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _spec(targets=ALL, rank=4, alpha=8.0, dropout=0.0, seed=7) -> contract_lora.LoraSpec:
    return contract_lora.LoraSpec(rank=rank, alpha=alpha, dropout=dropout, targets=tuple(targets), seed=seed, base_model="builtin:tiny-qwen3")


# --- config ---------------------------------------------------------------------------------------


def test_targets_are_validated_and_kept_in_one_canonical_form():
    assert RunConfig(lora_targets="v_proj, q_proj").lora_targets == "q_proj,v_proj"
    assert RunConfig(lora_targets=",".join(reversed(ALL))).lora_targets == "all-linear"
    assert contract_lora.targets_of("all-linear") == ALL
    with pytest.raises(Exception, match="did you mean q_proj"):
        RunConfig(lora_targets="qproj")
    with pytest.raises(Exception, match="give it alone"):
        RunConfig(lora_targets="all-linear,q_proj")
    with pytest.raises(Exception, match="lm_head"):  # never adapted: not a target name
        RunConfig(lora_targets="lm_head")


def test_defaults_alpha_and_merge_needs_lora():
    cfg = RunConfig(lora=True, lora_rank=8)
    assert cfg.resolved_lora_alpha == 16.0 and cfg.lora_dropout == 0.0 and cfg.lora_targets == "all-linear"
    assert RunConfig(lora=True, lora_rank=8, lora_alpha=4).resolved_lora_alpha == 4.0
    with pytest.raises(Exception, match="merge needs lora"):
        RunConfig(merge=True)


def test_lora_settings_come_from_toml_env_and_flags(tmp_path, monkeypatch):
    from trnqwen.config import resolve_config

    (tmp_path / "trnqwen.toml").write_text("lora = true\nlora_rank = 32\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRNQWEN_LORA_TARGETS", "q_proj,v_proj")
    resolved = resolve_config({"lora_dropout": 0.05})
    cfg = resolved.config
    assert (cfg.lora, cfg.lora_rank, cfg.lora_targets, cfg.lora_dropout) == (True, 32, "q_proj,v_proj", 0.05)
    assert resolved.sources["lora_rank"].startswith("file") and resolved.sources["lora_targets"].startswith("env")


# --- targets per backend --------------------------------------------------------------------------


def test_native_adapts_k_and_v_together_or_refuses():
    assert lora.backend_targets(_spec(("q_proj", "k_proj", "v_proj")), "native") == ("q_proj", "k_proj", "v_proj")
    with pytest.raises(UsageError, match="k_proj and v_proj"):
        lora.backend_targets(_spec(("q_proj", "v_proj")), "native")
    # hf-v5 and hf-trainer take any subset
    assert lora.backend_targets(_spec(("q_proj", "v_proj")), "hf-v5") == ("q_proj", "v_proj")
    assert lora.backend_targets(_spec(("q_proj", "v_proj")), "hf-trainer") == ("q_proj", "v_proj")


def test_moe_reaches_attention_only_and_says_so():
    spec = _spec()
    assert lora.backend_targets(spec, "nki-moe") == ("q_proj", "k_proj", "v_proj", "o_proj")
    note = lora.plan_note(spec, ("q_proj", "k_proj", "v_proj", "o_proj"), backend="nki-moe", trainable=None, total=None)
    assert "routed experts stay frozen" in note and "gate_proj" in note
    with pytest.raises(UsageError, match="routed experts"):
        lora.backend_targets(_spec(("gate_proj",)), "nki-moe")
    with pytest.raises(UsageError, match="fuse q, k and v"):
        lora.backend_targets(_spec(("q_proj",)), "nki-moe")


def test_torchtitan_names():
    assert contract_lora.titan_target_names(ALL, fused_qkv=False) == ["wq", "wkv", "wo", "w1", "w3", "w2"]
    assert contract_lora.titan_target_names(("q_proj", "k_proj", "v_proj", "o_proj"), fused_qkv=True) == ["wqkv", "wo"]
    assert contract_lora.titan_target_names(("down_proj",), fused_qkv=False) == ["w2"]


def test_vllm_rank_warning():
    assert contract_lora.vllm_rank_warning(16) is None
    assert "vLLM" in contract_lora.vllm_rank_warning(12)


def test_spec_and_log_line_round_trip():
    spec = _spec(("q_proj", "v_proj"), rank=16, alpha=32.0, dropout=0.05)
    assert contract_lora.LoraSpec.from_json(spec.to_json()) == spec
    line = contract_lora.log_line(trainable=155_648, total=1_205_632, spec=spec, adapters=8, initialised=8, rank=1)
    m = contract_lora.LOG_LINE_RE.search("[rank1]:[titan] 2026-12-01 10:00:00,000 - root - INFO - " + line)
    assert m and m["trainable"] == "155,648" and m["targets"] == "q_proj,v_proj" and m["dropout"] == "0.05"


def test_adapter_parameter_count_matches_a_real_peft_model(tiny_hf_model):
    """The plan's formula against peft's own count on the same architecture."""
    from peft import LoraConfig, get_peft_model

    from trnqwen import titan_compat as compat

    config = json.loads((tiny_hf_model / "config.json").read_text())
    dims = compat.dims_from_hf_config(config)
    for targets in (ALL, ("q_proj", "v_proj"), ("down_proj",)):
        spec = _spec(targets, rank=8)
        model = _load_hf(tiny_hf_model)
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(targets)))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert contract_lora.adapter_params(dims, spec, targets) == trainable


# --- the adapter's init and PEFT form -------------------------------------------------------------


def test_adapter_init_is_deterministic_per_seed_and_name_and_bounded():
    a = peft_adapter.adapter_init(7, "model.layers.0.self_attn.q_proj", (4, 128))
    assert a.dtype.is_floating_point and tuple(a.shape) == (4, 128)
    assert (a == peft_adapter.adapter_init(7, "model.layers.0.self_attn.q_proj", (4, 128))).all()
    assert not (a == peft_adapter.adapter_init(8, "model.layers.0.self_attn.q_proj", (4, 128))).all()
    assert not (a == peft_adapter.adapter_init(7, "model.layers.0.self_attn.k_proj", (4, 128))).all()
    bound = 1 / math.sqrt(128)
    assert float(a.abs().max()) <= bound and float(a.abs().max()) > 0.8 * bound  # kaiming-uniform(a=sqrt 5)
    # wrappers inserted by activation checkpointing / compile do not change the name
    b = peft_adapter.adapter_init(7, "model.layers.0._checkpoint_wrapped_module.self_attn.q_proj", (4, 128))
    assert (a == b).all()


def test_titan_module_names_map_to_hf():
    assert peft_adapter.hf_module_of_titan("layers.3.attention.qkv_linear.wk") == "model.layers.3.self_attn.k_proj"
    assert peft_adapter.hf_module_of_titan("layers.0._checkpoint_wrapped_module.feed_forward.w3") == "model.layers.0.mlp.up_proj"
    assert peft_adapter.hf_module_of_titan("layers.1.attention.wo") == "model.layers.1.self_attn.o_proj"
    with pytest.raises(ValueError, match="lm_head"):
        peft_adapter.hf_module_of_titan("lm_head")


def test_fused_qkv_split_is_torchtitans_own_split():
    """B of a fused wqkv adapter splits exactly as torchtitan splits the base wqkv weight on save."""
    import torch
    from torchtitan.models.common.attention import FusedQKVLinear

    n_heads, n_kv, head_dim, rank, dim = 8, 2, 16, 4, 32
    module = FusedQKVLinear.Config(
        head_dim=head_dim, n_heads=n_heads, n_kv_heads=n_kv,
        wqkv=__import__("torchtitan.models.common.linear", fromlist=["Linear"]).Linear.Config(
            in_features=rank, out_features=(n_heads + 2 * n_kv) * head_dim),
    ).build()
    b = torch.randn((n_heads + 2 * n_kv) * head_dim, rank)
    with torch.no_grad():
        module.wqkv.weight.copy_(b)
    stock = module.state_dict()  # torchtitan's hook writes wq / wk / wv
    a = torch.randn(rank, dim)
    split = peft_adapter.split_fused_qkv(a, b, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim)
    for proj, key in (("q_proj", "wq.weight"), ("k_proj", "wk.weight"), ("v_proj", "wv.weight")):
        assert torch.equal(split[proj][1], stock[key]), proj
        assert torch.equal(split[proj][0], a)


def test_write_and_read_adapter_round_trip(tmp_path):
    import torch

    spec = _spec(("q_proj", "down_proj"), rank=2)
    modules = {
        "model.layers.0.self_attn.q_proj": (torch.randn(2, 8), torch.randn(8, 2)),
        "model.layers.0.mlp.down_proj": (torch.randn(2, 16), torch.randn(8, 2)),
    }
    keys = peft_adapter.write_adapter(tmp_path / "a", modules, spec)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    config, back = peft_adapter.read_adapter(tmp_path / "a")
    assert config["peft_type"] == "LORA" and config["r"] == 2 and config["target_modules"] == ["down_proj", "q_proj"]
    assert config["base_model_name_or_path"] == "tiny-qwen3"
    for path, (a, b) in modules.items():
        assert torch.equal(back[path][0], a) and torch.equal(back[path][1], b)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    import os

    umask = os.umask(0)
    os.umask(umask)
    for p in (tmp_path / "a").iterdir():  # readable like any file this user writes (mkstemp makes 0600)
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask


# --- in-rank pieces on real modules -----------------------------------------------------------------


def _load_hf(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_hf_model(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("lora-tiny") / "tiny-qwen3")


def test_hf_injection_and_init_give_peft_names_and_the_shared_init(tiny_hf_model):
    import torch

    from trnqwen.adapters.lora import titan as runtime_lora

    spec = _spec(("q_proj", "v_proj", "down_proj"))
    model = _load_hf(tiny_hf_model)
    before = model(torch.arange(16)[None]).logits
    assert runtime_lora.inject_hf_adapters(model, spec) == 3 * model.config.num_hidden_layers
    runtime_lora.freeze_base(model)
    wrapper = torch.nn.Module()  # torchtitan's HFTransformerModel keeps the HF model as .model
    wrapper.model = model
    assert runtime_lora.initialise_adapters(wrapper, spec, "hf-v5") == 3 * model.config.num_hidden_layers
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    a = model.model.layers[1].self_attn.v_proj.lora_A.weight
    assert torch.equal(a, peft_adapter.adapter_init(7, "model.layers.1.self_attn.v_proj", tuple(a.shape)))
    assert float(model.model.layers[1].mlp.down_proj.lora_B.weight.detach().abs().max()) == 0.0
    assert torch.allclose(model(torch.arange(16)[None]).logits, before)  # B = 0: the base's function
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()  # base keys unchanged: the HF load works


def test_torchtitans_sharding_pass_gives_the_injected_adapters_torchtitans_lora_sharding(tiny_hf_model):
    """hf-v5: torchtitan's own sharding pass over the Transformers model (its completeness check
    included) finds every adapter configured, as torchtitan's LoRA shards them, with no torchtitan
    function replaced: the adapters take theirs when their base linear gets its own."""
    import spmd_types as spmd
    import torch
    from torchtitan.components.lora import _lora_adapter_sharding
    from torchtitan.experiments.transformers_modeling_backend.hf_sharding import set_hf_sharding_configs
    from torchtitan.experiments.transformers_modeling_backend.module_conversion import convert_hf_to_module
    from torchtitan.models.common.decoder_sharding import dense_param_placement

    from trnqwen.adapters.lora import titan as runtime_lora

    hf = _load_hf(tiny_hf_model)
    runtime_lora.inject_hf_adapters(hf, _spec(ALL))

    class Titanish(torch.nn.Module):  # the parts of torchtitan's HFTransformerModel the pass reads
        def __init__(self) -> None:
            super().__init__()
            self.tok_embeddings, self.norm, self.lm_head = hf.model.embed_tokens, hf.model.norm, hf.lm_head
            self.layers, self.rotary_emb = hf.model.layers, hf.model.rotary_emb

    model = Titanish()
    convert_hf_to_module(model)
    set_hf_sharding_configs(model, enable_sp=True)  # raises on any parameter left without a config
    replicated = dense_param_placement(tp=spmd.R)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    for linear, placement in ((attn.q_proj, spmd.S(0)), (attn.o_proj, spmd.S(1)), (mlp.down_proj, spmd.S(1))):
        a, b = _lora_adapter_sharding(linear._sharding_config)
        assert linear._sharding_config.state_shardings["weight"] == dense_param_placement(tp=placement)
        assert linear.lora_A._sharding_config == a and linear.lora_B._sharding_config == b
    assert attn.q_proj.lora_A._sharding_config.state_shardings["weight"] == replicated  # colwise: A replicated
    assert attn.o_proj.lora_B._sharding_config.state_shardings["weight"] == replicated  # rowwise: B replicated


def test_torchtitan_lora_with_dropout_and_the_shared_init():
    """torchtitan's converter on a non-fused Qwen3, trnqwen's dropout, A from (seed, HF name)."""
    import torch

    from trnqwen.adapters.lora import titan as runtime_lora
    from trnqwen.runtime.qwen3_native import qwen3_model_spec

    spec = _spec(ALL, dropout=0.5)
    ms = qwen3_model_spec(name="t", dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                          vocab_size=64, tied=True, rope_theta=1e4, max_seq_len=64, fuse_qkv=False)
    from torchtitan.components.lora import LoRAConverter

    ms.model = LoRAConverter.Config(rank=4, alpha=8.0, target_modules=contract_lora.titan_target_names(ALL, fused_qkv=False)).build().convert(ms.model)
    model = ms.model.build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    assert runtime_lora._add_titan_dropout(model, 0.5) == 2 * 7
    assert runtime_lora.initialise_adapters(model, spec, "native") == 2 * 7
    wk = model.layers["0"].attention.qkv_linear.wk
    assert torch.equal(wk.lora_a.weight, peft_adapter.adapter_init(7, "model.layers.0.self_attn.k_proj", (4, 32)))
    with torch.no_grad():
        wk.lora_b.weight.fill_(0.1)
    x = torch.randn(3, 32)
    wk.train()
    torch.manual_seed(0)
    noisy = wk(x)
    wk.eval()
    clean = wk(x)
    assert not torch.allclose(noisy, clean)  # dropout ran on the adapter path in training
    expected = torch.nn.functional.linear(x, wk.weight) + 2.0 * wk.lora_b(wk.lora_a(x))
    assert torch.allclose(clean, expected, atol=1e-6)


def test_a_trainable_base_parameter_stops_the_run_before_step_one():
    import torch

    from trnqwen.adapters.lora import titan as runtime_lora

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.proj.lora_A = torch.nn.Linear(4, 2, bias=False)
            self.proj.lora_B = torch.nn.Linear(2, 4, bias=False)

    model = Tiny()
    runtime_lora._state["initialised"] = 1
    good = torch.optim.AdamW([model.proj.lora_A.weight, model.proj.lora_B.weight])
    runtime_lora.report_trainable(good, [model], _spec(("q_proj",)))  # adapters only: fine
    bad = torch.optim.AdamW([model.proj.lora_A.weight, model.proj.lora_B.weight, model.proj.weight])
    with pytest.raises(RuntimeError, match=r"\[LoRA\] refusing to train: 1 non-adapter parameter.*proj.weight"):
        runtime_lora.report_trainable(bad, [model], _spec(("q_proj",)))


# --- merge --------------------------------------------------------------------------------------


def test_merge_is_w_plus_scaled_ba_and_equals_peft(tiny_hf_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trnqwen.ckpt.merge import merge_adapter

    spec = _spec(("q_proj", "gate_proj"), rank=4, alpha=12.0)
    g = torch.Generator().manual_seed(0)
    config = json.loads((tiny_hf_model / "config.json").read_text())
    h, ffn = config["hidden_size"], config["intermediate_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    modules = {}
    for i in range(config["num_hidden_layers"]):
        modules[f"model.layers.{i}.self_attn.q_proj"] = (torch.randn(4, h, generator=g), torch.randn(q_out, 4, generator=g) * 0.1)
        modules[f"model.layers.{i}.mlp.gate_proj"] = (torch.randn(4, h, generator=g), torch.randn(ffn, 4, generator=g) * 0.1)
    adapter = tmp_path / "hf" / "step-2"
    peft_adapter.write_adapter(adapter, modules, spec)
    result = merge_adapter(adapter, tiny_hf_model)
    assert result.out == tmp_path / "hf" / "step-2.merged" and result.merged_modules == len(modules)
    from safetensors.torch import load_file

    base_sd = load_file(str(next(tiny_hf_model.glob("*.safetensors"))))
    merged_sd = load_file(str(next(result.out.glob("*.safetensors"))))
    a, b = modules["model.layers.0.self_attn.q_proj"]
    w = base_sd["model.layers.0.self_attn.q_proj.weight"]
    assert torch.allclose(merged_sd["model.layers.0.self_attn.q_proj.weight"], (w.float() + 3.0 * (b @ a)).to(w.dtype), atol=1e-6)
    assert torch.equal(merged_sd["model.layers.0.self_attn.k_proj.weight"], base_sd["model.layers.0.self_attn.k_proj.weight"])
    ids = torch.arange(32)[None] % config["vocab_size"]
    with torch.no_grad():
        via_peft = PeftModel.from_pretrained(_load_hf(tiny_hf_model), adapter).eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(result.out, dtype=torch.float32).eval()(ids).logits
    assert float((via_peft - merged).abs().max()) < 1e-4
    assert (result.out / "config.json").is_file() and (result.out / "tokenizer.json").is_file()


def test_merge_refuses_a_base_it_was_not_trained_on_and_leaves_nothing(tiny_hf_model, tmp_path):
    import torch

    from trnqwen.ckpt.merge import merge_adapter

    adapter = tmp_path / "ad"
    peft_adapter.write_adapter(adapter, {"model.layers.0.self_attn.q_proj": (torch.zeros(2, 7), torch.zeros(5, 2))}, _spec(rank=2))
    with pytest.raises(CheckFailed, match="not trained on this base"):
        merge_adapter(adapter, tiny_hf_model, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["ad"]
    with pytest.raises(UsageError, match="not a LoRA adapter"):
        merge_adapter(tiny_hf_model, tiny_hf_model)


# --- planning through the CLI ---------------------------------------------------------------------


def test_the_lora_trainer_hook_keeps_adapters_out_of_the_base_load_and_exports_the_adapter(monkeypatch):
    """runtime's checkpointer never imports the adapter: it asks its hooks (hf_load_state, hf_export)."""
    from trnqwen.adapters.lora import titan

    hook = titan.LoraHook()
    state = {"layers.0.attention.wq.weight": 1, "layers.0.attention.wq.lora_a.weight": 2,
             "layers.0.attention.wq.lora_b.weight": 3}
    monkeypatch.setitem(titan._state, "spec", None)
    assert hook.hf_load_state(state) == state and hook.hf_export(None, "ck/hf/step-3") is False
    monkeypatch.setitem(titan._state, "spec", _spec())
    assert hook.hf_load_state(state) == {"layers.0.attention.wq.weight": 1}
    written = []
    monkeypatch.setattr(titan, "export_adapter", lambda manager, folder: written.append(folder))
    assert hook.hf_export(None, "ck/hf/step-3") is True and written == ["ck/hf/step-3"]


def test_dry_run_renders_lora_into_the_config_module(tmp_path):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    assets = write_tiny_qwen3(tmp_path / "assets" / "hf" / "tiny-qwen3")
    common = ("train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--device", "cpu", "--finetune",
              "--lora", "--lora-rank", "8", "--dry-run", "--json")
    native = run_subprocess(*common, "--backend", "native", cwd=tmp_path)
    assert native.code == 0, native.text
    doc = json.loads(native.out)
    text = doc["config_module_text"] if "config_module_text" in doc else json.dumps(doc)
    assert "fuse_qkv=False" in text and "attach_lora(config" in text and "backend='native'" in text
    # LoRA's trainer hook (the base loaded without adapter keys, the adapter as the export) joins the config's
    assert "from trnqwen.adapters.lora.titan import LoraHook, attach_lora" in text
    assert "hooks=[LoraHook()]" in text
    assert any("LoRA rank 8" in n for n in json.dumps(doc).split('"'))
    hf = run_subprocess(*common, "--backend", "hf-v5", cwd=tmp_path)
    assert hf.code == 0 and "backend='hf-v5'" in hf.out
    refused = run_subprocess(*common, "--backend", "native", "--lora-targets", "q_proj,v_proj", cwd=tmp_path)
    assert_clean_error(refused, code=2, contains="k_proj and v_proj")
    bad = run_subprocess("train", "--lora-targets", "qkv", "--dry-run", cwd=tmp_path)
    assert_clean_error(bad, code=2, contains="lora_targets")
    no_lora = run_subprocess("train", "--merge", "--dry-run", cwd=tmp_path)
    assert_clean_error(no_lora, code=2, contains="merge needs lora")


# --- preflight ---------------------------------------------------------------------------------------


def test_a_frozen_base_has_no_gradients_or_optimizer_state_in_the_estimate():
    from trnqwen.titan_compat import FlavorDims
    from trnqwen.train.memory import estimate_memory

    qwen3_4b = FlavorDims(dim=2560, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, vocab_size=151936,
                          ffn_dim=9728, tied=True, rope_theta=5e6)
    cfg = RunConfig(lora=True, seq_len=4096)
    spec = lora.spec_from_config(cfg)
    adapters = contract_lora.adapter_params(qwen3_4b, spec, spec.targets)
    assert adapters == 33_030_144  # rank 16, all-linear, 36 layers
    full, frozen = estimate_memory(qwen3_4b, cfg, 64), estimate_memory(qwen3_4b, cfg, 64, trainable=adapters)
    assert frozen.grads == 4 * adapters // 64 and frozen.optimizer == 8 * adapters // 64
    assert full.grads > 100 * frozen.grads and frozen.params > full.params  # base + the adapters' own weights


def test_preflight_warns_about_a_rank_vllm_cannot_serve(tmp_path):
    from trnqwen.train.preflight import PreflightReport, check_lora

    report = PreflightReport()
    check_lora(report, RunConfig(lora=True, lora_rank=12, finetune=True))
    assert [f.check for f in report.warnings] == ["lora"] and "vLLM" in report.warnings[0].message
    quiet = PreflightReport()
    check_lora(quiet, RunConfig(lora=True, lora_rank=16, finetune=True))
    assert quiet.findings == []


def test_a_lora_setting_cannot_change_on_resume_but_merge_can():
    from trnqwen.train.resume import MAY_CHANGE

    assert "merge" in MAY_CHANGE
    assert not {"lora", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets"} & MAY_CHANGE


def test_overwrite_clears_a_lora_runs_adapter_and_merged_folder_and_nothing_else(tmp_path):
    from trnqwen.contract import checkpoint_layout as checkpoints

    root = tmp_path / "ckpt"
    files = ["hf/step-3/adapter_config.json", "hf/step-3/adapter_model.safetensors", "hf/step-3/tokenizer.json",
             "hf/step-3/README.md", "hf/step-3.merged/model.safetensors", "hf/step-3.merged/config.json",
             "hf/step-3.merged/model.safetensors.index.json", "resume/step-3/.metadata"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    found = checkpoints.scan(root)
    assert [s.kind for s in found.exports] == ["adapter"] and found.exports[0].complete
    assert checkpoints.not_written_by_us(found) == []
    checkpoints.clear(found)
    assert not (root / "hf").exists() and not (root / "resume").exists()
    (root / "hf" / "step-4.merged").mkdir(parents=True)
    (root / "hf" / "step-4.merged" / "NOTES.md").write_text("mine")
    with pytest.raises(UsageError, match="NOTES.md"):
        checkpoints.clear(checkpoints.scan(root))
    assert (root / "hf" / "step-4.merged" / "NOTES.md").read_text() == "mine"


def test_the_adapter_keeps_the_base_checkpoints_dtype(tmp_path):
    """A bf16 base gets a bf16 adapter (half the bytes of float32; the 0.6B shape's rank-16 adapter
    is then 1.7% of the base), as every trnqwen export keeps the checkpoint's dtype."""
    import torch
    from safetensors.torch import load_file

    modules = {"model.layers.0.self_attn.q_proj": (torch.randn(2, 8), torch.randn(8, 2))}
    peft_adapter.write_adapter(tmp_path / "bf16", modules, _spec(rank=2), dtype="bfloat16")
    peft_adapter.write_adapter(tmp_path / "kept", modules, _spec(rank=2))
    bf16 = load_file(str(tmp_path / "bf16" / "adapter_model.safetensors"))
    assert {t.dtype for t in bf16.values()} == {torch.bfloat16}
    assert {t.dtype for t in load_file(str(tmp_path / "kept" / "adapter_model.safetensors")).values()} == {torch.float32}
    a = bf16["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert torch.equal(a, modules["model.layers.0.self_attn.q_proj"][0].to(torch.bfloat16))


# --- the base an export names (issue 34 #2) ---------------------------------------------------------


def _plan(tmp_path, monkeypatch, *flags):
    from trnqwen.config import resolve_config
    from trnqwen.train.run import plan_train

    monkeypatch.chdir(tmp_path)
    cli = dict(zip(*[iter(flags)] * 2))
    resolved = resolve_config({"finetune": True, "lora": True, "device": "cpu", **cli}, environ={})
    return plan_train(resolved, dry_run=True, cwd=tmp_path)


def test_an_export_names_the_base_it_was_trained_from(tmp_path, monkeypatch):
    """--assets with --model left at its default: the adapter, the card and the checkpoint folder
    name what --assets holds (its fetch record's repo, else the folder), said first; a matching
    --model changes nothing."""
    from trnqwen.ckpt.model_folder import card_info
    from trnqwen.fetch.builtin import fetch_builtin, write_tiny_qwen3
    from trnqwen.train.run import create_run_dir

    fetched = tmp_path / "fetched"
    fetch_builtin("builtin:tiny-qwen3", fetched)  # with its fetch record
    plain = write_tiny_qwen3(tmp_path / "plain")  # none: only its config.json tells

    plan = _plan(tmp_path, monkeypatch, "assets_dir", str(fetched))
    first = plan.preflight.findings[0]
    assert first.check == "assets" and "holds builtin:tiny-qwen3" in first.message and "--model builtin:tiny-qwen3" in first.message
    assert '"base_model": "builtin:tiny-qwen3"' in plan.job.config_module_text  # the adapter's base_model_name_or_path
    assert plan.job.checkpoint_dir.name.startswith("checkpoint_tiny_qwen3_")
    record = create_run_dir(plan)  # the record every card is written from (full fine-tunes too)
    assert record.extra["base_model"] == "builtin:tiny-qwen3" and card_info(record).base_model == "tiny-qwen3"

    plan = _plan(tmp_path, monkeypatch, "assets_dir", str(plain))
    assert plan.preflight.findings[0].check == "assets" and "hidden_size 128" in plan.preflight.findings[0].message
    assert f'"base_model": "{plain}"' in plan.job.config_module_text
    assert plan.job.checkpoint_dir.name.startswith("checkpoint_plain_")

    for flags in (("model", "builtin:tiny-qwen3", "assets_dir", str(fetched)), ("model", "builtin:tiny-qwen3", "assets_dir", str(plain))):
        plan = _plan(tmp_path, monkeypatch, *flags)
        assert not any(f.check == "assets" and "base" in f.message for f in plan.preflight.findings)
        assert '"base_model": "builtin:tiny-qwen3"' in plan.job.config_module_text


def test_base_identity_rules(tmp_path):
    from trnqwen.assets import DEFAULT_MODEL_SHAPE, base_identity
    from trnqwen.constants import DEFAULT_MODEL

    real = tmp_path / "real"
    real.mkdir()
    (real / "config.json").write_text(json.dumps({**DEFAULT_MODEL_SHAPE, "head_dim": 128}))
    assert base_identity(DEFAULT_MODEL, real) == (DEFAULT_MODEL, None)  # the default model's own shape
    assert base_identity(DEFAULT_MODEL, None) == (DEFAULT_MODEL, None)
    assert base_identity("Org/unknown", real) == ("Org/unknown", None)  # nothing to compare against: trusted
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({**DEFAULT_MODEL_SHAPE, "model_type": "qwen3_moe", "num_experts": 8}))
    name, note = base_identity(DEFAULT_MODEL, moe)
    assert name == str(moe) and "model_type 'qwen3_moe'" in note
