"""Recipes: each backend's generated torchtitan config, checked field by field against recipe.md.

The generated modules are imported and evaluated with the real torchtitan 0.3.0 (and, for
nki-moe, a test double of torchtitan-neuron that builds on torchtitan's real Qwen3 config).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from trnqwen.config import RunConfig
from trnqwen.env.device import DeviceInfo
from trnqwen.errors import EnvironmentProblem, TrnqwenError, UsageError
from trnqwen import titan_compat as compat
from trnqwen.dataset.streamed import resolve_dataset
from trnqwen.train.recipes import build_job, count_params, render_config_module

DOUBLES = Path(__file__).parent / "doubles"
TRN2 = DeviceInfo(type="neuron", count=64, lnc=2, memory_bytes_per_rank=24 << 30, instance_type="trn2.48xlarge")
CPU = DeviceInfo(type="cpu", count=1)

QWEN3_4B_2507 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
    "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 5000000, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("assets") / "tiny-qwen3")


@pytest.fixture(scope="session")
def qwen3_4b_assets(tmp_path_factory, tiny_assets) -> Path:
    """config.json of Qwen3-4B-Instruct-2507 + a tokenizer (no weights: dry-run material)."""
    folder = tmp_path_factory.mktemp("assets") / "Qwen3-4B-Instruct-2507"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_4B_2507))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_assets / name, folder / name)
    return folder


@pytest.fixture
def text_jsonl(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i} about trainium"}) + "\n" for i in range(20)))
    return path


def load_config(text: str, fn: str, tmp_path: Path):
    """Import a generated module under a fresh name and call its config function."""
    name = f"gen_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
        return getattr(module, fn)()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def job_and_config(cfg: RunConfig, device: DeviceInfo, tmp_path: Path, run_dir=None):
    job = build_job(cfg, device, run_dir)
    return job, load_config(job.config_module_text, job.config_fn, tmp_path)


# --- hf-v5 ---------------------------------------------------------------------------------------


def test_hf_v5_matches_the_recipe(qwen3_4b_assets, text_jsonl, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig(model="Qwen/Qwen3-4B-Instruct-2507", assets_dir=qwen3_4b_assets, backend="hf-v5",
                    dataset=str(text_jsonl), local_batch_size=1, steps=10)
    job, config = job_and_config(cfg, TRN2, tmp_path, run_dir=tmp_path / "run")
    from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
    from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer

    from trnqwen.runtime.trainer import TrnqwenTrainerMixin

    # the recipe's config, under trnqwen's Trainer over the backend's own (torchtitan extended, not patched)
    assert isinstance(config, TransformersBackendConfig)
    assert issubclass(config._owner, HFTransformerTrainer) and issubclass(config._owner, TrnqwenTrainerMixin)
    assert config.hf_model == str(qwen3_4b_assets.absolute())
    assert config.hf_assets_path == str(qwen3_4b_assets.absolute())
    assert config.model_spec.flavor == "full"  # transformers_modeling_backend_full()
    assert config.training.steps == 10
    assert config.training.local_batch_size == 1
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.parallelism.tensor_parallel_degree == 1
    assert config.parallelism.spmd_backend == "spmd_types"  # the only backend HF supports in 0.3.0
    # resumable checkpoints on every run (no HF export without --finetune/--export-hf)
    assert config.checkpoint.enable is True and config.checkpoint.last_save_in_hf is False
    assert config.checkpoint.last_save_model_only is False  # the last step keeps the full state
    assert config.checkpoint.folder.endswith("/checkpoint_qwen3_4b/resume")  # the recipe model: the recipe's folder
    assert config.dump_folder == str((tmp_path / "run").absolute())
    assert config.compile.enable is False
    assert config.training.mixed_precision_param == "bfloat16"  # the recipe's mixed precision on Trainium
    # hf-v5 goes through trnqwen's entry on Neuron too: it re-initialises the rotary buffers
    assert job.entry_module == "trnqwen.runtime.entry" and "--trnqwen-device" not in job.entry_args
    assert job.entry_args[:4] == ["--module", "trnqwen_run_config", "--config", "trnqwen_hf_v5"]
    assert job.nproc_per_node == 64 and job.world_size == 64 and job.global_batch_size == 64
    assert job.checkpoint_dir == Path(config.checkpoint.folder).parent
    assert job.num_layers == 36 and job.vocab_size == 151936
    assert 3.9e9 < job.num_params < 4.1e9  # Qwen3-4B


def test_finetune_sets_the_recipe_checkpoint_fields(qwen3_4b_assets, text_jsonl, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (qwen3_4b_assets / "model-00001-of-00001.safetensors").write_bytes(b"")  # presence is what is checked
    (qwen3_4b_assets / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})
    )
    cfg = RunConfig(model="Qwen/Qwen3-4B-Instruct-2507", assets_dir=qwen3_4b_assets, backend="hf-v5",
                    dataset=str(text_jsonl), finetune=True)
    job, config = job_and_config(cfg, TRN2, tmp_path)
    ck = config.checkpoint
    assert ck.enable is True
    root = tmp_path / "checkpoint_qwen3_4b_ft"
    assert ck.folder == str(root / "resume")  # resume points only; the HF export goes to root/hf
    assert Path(ck.folder).is_absolute()
    assert ck.initial_load_path == str(qwen3_4b_assets.absolute())
    assert ck.initial_load_in_hf is True and ck.initial_load_model_only is True
    assert ck.last_save_in_hf is True and ck.last_save_model_only is True
    assert ck.interval == 500 and ck.keep_latest_k == 3  # --save-every / --keep-last defaults
    assert ck.export_dtype == "bfloat16"  # the published weights' dtype, not the registry's float16
    assert job.checkpoint_dir == root


def test_save_every_and_keep_last_reach_torchtitan(tiny_assets, tmp_path):
    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="native", finetune=True,
                    checkpoint_dir=tmp_path / "ck", save_every=4, keep_last=0)
    job, config = job_and_config(cfg, CPU, tmp_path)
    assert (config.checkpoint.interval, config.checkpoint.keep_latest_k) == (4, 0)
    assert "config.checkpoint.interval = 4" in job.config_module_text
    assert "config.checkpoint.keep_latest_k = 0" in job.config_module_text


def test_export_without_finetune_starts_from_random_init(tiny_assets, tmp_path):
    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="native", export_hf=True,
                    checkpoint_dir=tmp_path / "ck")
    job, config = job_and_config(cfg, CPU, tmp_path)
    assert config.checkpoint.enable and config.checkpoint.last_save_in_hf
    assert config.checkpoint.initial_load_path is None and not config.checkpoint.initial_load_in_hf
    assert config.checkpoint.export_dtype == "float32"  # the tiny model's own dtype
    assert job.checkpoint_dir == tmp_path / "ck"


# --- native --------------------------------------------------------------------------------------


def test_native_matches_the_recipe_on_64_ranks(qwen3_4b_assets, text_jsonl, tmp_path):
    cfg = RunConfig(model="Qwen/Qwen3-4B-Instruct-2507", assets_dir=qwen3_4b_assets, backend="native",
                    dataset=str(text_jsonl), steps=10, local_batch_size=1)
    job, config = job_and_config(cfg, TRN2, tmp_path)
    from torchtitan.trainer import Trainer

    from trnqwen.runtime.trainer import TrnqwenTrainer

    assert isinstance(config, Trainer.Config) and type(config) is TrnqwenTrainer.Config
    assert config.model_spec.name == "qwen3" and config.model_spec.flavor == "4B"
    inner = config.model_spec.model.layers[0].attention.inner_attention
    assert type(inner).__qualname__ == "FlexAttention.Config"  # 0.3.0 refuses "sdpa"
    assert config.model_spec.model.layers[0].attention.rope.theta == 5000000.0  # the checkpoint's, not 1e6
    assert any("rope theta" in note for note in job.notes)
    assert config.hf_assets_path == str(qwen3_4b_assets.absolute())
    assert config.training.steps == 10
    assert config.training.local_batch_size == 1
    assert config.training.global_batch_size == 64
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.loss.loss_fn.global_vocab_size == 151936
    assert job.model_flavor == "4B"


def test_native_builds_any_qwen3_from_config_json(tiny_assets, tmp_path):
    """The tiny model matches no flavor: its spec is built from config.json, and it builds."""
    import torch

    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="native", seq_len=256)
    job, config = job_and_config(cfg, CPU, tmp_path)
    assert job.model_flavor == "config.json"
    hf = json.loads((tiny_assets / "config.json").read_text())
    model_cfg = config.model_spec.model
    assert model_cfg.dim == hf["hidden_size"] and len(model_cfg.layers) == hf["num_hidden_layers"]
    assert model_cfg.enable_weight_tying is hf["tie_word_embeddings"]
    assert config.parallelism.spmd_backend == "partial_dtensor"  # native on CPU
    # a CPU run trains in float32 as hf-trainer does (torchtitan's FSDP default casts to bfloat16)
    assert config.training.mixed_precision_param == "float32"
    assert job.entry_module == "trnqwen.runtime.entry" and "--trnqwen-device" in job.entry_args
    with torch.device("meta"):
        model = model_cfg.build()
    assert sum(p.numel() for p in model.parameters()) == job.num_params


def test_exported_config_loads_through_torchtitans_config_manager(tiny_assets, tmp_path, monkeypatch):
    """--module/--config and --section.key flags work on the generated module as on the recipe's."""
    from torchtitan.config import ConfigManager

    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="hf-v5", seq_len=128)
    text = render_config_module(cfg, CPU)
    name = f"gen_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = ConfigManager().parse_args(["--module", name, "--config", "trnqwen_hf_v5", "--training.steps", "7"])
    sys.modules.pop(name, None)
    assert config.training.steps == 7 and config.training.seq_len == 128
    assert config.hf_model == str(tiny_assets.absolute())
    assert config.metrics.backend == "hf-v5"  # what the metrics stream's header says (not "torchtitan")


# --- nki-moe -------------------------------------------------------------------------------------


def test_nki_moe_calls_the_documented_entry_point(neuron_double, tmp_path, text_jsonl):
    cfg = RunConfig(model="Qwen/Qwen3-30B-A3B", assets_dir=tmp_path / "none", backend="nki-moe",
                    dataset=str(text_jsonl))
    job = build_job(cfg, TRN2, None, check_runtime=False)
    assert "qwen3_nki_moe_config(" in job.config_module_text
    config = load_config(job.config_module_text, job.config_fn, tmp_path)
    call = neuron_double.CALLS[-1]
    assert (call["flavor"], call["n_layers"], call["num_experts"], call["top_k"]) == ("30B-A3B", 4, 64, 4)
    assert call["compile_config"].enable is False and call["compile_config"].backend == "neuron"
    layer = config.model_spec.model.layers[0]
    assert len(config.model_spec.model.layers) == 4 and layer.moe.num_experts == 64 and layer.moe.router.top_k == 4
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.parallelism.tensor_parallel_degree == 1
    assert config.parallelism.expert_parallel_degree == 1
    assert config.hf_assets_path == str((tmp_path / "none").absolute())
    assert job.num_layers == 4 and job.model_flavor == "30B-A3B"
    assert config.metrics.backend == "nki-moe"


def test_nki_moe_compile_adds_grad_clip(neuron_double, tmp_path, text_jsonl):
    cfg = RunConfig(model="Qwen/Qwen3-30B-A3B", assets_dir=tmp_path, backend="nki-moe", dataset=str(text_jsonl),
                    compile=True, moe_layers=2, num_experts=8, top_k=2)
    load_config(render_config_module(cfg, TRN2), "trnqwen_nki_moe", tmp_path)
    call = neuron_double.CALLS[-1]
    assert call["compile_config"].enable is True
    assert "grad_clip" in call["compile_config"].components
    assert (call["n_layers"], call["num_experts"], call["top_k"]) == (2, 8, 2)


def test_nki_moe_without_torchtitan_neuron(tmp_path, text_jsonl):
    assert importlib.util.find_spec("torchtitan_neuron") is None
    cfg = RunConfig(model="Qwen/Qwen3-30B-A3B", assets_dir=tmp_path, backend="nki-moe", dataset=str(text_jsonl))
    with pytest.raises(EnvironmentProblem, match="torchtitan-neuron") as err:
        build_job(cfg, TRN2, None)
    assert err.value.hint and "--dry-run" in err.value.hint
    text = render_config_module(cfg, TRN2)  # --dry-run / --export-config still work
    assert "from torchtitan_neuron.models.qwen3.config_registry import qwen3_nki_moe_config" in text
    job = build_job(cfg, TRN2, None, check_runtime=False)
    assert any("torchtitan-neuron is not installed" in n for n in job.notes)


# --- errors --------------------------------------------------------------------------------------


def test_hf_trainer_has_no_torchtitan_config_module(tiny_assets):
    """hf-trainer is dispatched to its own recipe; the torchtitan renderer refuses it clearly."""
    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="hf-trainer")
    with pytest.raises(TrnqwenError, match="hf-trainer"):
        render_config_module(cfg, CPU)


def test_missing_assets_are_reported_by_preflight_not_the_recipe(tiny_assets, tmp_path, text_jsonl):
    """The recipe builds the job without assets (config.json read as None); preflight is the one
    place that reports what is missing, each with the fetch command as the fix."""
    from trnqwen.train.preflight import preflight as _preflight
    from trnqwen.train.topology import plan_topology

    def preflight(cfg, device, job, nproc, **kwargs):
        topo = plan_topology(cfg.model_copy(update={"nproc_per_node": nproc}), device)
        return _preflight(cfg, device, job, topo, **kwargs)

    cfg = RunConfig(model="Qwen/Qwen3-4B-Instruct-2507", assets_dir=tmp_path / "nope", dataset=str(text_jsonl))
    job = build_job(cfg, CPU, None)
    err = preflight(cfg, CPU, job, 1, assets_dir=tmp_path / "nope").errors
    assert "model assets not found" in err[0].message and "trnqwen fetch" in err[0].hint
    partial = tmp_path / "partial"
    shutil.copytree(tiny_assets, partial)
    (partial / "tokenizer.json").unlink()
    cfg_partial = cfg.model_copy(update={"assets_dir": partial})
    err = preflight(cfg_partial, CPU, build_job(cfg_partial, CPU, None), 1, assets_dir=partial).errors
    assert [e.message for e in err] == [f"no tokenizer files in {partial} (need tokenizer.json, or vocab.json + merges.txt)"]
    weightless = tmp_path / "weightless"
    shutil.copytree(tiny_assets, weightless)
    for f in weightless.glob("*.safetensors"):
        f.unlink()
    cfg_w = cfg.model_copy(update={"assets_dir": weightless, "finetune": True})
    (weightless / "model.safetensors.index.json").unlink()
    err = preflight(cfg_w, CPU, build_job(cfg_w, CPU, None), 1, assets_dir=weightless).errors
    assert len(err) == 1 and "no *.safetensors" in err[0].message


def test_batch_sizes_must_agree_with_ranks(tiny_assets, tmp_path):
    """The topology's problem is preflight's to report: the run stops before anything starts."""
    from trnqwen.train.run import plan_train

    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, global_batch_size=65, backend="native",
                    runs_dir=tmp_path / "runs")
    plan = plan_train(cfg, device=TRN2, cwd=tmp_path)
    assert [f.check for f in plan.preflight.errors] == ["batch"]
    with pytest.raises(UsageError, match="global batch 65 is not a multiple of local batch 1 x data-parallel degree 64"):
        plan.preflight.raise_for_errors()
    assert not (tmp_path / "runs").exists()


# --- data ----------------------------------------------------------------------------------------


def test_default_corpus_streams_through_torchtitans_registry(tmp_path, tiny_assets):
    """No --dataset on the tiny model: the generated module registers the bundled corpus with
    torchtitan and its loader really reads it, one document per paragraph, offline."""
    from trnqwen.fetch.builtin import corpus_documents

    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="hf-v5", seq_len=64)
    job, config = job_and_config(cfg, CPU, tmp_path)
    assert type(config.dataloader).__qualname__ == "HuggingFaceTextDataLoader.Config"
    assert config.dataloader.dataset == "trnqwen_data" and job.dataset_cache is None
    assert job.env["HF_HUB_OFFLINE"] == "1"
    from torchtitan.hf_datasets.text_datasets import DATASETS

    entry = DATASETS["trnqwen_data"]
    texts = [entry.sample_processor(row) for row in entry.loader(entry.path)]
    assert [t.strip() for t in texts] == corpus_documents()


def test_torchtitan_names_stream_and_named_data_never_reaches_them(tmp_path, qwen3_4b_assets, monkeypatch):
    from trnqwen.train.cache_data import reads_cache

    cfg = RunConfig(model="Qwen/Qwen3-4B-Instruct-2507", assets_dir=qwen3_4b_assets, backend="hf-v5")
    job, config = job_and_config(cfg, TRN2, tmp_path)
    assert config.dataloader.dataset == "c4" and "HF_HUB_OFFLINE" not in job.env
    assert any("c4 streams from the Hugging Face Hub" in n for n in job.notes)
    api = compat.detect()
    if not api.c4_test_in_package:
        with pytest.raises(UsageError, match="c4_test") as exc:
            resolve_dataset("c4_test", model_is_builtin=False, api=api)
        assert exc.value.hint
    # Every dataset the user names goes through the token cache; resolve_dataset refuses one.
    assert not reads_cache(None) and not reads_cache("c4") and reads_cache("data.jsonl") and reads_cache("org/name")
    with pytest.raises(ValueError, match="prepare_rank_data"):
        resolve_dataset("data.jsonl", model_is_builtin=False, api=api)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c4").mkdir()
    assert reads_cache("c4")  # a local folder of that name is the user's data, as before


def test_named_datasets_train_from_the_token_cache(tmp_path, tiny_assets, text_jsonl):
    """Chat (multi-turn, system prompts) and text records alike: tokenized once by the launcher,
    read by every rank through TokenCacheDataLoader (no torchtitan ChatDataLoader limits)."""
    from trnqwen.dataset.cache import open_split

    multi = tmp_path / "multi.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
             {"role": "assistant", "content": "Goodbye."}]
    multi.write_text(json.dumps({"messages": turns}) + "\n")
    for data, rows in ((multi, 1), (text_jsonl, None)):
        cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="hf-v5", dataset=str(data), seq_len=64)
        job, config = job_and_config(cfg, CPU, tmp_path)
        assert type(config.dataloader).__qualname__ == "TokenCacheDataLoader.Config"
        assert config.model_spec.model.attn_mask_type == "block_causal"
        split = open_split(config.dataloader.cache_dir, "train")
        assert split.seq_len == 64 and (rows is None or len(split) == rows)
        assert job.dataset_cache == Path(config.dataloader.cache_dir)


def test_count_params_matches_a_registered_flavor():
    import torch

    flavors = compat.native_flavors()
    from torchtitan.models.qwen3 import model_registry

    spec = model_registry("0.6B")
    with torch.device("meta"):
        model = spec.model.build()
    assert count_params(flavors["0.6B"]) == sum(p.numel() for p in model.parameters())


def test_nki_moe_lora_adapts_attention_and_leaves_routed_experts_frozen(neuron_double, tmp_path, text_jsonl):
    """The plan for a LoRA fine-tune of the nki-moe recipe, evaluated against the torchtitan-neuron
    double: torchtitan's converter puts adapters on the fused wqkv and wo, nothing on the experts."""
    from torchtitan.components.lora import LoRAConverter  # noqa: F401  (the converter the module calls)

    cfg = RunConfig(model="Qwen/Qwen3-30B-A3B", assets_dir=tmp_path / "none", backend="nki-moe",
                    dataset=str(text_jsonl), lora=True, lora_rank=8, moe_layers=2, num_experts=8, top_k=2)
    job = build_job(cfg, TRN2, None, check_runtime=False)
    assert "backend='nki-moe'" in job.config_module_text
    assert any("routed experts stay frozen" in n and "gate_proj" in n for n in job.notes), job.notes
    config = load_config(job.config_module_text, job.config_fn, tmp_path)
    for layer in config.model_spec.model.layers:
        attention = layer.attention
        assert getattr(attention.qkv_linear.wqkv, "rank", None) == 8 and getattr(attention.wo, "rank", None) == 8
        assert not hasattr(layer.moe.router.gate, "rank")  # the router: never adapted
        assert not any(hasattr(c, "rank") for _f, c, _p, _a in layer.moe.traverse(object))
    with pytest.raises(UsageError, match="routed experts"):
        build_job(RunConfig(model="Qwen/Qwen3-30B-A3B", assets_dir=tmp_path / "none", backend="nki-moe",
                            dataset=str(text_jsonl), lora=True, lora_targets="gate_proj"), TRN2, None, check_runtime=False)
