"""Preflight: assets, NKI RoPE seq_len, batch/parallel consistency, ranks vs devices, memory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from trnqwen.config import RunConfig
from trnqwen.env.device import DeviceInfo
from trnqwen.errors import UsageError
from trnqwen.titan_compat import dims_from_hf_config
from trnqwen.train.job import TrainJob
from trnqwen.train.memory import count_params, estimate_memory
from trnqwen.train.preflight import (
    ERROR,
    INFO,
    WARNING,
)
from trnqwen.train.preflight import preflight as _preflight
from trnqwen.train.topology import plan_topology

GIB = 1024**3
TRN2 = DeviceInfo(type="neuron", count=64, lnc=2, memory_bytes_per_rank=24 * GIB, instance_type="trn2.48xlarge")
CPU = DeviceInfo(type="cpu", count=1)
JOB = TrainJob(backend="hf-v5", entry_module="torchtitan.train")

# Qwen/Qwen3-4B(-Instruct-2507) config.json fields (public model card facts).
QWEN3_4B = {
    "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936,
    "tie_word_embeddings": True, "rope_theta": 5000000,
}
TINY = {
    "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 96,
    "tie_word_embeddings": True, "rope_theta": 1000000,
}


def preflight(cfg: RunConfig, device: DeviceInfo, job: TrainJob, nproc_per_node: int, **kwargs):
    """Preflight of ``cfg`` with ``nproc_per_node`` ranks per node (the topology as plan_train makes it)."""
    topo = plan_topology(cfg.model_copy(update={"nproc_per_node": nproc_per_node}), device)
    return _preflight(cfg, device, job, topo, **kwargs)


def _assets(root: Path, *, config=TINY, weights=True, shards=1, tokenizer=True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
        (root / "tokenizer_config.json").write_text("{}")
    if weights:
        weight_map = {}
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            key = f"model.layers.{i}.mlp.up_proj.weight"
            save_file({key: np.ones((8, 8), dtype=np.float32)}, str(root / name))
            weight_map[key] = name
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def _checks(report, severity):
    return {f.check for f in report.findings if f.severity == severity}


# --- assets ----------------------------------------------------------------------------------


def test_complete_assets_pass(tmp_path):
    assets = _assets(tmp_path / "m", shards=2)
    report = preflight(RunConfig(finetune=True, seq_len=256), CPU, JOB, 1, assets_dir=assets)
    assert report.ok, report.findings
    report.raise_for_errors()


def test_missing_folder_config_tokenizer(tmp_path):
    r = preflight(RunConfig(), CPU, JOB, 1, assets_dir=tmp_path / "nope")
    assert not r.ok and "not a folder" in r.errors[0].message and "trnqwen fetch" in r.errors[0].hint
    bare = tmp_path / "bare"
    bare.mkdir()
    msgs = " ".join(f.message for f in preflight(RunConfig(), CPU, JOB, 1, assets_dir=bare).errors)
    assert "config.json is missing" in msgs and "no tokenizer files" in msgs
    notok = _assets(tmp_path / "notok", tokenizer=False)
    assert "tokenizer" in preflight(RunConfig(), CPU, JOB, 1, assets_dir=notok).errors[0].message


def test_finetune_needs_weights_but_random_init_does_not(tmp_path):
    assets = _assets(tmp_path / "m", weights=False)
    assert preflight(RunConfig(finetune=False), CPU, JOB, 1, assets_dir=assets).ok
    r = preflight(RunConfig(finetune=True), CPU, JOB, 1, assets_dir=assets)
    assert not r.ok and "no *.safetensors" in r.errors[0].message


def test_missing_and_truncated_shards(tmp_path):
    assets = _assets(tmp_path / "m", shards=3)
    (assets / "model-00002-of-00003.safetensors").unlink()
    r = preflight(RunConfig(finetune=True), CPU, JOB, 1, assets_dir=assets)
    assert "model-00002-of-00003.safetensors" in r.errors[0].message
    assets = _assets(tmp_path / "t", shards=1)
    shard = assets / "model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])  # an interrupted download
    r = preflight(RunConfig(finetune=True), CPU, JOB, 1, assets_dir=assets)
    assert not r.ok and "truncated" in r.errors[0].message
    (assets / "config.json").write_text('{"hidden_size": 6')
    assert any("not valid JSON" in f.message for f in preflight(RunConfig(), CPU, JOB, 1, assets_dir=assets).errors)


# --- seq_len ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "imports, seq_len, lnc, ok",
    [
        (["my_kernels.nki_rope"], 2000, 2, False),
        (["my_kernels.nki_rope"], 2048, 2, True),
        (["my_kernels.nki_rope"], 128, 2, False),  # 256 at LNC=2
        (["my_kernels.rope_override"], 384, 1, True),  # 128 at LNC=1
        (["pkg.dense_attention"], 2000, 2, True),  # no RoPE kernel: no constraint
        ([], 1000, 2, True),
    ],
)
def test_nki_rope_seq_len_multiple_of_128_lnc(tmp_path, imports, seq_len, lnc, ok):
    assets = _assets(tmp_path / "m")
    cfg = RunConfig(override_imports=imports, seq_len=seq_len, lnc=lnc)
    r = preflight(cfg, TRN2, JOB, 64, assets_dir=assets)
    assert ("seq_len" not in _checks(r, ERROR)) is ok
    if not ok:
        assert str(128 * lnc) in r.errors[0].message and "--seq-len" in r.errors[0].hint


def test_rope_tile_follows_device_lnc_when_not_configured(tmp_path):
    assets = _assets(tmp_path / "m")
    cfg = RunConfig(override_imports=["k.nki_rope"], seq_len=384)
    assert "seq_len" in _checks(preflight(cfg, TRN2, JOB, 64, assets_dir=assets), ERROR)
    lnc1 = DeviceInfo(type="neuron", count=128, lnc=1, memory_bytes_per_rank=12 * GIB)
    assert "seq_len" not in _checks(preflight(cfg, lnc1, JOB, 128, assets_dir=assets), ERROR)


# --- batch / parallelism / ranks -------------------------------------------------------------


def test_batch_consistency(tmp_path):
    assets = _assets(tmp_path / "m")
    ok = preflight(RunConfig(global_batch_size=64), TRN2, JOB, 64, assets_dir=assets)
    assert ok.ok and ok.dp == 64 and ok.grad_accum_steps == 1
    accum = preflight(RunConfig(global_batch_size=128), TRN2, JOB, 64, assets_dir=assets)
    assert accum.ok and accum.grad_accum_steps == 2 and "batch" in _checks(accum, INFO)
    bad = preflight(RunConfig(global_batch_size=100), TRN2, JOB, 64, assets_dir=assets)
    assert "batch" in _checks(bad, ERROR) and "--global-batch-size 64" in bad.errors[0].hint
    tp = preflight(RunConfig(tp=4, global_batch_size=16, local_batch_size=1), TRN2, JOB, 64, assets_dir=assets)
    assert tp.ok and tp.dp == 16
    with pytest.raises(UsageError, match="global batch 100"):
        bad.raise_for_errors()


def test_parallel_degrees_must_cover_ranks(tmp_path):
    assets = _assets(tmp_path / "m")
    assert "parallelism" in _checks(preflight(RunConfig(dp_shard=3), CPU, JOB, 4, assets_dir=assets), ERROR)
    assert "parallelism" in _checks(preflight(RunConfig(tp=3), CPU, JOB, 4, assets_dir=assets), ERROR)
    assert preflight(RunConfig(dp_shard=2, tp=2), CPU, JOB, 4, assets_dir=assets).ok
    # Multi-node: the world is nproc x nnodes.
    two = RunConfig(nnodes=2, node_rank=0, rdzv_endpoint="h:1", global_batch_size=128)
    r = preflight(two, TRN2, JOB, 64, assets_dir=assets)
    assert r.ok and r.world_size == 128 and r.dp == 128


def test_ranks_not_above_devices(tmp_path):
    assets = _assets(tmp_path / "m")
    r = preflight(RunConfig(), TRN2, JOB, 128, assets_dir=assets)
    assert "ranks" in _checks(r, ERROR) and "--nproc-per-node 64" in r.errors[0].hint
    gpus = DeviceInfo(type="cuda", count=8, memory_bytes_per_rank=80 * GIB)
    assert "ranks" in _checks(preflight(RunConfig(), gpus, JOB, 16, assets_dir=assets), ERROR)
    assert preflight(RunConfig(), gpus, JOB, 8, assets_dir=assets).ok
    import os

    cores = os.cpu_count() or 1
    some = preflight(RunConfig(), CPU, JOB, cores + 1, assets_dir=assets)
    assert some.ok and "ranks" in _checks(some, WARNING)  # CPU ranks are processes: a few more is slow, not wrong
    many = preflight(RunConfig(), CPU, JOB, 100_000, assets_dir=assets)  # issue 18: thousands per core never run
    assert "ranks" in _checks(many, ERROR) and f"--nproc-per-node {cores}" in many.errors[0].hint


# --- memory ----------------------------------------------------------------------------------


def test_param_count_matches_published_qwen3_4b():
    # Qwen3-4B: "Number of Parameters: 4.0B" (4,022,468,096 with tied embeddings).
    n = count_params(dims_from_hf_config(QWEN3_4B))
    assert abs(n - 4_022_468_096) / 4_022_468_096 < 0.001


@pytest.mark.parametrize("tied", [True, False])
def test_param_count_matches_transformers_qwen3(tied):
    """The same config built by transformers' own Qwen3 (on the meta device) has as many parameters."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = {**TINY, "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6,
          "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 200, "vocab_size": 500,
          "tie_word_embeddings": tied}
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**hf))
    total = sum(p.numel() for p in model.parameters())  # tied weights count once
    assert count_params(dims_from_hf_config(hf)) == total


def test_memory_recipe_fits_trn2_and_long_sequences_warn(tmp_path):
    assets = _assets(tmp_path / "m", config=QWEN3_4B, weights=False)
    r = preflight(RunConfig(seq_len=2048), TRN2, JOB, 64, assets_dir=assets)
    est = r.memory
    assert r.ok and "memory" not in _checks(r, WARNING)
    # FSDP over 64 ranks: params+grads+AdamW = 16 B/param / 64.
    assert est.params + est.grads + est.optimizer == pytest.approx(16 * est.num_params / 64, rel=0.01)
    assert est.total < 0.9 * TRN2.memory_bytes_per_rank
    big = preflight(RunConfig(seq_len=32768, local_batch_size=4), TRN2, JOB, 64, assets_dir=assets)
    assert "memory" in _checks(big, ERROR) and not big.ok  # beyond HBM: an error (issue 18), not a warning
    # TP splits activations and logits; fewer FSDP ranks mean more state per rank.
    tp = estimate_memory(dims_from_hf_config(QWEN3_4B), RunConfig(seq_len=32768, local_batch_size=4, tp=8), dp=8)
    assert tp.activations * 8 == pytest.approx(big.memory.activations, rel=0.01)
    one = estimate_memory(dims_from_hf_config(QWEN3_4B), RunConfig(), dp=1)
    assert one.optimizer == pytest.approx(64 * est.optimizer, rel=0.01)


def test_memory_without_capacity_is_info_only(tmp_path):
    assets = _assets(tmp_path / "m", config=QWEN3_4B, weights=False)
    r = preflight(RunConfig(seq_len=32768, local_batch_size=8), CPU, JOB, 1, assets_dir=assets)
    assert r.memory is not None and r.memory.capacity is None and r.host_memory.capacity is None
    assert "host-memory" in _checks(r, INFO) and not _checks(r, WARNING) and r.ok


def test_cpu_memory_beyond_host_ram_is_an_error(tmp_path):
    """Issue 18: ~33 GiB per rank against 23 GiB of host RAM was only info."""
    assets = _assets(tmp_path / "m", config=QWEN3_4B, weights=False)
    host = DeviceInfo(type="cpu", count=1, host_memory_bytes=23 * GIB)
    r = preflight(RunConfig(seq_len=4096), host, JOB, 2, assets_dir=assets)
    assert r.host_memory.per_node > 23 * GIB
    assert "host-memory" in _checks(r, ERROR) and "host RAM" in r.errors[0].message


def test_host_memory_of_64_ranks_each_loading_a_full_30b_checkpoint(tmp_path):
    """Issue 18: 64 ranks each holding the whole 30B checkpoint is ~3.8 TB, beyond a trn2's 2 TiB,
    reported next to the per-rank HBM estimate (which fits)."""
    moe = {
        **QWEN3_4B, "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    assets = _assets(tmp_path / "m", config=moe, weights=False)
    trn2 = DeviceInfo(type="neuron", count=64, lnc=2, memory_bytes_per_rank=24 * GIB, host_memory_bytes=2048 * GIB)
    r = preflight(RunConfig(finetune=True, seq_len=2048), trn2, JOB, 64, assets_dir=_no_weights_check(assets))
    host = r.host_memory
    assert host.checkpoint == pytest.approx(2 * 30.5e9, rel=0.02)  # bf16, the whole model, per rank
    assert host.at_load * 64 == pytest.approx(3.8e12, rel=0.08)
    assert "host-memory" in _checks(r, ERROR) and "memory" not in _checks(r, ERROR)
    assert host.training == 0  # on Neuron the training state lives in HBM


def _no_weights_check(assets: Path) -> Path:
    """A fine-tune's assets: the shard the index names (tiny), so only memory decides."""
    save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(assets / "model.safetensors"))
    return assets


def test_seq_len_beyond_the_context_without_rope_scaling(tmp_path):
    limited = _assets(tmp_path / "m", config={**TINY, "max_position_embeddings": 1024})
    r = preflight(RunConfig(seq_len=2048), CPU, JOB, 1, assets_dir=limited)
    assert "seq_len" in _checks(r, ERROR) and "--seq-len 1024" in r.errors[0].hint
    assert preflight(RunConfig(seq_len=1024), CPU, JOB, 1, assets_dir=limited).ok
    scaled = _assets(tmp_path / "s", config={**TINY, "max_position_embeddings": 1024,
                                             "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert preflight(RunConfig(seq_len=2048), CPU, JOB, 1, assets_dir=scaled).ok


def test_override_modules_are_located_without_importing_anything(tmp_path):
    import sys

    from trnqwen.train.preflight import locate_module

    pkg = tmp_path / "kern_pkg_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('a heavy SDK import that preflight must not run')\n")
    (pkg / "rope.py").write_text("")
    path = [str(tmp_path), *sys.path]
    assert locate_module("kern_pkg_xyz.rope", path) is None
    assert locate_module("kern_pkg_xyz.nope", path) == "kern_pkg_xyz.nope"
    assert locate_module("no_such_top_xyz.mod", path) == "no_such_top_xyz"
    assert locate_module("json", path) is None and locate_module("sys", path) is None
    assert "kern_pkg_xyz" not in sys.modules


def test_nki_moe_estimate_uses_cut_model(tmp_path):
    moe = {
        **QWEN3_4B, "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "tie_word_embeddings": False,
    }
    assets = _assets(tmp_path / "m", config=moe, weights=False)
    full = dims_from_hf_config(moe)
    assert abs(count_params(full) - 30.5e9) / 30.5e9 < 0.02  # Qwen3-30B-A3B: 30.5B total
    r = preflight(RunConfig(backend="nki-moe", moe_layers=4, num_experts=64, top_k=4), TRN2, JOB, 64, assets_dir=assets)
    assert r.memory.num_params < count_params(full) / 10
