"""Qwen3-MoE from HF weights (issue 27), the fast part: one reader of every config form
(``trnqwen.assets.moe_layout``) behind the planner, the memory estimate and verify-ckpt; the
native plan builds any Qwen3-MoE from config.json with torchtitan's MoE builders; hf-trainer's
export is the Hub layout in the checkpoint's dtype; verify-ckpt's round trip goes through
``from_pretrained``.  The end-to-end runs are in tests/test_moe_e2e.py."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.moe_fixtures import hf_config, write_tiny_moe
from tests.test_recipes import CPU, job_and_config
from trnqwen.config import RunConfig
from trnqwen.errors import UsageError
from trnqwen.titan_compat import dims_from_hf_config
from trnqwen.train.memory import count_params


def moe_layout(config: dict):
    from trnqwen.assets import moe_layout as read  # imported here: the tests below run on older code too

    return read(config)


def _local_form(config: dict) -> dict:
    out = dict(config)
    out["num_local_experts"] = out.pop("num_experts")
    return out


def _meta_params(config: dict) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "rope_theta")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**fields))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("form", ["hub", "local"])
def test_both_expert_count_keys_read_as_moe(form):
    """transformers 5 writes num_local_experts: the planner once read only num_experts and took the
    model for dense (native then crashed on a missing mlp.down_proj)."""
    config = hf_config() if form == "hub" else _local_form(hf_config())
    layout = moe_layout(config)
    assert (layout.num_experts, layout.top_k, layout.moe_ffn_dim, layout.norm_topk_prob) == (8, 2, 32, True)
    assert layout.sparse_layers == (0, 1) and layout.dense_layers == ()
    dims = dims_from_hf_config(config)
    assert (dims.num_experts, dims.top_k, dims.moe_ffn_dim, dims.route_norm, dims.ffn_dim) == (8, 2, 32, True, None)


def test_a_dense_moe_mix_follows_transformers_rule():
    config = hf_config(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    layout = moe_layout(config)
    assert layout.sparse_layers == (1,) and layout.dense_layers == (0, 2, 3)  # (i+1) % 2 == 0, not 3
    dims = dims_from_hf_config(config)
    assert dims.dense_layers == (0, 2, 3) and dims.ffn_dim == 128 and dims.moe_layers == 1


def test_aux_loss_coefficient_counts_only_with_router_logits():
    assert moe_layout(hf_config()).aux_loss_coef == 0.0  # transformers adds it only with output_router_logits
    assert moe_layout(hf_config(output_router_logits=True, router_aux_loss_coef=0.02)).aux_loss_coef == 0.02


def test_disagreeing_expert_counts_are_refused_by_name():
    with pytest.raises(UsageError, match="num_experts .8. and num_local_experts .4. disagree"):
        moe_layout(dict(hf_config(), num_local_experts=4))


@pytest.mark.parametrize("over", [{}, {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
                                  {"tie_word_embeddings": True}])
@pytest.mark.parametrize("form", ["hub", "local"])
def test_memory_estimate_counts_what_transformers_builds(form, over):
    config = hf_config(**over)
    config = config if form == "hub" else _local_form(config)
    assert count_params(dims_from_hf_config(config)) == _meta_params(hf_config(**over))


@pytest.mark.parametrize("form", ["hub", "local"])
def test_native_plan_builds_the_tiny_moe_from_config_json(tmp_path, form):
    """Once refused ("no registered torchtitan Qwen3-MoE flavor matches", Hub key) or built dense
    (transformers 5's key); now torchtitan's own MoE builders make it, as config.json says."""
    assets = tmp_path / "moe"
    assets.mkdir()
    config = hf_config(num_hidden_layers=3, mlp_only_layers=[1])
    (assets / "config.json").write_text(json.dumps(config if form == "hub" else _local_form(config)))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(8)))
    cfg = RunConfig(model="tiny-moe", assets_dir=assets, backend="native", device="cpu", dataset=str(data),
                    finetune=True, seq_len=64)
    job, config_obj = job_and_config(cfg, CPU, tmp_path)
    assert job.model_flavor == "config.json"
    layers = config_obj.model_spec.model.layers
    assert [layer.moe is not None for layer in layers] == [True, False, True]
    moe = layers[0].moe
    assert (moe.num_experts, moe.router.top_k, moe.router.route_norm, moe.routed_experts.inner_experts.hidden_dim) == (8, 2, True, 32)
    assert moe.load_balance_coeff is None  # transformers trains this config without any balancing term
    assert layers[1].feed_forward.w1.out_features == 128
    assert "balance_note='none (as transformers trains this config" in job.config_module_text


def test_router_logits_config_gets_torchtitan_balancing_and_says_so(tmp_path):
    from trnqwen.train.recipes import moe_balance

    coeff, note = moe_balance(hf_config(output_router_logits=True))
    assert coeff == 1e-3 and "not transformers' router aux loss" in note
    assert moe_balance(hf_config()) == (None, moe_balance(hf_config())[1])


# --- hf-trainer's export ------------------------------------------------------------------------


def test_hf_trainer_export_is_the_hub_layout_in_the_checkpoint_dtype(tmp_path):
    """transformers 5 fuses the experts on load; the export once kept the fused tensors and float32."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trnqwen.runtime.hf_trainer import hub_layout, save_hf_checkpoint

    src = write_tiny_moe(tmp_path / "moe", tokenizer=False)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)  # as hf-trainer trains
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in model.state_dict())
    out = save_hf_checkpoint(hub_layout(model, model.state_dict(), dtype="bfloat16"), tmp_path / "out")
    got, want = load_file(str(next(out.glob("*.safetensors")))), load_file(str(src / "model.safetensors"))
    assert set(got) == set(want)
    assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k]) for k in want)


def test_hf_trainer_export_keeps_a_dense_checkpoints_dtype(tmp_path):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trnqwen.runtime.hf_trainer import hub_layout

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    state = hub_layout(model, model.state_dict(), dtype="bfloat16")
    assert set(state) == set(model.state_dict()) and {v.dtype for v in state.values()} == {torch.bfloat16}


# --- verify-ckpt's round trip --------------------------------------------------------------------


def _verify(folder):
    from trnqwen.ckpt.layout import find_config, resolve_checkpoint

    ckpt = resolve_checkpoint(folder)
    return ckpt, find_config(ckpt)


@pytest.mark.parametrize("form", ["hub", "local"])
def test_verify_round_trips_a_moe_through_from_pretrained(tmp_path, form):
    from trnqwen.ckpt.verify import verify

    src = write_tiny_moe(tmp_path / "moe", key_form=form, tokenizer=False)
    report = verify(*_verify(src), round_trip=True, quick=True)
    rt = report.round_trip
    assert "skipped" not in rt, rt  # it was skipped for every Qwen3-MoE
    assert rt["model_class"] == "Qwen3MoeForCausalLM" and rt["disagrees"] is None and rt["loaded_problems"] == []
    assert rt["checked"] == "2 MoE layer(s) x 8 experts, top-2"
    assert report.ok


def test_verify_round_trip_fails_an_expert_short_export(tmp_path):
    from safetensors.torch import load_file, save_file

    from trnqwen.ckpt.verify import verify

    src = write_tiny_moe(tmp_path / "moe", tokenizer=False)
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors.pop("model.layers.1.mlp.experts.3.up_proj.weight")
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    report = verify(*_verify(bad), round_trip=True, quick=True)
    assert not report.ok and report.missing_keys == ["model.layers.1.mlp.experts.3.up_proj.weight"]
    assert report.round_trip["loaded_problems"] and report.round_trip["disagrees"] is None  # both fail it


# --- hf-v5 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["hub", "local"])
def test_hf_v5_plan_swaps_torchtitan_moe_in_with_the_hub_layout_adapter(tmp_path, form):
    """The dense Transformers-backend config never swapped torchtitan's MoE in, so the ranks
    crashed ('FSDPCheckpointWrapper' object has no attribute 'moe' / plain-tensor experts)."""
    from trnqwen.runtime.hf_moe_adapter import HFMoeStateDictAdapter

    assets = tmp_path / "moe"
    assets.mkdir()
    config = hf_config()
    (assets / "config.json").write_text(json.dumps(config if form == "hub" else _local_form(config)))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(8)))
    cfg = RunConfig(model="tiny-moe", assets_dir=assets, backend="hf-v5", device="cpu", dataset=str(data),
                    finetune=True, seq_len=64)
    _job, config_obj = job_and_config(cfg, CPU, tmp_path)
    model = config_obj.model_spec.model
    assert model.is_moe  # built from a TitanMoeModelConfig: the backend swaps torchtitan's MoE in
    assert model.attn_mask_type == "block_causal" and model.load_balance_coeff is None
    assert config_obj.model_spec.state_dict_adapter is HFMoeStateDictAdapter


def test_hf_v5_moe_adapter_maps_the_hub_layout_both_ways(tmp_path):
    """Plain tensors (the offline path): per-expert Hub keys <-> torchtitan's grouped experts."""
    import torch
    from safetensors.torch import load_file

    from trnqwen.runtime.hf_moe_adapter import HFMoeStateDictAdapter

    src = write_tiny_moe(tmp_path / "moe", tokenizer=False)
    hub = load_file(str(src / "model.safetensors"))
    adapter = HFMoeStateDictAdapter(None, str(src))
    titan = adapter.from_hf(dict(hub))
    w1 = titan["model.model.layers.1.mlp.routed_experts.inner_experts.w1_EFD"]
    assert w1.shape == (8, 32, 64) and torch.equal(w1[5], hub["model.layers.1.mlp.experts.5.gate_proj.weight"])
    assert torch.equal(titan["model.model.layers.0.mlp.router.gate.weight"], hub["model.layers.0.mlp.gate.weight"])
    assert "model.model.embed_tokens.weight" in titan
    back = adapter.to_hf(titan)
    assert set(back) == set(hub) and all(torch.equal(back[k], hub[k]) for k in hub)


# --- nki-moe -------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["hub", "local"])
def test_nki_moe_plan_for_the_tiny_moe_against_the_neuron_double(tmp_path, form, neuron_double):
    """The recipe's cut (2 layers, 8 experts, top-2) as torchtitan-neuron's entry point builds it;
    fine-tuning the tiny MoE's own weights into 30B-A3B's layer shape is refused by name."""
    from tests.test_recipes import load_config
    from trnqwen.train.recipes import build_job

    assets = tmp_path / "moe"
    assets.mkdir()
    (assets / "config.json").write_text(json.dumps(hf_config() if form == "hub" else _local_form(hf_config())))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(8)))
    cfg = RunConfig(model="tiny-moe", assets_dir=assets, backend="nki-moe", dataset=str(data), moe_layers=2,
                    num_experts=8, top_k=2)
    from tests.test_recipes import TRN2

    job = build_job(cfg, TRN2, None, check_runtime=False)
    config = load_config(job.config_module_text, job.config_fn, tmp_path)
    call = neuron_double.CALLS[-1]
    assert (call["flavor"], call["n_layers"], call["num_experts"], call["top_k"]) == ("30B-A3B", 2, 8, 2)
    layers = config.model_spec.model.layers
    assert len(layers) == 2 and all(la.moe.num_experts == 8 and la.moe.router.top_k == 2 for la in layers)
    assert job.num_layers == 2 and job.model_flavor == "30B-A3B"
    with pytest.raises(UsageError, match=r"nki-moe fine-tunes the layers of Qwen3-30B-A3B, cut; .* dim 64 \(30B-A3B: 2048\)"):
        build_job(cfg.model_copy(update={"finetune": True}), TRN2, None, check_runtime=False)
