"""``trnqwen merge``: base + adapter as peft itself merges them, for every LoraConfig setting that
changes the weights; what a plain merge cannot reproduce refused by name (and by verify-ckpt); a
broken adapter told in verify-ckpt's words; the base found from any folder; the result readable by
others and its card carrying the run's facts.

The reference is peft's own ``PeftModel.from_pretrained(base, folder).merge_and_unload()`` on
adapters peft itself wrote (real peft, real transformers, the tiny Qwen3 on CPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error
from trnqwen.errors import CheckFailed

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("merge") / "tiny-qwen3")


def _base(tiny: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


def peft_adapter(tiny: Path, folder: Path, **settings) -> Path:
    """An adapter written by peft itself (save_pretrained), every LoRA weight random (non-zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_base(tiny), LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ALL, **settings}))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    model.save_pretrained(str(folder))
    return folder


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


APPLIED = {
    "plain": {},
    "use_rslora": {"use_rslora": True},
    "rank_pattern": {"rank_pattern": {"q_proj": 2, "layers.1.mlp.down_proj": 6}},
    "alpha_pattern": {"alpha_pattern": {"v_proj": 32, r"layers\.2\.self_attn\.o_proj": 3}},
    "rslora_and_patterns": {"use_rslora": True, "rank_pattern": {"gate_proj": 8}, "alpha_pattern": {"k_proj": 2}},
    "layers_to_transform": {"layers_to_transform": [0, 2]},
    "layers_pattern": {"layers_to_transform": 1, "layers_pattern": "layers"},
    "exclude_modules": {"exclude_modules": ["model.layers.0.self_attn.q_proj", "down_proj"]},
    "exclude_regex": {"exclude_modules": r".*layers\.3\..*"},
    "target_regex": {"target_modules": r".*\.(q_proj|up_proj)"},
    "all_linear": {"target_modules": "all-linear"},
    "fan_in_fan_out": {"fan_in_fan_out": True},  # peft turns it off for Linear layers
    "bias_all": {"bias": "all"},  # Qwen3's projections have no bias
    "float_alpha_dropout": {"lora_alpha": 5.5, "lora_dropout": 0.1},
    "init_gaussian": {"init_lora_weights": "gaussian"},
    "init_orthogonal": {"init_lora_weights": "orthogonal"},
    "init_mica": {"init_lora_weights": "mica"},
}


@pytest.mark.parametrize("case", list(APPLIED))
def test_merge_equals_peft_merge_and_unload(tiny, tmp_path, case):
    import torch
    from peft import PeftModel

    from trnqwen.ckpt.layout import CheckpointFiles, _load_config
    from trnqwen.ckpt.merge import merge_adapter
    from trnqwen.ckpt.verify_adapter import verify_adapter

    adapter = peft_adapter(tiny, tmp_path / "adapter", **APPLIED[case])
    report = verify_adapter(CheckpointFiles(adapter, [adapter / "adapter_model.safetensors"]),
                            _load_config(tiny / "config.json", "--base"), quick=True)
    assert report.ok, report.problems  # verify-ckpt calls it OK ...
    result = merge_adapter(adapter, tiny)  # ... and merge reproduces it
    with torch.no_grad():
        reference = PeftModel.from_pretrained(_base(tiny), str(adapter)).merge_and_unload().state_dict()
    ours, base = _weights(result.out), _weights(tiny)
    assert set(ours) == set(base)
    moved = 0
    for key, value in ours.items():
        assert float((value - reference[key]).abs().max()) < 1e-6, key
        moved += not torch.equal(value, base[key])
    assert moved == result.merged_modules > 0


def _edited(tiny: Path, folder: Path, **fields) -> Path:
    peft_adapter(tiny, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(fields)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


REFUSED = [
    ("use_dora", True), ("modules_to_save", ["lm_head"]), ("lora_bias", True),
    ("target_parameters", ["mlp.gate_proj.weight"]), ("trainable_token_indices", [1, 2]),
    ("layer_replication", [[0, 2], [1, 4]]), ("use_qalora", True), ("alora_invocation_tokens", [5]),
    ("velora_config", {"x": 1}), ("monteclora_config", {"x": 1}), ("use_bdlora", {"nblocks": 2}),
    ("arrow_config", {"top_k": 1}), ("kasa_config", {"x": 1}),
    ("init_lora_weights", "pissa"), ("init_lora_weights", "pissa_niter_4"), ("init_lora_weights", "olora"),
    ("init_lora_weights", "corda"), ("init_lora_weights", "loftq"), ("init_lora_weights", "lora_ga"),
]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f"{f}={v}" for f, v in REFUSED])
def test_what_a_plain_merge_cannot_reproduce_is_refused_by_name(tiny, tmp_path, field, value):
    from trnqwen.ckpt.layout import CheckpointFiles, _load_config
    from trnqwen.ckpt.merge import merge_adapter
    from trnqwen.ckpt.verify_adapter import verify_adapter

    adapter = _edited(tiny, tmp_path / "adapter", **{field: value})
    report = verify_adapter(CheckpointFiles(adapter, [adapter / "adapter_model.safetensors"]),
                            _load_config(tiny / "config.json", "--base"), quick=True)
    assert any(field in p for p in report.problems), report.problems
    with pytest.raises(CheckFailed, match=field):
        merge_adapter(adapter, tiny, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pissa_really_changes_what_peft_loads(tiny, tmp_path):
    """Why init_lora_weights 'pissa' is refused: peft rewrites the base when it builds the adapter."""
    import torch
    from peft import PeftModel

    adapter = peft_adapter(tiny, tmp_path / "pissa", init_lora_weights="pissa")
    with torch.no_grad():
        via_peft = PeftModel.from_pretrained(_base(tiny), str(adapter)).merge_and_unload().state_dict()
    key = "model.layers.0.self_attn.q_proj.weight"
    plain = json.loads((adapter / "adapter_config.json").read_text())
    plain["init_lora_weights"] = True
    (adapter / "adapter_config.json").write_text(json.dumps(plain))
    with torch.no_grad():
        as_plain = PeftModel.from_pretrained(_base(tiny), str(adapter)).merge_and_unload().state_dict()
    assert float((via_peft[key] - as_plain[key]).abs().max()) > 1e-3


def test_every_lora_config_field_is_applied_ignored_or_refused():
    """A field peft adds later must be looked at: this fails until it is put in one list."""
    from peft import LoraConfig

    from trnqwen.ckpt import adapter_rules

    known = {*adapter_rules.APPLIED, *adapter_rules.NO_EFFECT, *adapter_rules.REFUSED}
    assert {f.name for f in dataclasses.fields(LoraConfig)} - known == set()
    assert not set(adapter_rules.APPLIED) & set(adapter_rules.NO_EFFECT) | set(adapter_rules.APPLIED) & set(adapter_rules.REFUSED)


def test_weights_peft_would_skip_are_refused(tiny, tmp_path):
    """The file holds every layer, the config says layers_to_transform [0]: peft ignores layers 1-3,
    so merge must not add them (verify-ckpt names them too)."""
    from trnqwen.ckpt.merge import merge_adapter

    adapter = _edited(tiny, tmp_path / "adapter", layers_to_transform=[0])
    with pytest.raises(CheckFailed, match="does not target"):
        merge_adapter(adapter, tiny)


# --- the command ---------------------------------------------------------------------------------


def _merge(cli, *args):
    res = cli("merge", *map(str, args), "--json")
    doc = json.loads(res.out) if res.out.strip() else None
    return res, doc


@pytest.mark.parametrize("damage", ["truncated", "random", "config_json", "config_not_object", "no_weights"])
def test_a_broken_adapter_gets_verify_ckpts_diagnosis_and_exit_code(cli, tiny, tmp_path, damage):
    adapter = peft_adapter(tiny, tmp_path / "adapter")
    weights, config = adapter / "adapter_model.safetensors", adapter / "adapter_config.json"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "random":
        weights.write_bytes(os.urandom(4096))
    elif damage == "config_json":
        config.write_text(config.read_text()[:-20])
    elif damage == "config_not_object":
        config.write_text("[1, 2]")
    else:
        weights.unlink()
    verified = cli("verify-ckpt", str(adapter), "--base", str(tiny), "--quick")
    res, doc = _merge(cli, adapter, "--base", tiny)
    assert_clean_error(res, code=verified.code, contains="cannot be merged")
    assert res.code == 1 and "internal error" not in res.text
    first = next(line for line in verified.err.splitlines() if line.startswith("Error:"))
    assert first.split("failed verification: ", 1)[1] in res.err  # verify-ckpt's words
    assert doc["ok"] is False and "cannot be merged" in doc["error"] and doc["exit_code"] == 1
    if damage == "no_weights":  # what is missing, not "cannot tell which base"
        res, _ = _merge(cli, adapter)
        assert_clean_error(res, code=1, contains="adapter_model.safetensors: missing")


def _trained_here(tiny: Path, root: Path, cwd: Path, *, owner_names_run_dir: bool = True) -> tuple[Path, Path]:
    """A LoRA run's checkpoint folder and record as `trnqwen train` leaves them (run dir under
    ``cwd``, the owner file naming it), the adapter written by peft."""
    from trnqwen.contract.checkpoint_layout import write_owner
    from trnqwen.rundir import RunRecord

    run_dir = cwd / ".trnqwen" / "runs" / "20260101-000000-hf-v5"
    run_dir.mkdir(parents=True)
    adapter = peft_adapter(tiny, root / "hf" / "step-3")
    RunRecord(run_id=run_dir.name, run_dir=str(run_dir), status="succeeded", assets_dir=str(tiny),
              checkpoint_dir=str(root), backend="hf-v5",
              config={"model": "builtin:tiny-qwen3", "backend": "hf-v5", "dataset": "my_chats.jsonl", "method": "dpo"},
              extra={"exported": str(adapter), "summary": {"last_step": {"step": 3, "loss": 1.25}}}).save()
    write_owner(root, run_id=run_dir.name, model="builtin:tiny-qwen3", backend="hf-v5",
                run_dir=run_dir if owner_names_run_dir else None)  # an older owner file: the run id alone
    return adapter, run_dir


@pytest.mark.parametrize("owner_names_run_dir", [True, False])
def test_merge_from_another_folder_finds_the_base_and_carries_the_runs_facts(cli, tiny, tmp_path, monkeypatch,
                                                                             owner_names_run_dir):
    adapter, _run_dir = _trained_here(tiny, tmp_path / "project" / "checkpoint_tiny_qwen3_ft", tmp_path / "project",
                                      owner_names_run_dir=owner_names_run_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no runs dir here; the adapter_config names the tiny folder by path
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "tiny-qwen3"  # as trnqwen writes it for builtin:tiny-qwen3
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    old_mask = os.umask(0o022)
    try:
        res, doc = _merge(cli, adapter)
    finally:
        os.umask(old_mask)
    assert res.code == 0, res.text
    out = Path(doc["out"])
    assert doc["base"] == str(tiny) and out == adapter.with_name("step-3.merged")
    assert out.stat().st_mode & 0o777 == 0o755  # what mkdir and every other export get
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {p.name: 0o644 for p in out.iterdir()}
    card = (out / "README.md").read_text()
    assert "hf-v5 backend" in card and "my_chats.jsonl" in card and "| method | dpo |" in card and "| steps | 3 |" in card
    assert "merge backend" not in card and "(the model's default)" not in card
    assert "| merged | base + LoRA r 4, alpha 8" in card


def test_merge_without_a_run_says_only_what_it_knows(cli, tiny, tmp_path):
    adapter = peft_adapter(tiny, tmp_path / "adapter")
    res, doc = _merge(cli, adapter, "--base", tiny)
    assert res.code == 0, res.text
    card = (Path(doc["out"]) / "README.md").read_text()
    assert "merge backend" not in card and "(the model's default)" not in card and "| dataset |" not in card
    assert "Fine-tuned from" in card


def test_a_base_that_cannot_be_found_still_says_so(cli, tiny, tmp_path, monkeypatch):
    adapter = peft_adapter(tiny, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Org/not-fetched"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    res, doc = _merge(cli, adapter)
    assert_clean_error(res, code=2, contains="no base model for the adapter")
    assert "--base DIR" in res.err and doc["ok"] is False and doc["exit_code"] == 2


def test_merged_copy_is_refused_without_a_trace(cli, tiny, tmp_path):
    adapter = peft_adapter(tiny, tmp_path / "adapter")
    shutil.copytree(adapter, tmp_path / "other")
    res, _ = _merge(cli, adapter, "--base", tmp_path / "other")
    assert_clean_error(res, code=2, contains="no config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "other"]
