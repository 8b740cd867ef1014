"""trnqwen's Transformers-Trainer training entry point (the ``hf-trainer`` backend).

Run once per rank under torchrun::

    torchrun --nproc_per_node 2 -m trnqwen.runtime.hf_trainer --assets-dir assets/hf/tiny-qwen3 \\
        --dataset data.jsonl --steps 3 --seq-len 128 --finetune --checkpoint-dir ckpt --export-hf

or with a JSON spec file (flags given after it win)::

    torchrun ... -m trnqwen.runtime.hf_trainer run_dir/hf_trainer_spec.json

It follows the Transformers-on-Neuron rules: the model is loaded with ``device_map="neuron"`` on
Trainium (never ``"auto"``, which silently loads on CPU), every batch has one shape (padding to
``seq_len``, last uneven batch dropped), bf16 mixed precision where the device has it,
``torch_compile`` on request, and ``DistributedConfig(tp_size, fsdp_size)`` at ``from_pretrained``
when the installed transformers has it and the device can run it.  On CPU several ranks train with
plain DDP over gloo (see :func:`choose_strategy`).

Its step lines use torchtitan's exact format (``step: N  loss: X  grad_norm: Y  memory: ZGiB(P%)
tps: T  tflops: F  mfu: M%``) so ``inspect-logs`` reads both the same way; global rank 0 also writes
each step and validation to the metrics stream (:mod:`trnqwen.runtime.hf_trainer_metrics`: one
record per step with every value by name, the method's included), and the last step is
saved as HF safetensors in torchtitan's layout (``<checkpoint_dir>/hf/step-N/model-00001-of-00001
.safetensors`` + ``model.safetensors.index.json``) so ``verify-ckpt`` works unchanged.  Resumable
state is the Trainer's own checkpoint (``<checkpoint_dir>/resume/checkpoint-N``: model, optimizer,
scheduler, per-rank RNG, trainer state) every ``save_every`` steps, at the last step and on
SIGTERM/SIGUSR1; a run whose resume folder holds one continues through the Trainer's own
``resume_from_checkpoint`` (the launcher makes sure a new run never finds one there).

The spec, its flags, the strategy and the FLOPs formula are the launcher's too and live in
:mod:`trnqwen.contract.hf_trainer_spec`; this module is what runs inside a rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

from trnqwen.assets import INDEX_NAME, checkpoint_dtype, read_config_json
from trnqwen.runtime.hf_trainer_metrics import metrics_trainer_class, step_recorder
from trnqwen.contract.hf_trainer_spec import (
    HFTrainerSpec,
    ParallelPlan,
    SpecError,
    choose_strategy,
    flops_per_token,
    spec_from_argv,
)
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.contract.lora import LOG_MARK
from trnqwen.contract.topology import topology

SAFETENSORS_NAME = "model-00001-of-00001.safetensors"
LOG_PREFIX = "[trnqwen-hf]"

# --- the run (everything below imports torch/transformers) -------------------------------------


def _log(message: str) -> None:
    """One line in torchtitan's layout (stamp with milliseconds, as its logger writes it), so step
    timing can be read from the log, not from when a line reached a reader."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    print(f"{LOG_PREFIX} {stamp} - hf_trainer - INFO - {message}", flush=True)


def _has_distributed_config() -> bool:
    try:
        from transformers.distributed import DistributedConfig  # noqa: F401
    except ImportError:
        return False
    return True


def _model_facts(model, seq_len: int) -> tuple[int, int]:
    """(total parameters, training FLOPs per token)."""
    import torch

    cfg = model.config
    nparams = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    return nparams, flops_per_token(nparams, emb, cfg.num_hidden_layers, heads, head_dim, seq_len, tied)


def _tied_keys(model) -> set[str]:
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    keys = getattr(model, "_tied_weights_keys", None) or {}
    names = set(keys) if isinstance(keys, (dict, list, tuple, set)) else set()
    return names or {"lm_head.weight"}


def hub_layout(model, state_dict: dict, *, dtype: Optional[str]) -> dict:
    """The state dict as the checkpoint had it: transformers' own reverse weight conversion (what
    ``save_pretrained`` applies: a Qwen3-MoE's fused ``mlp.experts.gate_up_proj``/``down_proj`` back
    to per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``), in the checkpoint's own dtype
    (the model trains in float32; ``dtype`` None keeps it)."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    state = revert_weight_conversion(model, dict(state_dict))
    if dtype is None:
        return state
    target = getattr(torch, dtype)
    return {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}


def save_hf_checkpoint(state_dict: dict, dest: Path, *, drop: set[str] = frozenset()) -> Path:
    """Write ``dest/model-00001-of-00001.safetensors`` + index json atomically (temp dir + rename)."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items() if k not in drop}
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_file(tensors, str(tmp / SAFETENSORS_NAME), metadata={"format": "pt"})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": {k: SAFETENSORS_NAME for k in sorted(tensors)}}
        (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def schedule_trainer_class(base, spec: HFTrainerSpec):
    """``base`` with torchtitan's optimizer and LR curve: one ``LambdaLR`` built from
    :func:`trnqwen.contract.lr_schedule.lr_factor` (the formula torchtitan 0.3.0 uses), and weight decay on
    every parameter, as torchtitan's ``default_adamw`` (one ``.*`` param group) applies it."""
    import functools

    from torch.optim.lr_scheduler import LambdaLR

    from trnqwen.contract.lr_schedule import lr_factor

    factor = functools.partial(
        lr_factor, warmup_steps=spec.warmup_steps, total_steps=spec.steps,
        decay_type="linear" if spec.lr_schedule == "constant" else spec.lr_schedule,
        decay_ratio=0.0 if spec.lr_schedule == "constant" else None, min_lr_factor=spec.min_lr_ratio,
    )

    class TitanSchedule(base):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer if optimizer is not None else self.optimizer, factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

        def get_decay_parameter_names(self, model):
            return [name for name, _ in model.named_parameters()]

    return TitanSchedule


def resumable(spec: HFTrainerSpec) -> bool:
    """Whether the Trainer writes resumable checkpoints (in DCP form: runtime/hf_trainer_checkpoint)."""
    return bool(spec.checkpoint_dir)


def _resume_callback(can_save: bool):
    """Saves at the last step (a finished run can be extended) and, on SIGTERM/SIGUSR1, saves at
    the next step boundary and stops: the Trainer's own checkpoint is the resume point."""
    from transformers import TrainerCallback

    from trnqwen.runtime import resume_state

    class SaveAndStopOnPreemption(TrainerCallback):
        def __init__(self):
            self.preempted_at: Optional[int] = None

        def on_step_end(self, args, state, control, **kwargs):
            resume_state._maybe_inject_fault(state.global_step)
            if state.global_step >= state.max_steps:
                control.should_save = can_save
            elif resume_state._everyone_stops():
                control.should_save = can_save
                control.should_training_stop = True
                self.preempted_at = state.global_step
            return control

    return SaveAndStopOnPreemption()


def _step_of(checkpoint: Optional[str]) -> int:
    return int(Path(checkpoint).name.rsplit("-", 1)[1]) if checkpoint else 0


def latest_resume_point(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The newest complete ``resume/checkpoint-N`` (``trainer_state.json`` is written last)."""
    if not checkpoint_dir:
        return None
    done = [s for s in checkpoints.scan(Path(checkpoint_dir)).resume if s.complete and s.kind == "trainer"]
    return str(max(done, key=lambda s: s.step).path) if done else None


def load_kwargs(device: str, plan: ParallelPlan, local_rank: int) -> dict[str, Any]:
    """``from_pretrained`` placement arguments (pure): ``device_map`` and the DistributedConfig sizes.

    Neuron gets ``device_map="neuron"``, never ``"auto"`` (Accelerate does not list Neuron, so
    ``"auto"`` silently loads on CPU).  With TP the device mesh places the shards and transformers
    rejects a ``device_map``.
    """
    if device == "neuron":
        device_map: Any = "neuron"
    elif device == "cuda":
        device_map = f"cuda:{local_rank}"
    else:
        device_map = "cpu"
    kwargs: dict[str, Any] = {}
    if plan.strategy == "distributed-config":
        kwargs["distributed_config"] = {"tp_size": plan.tp, "fsdp_size": plan.fsdp}
        if plan.tp == 1:
            kwargs["device_map"] = device_map
    else:
        kwargs["device_map"] = device_map
    return kwargs


def training_arguments(spec: HFTrainerSpec, plan: ParallelPlan, *, bf16_supported: bool) -> dict[str, Any]:
    """``TrainingArguments`` keywords for the run (pure)."""
    kwargs: dict[str, Any] = dict(
        output_dir=str(checkpoints.resume_dir(Path(spec.checkpoint_dir)) if spec.checkpoint_dir else Path(spec.output_dir) / "hf_trainer"),
        max_steps=spec.steps,
        per_device_train_batch_size=spec.local_batch_size,
        gradient_accumulation_steps=plan.grad_accum,
        learning_rate=spec.lr,
        # The LR curve is torchtitan's (schedule_trainer_class replaces the Trainer's scheduler with it);
        # these name it for the Trainer's own records.
        warmup_steps=spec.warmup_steps,
        lr_scheduler_type={"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[spec.lr_schedule],
        max_grad_norm=spec.max_grad_norm,
        weight_decay=spec.weight_decay,
        adam_beta1=0.9,  # torchtitan's default_adamw
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        logging_steps=1,
        logging_first_step=True,
        # The Trainer's own resumable checkpoints; the HF export below is separate (hf/step-N).
        # Model and optimizer state in DCP form, on every strategy (hf_trainer_checkpoint).
        save_strategy="steps" if resumable(spec) else "no",
        save_steps=spec.save_every,
        save_total_limit=spec.keep_last or None,
        report_to=[name for name in spec.report_to.split(",") if name] or "none",
        disable_tqdm=True,
        dataloader_drop_last=True,  # a short last batch would be a new shape: a recompile on Neuron
        bf16=spec.device != "cpu" and bf16_supported,  # mixed precision; fp32 master weights
        use_cpu=spec.device == "cpu",
        torch_compile=spec.compile,  # transformers picks backend "neuron" on Trainium
        remove_unused_columns=False,
        ddp_find_unused_parameters=False,
        log_level="warning",
    )
    if spec.gradient_checkpointing:  # --activation-checkpointing selective/full (transformers 5's name)
        kwargs["activation_checkpointing"] = True
    if spec.seed is not None:
        kwargs["seed"] = spec.seed
    if spec.val_every:
        kwargs.update(eval_strategy="steps", eval_steps=spec.val_every, per_device_eval_batch_size=spec.local_batch_size)
    if plan.strategy == "ddp" and spec.device == "cpu":
        kwargs["ddp_backend"] = "gloo"
    return kwargs


def _load_model(spec: HFTrainerSpec, plan: ParallelPlan, local_rank: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32, "trust_remote_code": spec.trust_remote_code, "use_safetensors": True}
    kwargs.update(load_kwargs(spec.device, plan, local_rank))
    device_map = kwargs.get("device_map", "cpu")
    if "distributed_config" in kwargs:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(**kwargs["distributed_config"])
    if spec.finetune:
        return AutoModelForCausalLM.from_pretrained(spec.assets_dir, **kwargs)
    if plan.strategy == "distributed-config":
        # Random init, sharded at load: DistributedConfig only exists on from_pretrained, so load the
        # snapshot sharded, then re-run the model's own initialiser over the (local) shards.
        model = AutoModelForCausalLM.from_pretrained(spec.assets_dir, **kwargs)
        _reinitialize(model, spec.seed)
        return model
    if spec.seed is not None:
        torch.manual_seed(spec.seed)  # same random init on every rank
    config = AutoConfig.from_pretrained(spec.assets_dir, trust_remote_code=spec.trust_remote_code)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=spec.trust_remote_code)
    return model.to(device_map if isinstance(device_map, str) else "cpu")


def _reinitialize(model, seed: Optional[int]) -> None:
    """Random-init a loaded model in place with its own ``_init_weights`` (works on FSDP shards)."""
    import torch

    for module in model.modules():  # transformers skips modules/tensors it marked as loaded
        module.__dict__.pop("_is_hf_initialized", None)
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            tensor.__dict__.pop("_is_hf_initialized", None)
    if seed is not None:
        torch.manual_seed(seed)
    model.initialize_weights()


def _sharding_summary(model) -> str:
    """How the parameters are laid out on this rank, e.g. ``46 of 46 tensors sharded (DTensor), ...``."""
    total = sharded = local = full = 0
    for p in model.parameters():
        total += 1
        full += p.numel()
        if hasattr(p, "to_local"):
            sharded += 1
            local += p.to_local().numel()
        else:
            local += p.numel()
    placements = sorted({str(getattr(p, "placements", "")) for p in model.parameters() if hasattr(p, "placements")})
    return (
        f"{sharded} of {total} parameter tensors sharded (DTensor {', '.join(placements) or '-'}); "
        f"this rank holds {local:,} of {full:,} elements"
    )


def load_method_hooks(spec: HFTrainerSpec):
    """The training method's hooks named by the spec (``"module:Class"``, built with its settings
    JSON), or None for a supervised run.  By dotted path: the ranks never import ``trnqwen.methods``
    by name (the launcher's plan chose the method)."""
    if not spec.method_hooks:
        return None
    import importlib

    module, _, attr = spec.method_hooks.partition(":")
    hooks_cls = getattr(importlib.import_module(module), attr)
    return hooks_cls(json.loads(spec.method_settings or "{}"))


def run(spec: HFTrainerSpec) -> int:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ranks = topology(
        nproc_per_node=world_size, tp=spec.tp, dp_shard=spec.dp_shard,
        local_batch_size=spec.local_batch_size, global_batch_size=spec.global_batch_size,
    )
    plan = choose_strategy(
        ranks, device=spec.device, strategy=spec.strategy, has_distributed_config=_has_distributed_config()
    )
    if spec.device == "neuron":
        import torch_neuronx  # noqa: F401  (registers the `neuron` device with torch)

    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    hf_logging.disable_progress_bar()
    if rank == 0:
        # Start-up lines in the shapes torchtitan prints (inspect-logs reads them the same way).
        _log(f"Starting job: hf-trainer, world size: {world_size}, strategy {plan.strategy}, device {spec.device}")
        dims = f"dp_replicate={plan.dp}, tp=1" if plan.strategy == "ddp" else f"dp_shard={plan.fsdp}, tp={plan.tp}"
        _log(f"Building device mesh with parallelism: {dims}")
        for note in plan.notes:
            _log(note)

    # the step line and the metrics stream (flops per token known once the model is loaded)
    recorder = step_recorder(
        tokens_per_step=spec.local_batch_size * spec.seq_len * plan.grad_accum,  # per rank, padding included
        flops_token=0, peak_flops=spec.peak_flops_per_rank, device=spec.device, memory_bytes=spec.memory_bytes_per_rank,
        meta={"backend": "hf-trainer", **({"method": spec.method} if getattr(spec, "method", None) else {})},
        log=_log, rank=rank)
    log_validation = recorder.validation  # torchtitan's validate line + the validation record (rank 0)
    trainer_cls, eval_dataset = Trainer, None
    method_hooks = load_method_hooks(spec)
    if spec.cache_dir:  # the launcher's token cache: torchtitan's rows, order, labels and positions
        from trnqwen.runtime import hf_trainer_data

        # TP ranks of one group read the same rows: the data-parallel rank is rank // tp.
        if method_hooks is not None:  # the training method's rows, loss and validation (its hooks)
            train_dataset, eval_dataset = method_hooks.datasets(spec, rank=rank // plan.tp, world=plan.dp)
        else:
            train_dataset, eval_dataset = hf_trainer_data.cache_datasets(spec, rank=rank // plan.tp, world=plan.dp)
        trainer_cls = hf_trainer_data.cache_trainer_class(
            Trainer, batch_size=spec.local_batch_size, log_validation=log_validation)
        if method_hooks is not None:
            trainer_cls = method_hooks.trainer_class(trainer_cls, log_validation=log_validation)
    else:  # a dataset torchtitan streams itself: its own reader, so the rows are the torchtitan backends'
        from trnqwen.runtime import hf_trainer_data

        train_dataset = hf_trainer_data.StreamedRows(
            spec.dataset, assets_dir=spec.assets_dir, model_is_builtin=spec.model.startswith("builtin:"),
            seq_len=spec.seq_len, rank=rank // plan.tp, world=plan.dp)
        trainer_cls = hf_trainer_data.cache_trainer_class(
            Trainer, batch_size=spec.local_batch_size, log_validation=log_validation)

    bf16_ok = spec.device == "neuron" or (spec.device == "cuda" and torch.cuda.is_bf16_supported())
    args_kwargs = training_arguments(spec, plan, bf16_supported=bf16_ok)
    args = TrainingArguments(**args_kwargs)

    if rank == 0:
        if spec.finetune:
            _log(f"Loading HF safetensors from {spec.assets_dir}")
        else:
            _log("Random init from config.json: no checkpoint was provided, this is a fresh start")
    resume_from = latest_resume_point(spec.checkpoint_dir) if resumable(spec) else None
    load_started = time.perf_counter()
    model = _load_model(spec, plan, local_rank)
    model.config.use_cache = False  # no KV cache in training: transformers then detects packed position_ids
    nparams, flops_token = _model_facts(model, spec.seq_len)
    recorder.flops_token = flops_token
    if rank == 0:
        _log(
            f"Model {getattr(model.config, 'model_type', '?')} {spec.model or Path(spec.assets_dir).name} "
            f"size: {nparams:,} total parameters"
        )
        _log(f"Parallelism: {_sharding_summary(model)}")
        if spec.finetune:
            _log(f"Finished loading the checkpoint in {time.perf_counter() - load_started:.2f} seconds")
        global_batch = spec.local_batch_size * plan.dp * plan.grad_accum
        _log(
            f"Trainer is initialized with local batch size {spec.local_batch_size}, global batch size {global_batch}, "
            f"gradient accumulation steps {plan.grad_accum}, sequence length {spec.seq_len}, "
            f"total steps {spec.steps} (warmup {spec.warmup_steps}, {spec.lr_schedule} LR from {spec.lr:g})"
        )
        if spec.peak_flops_per_rank:
            _log(f"Peak FLOPS used for computing MFU: {spec.peak_flops_per_rank:.3e}")
        _log(f"Training starts at step {_step_of(resume_from) + 1}")

    lora = spec.lora_spec()
    callbacks = [recorder]
    if lora is not None:  # peft on the loaded model; the [LoRA] line and check before step 1
        import importlib

        lora_code = importlib.import_module(spec.lora_module)  # by the spec's name: runtime never imports adapters/
        model, initialised = lora_code.attach(model, lora)
        callbacks.append(lora_code.callback(lora, initialised=initialised, rank=rank, log=_log))

    if method_hooks is not None:  # what the method does before step 1 (e.g. reference log-probs)
        method_hooks.before_train(spec, model, rank=rank // plan.tp, world=plan.dp, replicas=plan.tp,
                                  grad_accum=plan.grad_accum, resumed_at=_step_of(resume_from),
                                  log=_log if rank == 0 else (lambda _m: None))

    from trnqwen.runtime import resume_state

    resume_state.install_signal_handlers()
    preemption = _resume_callback(resumable(spec))
    trainer_cls = metrics_trainer_class(schedule_trainer_class(trainer_cls, spec), recorder)
    if resumable(spec):  # one checkpoint form for every strategy: DCP, resharded on load
        from trnqwen.runtime.hf_trainer_checkpoint import dcp_checkpoint_class

        trainer_cls = dcp_checkpoint_class(trainer_cls, log=_log)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[*callbacks, preemption],
    )
    trainer.remove_callback(PrinterCallback)  # our step lines replace its dict dumps
    if resume_from and rank == 0:
        _log(f"Loading the checkpoint from {resume_from}.")
    trainer.train(resume_from_checkpoint=resume_from)
    final_step = trainer.state.global_step

    if preemption.preempted_at is not None:
        if rank == 0:
            where = Path(args.output_dir) / f"checkpoint-{final_step}"
            saved = (f"saved a resumable checkpoint of step {final_step} to {where}" if resumable(spec)
                     else "no checkpoint folder: nothing saved")
            _log(f"{resume_state.PREEMPTED_MARK} {resume_state.signal_name()} at step {final_step}; {saved}")
    elif spec.export_hf:
        save_started = time.perf_counter()
        if rank == 0:
            _log(f"Saving a model only checkpoint in safetensors at last step, step {final_step}")
        dest = checkpoints.export_dir(Path(spec.checkpoint_dir), final_step)
        trained = trainer.model
        trained = getattr(trained, "module", trained)
        if lora is not None:  # the PEFT adapter, not the base model
            written = lora_code.export(trained, lora, dest, rank=rank,
                                       dtype=checkpoint_dtype(read_config_json(Path(spec.assets_dir))))
            if rank == 0:
                _log(f"{LOG_MARK} exported a PEFT adapter: {len(written or [])} tensors to {dest}")
        else:
            if plan.strategy == "distributed-config":
                from transformers.distributed import gather_full_state_dict

                state = gather_full_state_dict(trained)
            else:
                state = trained.state_dict() if rank == 0 else {}
            if rank == 0:
                state = hub_layout(trained, state, dtype=checkpoint_dtype(read_config_json(Path(spec.assets_dir))))
                save_hf_checkpoint(state, dest, drop=_tied_keys(trained))
        if rank == 0:
            _log(f"Saved HF safetensors checkpoint of step {final_step} to {dest}")
            _log(f"Last step checkpoint completed in {time.perf_counter() - save_started:.2f}s")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
    if rank == 0:
        _log("Training completed")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        spec = spec_from_argv(sys.argv[1:] if argv is None else argv)
        return run(spec)
    except SpecError as exc:
        print(f"{LOG_PREFIX} error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
