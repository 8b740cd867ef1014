"""The ``hf-trainer`` recipe: a run config + device -> a :class:`TrainJob` for trnqwen's Trainer entry point.

Unlike the torchtitan backends there is no generated config module: the job runs
``python -m trnqwen.runtime.hf_trainer <flags>`` under the same torchrun launcher, and the flags
(see :class:`trnqwen.contract.hf_trainer_spec.HFTrainerSpec`) say everything, so ``command.sh`` in the
run dir re-runs it as is.  Checks that need no torch run here, before any rank starts: the
dataset resolves, the assets exist, ``accelerate`` (which ``Trainer`` needs) is installed,
``DistributedConfig`` exists when sharding needs it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.assets import read_config_json
from trnqwen.errors import EnvironmentProblem, UsageError
from trnqwen.titan_compat import FlavorDims
from trnqwen.contract import lora as contract_lora
from trnqwen.methods import registry as methods
from trnqwen.methods.base import MethodPlan
from trnqwen.methods.planning import plan_method
from trnqwen.adapters.lora import plan as lora
from trnqwen.train import tracking
from trnqwen.contract.hf_trainer_spec import LORA_TP_PROBLEM, HFTrainerSpec, SpecError, choose_strategy, spec_to_argv
from trnqwen.train.job import TrainJob
from trnqwen.dataset.cache import RankData
from trnqwen.train.schedule import Schedule, plan_schedule
from trnqwen.contract.topology import Topology
from trnqwen.train.topology import plan_topology

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.train.cache_data import DataProgress
    from trnqwen.env.device import DeviceInfo

ENTRY_MODULE = "trnqwen.runtime.hf_trainer"


def transformers_has_distributed_config() -> bool:
    """Whether the installed transformers ships ``transformers.distributed.DistributedConfig``.

    Looked up as a file next to the package, so transformers itself is not imported here.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        return False
    return (Path(spec.origin).parent / "distributed" / "configuration_utils.py").is_file()


def _dims(hf_config: Optional[dict[str, Any]]) -> Any:
    """The model's dimensions from config.json, or None when it is missing or unusual."""
    if not hf_config:
        return None
    try:
        from trnqwen.titan_compat import dims_from_hf_config

        return dims_from_hf_config(hf_config)
    except (ImportError, KeyError, TypeError, ValueError):
        return None


def _model_facts(hf_config: Optional[dict[str, Any]]) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(layers, parameters, vocab) from config.json, or Nones when it is missing or unusual."""
    if not hf_config:
        return None, None, None
    dims = _dims(hf_config)
    params = _count_params(dims)
    if params is None:
        return hf_config.get("num_hidden_layers"), None, hf_config.get("vocab_size")
    return dims.n_layers, params, dims.vocab_size


def _count_params(dims: Optional[FlavorDims]) -> Optional[int]:
    if dims is None:
        return None
    try:
        from trnqwen.train.memory import count_params

        return count_params(dims)
    except (ImportError, KeyError, TypeError, ValueError):
        return None


def _lora_plan(cfg: RunConfig, hf_config: Optional[dict[str, Any]]) -> tuple[Optional[contract_lora.LoraSpec], Optional[str]]:
    """(the LoRA spec the ranks train, with this backend's targets; the plan note), or (None, None).

    peft adapts any subset of the targets on a dense model; a Qwen3-MoE's routed experts are not
    Linear layers (trnqwen.adapters.lora.plan.backend_targets says what is in reach)."""
    spec = lora.spec_from_config(cfg)
    if spec is None:
        return None, None
    dims = _dims(hf_config)
    targets = lora.backend_targets(spec, "hf-trainer", moe=bool(dims and dims.num_experts))
    total = _count_params(dims)
    trainable = contract_lora.adapter_params(dims, spec, targets) if total is not None else None
    note = lora.plan_note(spec, targets, backend="hf-trainer", trainable=trainable, total=total)
    return dataclasses.replace(spec, targets=targets), note


def _dataset_arg(cfg: RunConfig, rank_data: Optional[RankData] = None) -> tuple[Optional[str], list[str], str]:
    """(the ranks' ``dataset`` argument, notes, what the data is).

    A run that reads the token cache gets no dataset argument: its spec names the cache.  Any
    other run streams a torchtitan name (passed on) or the default corpus (None); resolving it
    here makes a bad one stop the run before torchrun starts."""
    from trnqwen.train.cache_data import data_name, streamed_data

    if rank_data is not None:
        return None, [], str(data_name(cfg))
    data = streamed_data(cfg)
    return cfg.dataset or None, list(data.notes), data.source


def build_hf_trainer_spec(
    cfg: RunConfig, device: DeviceInfo, run_dir: Optional[Path], *, dataset: Any = ..., rank_data: Optional[RankData] = None,
    lora_spec: Any = ...,
    schedule: Optional[Schedule] = None,
    method_plan: Optional[MethodPlan] = None,
) -> HFTrainerSpec:
    """The :class:`~trnqwen.contract.hf_trainer_spec.HFTrainerSpec` for this run (pure; checks only files).

    ``rank_data``: the token cache the ranks read (:mod:`trnqwen.train.cache_data`), if any.
    ``lora_spec``: the LoRA adapter (:func:`_lora_plan`), planned from the config when not given."""
    assets_dir = Path(cfg.resolved_assets_dir).expanduser().absolute()
    if lora_spec is ...:
        lora_spec, _ = _lora_plan(cfg, read_config_json(assets_dir))
    export = bool(cfg.resolved_export_hf)
    if dataset is ...:
        dataset, _, _ = _dataset_arg(cfg, rank_data)
    if schedule is None:
        schedule = plan_schedule(cfg, rank_data, plan_topology(cfg, device))
    device_type = device.type
    return HFTrainerSpec(
        assets_dir=str(assets_dir),
        model=cfg.model,
        dataset=dataset,
        cache_dir=str(rank_data.cache_dir) if rank_data is not None else None,
        val_every=schedule.val_every,
        device=device_type,
        steps=schedule.steps,
        local_batch_size=cfg.local_batch_size,
        global_batch_size=cfg.global_batch_size,
        seq_len=cfg.seq_len,
        lr=schedule.lr,
        warmup_steps=min(schedule.warmup_steps, schedule.steps),
        lr_schedule=schedule.lr_schedule,
        min_lr_ratio=schedule.min_lr_ratio,
        weight_decay=schedule.weight_decay,
        max_grad_norm=schedule.max_grad_norm,
        gradient_checkpointing=schedule.activation_checkpointing in ("selective", "full"),
        seed=cfg.seed,
        tp=cfg.tp,
        dp_shard=cfg.dp_shard,
        compile=cfg.compile,
        finetune=cfg.finetune,
        checkpoint_dir=str(Path(cfg.resolved_checkpoint_dir).expanduser().absolute()),  # resume points always
        export_hf=export,
        save_every=schedule.save_every,
        keep_last=cfg.keep_last,
        output_dir=str(Path(run_dir if run_dir is not None else cfg.runs_dir).expanduser().absolute()),
        peak_flops_per_rank=device.peak_flops_per_rank,
        memory_bytes_per_rank=device.memory_bytes_per_rank,
        trust_remote_code=cfg.trust_remote_code,
        report_to=",".join(tracking.report_to(cfg)),
        lora=lora_spec.to_json() if lora_spec is not None else None,
        lora_module=lora.HF_TRAINER_MODULE if lora_spec is not None else None,
        method=cfg.method,
        method_hooks=methods.get(cfg.method).hf_trainer if method_plan is not None else None,
        method_settings=json.dumps(method_plan.settings) if method_plan is not None else None,
    )


def build_hf_trainer_job(
    cfg: RunConfig,
    device: DeviceInfo,
    run_dir: Optional[Path],
    *,
    topology: Optional[Topology] = None,
    check_runtime: bool = True,
    data_progress: Optional[DataProgress] = None,
) -> TrainJob:
    """A TrainJob running :mod:`trnqwen.runtime.hf_trainer` under torchrun for ``cfg`` on ``device``.

    ``check_runtime=False`` (``--dry-run``): a missing transformers/accelerate/DistributedConfig is
    a note instead of an error; the dataset is still resolved (it only reads files).
    """
    if cfg.backend != "hf-trainer":
        raise UsageError(f"build_hf_trainer_job called for backend {cfg.backend!r}")
    if cfg.override_imports:
        raise UsageError(
            "--override-imports replaces torchtitan modules; the hf-trainer backend does not run torchtitan",
            hint="drop --override-imports, or use --backend hf-v5/native/nki-moe for kernel overrides",
        )
    if cfg.tp > 1 and device.type == "cpu":  # before any data is tokenized: nothing written
        raise UsageError(
            f"hf-trainer --tp {cfg.tp} cannot run on CPU: accelerate's tensor parallelism needs FSDP2 on a "
            "device backend and refuses CPU processes (MULTI_CPU)",
            hint="on CPU use --tp 1 (the ranks shard the model FSDP-style), or run --tp on Trainium or CUDA",
        )
    if cfg.lora and cfg.tp > 1:
        raise UsageError(f"--tp {cfg.tp} with --lora: {LORA_TP_PROBLEM}",
                         hint="run with --tp 1, or use --backend hf-v5 or native for LoRA with tensor parallelism")
    problems: list[EnvironmentProblem] = []
    if importlib.util.find_spec("transformers") is None:
        problems.append(EnvironmentProblem(
            "the hf-trainer backend needs transformers, which is not installed",
            hint="pip install 'trnqwen[train]' (keep your torch build: add --no-deps on Trainium)",
        ))
    if importlib.util.find_spec("accelerate") is None:
        problems.append(EnvironmentProblem(
            "the hf-trainer backend needs accelerate (transformers' Trainer runs on it), which is not installed",
            hint="pip install 'accelerate>=1.12' (on Trainium add --no-deps so the Neuron torch is kept)",
        ))
    has_dc = transformers_has_distributed_config()
    if cfg.tp > 1 and not has_dc:
        problems.append(EnvironmentProblem(
            f"--tp {cfg.tp} needs transformers.distributed.DistributedConfig, which the installed transformers lacks",
            hint="upgrade transformers to a 5.x release with DistributedConfig, or run with --tp 1 (DDP)",
        ))
    if problems and check_runtime:
        raise problems[0]
    assets_dir = Path(cfg.resolved_assets_dir).expanduser().absolute()
    from trnqwen.train.cache_data import prepare_rank_data

    prepared = prepare_rank_data(cfg, assets_dir, data_progress)
    rank_data = prepared[1] if prepared is not None else None
    dataset, data_notes, data_source = _dataset_arg(cfg, rank_data)
    if prepared is not None:
        data_notes = list(prepared[0].notes)
    hf_config = read_config_json(assets_dir)
    lora_spec, lora_note = _lora_plan(cfg, hf_config)
    topology = topology or plan_topology(cfg, device)
    schedule = plan_schedule(cfg, rank_data, topology)
    method_plan = plan_method(cfg, assets_dir, rank_data, device_type=device.type, dp_degree=topology.dp,
                              steps=schedule.steps, validates=bool(schedule.val_every))
    spec = build_hf_trainer_spec(cfg, device, run_dir, dataset=dataset, rank_data=rank_data, lora_spec=lora_spec,
                                 schedule=schedule, method_plan=method_plan)
    device_type = spec.device
    notes = [] if rank_data is not None else ["hf-trainer pads/truncates each document to seq_len (no packing as in torchtitan)"]
    notes += [lora_note] if lora_note else []
    notes += [method_plan.note] if method_plan is not None and method_plan.note else []
    notes += data_notes
    notes += [f"not runnable here: {p.message}" for p in problems]
    if schedule.activation_checkpointing == "selective":
        notes.append("hf-trainer has no selective activation checkpointing: it recomputes whole layers (gradient_checkpointing)")
    try:
        strategy = choose_strategy(topology, device=device_type, has_distributed_config=has_dc)
        notes += strategy.notes
    except SpecError:
        pass  # preflight reports bad degrees and batches (topology.problems)
    env = {"TOKENIZERS_PARALLELISM": "false"}
    local_data = rank_data is not None or Path(data_source).exists()
    if local_data:  # local assets + local data: nothing may wait on the network
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if device_type == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // topology.nproc_per_node))
    if device_type == "neuron":
        env["HF_DEACTIVATE_ASYNC_LOAD"] = "1"  # avoids a reported hang in HF model loading on Neuron
    env.update(tracking.rank_env(cfg, run_dir))
    notes += tracking.check(cfg, check_runtime=check_runtime)
    layers, params, vocab = _model_facts(hf_config)
    return TrainJob(
        backend="hf-trainer",
        entry_module=ENTRY_MODULE,
        entry_args=spec_to_argv(spec),
        env=env,
        checkpoint_dir=Path(spec.checkpoint_dir) if spec.checkpoint_dir else None,
        num_layers=layers,
        num_params=params,
        vocab_size=vocab,
        notes=notes,
        nproc_per_node=topology.nproc_per_node,
        world_size=topology.world_size,
        global_batch_size=topology.sequences_per_step if topology.ok else cfg.global_batch_size,
        dump_folder=Path(run_dir).absolute() if run_dir is not None else None,
        dataset=data_source,
        dataset_cache=rank_data.cache_dir if rank_data is not None else None,
        schedule=schedule,
    )
