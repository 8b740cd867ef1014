"""verify-ckpt on PEFT LoRA adapter folders (trnqwen.ckpt.verify_adapter): a good adapter passes with
peft's own load onto its base, an untrained one passes with a warning, and each kind of damage
fails with exit 1 and says what is wrong."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.ckpt_fixtures import tree_hash
from tests.helpers import assert_clean_error
from tests.lora_fixtures import make_adapter, make_base, rewrite_tensors


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_verify")
    base = make_base(root / "base")
    trained = make_adapter(root / "trained", base)
    untrained = make_adapter(root / "untrained", base, trained=False)
    return root, base, trained, untrained


@pytest.fixture
def adapter(made, tmp_path):
    """A copy of the trained adapter a test may damage."""
    return shutil.copytree(made[2], tmp_path / "adapter")


def verify(cli, *args):
    res = cli("verify-ckpt", *map(str, args), "--json")
    return res, json.loads(res.out) if res.out.strip().startswith("{") else None


def test_good_adapter_passes_with_peft_round_trip(cli, made):
    _, base, trained, _ = made
    before = tree_hash(trained)
    res, doc = verify(cli, trained)
    assert res.code == 0, res.text
    assert doc["ok"] and doc["problems"] == [] and doc["warnings"] == []
    assert doc["kind"] == "adapter" and doc["checkpoint"] == str(trained)
    # no run record, no --base: the base comes from adapter_config.json's base_model_name_or_path
    assert doc["base"] == str(base) and "base_model_name_or_path" in doc["base_source"]
    assert doc["modules"] == 2 * 7 and doc["num_tensors"] == 2 * 2 * 7
    assert doc["targets"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert doc["adapter_config"]["r"] == 8 and doc["adapter_config"]["peft_type"] == "LORA"
    assert doc["scanned"] and doc["nonfinite"] == {} and doc["untrained"] is False and doc["nonzero_b"] == 14
    rt = doc["round_trip"]
    assert rt["library"].startswith("peft ") and rt["model_class"] == "Qwen3ForCausalLM"
    assert rt["missing_adapter_keys"] == [] and rt["unexpected_keys"] == [] and rt["loaded"] == 28
    assert tree_hash(trained) == before  # read-only


def test_untrained_adapter_warns(cli, made):
    res, doc = verify(cli, made[3])
    assert res.code == 0, res.text
    assert doc["ok"] and doc["untrained"] is True and doc["nonzero_b"] == 0
    assert "the adapter is untrained (every lora_B is zero)" in doc["warnings"]
    assert "the adapter is untrained (every lora_B is zero)" in res.err


def test_human_output_names_the_checks(cli, made):
    res = cli("verify-ckpt", str(made[2]))
    assert res.code == 0, res.text
    for word in ("LoRA adapter", "peft round trip", "0 missing, 0 unexpected adapter keys", "OK: a PEFT LoRA adapter"):
        assert word in res.out, res.out


def test_base_option_and_a_base_of_another_size(cli, made, adapter, tmp_path):
    _, base, _, _ = made
    res, doc = verify(cli, adapter, "--base", base)
    assert res.code == 0 and doc["base_source"] == "--base"
    other = make_base(tmp_path / "wide", hidden_size=48)
    res, doc = verify(cli, adapter, "--base", other)
    assert res.code == 1, res.text
    assert doc["shape_mismatches"] and "shape mismatch" in doc["problems"][0]
    assert "failed verification" in res.err and "Traceback" not in res.text
    # --base without a config.json: a usage error
    assert_clean_error(cli("verify-ckpt", str(adapter), "--base", str(tmp_path)), code=2, contains="no config.json")


def test_no_base_found_is_a_usage_error(cli, adapter, in_tmp):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "Qwen/Qwen3-Nowhere"
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    assert_clean_error(cli("verify-ckpt", str(adapter)), code=2, contains="--base")


def test_base_name_resolved_like_model_refs(cli, made, adapter, in_tmp):
    """``Qwen/X`` -> ./assets/hf/X, where ``trnqwen fetch Qwen/X`` puts it."""
    shutil.copytree(made[1], in_tmp / "assets" / "hf" / "Tiny-Base")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "Someone/Tiny-Base"
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res, doc = verify(cli, adapter)
    assert res.code == 0, res.text
    assert doc["base"] == str(in_tmp / "assets" / "hf" / "Tiny-Base")


def test_wrong_key_fails(cli, adapter):
    def edit(t):
        t["base_model.model.model.layers.0.self_attn.zz_proj.lora_A.weight"] = t.pop(
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        t["base_model.model.model.layers.0.self_attn.zz_proj.lora_B.weight"] = t.pop(
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
        t["model.layers.1.mlp.up_proj.lora_A.weight"] = t.pop("base_model.model.model.layers.1.mlp.up_proj.lora_A.weight")

    rewrite_tensors(adapter, edit)
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert doc["invalid_keys"] == ["model.layers.1.mlp.up_proj.lora_A.weight"]
    assert doc["unknown_modules"] == ["model.layers.0.self_attn.zz_proj"]
    assert doc["unpaired"] == ["model.layers.1.mlp.up_proj (lora_B only)"]
    assert "model.layers.0.self_attn.q_proj" in doc["missing_modules"]
    rt = doc["round_trip"]  # peft itself: the keys it could not place, the ones it left at init
    assert "base_model.model.model.layers.0.self_attn.zz_proj.lora_A.weight" in rt["unexpected_keys"]
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in rt["missing_adapter_keys"]
    assert any("not PEFT LoRA keys" in p for p in doc["problems"])
    assert any("the base model does not have" in p for p in doc["problems"])


def test_module_outside_target_modules_fails(cli, made, tmp_path):
    adapter = make_adapter(tmp_path / "qv", made[1], targets=("q_proj", "v_proj"))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj"]
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert doc["not_targeted"] == ["model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.v_proj"]
    assert len(doc["round_trip"]["unexpected_keys"]) == 4  # peft skips them: strict=False only warns


def test_wrong_shape_fails(cli, adapter):
    import torch

    def edit(t):
        key = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
        t[key] = torch.zeros(t[key].shape[0], 16)  # rank 16 where adapter_config says r 8

    rewrite_tensors(adapter, edit)
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert doc["shape_mismatches"] == [{"key": "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight",
                                        "expected": [32, 8], "found": [32, 16]}]
    assert "shape mismatch" in res.err and "down_proj.lora_B" in res.err and "--base" in res.err


def test_nan_fails(cli, adapter):
    def edit(t):
        t["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"][0, 3] = float("nan")

    rewrite_tensors(adapter, edit)
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert doc["nonfinite_detail"] == {"base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight": {"nan": 1, "inf": 0}}
    assert "NaN/Inf" in res.err and "inspect-logs" in res.err  # the hint for diverged training


def test_missing_adapter_config_fails(cli, adapter, made):
    (adapter / "adapter_config.json").unlink()
    res, doc = verify(cli, adapter, "--base", made[1])
    assert res.code == 1, res.text
    assert doc["kind"] == "adapter" and doc["problems"][0].startswith("adapter_config.json: missing")
    assert "adapter_config.json: missing" in res.err and "Traceback" not in res.text


def test_missing_adapter_weights_fail(cli, adapter):
    (adapter / "adapter_model.safetensors").unlink()
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert doc["problems"] == ["adapter_model.safetensors: missing: the adapter has no weights"]


def test_the_weights_file_itself(cli, made):
    res, doc = verify(cli, made[2] / "adapter_model.safetensors")
    assert res.code == 0 and doc["kind"] == "adapter" and doc["checkpoint"] == str(made[2]), res.text


def test_bad_adapter_config_fails(cli, adapter):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg.update(peft_type="IA3", r=0)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res, doc = verify(cli, adapter)
    assert res.code == 1, res.text
    assert "adapter_config.json: peft_type is 'IA3', not 'LORA'" in doc["problems"]
    assert "adapter_config.json: r is 0, not a positive integer" in doc["problems"]


def test_quick_reads_headers_only(cli, adapter):
    def edit(t):
        t["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"][0, 0] = float("inf")

    rewrite_tensors(adapter, edit)
    res, doc = verify(cli, adapter, "--quick")
    assert res.code == 0, res.text
    assert not doc["scanned"] and doc["round_trip"] is None and doc["untrained"] is None


def test_layout_root_and_step_folders(cli, made, tmp_path):
    """trnqwen's checkpoint folder: <root>/hf/step-N is the adapter; the root and hf/ resolve to it."""
    root = tmp_path / "checkpoint_tiny_ft"
    make_adapter(root / "hf" / "step-2", made[1], trained=False)
    make_adapter(root / "hf" / "step-5", made[1])
    for given in (root, root / "hf"):
        res, doc = verify(cli, given)
        assert res.code == 0, res.text
        assert doc["step"] == 5 and doc["checkpoint"] == str(root / "hf" / "step-5") and doc["untrained"] is False
    res, doc = verify(cli, root / "hf", "--step", "2")
    assert res.code == 0 and doc["untrained"] is True


def test_options_for_whole_models_are_refused(cli, made, tmp_path):
    assert_clean_error(cli("verify-ckpt", str(made[2]), "--compare-to", str(made[1])), code=2, contains="LoRA adapter")
    assert_clean_error(cli("verify-ckpt", str(made[2]), "--generate", "hi"), code=2, contains="trnqwen eval")


def test_base_option_on_a_whole_model_is_refused(cli, tmp_path):
    from tests.ckpt_fixtures import make_case

    ckpt, assets, _ = make_case(tmp_path)
    res, doc = verify(cli, ckpt, "--assets", assets, "--quick")
    assert res.code == 0 and doc["kind"] == "model"
    assert_clean_error(cli("verify-ckpt", str(ckpt), "--base", str(assets)), code=2, contains="--assets")


def test_layers_to_transform_limits_what_must_be_there(cli, adapter):
    rewrite_tensors(adapter, lambda t: [t.pop(k) for k in list(t) if ".layers.1." in k])
    res, doc = verify(cli, adapter)
    assert res.code == 1 and len(doc["missing_modules"]) == 7, res.text  # layer 1's seven projections
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["layers_to_transform"] = [0]
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res, doc = verify(cli, adapter)
    assert res.code == 0, res.text
    assert doc["missing_modules"] == [] and doc["round_trip"]["missing_adapter_keys"] == []
