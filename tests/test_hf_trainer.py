"""The hf-trainer backend: spec/flags, parallel plan, step-line format, recipe, and real CPU runs.

Real runs (``slow``): one 2-rank torchrun of ``trnqwen.runtime.hf_trainer`` (fine-tune the tiny
Qwen3, export, verify the checkpoint, parse the log), one single-process random-init run, and the
same fine-tune through ``trnqwen train --backend hf-trainer`` (the second and last torchrun).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trnqwen.runtime import hf_trainer as hft
from trnqwen.contract.stepline import format_step_line
from trnqwen.runtime.hf_trainer_metrics import step_metrics
from trnqwen.contract.hf_trainer_spec import (
    SPEC_FILE_NAME,
    HFTrainerSpec,
    SpecError,
    choose_strategy,
    flops_per_token,
    spec_from_argv,
    spec_to_argv,
)
from trnqwen.contract.topology import topology


def _rank_plan(world_size, tp, dp_shard, *, device, local_batch_size=1, global_batch_size=None, **kwargs):
    """The hf-trainer rank's plan: the topology of its ranks, then the Trainer strategy."""
    ranks = topology(nproc_per_node=world_size, tp=tp, dp_shard=dp_shard,
                     local_batch_size=local_batch_size, global_batch_size=global_batch_size)
    return choose_strategy(ranks, device=device, **kwargs)

STEPS = 3
SEQ_LEN = 128


# --- spec and flags ------------------------------------------------------------------------------


def _spec(**over) -> HFTrainerSpec:
    base = dict(assets_dir="/a/tiny", model="builtin:tiny-qwen3", steps=3, seq_len=128, finetune=True,
                checkpoint_dir="/c", export_hf=True, output_dir="/r")
    return HFTrainerSpec(**{**base, **over}).validate()


def test_spec_round_trips_through_flags():
    spec = _spec(global_batch_size=8, lr=3e-4, seed=None, tp=2, compile=True, peak_flops_per_rank=1.57e14,
                 memory_bytes_per_rank=24 * 2**30, dataset="c4_validation", device="neuron")
    assert spec_from_argv(spec_to_argv(spec)) == spec


def test_defaults_are_not_written_as_flags():
    argv = spec_to_argv(HFTrainerSpec(assets_dir="/a"))
    assert argv == ["--assets-dir", "/a"]


def test_spec_file_then_flags_override(tmp_path):
    path = tmp_path / SPEC_FILE_NAME
    path.write_text(_spec(steps=7).to_json())
    spec = spec_from_argv([str(path), "--steps", "2", "--no-export-hf"])
    assert spec.steps == 2 and spec.export_hf is False and spec.seq_len == 128 and spec.assets_dir == "/a/tiny"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--dp-shard", "0", "--assets-dir", "/a"], "dp_shard"),
        (["--assets-dir", "/a", "--export-hf"], "checkpoint_dir"),
        (["--steps", "1"], "assets_dir"),
        (["--assets-dir", "/a", "--device", "auto"], "device"),
        (["--assets-dir", "/a", "--strategy", "zero3"], "strategy"),
        # a file reaches the ranks as the launcher's token cache, never as a dataset to stream
        (["--assets-dir", "/a", "--dataset", "/d/data.jsonl"], "'/d/data.jsonl'.*cache_dir"),
    ],
)
def test_bad_specs_are_refused(argv, words):
    with pytest.raises(SpecError, match=words):
        spec_from_argv(argv)


def test_spec_file_with_unknown_key(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"assets_dir": "/a", "stepz": 3}))
    with pytest.raises(SpecError, match="stepz"):
        spec_from_argv([str(path)])


def test_main_reports_spec_errors_with_exit_2(capsys):
    assert hft.main(["--assets-dir", "/a", "--dp-shard", "-3"]) == 2
    err = capsys.readouterr().err
    assert "dp_shard" in err and "Traceback" not in err


# --- parallelism ---------------------------------------------------------------------------------


def test_plan_shards_over_all_ranks_left_after_tp():
    plan = _rank_plan(64, 2, -1, device="neuron")
    assert (plan.tp, plan.fsdp, plan.dp, plan.strategy, plan.grad_accum) == (2, 32, 32, "distributed-config", 1)


def test_plan_gradient_accumulation_from_global_batch():
    plan = _rank_plan(4, 1, -1, device="cpu", local_batch_size=2, global_batch_size=32)
    assert plan.grad_accum == 4
    with pytest.raises(SpecError, match="multiple"):
        _rank_plan(4, 1, -1, device="cpu", local_batch_size=2, global_batch_size=12)


@pytest.mark.parametrize("world, tp, dp_shard", [(4, 3, -1), (8, 2, 2), (8, 1, 3)])
def test_plan_refuses_degrees_that_do_not_cover_the_ranks(world, tp, dp_shard):
    with pytest.raises(SpecError):
        _rank_plan(world, tp, dp_shard, device="cpu")


def test_plan_without_distributed_config():
    plan = _rank_plan(2, 1, -1, device="cpu", has_distributed_config=False)
    assert plan.strategy == "ddp" and any("DDP" in n for n in plan.notes)
    with pytest.raises(SpecError, match="DistributedConfig"):
        _rank_plan(4, 2, -1, device="neuron", has_distributed_config=False)
    assert _rank_plan(1, 1, -1, device="cpu").strategy == "single"
    assert _rank_plan(2, 1, -1, device="cpu", strategy="ddp").strategy == "ddp"


def test_load_kwargs_never_auto_and_shard_sizes():
    dc = _rank_plan(64, 1, -1, device="neuron")
    assert hft.load_kwargs("neuron", dc, 3) == {"distributed_config": {"tp_size": 1, "fsdp_size": 64}, "device_map": "neuron"}
    tp = _rank_plan(4, 2, -1, device="neuron")
    assert hft.load_kwargs("neuron", tp, 0) == {"distributed_config": {"tp_size": 2, "fsdp_size": 2}}  # mesh places shards
    single = _rank_plan(1, 1, -1, device="cuda")
    assert hft.load_kwargs("cuda", single, 0) == {"device_map": "cuda:0"}
    for device in ("neuron", "cuda", "cpu"):
        for plan in (dc, tp, single):
            assert "auto" not in str(hft.load_kwargs(device, plan, 1))


def test_training_arguments_follow_the_neuron_rules():
    plan = _rank_plan(64, 1, -1, device="neuron", local_batch_size=1, global_batch_size=128)
    args = hft.training_arguments(_spec(device="neuron", compile=True, local_batch_size=1), plan, bf16_supported=True)
    assert args["bf16"] is True and args["torch_compile"] is True and args["dataloader_drop_last"] is True
    assert args["use_cpu"] is False and args["gradient_accumulation_steps"] == 2 and args["max_steps"] == 3
    # sharded at load (DistributedConfig) and still resumable: DCP checkpoints (hf_trainer_checkpoint)
    assert plan.strategy == "distributed-config" and args["save_strategy"] == "steps" and args["logging_steps"] == 1
    unsaved = hft.training_arguments(_spec(device="neuron", checkpoint_dir=None, export_hf=False), plan, bf16_supported=True)
    assert unsaved["save_strategy"] == "no"
    cpu_plan = _rank_plan(2, 1, -1, device="cpu", strategy="ddp")
    cpu = hft.training_arguments(_spec(device="cpu"), cpu_plan, bf16_supported=True)
    assert cpu["bf16"] is False and cpu["use_cpu"] is True and cpu["ddp_backend"] == "gloo"
    assert "seed" not in hft.training_arguments(_spec(seed=None), cpu_plan, bf16_supported=False)


def test_training_arguments_are_accepted_by_transformers(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    plan = _rank_plan(1, 1, -1, device="cpu")
    args = TrainingArguments(**hft.training_arguments(_spec(output_dir=str(tmp_path)), plan, bf16_supported=False))
    assert args.dataloader_drop_last and args.max_steps == 3 and not args.bf16


# --- step lines and FLOPs --------------------------------------------------------------------------


def test_step_line_is_torchtitans_format():
    # torchtitan 0.3.0's line from a CPU run, colour codes removed (reference/torchtitan-0.3.0-on-cpu.md).
    expected = "step:  1  loss:  7.60683  grad_norm: 10.0349  memory:  0.00GiB(0.00%)  tps: 108  tflops: 0.03  mfu: 0.01%"
    assert format_step_line(1, 7.60683, 10.0349, 0.0, 0.0, 108, 0.03, 0.01) == expected
    assert format_step_line(12, 1.5, 0.5, 1.25, 5.0, 12345.6, 1234.567, None).endswith("tps: 12,346  tflops: 1,234.57  mfu: N/A")


@pytest.mark.parametrize(
    "values",
    [
        (1, 7.60683, 10.0349, 0.0, 0.0, 108, 0.03, 0.01),
        (250, 2.25, 0.8125, 21.5, 89.58, 123456, 1234.5, 42.5),
        (3, 11.0, 123.0, 0.87, 3.7, 3, 0.0, None),
    ],
)
def test_inspect_logs_parser_reads_every_field(values):
    from trnqwen.contract.stepline import parse_step_line

    line = "[rank0]:" + format_step_line(*values)
    got = parse_step_line(line)
    step, loss, gn, mem, pct, tps, tflops, mfu = values
    assert got["step"] == step and got["tps"] == round(tps)
    for key, want, digits in [("loss", loss, 5), ("grad_norm", gn, 4), ("memory_gib", mem, 2),
                              ("memory_pct", pct, 2), ("tflops", tflops, 2)]:
        assert got[key] == pytest.approx(round(want, digits)), key
    assert got["mfu"] == (None if mfu is None else pytest.approx(mfu))


def test_step_metrics():
    tps, tflops, mfu = step_metrics(tokens=4096, seconds=2.0, flops_token=10**9, peak_flops=157e12)
    assert tps == 2048 and tflops == pytest.approx(2048 * 1e9 / 1e12)
    assert mfu == pytest.approx(100 * 2048e9 / 157e12)
    assert step_metrics(4096, 2.0, 10**9, None)[2] is None


class _State:
    def __init__(self, step: int, zero: bool = True):
        self.global_step, self.is_world_process_zero = step, zero


def _recorder(tmp_path, lines: list):
    from trnqwen.contract.metrics_stream import MetricsWriter
    from trnqwen.runtime.hf_trainer_metrics import StepRecorder

    return StepRecorder(tokens_per_step=256, flops_token=10**6, peak_flops=None, device="cpu", memory_bytes=None,
                        writer=MetricsWriter(tmp_path / "metrics.jsonl"), meta={"backend": "hf-trainer"},
                        log=lines.append, print_line=lines.append)


def test_the_recorder_writes_a_record_per_step_with_the_methods_values_and_prints_the_line(tmp_path):
    """One record per logged step: the core values, the measured ones the trainer put in the logs
    and every logged ``<method>/<name>`` (an invented one too); the step line prints the same loss."""
    from trnqwen.contract.metrics_stream import STEP_CORE, read_stream
    from trnqwen.contract.stepline import parse_step_line
    from trnqwen.runtime.hf_trainer_metrics import metrics_trainer_class

    lines: list[str] = []
    rec = _recorder(tmp_path, lines)
    rec.on_train_begin(None, _State(0), None)
    rec.on_step_begin(None, _State(0), None)  # no scheduler: lr unknown until one is given
    rec.seconds, rec.lr = 0.5, 2e-4

    class Base:
        def log(self, logs):
            self.seen = logs
            rec.on_log(None, _State(1), None, logs=logs)

    trainer = metrics_trainer_class(Base, rec)()
    trainer.log({"loss": 0.6931471, "grad_norm": 0.25, "learning_rate": 1.9e-4, "epoch": 0.1,
                 "dpo/margin": 0.0, "dpo/accuracy": 0.0, "x/novel": 3.5})
    assert trainer.seen["tps"] == 512 and trainer.seen["lr"] == 2e-4 and "mfu" not in trainer.seen  # TensorBoard's
    header, step = read_stream(tmp_path / "metrics.jsonl")
    assert header.kind == "header" and header.meta == {"backend": "hf-trainer"}
    assert step.kind == "step" and step.step == 1 and set(STEP_CORE) <= set(step.values)
    assert step.values["loss"] == 0.6931471 and step.values["lr"] == 2e-4 and step.values["mfu"] is None
    assert (step.values["dpo/margin"], step.values["x/novel"]) == (0.0, 3.5) and "epoch" not in step.values
    line = parse_step_line(lines[-1])
    assert line["step"] == 1 and line["loss"] == round(step.values["loss"], 5) and line["tps"] == 512

    # a validation: its line now, its record with the evaluation's method values under the steps' names
    rec.validation(1, 0.75, 100.0)
    assert lines[-1].startswith("validate step:  1  loss:  0.7500")
    rec.on_evaluate(None, _State(1), None, metrics={"eval_loss": 0.75, "eval_dpo_margin": 0.5, "eval_x/novel": 4.0})
    rec.on_log(None, _State(1), None, logs={"eval_loss": 0.75})  # not a step
    rec.on_train_end(None, _State(1), None)
    validation = read_stream(tmp_path / "metrics.jsonl")[-1]
    assert validation.kind == "validation" and validation.step == 1
    assert validation.values["loss"] == 0.75 and validation.values["tps"] == 100.0
    assert validation.values["dpo/margin"] == 0.5 and validation.values["x/novel"] == 4.0
    assert len(read_stream(tmp_path / "metrics.jsonl")) == 3


def test_the_recorder_writes_nothing_off_rank_0(tmp_path, monkeypatch):
    from trnqwen.contract.metrics_stream import PATH_ENV, MetricsWriter

    monkeypatch.setenv(PATH_ENV, str(tmp_path / "metrics.jsonl"))
    assert MetricsWriter.from_env(rank=1).enabled is False and MetricsWriter.from_env(rank=0).enabled
    lines: list[str] = []
    rec = _recorder(tmp_path, lines)
    rec.on_log(None, _State(1, zero=False), None, logs={"loss": 1.0})
    assert lines == [] and not (tmp_path / "metrics.jsonl").exists()


def test_flops_per_token_matches_torchtitans_dense_formula():
    torch = pytest.importorskip("torch")
    from torchtitan.models.utils import get_dense_model_nparams_and_flops
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    nparams, ours = hft._model_facts(model, seq_len=256)
    # torchtitan's native Qwen3 passes head_dims = 2 * head_dim (qk + v).
    want_n, want = get_dense_model_nparams_and_flops(model, 2, 4, 2 * 16, 256, enable_weight_tying=True)
    assert (nparams, ours) == (want_n, want)
    untied = flops_per_token(1000, 100, 2, 4, 16, 256, tied=False)
    assert untied == 6 * 900 + 12 * 2 * 4 * 16 * 256


# --- recipe --------------------------------------------------------------------------------------


def _cfg(**over):
    from trnqwen.config import resolve_config

    values = dict(backend="hf-trainer", model="builtin:tiny-qwen3", finetune=True, nproc_per_node=2,
                  steps=STEPS, seq_len=SEQ_LEN)
    values.update(over)
    return resolve_config(values, environ={}).config


def test_recipe_job_carries_the_run_config(tmp_path):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    cfg = _cfg(assets_dir=tmp_path / "assets", dataset=str(data), checkpoint_dir=tmp_path / "ck", lr=1e-3)
    job = build_hf_trainer_job(cfg, DeviceInfo(type="cpu", count=1), tmp_path / "run")
    assert job.backend == "hf-trainer" and job.entry_module == "trnqwen.runtime.hf_trainer"
    assert job.config_module is None and job.checkpoint_dir == (tmp_path / "ck").absolute()
    spec = spec_from_argv(job.entry_args)
    assert (spec.steps, spec.seq_len, spec.lr, spec.finetune, spec.export_hf, spec.device) == (STEPS, SEQ_LEN, 1e-3, True, True, "cpu")
    assert spec.assets_dir == str((tmp_path / "assets").absolute())
    # A dataset the user names is tokenized by the launcher; without assets yet, when the run starts.
    assert spec.dataset is None and spec.cache_dir and any("tokenized when the run starts" in n for n in job.notes)
    assert job.env["HF_HUB_OFFLINE"] == "1"
    assert job.world_size in (None, 2)


def test_recipe_refuses_override_imports_and_missing_data(tmp_path):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.errors import UsageError
    from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

    dev = DeviceInfo(type="cpu", count=1)
    with pytest.raises(UsageError, match="override"):
        build_hf_trainer_job(_cfg(override_imports=["my_kernels.rope"]), dev, tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        build_hf_trainer_job(_cfg(dataset=str(tmp_path / "nope.jsonl")), dev, tmp_path)


def test_recipe_needs_accelerate(tmp_path, monkeypatch):
    import importlib.util

    from trnqwen.env.device import DeviceInfo
    from trnqwen.errors import EnvironmentProblem
    from trnqwen.train import hf_trainer_recipe

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    dev = DeviceInfo(type="neuron", count=64, lnc=2)
    with pytest.raises(EnvironmentProblem, match="accelerate"):
        hf_trainer_recipe.build_hf_trainer_job(_cfg(nproc_per_node=None), dev, tmp_path)
    job = hf_trainer_recipe.build_hf_trainer_job(_cfg(nproc_per_node=None), dev, tmp_path, check_runtime=False)
    assert any("accelerate" in n for n in job.notes) and job.world_size in (None, 64)
    assert job.env["HF_DEACTIVATE_ASYNC_LOAD"] == "1" and spec_from_argv(job.entry_args).device == "neuron"


def test_recipe_module_imports_nothing_heavy():
    code = (
        "import sys, trnqwen.train.hf_trainer_recipe, trnqwen.runtime.hf_trainer; "
        "print([m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "[]"


# --- real runs ----------------------------------------------------------------------------------


def _subprocess_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "TRNQWEN_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HOME=str(home / ".cache" / "hf"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", NO_COLOR="1",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _write_tiny(dest: Path) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(dest)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    return _write_tiny(tmp_path_factory.mktemp("hft-assets") / "tiny-qwen3")


@pytest.fixture(scope="session")
def torchrun_finetune(tiny_assets, tmp_path_factory):
    """2 ranks, torchrun directly: fine-tune the tiny Qwen3 for STEPS steps and export."""
    work = tmp_path_factory.mktemp("hft-run")
    spec = HFTrainerSpec(assets_dir=str(tiny_assets), model="builtin:tiny-qwen3", steps=STEPS, seq_len=SEQ_LEN,
                         finetune=True, checkpoint_dir=str(work / "ckpt"), export_hf=True, output_dir=str(work))
    spec_file = work / SPEC_FILE_NAME
    spec_file.write_text(spec.to_json())
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "localhost:0", "-m", "trnqwen.runtime.hf_trainer", str(spec_file)]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=_subprocess_env(work), timeout=600)
    return proc, work, time.perf_counter() - started


@pytest.mark.slow
def test_torchrun_two_ranks_finetune_logs_and_checkpoint(torchrun_finetune, tiny_assets):
    from trnqwen.contract.stepline import parse_step_line

    proc, work, seconds = torchrun_finetune
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "world size: 2" in log and "DTensor" in log  # start-up line; parameters sharded at load
    steps = [m for m in map(parse_step_line, log.splitlines()) if m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1)), log[-3000:]
    vocab = json.loads((tiny_assets / "config.json").read_text())["vocab_size"]
    for m in steps:
        assert 0 < m["loss"] < 2 * math.log(vocab) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
        assert m["tps"] > 0 and m["memory_gib"] > 0 and m["mfu"] is None  # CPU: no peak FLOP/s known
    assert not list(work.rglob("metrics.jsonl"))  # a by-hand torchrun (no TRNQWEN_METRICS_PATH) writes no stream
    print(f"hf-trainer 2-rank CPU fine-tune, {STEPS} steps: {seconds:.1f} s wall")


@pytest.mark.slow
def test_torchrun_checkpoint_round_trip(torchrun_finetune, tiny_assets):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    proc, work, _ = torchrun_finetune
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    step_dir = work / "ckpt" / "hf" / f"step-{STEPS}"
    files = sorted(p.name for p in step_dir.iterdir())
    assert files == [hft.SAFETENSORS_NAME, hft.INDEX_NAME]
    tensors = load_file(str(step_dir / hft.SAFETENSORS_NAME))
    index = json.loads((step_dir / hft.INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(tensors)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_assets))
    result = model.load_state_dict(tensors, strict=False, assign=True)
    assert list(result.missing_keys) == ["lm_head.weight"] and list(result.unexpected_keys) == []
    original = {k: v for f in sorted(tiny_assets.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    assert set(original) == set(tensors)
    assert all(torch.isfinite(t).all() for t in tensors.values())
    moved = max((tensors[k] - original[k]).abs().max().item() for k in tensors)
    assert moved > 0, "training did not change the weights"


@pytest.mark.slow
def test_verify_ckpt_accepts_the_export(torchrun_finetune, tiny_assets, cli):
    proc, work, _ = torchrun_finetune
    assert proc.returncode == 0
    result = cli("verify-ckpt", str(work / "ckpt"), "--assets", str(tiny_assets), "--json")
    assert result.code == 0, result.text
    report = json.loads(result.out)
    assert report["ok"] and report["step"] == STEPS and report["missing_keys"] == []
    assert report["expected_missing"] == ["lm_head.weight"]


@pytest.mark.slow
def test_single_process_random_init(tiny_assets, tmp_path):
    """One process, no torchrun: random init from config.json, no export (the bundled corpus: named
    data reaches a rank only as the launcher's token cache)."""
    argv = [sys.executable, "-m", "trnqwen.runtime.hf_trainer", "--assets-dir", str(tiny_assets),
            "--model", "builtin:tiny-qwen3", "--steps", "2", "--seq-len", "64", "--local-batch-size", "2",
            "--output-dir", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=_subprocess_env(tmp_path), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "strategy single" in log and "world size: 1" in log and "fresh start" in log
    from trnqwen.contract.stepline import parse_step_line

    assert [m["step"] for m in map(parse_step_line, log.splitlines()) if m] == [1, 2]


@pytest.fixture(scope="session")
def cli_finetune(tiny_assets, tmp_path_factory):
    """The same fine-tune through ``trnqwen train`` (launcher, run dir, preflight): the second torchrun."""
    work = tmp_path_factory.mktemp("hft-cli")
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "trnqwen", "train", "--backend", "hf-trainer", "--finetune", "--model",
         "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "cpu", "--nproc-per-node", "2",
         "--steps", str(STEPS), "--seq-len", str(SEQ_LEN)],
        capture_output=True, text=True, cwd=work, env=_subprocess_env(work), timeout=600,
    )
    return proc, work, time.perf_counter() - started


@pytest.mark.slow
def test_trnqwen_train_hf_trainer_end_to_end(cli_finetune, tiny_assets):
    proc, work, seconds = cli_finetune
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    env = _subprocess_env(work)
    run = lambda *a: subprocess.run([sys.executable, "-m", "trnqwen", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=work, env=env, timeout=300)
    verify = run("verify-ckpt", "--assets", str(tiny_assets), "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["ok"] and report["step"] == STEPS and report["expected_missing"] == ["lm_head.weight"]
    logs = run("inspect-logs", "--json")
    summary = json.loads(logs.stdout)["summary"]
    assert summary["world_size"] == 2 and summary["steps_logged"] == STEPS and summary["completed"]
    assert summary["checkpoint_loaded"] and summary["checkpoint_saved"]
    assert summary["model_params"] == report["num_parameters"]
    print(f"trnqwen train --backend hf-trainer, 2 CPU ranks, {STEPS} steps: {seconds:.1f} s wall")


@pytest.mark.slow
def test_trnqwen_train_hf_trainer_writes_the_metrics_stream(cli_finetune):
    """The launcher's run dir has rank 0's stream: one step record per step, each loss the step
    line's; run.json's summary and the status line come from it."""
    from trnqwen.contract.metrics_stream import STEP_CORE, read_stream
    from trnqwen.contract.stepline import parse_step_line
    from trnqwen.rundir import last_run_dir

    proc, work, _ = cli_finetune
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = last_run_dir(work / ".trnqwen" / "runs")
    records = read_stream(run_dir / "metrics.jsonl")
    assert records[0].kind == "header" and records[0].meta["backend"] == "hf-trainer"
    steps = [r for r in records if r.kind == "step"]
    assert [r.step for r in steps] == list(range(1, STEPS + 1)) and len(records) == STEPS + 1
    lines = {m["step"]: m for m in map(parse_step_line, (run_dir / "train.log").read_text().splitlines()) if m}
    assert sorted(lines) == list(range(1, STEPS + 1))
    for r in steps:
        assert set(r.values) == set(STEP_CORE), r.values
        assert lines[r.step]["loss"] == round(r.values["loss"], 5) and lines[r.step]["lr"] == r.values["lr"]
        assert r.values["mfu"] is None and r.values["tps"] > 0 and r.values["memory_gib"] > 0
    summary = json.loads((run_dir / "run.json").read_text())["extra"]["summary"]
    assert summary["last_step"] == {"step": STEPS, **steps[-1].values}
    status = [ln for ln in proc.stderr.splitlines() if ln.startswith("step ")]
    assert status[-1].startswith(f"step {STEPS}/{STEPS}  loss {steps[-1].values['loss']:.4f}  tok/s "), status
