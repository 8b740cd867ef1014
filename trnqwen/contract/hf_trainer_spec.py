"""The pure half of the ``hf-trainer`` backend: the spec, its argv round trip, the strategy, FLOPs.

The recipe (:mod:`trnqwen.train.hf_trainer_recipe`) builds an :class:`HFTrainerSpec` and passes
it to every rank as flags (:func:`spec_to_argv`); the rank entry point
(:mod:`trnqwen.runtime.hf_trainer`) reads them back (:func:`spec_from_argv`) and asks
:func:`choose_strategy` how Trainer runs its ranks.  The degrees and the batch rule come from
:mod:`trnqwen.contract.topology`.  Nothing here imports torch or transformers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Sequence

from trnqwen.dataset.streamed import TITAN_DATASETS, streams_itself
from trnqwen.contract.lora import LoraSpec
from trnqwen.contract.topology import Topology

SPEC_FILE_NAME = "hf_trainer_spec.json"
STRATEGIES = ("auto", "ddp", "distributed-config")
# peft shards its adapters across tensor-parallel ranks in its own layout, which trnqwen's
# adapter init and PEFT export do not follow yet (and which cannot be run on CPU to be checked).
LORA_TP_PROBLEM = (
    "LoRA on hf-trainer runs with --tp 1 only (data parallel, the base sharded FSDP-style): peft's "
    "tensor-parallel adapters are not supported by trnqwen's adapter init and export"
)


class SpecError(ValueError):
    """A bad spec: raised before anything heavy is imported; the rank's main() prints it and exits 2."""


@dataclass
class HFTrainerSpec:
    """Everything one hf-trainer run needs; the recipe writes it, every rank reads it."""

    assets_dir: str = ""
    model: str = ""  # display name for the start-up line (Hub id or builtin:...)
    dataset: Optional[str] = None  # a torchtitan name (c4...); None = the model's default corpus
    cache_dir: Optional[str] = None  # a prepared token cache (trnqwen.dataset): read instead of `dataset`
    val_every: Optional[int] = None  # validate on the cache's val split every N steps (and at step 1)
    device: str = "cpu"  # neuron | cuda | cpu (already resolved: never "auto")
    steps: int = 10
    local_batch_size: int = 1
    global_batch_size: Optional[int] = None  # None = local batch x data-parallel degree
    seq_len: int = 2048
    lr: float = 8e-4
    warmup_steps: int = 2  # resolved (trnqwen.train.schedule): the LR follows contract.lr_schedule.lr_factor, as torchtitan's
    lr_schedule: str = "cosine"  # cosine | linear | constant
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1  # AdamW on every parameter, betas (0.9, 0.95): torchtitan's default_adamw
    gradient_checkpointing: bool = False
    seed: Optional[int] = 42
    tp: int = 1
    dp_shard: int = -1  # -1 = all ranks left after tp
    compile: bool = False
    finetune: bool = False  # load the published weights (else random init from config.json)
    checkpoint_dir: Optional[str] = None  # trnqwen's layout: resume/checkpoint-N, hf/step-N
    export_hf: bool = False  # save the last step as HF safetensors under checkpoint_dir/hf/step-N
    save_every: int = 500  # the Trainer's save_steps (resumable checkpoints in checkpoint_dir/resume)
    keep_last: int = 3  # the Trainer's save_total_limit (0 = keep all)
    output_dir: str = "."  # Trainer scratch (the run dir); nothing is checkpointed there
    peak_flops_per_rank: Optional[float] = None  # bf16 peak, for MFU; None = "N/A"
    memory_bytes_per_rank: Optional[int] = None  # for the memory percentage
    trust_remote_code: bool = False
    max_grad_norm: float = 1.0
    strategy: str = "auto"  # auto | ddp | distributed-config
    report_to: str = ""  # comma-separated Trainer report_to ("tensorboard,wandb"): --tensorboard / --wandb
    lora: Optional[str] = None  # a trnqwen.contract.lora.LoraSpec as JSON (targets already this backend's): train a LoRA adapter
    lora_module: Optional[str] = None  # the module the ranks train it with (attach / callback / export), by dotted path
    method: str = "sft"  # the training method (trnqwen.methods.registry)
    method_hooks: Optional[str] = None  # its hf-trainer hooks, "module:Class" (loaded by the ranks; None = supervised)
    method_settings: Optional[str] = None  # JSON: what the hooks are built with (the method's plan settings)

    def lora_spec(self) -> Optional[LoraSpec]:
        """The LoRA adapter this run trains, or None for a full fine-tune."""
        return LoraSpec.from_json(self.lora) if self.lora else None

    def validate(self) -> "HFTrainerSpec":
        problems = []
        if not self.assets_dir:
            problems.append("assets_dir is required (a local HF snapshot with config.json)")
        if self.device not in ("neuron", "cuda", "cpu"):
            problems.append(f"device must be neuron, cuda or cpu, not {self.device!r}")
        for name in ("steps", "local_batch_size", "seq_len", "tp"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1")
        if self.dp_shard == 0 or self.dp_shard < -1:
            problems.append("dp_shard must be -1 (all ranks) or a positive integer")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            problems.append("global_batch_size must be >= 1")
        if self.lr_schedule not in ("cosine", "linear", "constant"):
            problems.append("lr_schedule must be cosine, linear or constant")
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy must be one of {', '.join(STRATEGIES)}")
        if self.export_hf and not self.checkpoint_dir:
            problems.append("export_hf needs checkpoint_dir")
        if self.lora:
            try:
                self.lora_spec()
            except (ValueError, TypeError, KeyError) as exc:
                problems.append(f"lora must be a LoRA spec as JSON (trnqwen.contract.lora.LoraSpec): {exc}")
            if self.tp > 1:
                problems.append(LORA_TP_PROBLEM)
            if not self.lora_module:
                problems.append("lora needs lora_module (the ranks' LoRA code, a module's dotted path)")
        if self.method_hooks is not None and not self.cache_dir:
            problems.append(f"method {self.method} needs cache_dir (its token cache)")
        if not streams_itself(self.dataset):
            problems.append(
                f"dataset {self.dataset!r}: the ranks stream only {', '.join(TITAN_DATASETS)} (or the default "
                "corpus); other data reaches them as cache_dir (trnqwen train tokenizes it)"
            )
        if problems:
            raise SpecError("; ".join(problems))
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


_FIELD_TYPES = {f.name: f.type for f in fields(HFTrainerSpec)}
_BOOL_FIELDS = [f.name for f in fields(HFTrainerSpec) if f.type in ("bool", bool)]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def spec_to_argv(spec: HFTrainerSpec) -> list[str]:
    """The spec as command-line flags (only values that differ from the defaults)."""
    default = HFTrainerSpec()
    argv: list[str] = []
    for f in fields(HFTrainerSpec):
        value = getattr(spec, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name in _BOOL_FIELDS:
            argv.append(_flag(f.name) if value else "--no-" + f.name.replace("_", "-"))
        elif value is None:
            argv += [_flag(f.name), "none"]
        else:
            argv += [_flag(f.name), str(value)]
    return argv


def _optional(kind):
    def convert(text: str):
        return None if text.lower() in ("none", "null", "") else kind(text)

    convert.__name__ = kind.__name__
    return convert


def _arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trnqwen.runtime.hf_trainer",
        allow_abbrev=False,
        description="Train a causal LM with transformers.Trainer (trnqwen's hf-trainer backend; run under torchrun).",
    )
    parser.add_argument("spec_file", nargs="?", default=None, help="JSON spec file (flags given too override its values)")
    converters = {
        "int": int, "float": float, "str": str,
        "Optional[int]": _optional(int), "Optional[float]": _optional(float), "Optional[str]": _optional(str),
    }
    for f in fields(HFTrainerSpec):
        if f.name in _BOOL_FIELDS:
            parser.add_argument(
                _flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS
            )
        else:  # SUPPRESS: a flag not given leaves no attribute, so "--seed none" can still mean None
            parser.add_argument(_flag(f.name), dest=f.name, type=converters[str(f.type)], default=argparse.SUPPRESS)
    return parser


def spec_from_argv(argv: Sequence[str]) -> HFTrainerSpec:
    """Build and validate a spec from ``[spec.json] [--flag value ...]``."""
    parser = _arg_parser()
    ns = parser.parse_args(list(argv))
    values: dict[str, Any] = {}
    if ns.spec_file:
        path = Path(ns.spec_file)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise SpecError(f"cannot read spec file {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"spec file {path} is not JSON: {exc}") from None
        unknown = sorted(set(data) - set(_FIELD_TYPES))
        if unknown:
            raise SpecError(f"spec file {path}: unknown keys {', '.join(unknown)}")
        values.update(data)
    values.update({name: value for name, value in vars(ns).items() if name in _FIELD_TYPES})
    return HFTrainerSpec(**values).validate()


# --- parallelism -------------------------------------------------------------------------------


@dataclass
class ParallelPlan:
    """The run's topology and how Trainer runs it."""

    topology: Topology
    strategy: str  # "single" | "ddp" | "distributed-config"
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def tp(self) -> int:
        return self.topology.tp

    @property
    def fsdp(self) -> int:
        """Ranks sharing one copy of the weights (DistributedConfig.fsdp_size)."""
        return self.topology.dp

    @property
    def dp(self) -> int:
        """Ranks that see a distinct batch (hf-trainer has no replicate dimension)."""
        return self.topology.dp

    @property
    def grad_accum(self) -> int:
        return self.topology.grad_accum_steps


def choose_strategy(
    topology: Topology,
    *,
    device: str,
    strategy: str = "auto",
    has_distributed_config: bool = True,
) -> ParallelPlan:
    """How Trainer runs the ranks of ``topology``; a topology that breaks a rule is a SpecError.

    ``auto``: one rank -> a plain single-process Trainer; several ranks ->
    ``DistributedConfig(tp_size, fsdp_size)`` at ``from_pretrained`` (FSDP2 + TP; on CPU/gloo FSDP
    only, measured to match DDP's losses: accelerate refuses TP there), or, when this transformers has
    no DistributedConfig and tp is 1, plain DDP (gloo on CPU) with a note saying so.
    """
    if topology.problems:
        problem = topology.problems[0]
        raise SpecError(f"{problem.message} ({problem.hint})")
    world_size, tp = topology.world_size, topology.tp
    notes: list[str] = []
    if strategy == "auto":
        if world_size == 1:
            chosen = "single"
        elif has_distributed_config or tp > 1:
            chosen = "distributed-config"
        else:
            chosen = "ddp"
            notes.append(
                "this transformers has no DistributedConfig: data parallel with DDP "
                f"({'gloo' if device == 'cpu' else 'the device backend'}), parameters replicated, not sharded"
            )
    elif strategy == "ddp":
        if tp > 1:
            raise SpecError("strategy ddp cannot do tensor parallelism (tp > 1): use distributed-config")
        chosen = "ddp" if world_size > 1 else "single"
    else:
        chosen = "distributed-config"
    if chosen == "distributed-config" and not has_distributed_config:
        raise SpecError(
            "this transformers has no transformers.distributed.DistributedConfig (needed for tp/FSDP sharding at load): "
            "upgrade transformers (5.x with DistributedConfig), or run with --tp 1 and strategy ddp"
        )
    return ParallelPlan(topology=topology, strategy=chosen, notes=notes)


# --- metrics -----------------------------------------------------------------------------------


def flops_per_token(
    nparams: int, nparams_embedding: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int, tied: bool
) -> int:
    """Training FLOPs per token as torchtitan counts them for its native Qwen3.

    6 per matmul parameter (forward + backward; the token embedding is a lookup, not a matmul,
    unless it is tied to the output projection) plus 6 x layers x heads x (qk + v head dims) x seq
    for attention scores and values (causal sparsity ignored, as in torchtitan).
    """
    matmul_params = nparams if tied else nparams - nparams_embedding
    return 6 * matmul_params + 6 * n_layers * n_heads * (2 * head_dim) * seq_len
