"""Recipes: a resolved :class:`RunConfig` + the device -> the torchtitan run (:class:`TrainJob`).

Each backend builds its config the way the published recipe does by hand
(``shared/reference/recipe.md``), written out as a small standalone torchtitan config module
(imports + one function returning the config) that torchrun selects with ``--module/--config``:

* ``hf-v5``   ``transformers_modeling_backend_full()`` with ``hf_model`` and ``hf_assets_path``
              both the local assets folder (no network at train time).
* ``native``  ``qwen3_32b()`` with ``model_spec`` = the registered Qwen3 flavor whose architecture
              equals the checkpoint's ``config.json`` (0.6B ... 32B, 30B-A3B), or a spec built
              from ``config.json`` when none does (any dense Qwen3, the tiny model).
* ``nki-moe`` ``qwen3_nki_moe_config("30B-A3B", compile_config=..., n_layers, num_experts, top_k)``
              from torchtitan-neuron.

``--finetune`` loads the assets in HF format (model only) and saves the last step in HF format
(model only) to ``<checkpoint_dir>/hf/step-N/``; resumable DCP checkpoints go to
``<checkpoint_dir>/resume/step-N/`` (:mod:`trnqwen.contract.checkpoint_layout`).  Version differences come from :mod:`compat`.

Every module ends with ``return trnqwen_config(config, hooks=[...], backend=...)``: the same values under
trnqwen's Trainer, checkpointer, metrics processor and validator (torchtitan's classes extended
through its config: :mod:`trnqwen.runtime.trainer`), with the adapter's and the method's trainer hooks.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.assets import checkpoint_dtype, moe_layout, read_config_json
from trnqwen.config import RunConfig
from trnqwen.env.device import DeviceInfo
from trnqwen.errors import EnvironmentProblem, UsageError
from trnqwen import titan_compat as compat
from trnqwen.contract import lora as contract_lora
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.adapters.lora import plan as lora
from trnqwen.train import tracking
from trnqwen.train.memory import count_params  # one parameter formula for both
from trnqwen.methods.base import MethodPlan
from trnqwen.methods.planning import plan_method
from trnqwen.dataset.cache import RankData
from trnqwen.train.cache_data import DataProgress, prepare_rank_data, streamed_data, titan_dataloader_code
from trnqwen.dataset.streamed import DataSpec, render_dataset_code
from trnqwen.train.job import TrainJob
from trnqwen.train.schedule import Schedule, plan_schedule
from trnqwen.contract.topology import Topology
from trnqwen.train.topology import plan_topology

CONFIG_MODULE = "trnqwen_run_config"
CONFIG_FNS = {"hf-v5": "trnqwen_hf_v5", "native": "trnqwen_native", "nki-moe": "trnqwen_nki_moe"}
ENTRY_MODULE = "trnqwen.runtime.entry"
CPU_ATTENTION_OVERRIDE = "trnqwen.runtime.cpu_attention.cpu_dense_attention"
TRAINER_IMPORT = "from trnqwen.runtime.trainer import trnqwen_config"
NKI_MOE_MODULE = "torchtitan_neuron.models.qwen3.config_registry"
NKI_MOE_FN = "qwen3_nki_moe_config"
NKI_MOE_FLAVOR = "30B-A3B"


@dataclass
class Plan:
    """Everything a backend's config module needs, resolved once."""

    cfg: RunConfig
    device: DeviceInfo
    api: compat.TitanAPI
    assets_dir: Path
    hf_config: Optional[dict[str, Any]]
    data: DataSpec
    topology: Topology
    checkpoint_dir: Optional[Path]
    dump_folder: Optional[Path]
    flavor: Optional[str] = None  # native: a registered flavor
    custom_dims: Optional[compat.FlavorDims] = None  # native: built from config.json
    rope_theta_override: Optional[float] = None
    dims: Optional[compat.FlavorDims] = None
    rank_data: Optional[RankData] = None  # the token cache the ranks read (datasets the user names)
    lora: Optional[contract_lora.LoraSpec] = None
    lora_targets: tuple[str, ...] = ()  # the HF targets this backend adapts (trnqwen.adapters.lora.plan)
    method: Optional[MethodPlan] = None  # the training method's plan (trnqwen.methods: None for SFT)
    schedule: Optional[Schedule] = None  # steps, LR curve, optimizer: resolved once (train/schedule.py)
    notes: list[str] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.cfg.backend


# --- public API ----------------------------------------------------------------------------------


def build_job(
    cfg: RunConfig,
    device: DeviceInfo,
    run_dir: Optional[Path],
    *,
    topology: Optional[Topology] = None,
    check_runtime: bool = True,
    data_progress: Optional[DataProgress] = None,
) -> TrainJob:
    """The TrainJob for ``cfg`` on ``device`` (``topology``: the plan's, else worked out here;
    ``data_progress``: shown while the dataset is prepared, cache_data.prepare_rank_data).

    ``check_runtime=False`` (``--dry-run`` / ``--export-config``) only generates text: missing
    torchtitan-neuron is then a note, not an error.  Missing or broken assets never stop the
    recipe: preflight reports them (:func:`trnqwen.train.preflight.check_assets`).
    """
    if cfg.backend == "hf-trainer":  # no torchtitan config module: trnqwen's Trainer entry point
        from trnqwen.train.hf_trainer_recipe import build_hf_trainer_job

        return build_hf_trainer_job(cfg, device, run_dir, topology=topology, check_runtime=check_runtime,
                                    data_progress=data_progress)
    plan = make_plan(cfg, device, run_dir, topology=topology, check_runtime=check_runtime, data_progress=data_progress)
    text = _render(plan)
    fn = CONFIG_FNS[cfg.backend]
    entry_args = ["--module", CONFIG_MODULE, "--config", fn]
    override_imports = list(cfg.override_imports)
    # Every torchtitan run goes through trnqwen's rank entry: exact resume (RNG in the checkpoint),
    # exports apart from resume points and preemption handling (trnqwen.runtime.resume_state);
    # hf-v5 also needs its rotary buffers re-initialised (trnqwen.runtime.hf_rope).
    if device.type == "cpu":
        entry_args += ["--trnqwen-device", "cpu"]
    entry_args += compat.format_override_imports(override_imports, plan.api)
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if plan.data.is_local:  # local assets + local data: nothing may wait on the network
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if device.type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // plan.topology.nproc_per_node)
        env["OMP_NUM_THREADS"] = str(threads)
    if cfg.backend == "hf-v5":
        env["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    env.update(tracking.rank_env(cfg, run_dir))
    job = TrainJob(
        backend=cfg.backend,
        entry_module=ENTRY_MODULE,
        entry_args=entry_args,
        config_module=CONFIG_MODULE,
        config_fn=fn,
        config_module_text=text,
        env=env,
        checkpoint_dir=plan.checkpoint_dir,
        num_layers=plan.dims.n_layers if plan.dims else None,
        num_params=count_params(plan.dims) if plan.dims else None,
        vocab_size=plan.dims.vocab_size if plan.dims else None,
        notes=plan.notes + plan.data.notes,
        nproc_per_node=plan.topology.nproc_per_node,
        world_size=plan.topology.world_size,
        global_batch_size=cfg.global_batch_size or cfg.local_batch_size * plan.topology.dp,
        dump_folder=plan.dump_folder,
        model_flavor=plan.flavor or ("config.json" if plan.custom_dims else None),
        override_imports=override_imports,
        dataset=plan.data.source,
        dataset_cache=plan.rank_data.cache_dir if plan.rank_data is not None else None,
        schedule=plan.schedule,
    )
    return job


def render_config_module(
    cfg: RunConfig, device: DeviceInfo, run_dir: Optional[Path] = None, *, topology: Optional[Topology] = None
) -> str:
    """The standalone torchtitan config module for ``cfg`` (never needs torchtitan-neuron)."""
    return _render(make_plan(cfg, device, run_dir, topology=topology, check_runtime=False))


# --- planning ------------------------------------------------------------------------------------


def make_plan(
    cfg: RunConfig,
    device: DeviceInfo,
    run_dir: Optional[Path],
    *,
    topology: Optional[Topology] = None,
    check_runtime: bool,
    data_progress: Optional[DataProgress] = None,
) -> Plan:
    if cfg.backend == "hf-trainer":
        raise UsageError(
            "backend hf-trainer does not run through torchtitan recipes",
            hint="it is launched by trnqwen's Transformers Trainer path; use --backend hf-v5, native or nki-moe here",
        )
    if cfg.backend not in CONFIG_FNS:
        raise UsageError(f"unknown backend {cfg.backend!r}", hint="use hf-v5, native or nki-moe")
    api = compat.require_torchtitan()
    notes: list[str] = []
    if cfg.backend == "nki-moe":
        _check_nki_moe_available(check_runtime, notes)
    assets_dir = cfg.resolved_assets_dir.expanduser().absolute()
    hf_config = read_config_json(assets_dir)  # missing or broken assets: preflight reports them
    prepared = prepare_rank_data(cfg, assets_dir, data_progress)
    data, rank_data = prepared if prepared is not None else (streamed_data(cfg, api=api), None)
    topology = topology or plan_topology(cfg, device)  # its problems are preflight's to report
    # Resumable checkpoints always; whether this folder may be used is the launcher's check
    # (trnqwen.contract.checkpoint_layout.check_for_new_run), never a silent torchtitan resume.
    ckpt = cfg.resolved_checkpoint_dir.expanduser().absolute()
    notes += tracking.check(cfg, check_runtime=check_runtime)
    plan = Plan(
        cfg=cfg, device=device, api=api, assets_dir=assets_dir, hf_config=hf_config, data=data,
        topology=topology, checkpoint_dir=ckpt,
        dump_folder=Path(run_dir).absolute() if run_dir is not None else None, notes=notes, rank_data=rank_data,
        schedule=plan_schedule(cfg, rank_data, topology),
    )
    if cfg.backend == "native":
        _plan_native(plan)
    elif cfg.backend == "hf-v5":
        plan.dims = compat.dims_from_hf_config(hf_config) if hf_config else None
    else:
        _plan_nki_moe(plan)
    _plan_lora(plan)
    _plan_method(plan)
    return plan


def _plan_method(plan: Plan) -> None:
    plan.method = plan_method(plan.cfg, plan.assets_dir, plan.rank_data, device_type=plan.device.type,
                              dp_degree=plan.topology.dp,
                              steps=plan.schedule.steps if plan.schedule else 1,
                              validates=bool(plan.schedule and plan.schedule.val_every))
    if plan.method is not None and plan.method.note:
        plan.notes.append(plan.method.note)


def _plan_lora(plan: Plan) -> None:
    spec = lora.spec_from_config(plan.cfg)
    if spec is None:
        return
    moe = bool(plan.dims and plan.dims.num_experts)
    plan.lora = spec
    plan.lora_targets = lora.backend_targets(spec, plan.cfg.backend, moe=moe)
    if plan.cfg.backend == "native" and plan.flavor and plan.dims is not None:
        # one adapter per q/k/v projection needs the non-fused layout: built from the same dims
        plan.custom_dims, plan.flavor, plan.rope_theta_override = plan.dims, None, None
    total = count_params(plan.dims) if plan.dims else None
    trainable = contract_lora.adapter_params(plan.dims, spec, plan.lora_targets) if plan.dims else None
    plan.notes.append(lora.plan_note(spec, plan.lora_targets, backend=plan.cfg.backend, trainable=trainable, total=total))


def _check_nki_moe_available(check_runtime: bool, notes: list[str]) -> None:
    try:
        found = importlib.util.find_spec("torchtitan_neuron") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return
    if check_runtime:
        raise EnvironmentProblem(
            "backend nki-moe needs torchtitan-neuron, which is not installed",
            hint="on a Trainium host: clone torchtitan-neuron and `pip install -e .` it (AWS Neuron "
            "pip repository, --no-deps to keep the Neuron torch); --dry-run/--export-config work without it",
        )
    notes.append("torchtitan-neuron is not installed here: the config is generated but cannot run on this machine")


_NAME_FLAVOR = re.compile(r"qwen3-(\d+(?:\.\d+)?b(?:-a\d+b)?)", re.IGNORECASE)


def _plan_native(plan: Plan) -> None:
    flavors = compat.native_flavors()
    if plan.hf_config is None:  # dry run without assets: go by the model's name
        match = _NAME_FLAVOR.search(plan.cfg.model_name)
        guess = match.group(1).upper() if match else None
        if guess not in flavors:
            raise UsageError(
                f"cannot tell the architecture of {plan.cfg.model}: no config.json and no registered flavor in its name",
                hint=f"{shlex.join(['trnqwen', 'fetch', str(plan.cfg.model)])} first",
            )
        plan.flavor = guess
        plan.dims = flavors[guess]
        return
    if plan.hf_config.get("model_type") not in ("qwen3", "qwen3_moe"):
        raise UsageError(
            f"the native backend builds Qwen3 models; {plan.assets_dir} holds model_type "
            f"{plan.hf_config.get('model_type')!r}",
            hint="use --backend hf-v5 for other architectures",
        )
    hf_dims = compat.dims_from_hf_config(plan.hf_config)
    if hf_dims.num_experts:
        # Every Qwen3-MoE is built from config.json with torchtitan's own MoE builders (a registered
        # flavor would fix route_norm and torchtitan's load balancing, which the checkpoint decides).
        plan.custom_dims = plan.dims = hf_dims
        mix = f", dense MLP in layers {list(hf_dims.dense_layers)}" if hf_dims.dense_layers else ""
        plan.notes.append(
            f"Qwen3-MoE: {hf_dims.num_experts} experts, top-{hf_dims.top_k}{mix}; built from config.json with "
            f"torchtitan's MoE builders; load balancing: {moe_balance(plan.hf_config)[1]}"
        )
        return
    flavor = compat.match_flavor(hf_dims, flavors)
    if flavor is not None:
        plan.flavor = flavor
        plan.dims = hf_dims
        if flavors[flavor].rope_theta != hf_dims.rope_theta:
            plan.rope_theta_override = hf_dims.rope_theta
            plan.notes.append(
                f"flavor {flavor} uses rope theta {flavors[flavor].rope_theta:g}; the checkpoint's "
                f"{hf_dims.rope_theta:g} is used instead"
            )
        return
    plan.custom_dims = hf_dims
    plan.dims = hf_dims
    plan.notes.append("no registered Qwen3 flavor matches config.json: the model config is built from it")


# torchtitan's default coefficient of its aux-loss-free expert-bias update (MoE.Config).
TITAN_LOAD_BALANCE_COEFF = 1e-3


def moe_balance(hf_config: dict[str, Any]) -> tuple[Optional[float], str]:
    """(torchtitan ``load_balance_coeff``, what to log) for a Qwen3-MoE fine-tune on native.

    transformers adds its router aux loss (``router_aux_loss_coef`` x load_balancing_loss) to the
    training loss only when the config sets ``output_router_logits``; the published Qwen3-MoE
    configs do not, so then native trains without any balancing term either (the same objective).
    With ``output_router_logits`` torchtitan has no aux loss to match: it balances with its
    aux-loss-free expert bias instead, and says so."""
    layout = moe_layout(hf_config)
    if layout is None or not layout.aux_loss_coef:
        return None, "none (as transformers trains this config: output_router_logits is false, no router aux loss)"
    return TITAN_LOAD_BALANCE_COEFF, (
        f"torchtitan's aux-loss-free expert bias (coeff {TITAN_LOAD_BALANCE_COEFF:g}), not transformers' router aux "
        f"loss (x{layout.router_aux_loss_coef:g}); the logged loss has no aux term"
    )


def _plan_nki_moe(plan: Plan) -> None:
    flavors = compat.native_flavors()
    base = flavors.get(NKI_MOE_FLAVOR)
    if base is not None:
        from dataclasses import replace

        plan.dims = replace(base, n_layers=plan.cfg.moe_layers, num_experts=plan.cfg.num_experts, top_k=plan.cfg.top_k)
        if plan.cfg.finetune and plan.hf_config and plan.hf_config.get("model_type") == "qwen3_moe":
            # The recipe cuts Qwen3-30B-A3B's layers; HF weights of another layer shape cannot load.
            have = compat.dims_from_hf_config(plan.hf_config)
            fields = ("dim", "n_heads", "n_kv_heads", "head_dim", "moe_ffn_dim", "vocab_size")
            differ = [f"{f} {getattr(have, f)} (30B-A3B: {getattr(base, f)})" for f in fields if getattr(have, f) != getattr(base, f)]
            if differ:
                raise UsageError(
                    f"nki-moe fine-tunes the layers of Qwen3-{NKI_MOE_FLAVOR}, cut; {plan.assets_dir / 'config.json'} "
                    f"is another shape: {', '.join(differ)}",
                    hint="use --backend native (any Qwen3-MoE from config.json) for this checkpoint",
                )
    plan.flavor = NKI_MOE_FLAVOR


hf_export_dtype = checkpoint_dtype  # the HF export keeps the assets' own dtype (one home: trnqwen.assets)


# --- rendering -----------------------------------------------------------------------------------


def _render(plan: Plan) -> str:
    cfg, api = plan.cfg, plan.api
    sched = plan.schedule or plan_schedule(cfg, plan.rank_data, plan.topology)
    imports: list[str] = []
    body: list[str] = []  # lines of the config function, after the base call
    head_lines: list[str] = []
    hooks: list[str] = []  # trainer hooks (trnqwen.runtime.trainer.TrainerHook) the config passes in

    def imp(line: str) -> None:
        if line not in imports:
            imports.append(line)

    fn = CONFIG_FNS[cfg.backend]
    assets = str(plan.assets_dir)
    if cfg.backend == "hf-v5":
        imp(f"from {api.hf_config_registry} import {api.hf_base_fn}")
        base = f"{api.hf_base_fn}()"
        body.append(f"config.hf_model = {assets!r}  # local snapshot: AutoConfig needs no network")
        # Packed documents must not attend across each other (native models always mask per
        # document); torchtitan's Transformers backend defaults to a plain causal mask.
        body.append('config.model_spec.model.attn_mask_type = "block_causal"')
        layout = moe_layout(plan.hf_config or {})
        if layout is not None and layout.is_moe:
            # The dense base config never swaps torchtitan's MoE in (then the load-balancing hook
            # finds no ``layer.moe``); the MoE config does, and trnqwen's adapter loads and exports
            # the Hub's per-expert tensors (the backend's own only strips a prefix).
            package = api.hf_config_registry.rpartition(".")[0]
            coeff, note = moe_balance(plan.hf_config or {})
            imp(f"from {package} import HFTransformerModel, TitanMoeModelConfig")
            imp("from trnqwen.runtime.hf_moe_adapter import HFMoeStateDictAdapter")
            imp("from trnqwen.runtime.qwen3_native import log_experts_path")
            body += [
                "config.model_spec.model = HFTransformerModel.Config(model_config=TitanMoeModelConfig(",
                f'    attn_mask_type="block_causal", load_balance_coeff={coeff!r},',
                "))",
                "config.model_spec.state_dict_adapter = HFMoeStateDictAdapter",
                f"log_experts_path({layout.num_experts}, {layout.top_k}, {note!r})",
            ]
    elif cfg.backend == "native":
        imp(f"from {api.qwen3_config_registry} import {api.native_base_fn}")
        base = f"{api.native_base_fn}()"
        if plan.flavor:
            imp(f"from {api.qwen3_package} import model_registry")
            body.append(f"config.model_spec = model_registry({plan.flavor!r}, attn_backend={api.attn_backend!r})")
            if plan.rope_theta_override is not None:
                imp("from trnqwen.runtime.qwen3_native import set_rope_theta")
                body.append(f"set_rope_theta(config.model_spec, {plan.rope_theta_override!r})  # the checkpoint's rotary base")
        else:
            d = plan.custom_dims
            assert d is not None
            hf_config = plan.hf_config or {}
            imp("from trnqwen.runtime.qwen3_native import qwen3_model_spec")
            max_pos = int(hf_config.get("max_position_embeddings") or max(cfg.seq_len, 4096))
            eps = float(hf_config.get("rms_norm_eps") or 1e-6)
            body += [
                "# Built from the checkpoint's config.json (no registered flavor has it, or LoRA wants separate q/k/v).",
                "config.model_spec = qwen3_model_spec(",
                f"    name={cfg.model_name!r}, dim={d.dim}, n_layers={d.n_layers}, n_heads={d.n_heads},",
                f"    n_kv_heads={d.n_kv_heads}, head_dim={d.head_dim}, ffn_dim={d.ffn_dim}, vocab_size={d.vocab_size},",
                f"    tied={d.tied}, rope_theta={d.rope_theta!r}, max_seq_len={max(max_pos, cfg.seq_len)},",
                f"    norm_eps={eps!r}, attn_backend={api.attn_backend!r},"
                + (" fuse_qkv=False," if plan.lora else ""),
            ]
            if d.num_experts:
                coeff, note = moe_balance(hf_config)
                body += [
                    f"    num_experts={d.num_experts}, top_k={d.top_k}, moe_ffn_dim={d.moe_ffn_dim}, route_norm={d.route_norm},",
                    f"    dense_layers={d.dense_layers!r}, load_balance_coeff={coeff!r},",
                    f"    balance_note={note!r},",
                ]
            body.append(")")
        body.append("config.loss.loss_fn.global_vocab_size = config.model_spec.model.vocab_size")
    else:
        imp("from torchtitan.config import CompileConfig")
        imp(f"from {NKI_MOE_MODULE} import {NKI_MOE_FN}")
        components = '["model", "loss", "grad_clip"]' if cfg.compile else None
        compile_cfg = (
            f"CompileConfig(enable={cfg.compile}, backend=\"neuron\""
            + (f", components={components}" if components else "")
            + ")"
        )
        base = (
            f"{NKI_MOE_FN}(\n        {NKI_MOE_FLAVOR!r},\n        compile_config={compile_cfg},\n"
            f"        n_layers={cfg.moe_layers},\n        num_experts={cfg.num_experts},\n        top_k={cfg.top_k},\n    )"
        )

    body.append(f"config.hf_assets_path = {assets!r}")
    if plan.lora is not None:
        lora_imports, lora_lines, lora_hooks = lora.render_attach_lines(plan.lora, backend=cfg.backend,
                                                                        targets=plan.lora_targets)
        for line in lora_imports:
            imp(line)
        body += lora_lines
        hooks += lora_hooks  # LoRA's: the base loaded without adapter keys, the adapter as the HF export
    if plan.rank_data is not None:
        data_imports, data_lines = titan_dataloader_code(
            plan.rank_data, seed=cfg.seed, val_every=sched.val_every, dp_degree=plan.topology.dp,
            local_batch_size=cfg.local_batch_size,
        )
        body += data_lines
    else:
        data_imports, data_head, data_expr = render_dataset_code(plan.data)
        head_lines += data_head
        body.append(f"config.dataloader = {data_expr}")
    for line in data_imports:
        imp(line)
    if plan.method is not None:  # the training method's lines (its loss, its dataloaders' extras)
        for line in plan.method.imports:
            imp(line)
        body += plan.method.config_lines
        hooks += plan.method.hooks  # its trainer hooks: batch fields, passes before step 1, its values
    body += [
        f"config.training.steps = {sched.steps}",
        f"config.training.local_batch_size = {cfg.local_batch_size}",
    ]
    gbs = cfg.global_batch_size or (cfg.local_batch_size * plan.topology.dp if cfg.backend == "native" else None)
    if gbs is not None:
        body.append(f"config.training.global_batch_size = {gbs}")
    body += [
        f"config.training.seq_len = {cfg.seq_len}",
        f"config.parallelism.data_parallel_shard_degree = {cfg.dp_shard}",
        f"config.parallelism.tensor_parallel_degree = {cfg.tp}",
    ]
    spmd = compat.spmd_backend(cfg.backend, plan.device.type, api)
    if spmd is not None:
        body.append(f"config.parallelism.spmd_backend = {spmd!r}")
    imp("from torchtitan.components.optimizer import default_adamw")
    body += [
        *sched.titan_lines(),  # optimizer, LR curve, clipping: the same numbers the Trainer backend gets
        "config.metrics.log_freq = 1",
        *tracking.titan_lines(cfg),  # --tensorboard / --wandb: torchtitan's own writers
    ]
    if cfg.seed is not None:
        body.append(f"config.debug.seed = {cfg.seed}")
    if plan.device.type == "cpu":
        # torchtitan's FSDP casts parameters to bfloat16 for the forward by default
        # (training.mixed_precision_param); a CPU run trains in float32, as hf-trainer does, so
        # the backends compute the same loss (and CPU bfloat16 matmuls are no faster).
        body.append('config.training.mixed_precision_param = "float32"')
    if sched.activation_checkpointing is not None:  # else the recipe's own (hf-v5 selective, native full)
        body += _activation_checkpoint_lines(sched.activation_checkpointing, imp)
    if cfg.backend != "nki-moe":
        body.append(f"config.compile.enable = {cfg.compile}")
        if cfg.compile and plan.device.type == "neuron":
            body.append('config.compile.backend = "neuron"')
    if plan.dump_folder is not None:
        body.append(f"config.dump_folder = {str(plan.dump_folder)!r}")
    if plan.checkpoint_dir is not None:
        export = cfg.resolved_export_hf
        body += [
            "config.checkpoint.enable = True",
            # trnqwen's layout: resume points only here; the HF export goes to <dir>/hf/step-N
            f"config.checkpoint.folder = {str(checkpoints.resume_dir(plan.checkpoint_dir))!r}",
            f"config.checkpoint.interval = {sched.save_every}",
            f"config.checkpoint.keep_latest_k = {cfg.keep_last}",
            f"config.checkpoint.last_save_model_only = {export}",
            f"config.checkpoint.last_save_in_hf = {export}",
        ]
        export_dtype = hf_export_dtype(plan.hf_config) if export else None
        if export_dtype:
            # torchtitan's Qwen3 configs export float16; bf16 weights can overflow float16, so the
            # export keeps the checkpoint's own dtype (bfloat16 for the published Qwen3 models).
            body.append(f"config.checkpoint.export_dtype = {export_dtype!r}")
        if cfg.finetune:
            body += [
                f"config.checkpoint.initial_load_path = {assets!r}",
                "config.checkpoint.initial_load_in_hf = True",
                "config.checkpoint.initial_load_model_only = True",
            ]

    doc = (
        f'"""torchtitan config generated by trnqwen: backend {cfg.backend}, model {cfg.model}.\n\n'
        f"Run it by hand (torchtitan {api.version or '?'}, API shape {api.era}):\n"
        f"    PYTHONPATH=<folder of this file> torchrun --nproc_per_node={plan.topology.nproc_per_node} --rdzv_backend c10d \\\n"
        f"        --rdzv_endpoint localhost:0 --local-ranks-filter 0 --role rank --tee 3 \\\n"
        f"        -m {ENTRY_MODULE} "
        f"--module <this module> --config {fn}"
        + (" --trnqwen-device cpu" if plan.device.type == "cpu" else "")
        + '\n"""'
    )
    imp(TRAINER_IMPORT)
    lines = [doc, "", *sorted(imports, key=_import_key), "", ""]
    if head_lines:
        lines += head_lines + ["", ""]
    lines.append(f"def {fn}():")
    if cfg.backend == "native" and plan.flavor != "32B":
        lines += [
            f"    # {api.native_base_fn}() is the recipe's base for every native run: its model, data, schedule and",
            "    # checkpoint fields are all replaced below, so only its defaults for the rest (activation",
            "    # checkpointing, parallelism) carry over; nothing of the 32B model remains.",
        ]
    lines.append(f"    config = {base}")
    lines += [f"    {line}" if line else "" for line in body]
    # trnqwen's Trainer, checkpointer, metrics processor and validator: torchtitan's own classes
    # extended (resume, preemption, LR on the step line, LoRA export, metrics stream, the hooks)
    lines.append(f"    return trnqwen_config(config, hooks=[{', '.join(hooks)}], backend={cfg.backend!r})")
    return "\n".join(lines) + "\n"


def _activation_checkpoint_lines(mode: str, imp) -> list[str]:
    """torchtitan's activation_checkpoint for --activation-checkpointing (None disables it)."""
    if mode == "none":
        return ["config.activation_checkpoint = None"]
    cls = {"selective": "SelectiveAC", "full": "FullAC"}[mode]
    imp(f"from torchtitan.distributed.activation_checkpoint import {cls}")
    return [f"config.activation_checkpoint = {cls}.Config()"]


def _import_key(line: str) -> tuple[int, str]:
    module = line.split()[1]
    group = 0 if module.split(".")[0] in ("datasets",) else 1 if module.startswith("torchtitan.") else 2
    return group, line
