"""The one config core every subcommand shares.

A run is described by :class:`RunConfig`, a typed pydantic model.  Values come
from four sources, later ones winning:

    built-in defaults  <  trnqwen.toml  <  TRNQWEN_* environment  <  command-line flags

:func:`resolve_config` merges them, validates once, and remembers where every
value came from (``trnqwen config show``).  Validation failures become one
:class:`~trnqwen.errors.ConfigError` with one line per bad field.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from trnqwen.errors import ConfigError
from trnqwen.fsutil import expand_user
from trnqwen.naming import default_checkpoint_dir, model_name, model_slug  # noqa: F401 (also RunConfig's)
from trnqwen.settings import ENV_PREFIX, Setting, flatten_settings, nest, setting, settings
from trnqwen.methods import registry as methods
from trnqwen.dataset.settings import flat_fields as data_fields  # mapping, [[datasets]], packing, template

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trnqwen.constants import (  # noqa: E402,F401
    BACKENDS, BUILTIN_PREFIX, CONFIG_FILE_NAME, DEFAULT_MODEL, DEVICES, LORA_ALL_LINEAR, LORA_TARGETS,
)

# TRNQWEN_* variables that are not run fields.
RESERVED_ENV = {"TRNQWEN_DEBUG", "TRNQWEN_CONFIG_FILE", "TRNQWEN_NO_COLOR", "TRNQWEN_HOME", "TRNQWEN_SYSFS_ROOT",
                "TRNQWEN_FAULT_PREEMPT_AT_STEP", "TRNQWEN_LOCK_DIR",  # the lock on a local disk (train/folder_lock.py)
                "TRNQWEN_SCAN_THREADS",  # verify-ckpt's scan threads (ckpt/scan.py)
                "TRNQWEN_LOG_WORKERS",  # read by earlier versions' inspect-logs (its worker count): kept quiet, not warned about
                "TRNQWEN_METRICS_PATH"}  # where rank 0 writes the metrics stream (contract/metrics_stream.py)

Backend = Literal["hf-v5", "native", "nki-moe", "hf-trainer"]
Device = Literal["auto", "neuron", "cuda", "cpu"]
Launcher = Literal["local", "slurm", "k8s"]
K8sApi = Literal["trainjob", "pytorchjob"]
CHAT_FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt-completion", "text")  # dataset/formats.py
PAIR_FORMATS = ("prompt-chosen-rejected", "conversation-chosen-rejected")  # a method that reads preference pairs
DatasetFormat = Literal[CHAT_FORMATS + PAIR_FORMATS]
LongConversations = Literal["truncate", "drop"]
LrSchedule = Literal["cosine", "linear", "constant"]
Method = Literal[methods.NAMES]  # the registry's methods (trnqwen/methods/registry.py)
# each method's settings, declared in its folder (methods/<name>/settings.py): name -> (type, field)
METHOD_SETTINGS = {n: (i.annotation, i) for model in methods.settings_models() for n, i in model.model_fields.items()}
ActivationCheckpointing = Literal["none", "selective", "full"]
EPOCH = "epoch"  # --val-every / --save-every epoch: once per pass over the training data
EveryN = Union[Annotated[int, Field(ge=1)], Literal["epoch"]]


class _RunFields(BaseModel):
    """RunConfig's fields up to ``method`` (the methods' settings follow it, then the rest)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    # --- what to train -------------------------------------------------------------
    model: str = setting(DEFAULT_MODEL, help="Hub repo id or builtin:tiny-qwen3.", short="-m", panel="Model")
    assets_dir: Optional[Path] = setting(
        None, help="Local HF snapshot.", flags=("--assets", "--assets-dir"), shown_default="./assets/hf/<model name>",
        panel="Model",
    )
    backend: Backend = setting("hf-v5", help=f"Modeling backend: {', '.join(BACKENDS)}.", short="-b", panel="Model")
    finetune: bool = setting(False, help="Start from the published weights and export HF safetensors.", panel="Model")
    dataset: Optional[str] = setting(
        None, help="Local JSONL/Parquet/text file or folder, or a Hub dataset name.", panel="Data",
    )
    # --- your data (trnqwen.dataset: formats, chat template, labels, packing, cache) -------
    dataset_format: Optional[DatasetFormat] = setting(
        None, help=f"Record format: {', '.join(CHAT_FORMATS)}; a preference method's pairs: {', '.join(PAIR_FORMATS)}.",
        shown_default="auto (detected from the records)", panel="Data",
    )
    dataset_split: str = setting("train", help="Hub dataset split.", panel="Data")
    train_on_inputs: bool = setting(False, help="Train on every token, not only the assistant answers.", panel="Data")
    packing: bool = setting(True, help="Pack conversations into --seq-len rows (--no-packing: one per row, padded).", panel="Data")
    long_conversations: LongConversations = setting("truncate", panel="Data",
                                                    help="Conversations longer than --seq-len: truncate or drop (counted either way).")
    val_split: float = setting(
        0.0, ge=0.0, lt=1.0, allow_inf_nan=False, help="Fraction of records held out for validation, e.g. 0.05 (seeded).",
        shown_default="0", panel="Data",
    )
    val_dataset: Optional[str] = setting(
        None, help="Validation records from another file, folder or Hub dataset.", panel="Data",
    )
    val_every: Optional[EveryN] = setting(None, help="Validate every N steps, or 'epoch'.", metavar="N|epoch", panel="Data")
    data_cache_dir: Optional[Path] = setting(
        None, help="Tokenized dataset cache.", shown_default="~/.cache/trnqwen/datasets", panel="Data",
    )
    # --- schedule ---------------------------------------------------------------------
    steps: Optional[int] = setting(
        None, ge=1, help="Training steps (or --epochs).", shown_default="one epoch with --dataset, else 10", panel="Schedule",
    )
    local_batch_size: int = setting(1, ge=1, help="Sequences per rank per step.", panel="Schedule")
    global_batch_size: Optional[int] = setting(
        None, ge=1, help="Sequences per step over all ranks (gradient accumulation when above local x dp).",
        shown_default="local x dp", panel="Schedule",
    )
    seq_len: int = setting(2048, ge=8, le=1_048_576, help="Sequence length in tokens.", panel="Schedule")
    lr: Optional[float] = setting(
        None, gt=0, le=1.0, allow_inf_nan=False, help="Peak learning rate.",
        shown_default="1e-5 for a full fine-tune, 8e-4 from random init", panel="Schedule",
    )
    seed: Optional[int] = setting(
        42, ge=0, help="Random seed: the random init, LoRA's adapters, the --val-split hold-out and each epoch's data "
        "order (torchtitan's debug.seed, the Trainer's seed); recorded in run.json, kept by --resume.", panel="Schedule",
    )
    # --- LoRA (trnqwen.adapters.lora: plan, ranks, readers; contract.peft_adapter: the PEFT adapter) ---
    lora: bool = setting(
        False, help="Train a LoRA adapter on the frozen base; the export is a PEFT adapter folder.", panel="LoRA",
    )
    lora_rank: int = setting(16, ge=1, le=4096, help="LoRA rank r.", panel="LoRA")
    lora_alpha: Optional[float] = setting(
        None, gt=0, allow_inf_nan=False, help="LoRA alpha; the update is scaled by alpha/r.", shown_default="2 x rank",
        panel="LoRA",
    )
    lora_dropout: float = setting(0.0, ge=0.0, lt=1.0, allow_inf_nan=False, help="Dropout on the adapter's input.", panel="LoRA")
    lora_targets: str = setting(
        "all-linear",
        help="Modules to adapt, Hugging Face names, comma-separated (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        "down_proj) or all-linear.",
        panel="LoRA",
    )
    merge: bool = setting(
        False, help="With --lora: also write the merged whole model folder beside the adapter (hf/step-N.merged).",
        panel="LoRA",
    )
    # --- the training method (trnqwen/methods/<name>/: one folder each; their settings declared there) ---
    method: Method = setting(methods.DEFAULT, help=methods.help_text(), panel="Method")


# every method's settings (from the registry) right after ``method``, then the data settings of dataset/settings.py
_WithMethodSettings = create_model("_WithMethodSettings", __base__=_RunFields, __module__=__name__, **METHOD_SETTINGS,
                                   **data_fields())


class RunConfig(_WithMethodSettings):
    """Everything that describes one fine-tune run.  Each field is declared once, here (a method's
    settings in ``methods/<name>/settings.py``): its description is its help text, and
    :func:`setting`'s metadata names its flag, env variable, shown default and panel; the CLI
    options, ``config show``, docs/config.md and the TOML reader all follow from it (:func:`settings`)."""
    # --- fine-tune schedule: epochs, LR curve, optimizer, memory (the same on every backend) ----
    epochs: Optional[float] = setting(
        None, gt=0, le=1_000_000, allow_inf_nan=False,
        help="Passes over the training data (0.5 is fine); the steps are counted from the tokenized --dataset. "
        "Not with --steps.",
        panel="Schedule",
    )
    lr_schedule: LrSchedule = setting("cosine", help="LR after warm-up: cosine, linear or constant.", panel="Schedule")
    warmup: Optional[Union[int, float]] = setting(
        None, ge=0, allow_inf_nan=False, help="Linear warm-up: steps (20) or a fraction of the steps (0.03).",
        shown_default="2 steps, at most the run's", panel="Schedule",
    )
    min_lr_ratio: float = setting(
        0.0, ge=0.0, le=1.0, allow_inf_nan=False, help="Lowest LR of the decay, as a fraction of --lr.", panel="Schedule",
    )
    weight_decay: float = setting(0.1, ge=0.0, allow_inf_nan=False, help="AdamW weight decay.", panel="Schedule")
    max_grad_norm: float = setting(1.0, gt=0.0, allow_inf_nan=False, help="Clip the gradient norm to this.", panel="Schedule")
    activation_checkpointing: Optional[ActivationCheckpointing] = setting(
        None, help="none, selective or full.",
        shown_default="the backend's: hf-v5 selective, native full, hf-trainer none", panel="Schedule",
    )
    # --- parallelism & device ------------------------------------------------------------
    dp_shard: int = setting(-1, help="FSDP degree; -1 shards over all ranks.", panel="Parallelism and device")
    tp: int = setting(1, ge=1, help="Tensor-parallel degree.", panel="Parallelism and device")
    device: Device = setting("auto", help=f"Device: {', '.join(DEVICES)}.", panel="Parallelism and device")
    nproc_per_node: Optional[int] = setting(
        None, ge=1, help="Ranks per node.", shown_default="logical NeuronCores, GPUs, or 1 on CPU",
        panel="Parallelism and device",
    )
    lnc: Optional[Literal[1, 2]] = setting(
        None, help="Logical NeuronCore config (default: the instance's).", flag=False, panel="Parallelism and device",
    )
    compile: bool = setting(False, help="torch.compile the model.", panel="Parallelism and device")
    override_imports: list[str] = setting(
        default_factory=list, help="torchtitan override to activate (module.function); repeatable.",
        env_note="comma-separated", panel="Parallelism and device",
    )
    # --- nki-moe ---------------------------------------------------------------------------
    moe_layers: int = setting(4, ge=1, help="nki-moe: transformer layers kept.", panel="nki-moe")
    num_experts: int = setting(64, ge=1, help="nki-moe: experts per MoE layer.", panel="nki-moe")
    top_k: int = setting(4, ge=1, help="nki-moe: experts per token.", panel="nki-moe")
    # --- outputs ---------------------------------------------------------------------------
    checkpoint_dir: Optional[Path] = setting(
        None, help="Checkpoint folder.",
        shown_default="./checkpoint_<slug>_<hash6>[_ft], the hash of the model's identity; the recipe's "
        "Qwen3-4B-Instruct-2507: ./checkpoint_qwen3_4b[_ft]",
        panel="Outputs",
    )
    export_hf: Optional[bool] = setting(
        None, help="Save the last step as HF safetensors.", shown_default="on with --finetune", panel="Outputs",
    )
    save_every: Optional[EveryN] = setting(
        None, help="Save a resumable checkpoint every N steps or 'epoch' (torchtitan checkpoint.interval, the Trainer's "
        "save_steps).", metavar="N|epoch", shown_default="500; the last step and a preemption always save",
        panel="Checkpoints and preemption",
    )
    keep_last: int = setting(
        3, ge=0, help="Resumable checkpoints kept; 0 keeps all (torchtitan keep_latest_k, the Trainer's "
        "save_total_limit).", panel="Checkpoints and preemption",
    )
    disk_check: bool = setting(True, panel="Checkpoints and preemption", help="Refuse a run whose resume points "
                               "(x --keep-last) and export would not fit on the disk (preflight's estimate).")
    grace_seconds: float = setting(
        90.0, gt=0, le=3600, help="On SIGTERM/SIGUSR1 the ranks save at the next step boundary within this many "
        "seconds, then exit 138.", shown_default="90", panel="Checkpoints and preemption",
    )
    runs_dir: Path = setting(
        Path(".trnqwen/runs"), help="Where run directories (logs, records) are kept.", flag=False, panel="Outputs",
    )
    tensorboard: bool = setting(
        False, help="TensorBoard events in the run dir (<run>/tb), validation included.", panel="Outputs",
    )
    wandb: bool = setting(
        False, help="Log to Weights & Biases (wandb installed and logged in; project trnqwen).", panel="Outputs",
    )
    compile_cache_dir: Optional[Path] = setting(
        None, help="Neuron compile cache (default .trnqwen/neff-cache; TORCH_NEURONX_NEFF_CACHE_DIR wins).", flag=False,
        panel="Outputs",
    )
    trust_remote_code: bool = setting(
        False, help="Allow model repos to run their own code (off by default).", flag=False, panel="Model",
    )
    # --- multi-node ------------------------------------------------------------------------
    launcher: Launcher = setting(
        "local", help="local (torchrun on this node), slurm (sbatch script, submitted) or k8s (Kubeflow manifest, "
        "see --k8s-api).", panel="Multi-node",
    )
    nnodes: int = setting(
        1, ge=1, help="Nodes in the job (--nodes for slurm/k8s).", flags=("--nnodes", "--nodes"), min=1, panel="Multi-node",
    )
    node_rank: int = setting(0, ge=0, help="This node's rank, 0..N-1 (local launcher).", min=0, panel="Multi-node")
    rdzv_endpoint: Optional[str] = setting(
        None, help="HOST:PORT of node 0, the same on every node.", metavar="HOST:PORT", panel="Multi-node",
    )
    rdzv_id: Optional[str] = setting(None, help="Run id shared by all nodes; names the run dir.", panel="Multi-node")
    max_restarts: int = setting(0, ge=0, help="torchrun restarts of the worker group.", min=0, panel="Multi-node")
    partition: Optional[str] = setting(None, help="SLURM partition.", panel="Multi-node")
    time_limit: Optional[str] = setting(None, help="SLURM time limit, e.g. 4:00:00.", flags=("--time",), panel="Multi-node")
    image: Optional[str] = setting(None, help="Container image with trnqwen (k8s launcher).", panel="Multi-node")
    k8s_secret: Optional[str] = setting(
        None, help="k8s launcher: a Secret whose HF_TOKEN and WANDB_API_KEY keys (each optional) the pods get by "
        "secretKeyRef; the values are never written into the manifest.", metavar="NAME", panel="Multi-node")
    k8s_api: K8sApi = setting(
        "trainjob", help="k8s launcher: trainjob (Kubeflow Trainer v2 TrainJob + TrainingRuntime) or pytorchjob "
        "(the v1 training operator).", panel="Multi-node",
    )

    @field_validator("dp_shard")
    @classmethod
    def _dp_shard_valid(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("must be -1 (all ranks) or a positive integer")
        return v

    @field_validator("*")
    @classmethod
    def _home_exists(cls, value: Any) -> Any:
        """A path field naming ``~nosuchuser`` is a usage error here, not a crash where it is used."""
        if isinstance(value, Path) and str(value).startswith("~") and _expand(str(value)) == value:
            raise ValueError("cannot expand a path starting with ~ (no such user here); use an absolute path, or ~/ for your own home")
        return value

    @field_validator("warmup")
    @classmethod
    def _warmup_valid(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and v >= 1 and v != int(v):
            raise ValueError("must be a whole number of steps (20) or a fraction of the steps below 1 (0.03)")
        return int(v) if v is not None and v >= 1 else v

    @field_validator("keep_last")
    @classmethod
    def _keep_last_valid(cls, v: int) -> int:
        if v == 1:  # torchtitan's rule: the newest may still be being written
            raise ValueError("must be 0 (keep all) or at least 2")
        return v

    @field_validator("model")
    @classmethod
    def _model_valid(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must not be empty")
        if v.startswith(BUILTIN_PREFIX):
            return v
        if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", v) and not _expand(v).exists():
            raise ValueError("must be a Hub repo id like Qwen/Qwen3-4B-Instruct-2507, builtin:tiny-qwen3, or a local folder")
        return v

    @field_validator("rdzv_endpoint")
    @classmethod
    def _endpoint_valid(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"[\w.\-\[\]:]+:\d{1,5}", v):
            raise ValueError("must be HOST:PORT")
        return v

    @field_validator("lora_targets")
    @classmethod
    def _lora_targets_valid(cls, v: str) -> str:
        """Canonical form: ``all-linear`` or the chosen names in LORA_TARGETS order, comma-joined."""
        names = [part.strip() for part in str(v).replace(" ", ",").split(",") if part.strip()]
        if not names:
            raise ValueError(f"must name at least one module: {LORA_ALL_LINEAR} or some of {','.join(LORA_TARGETS)}")
        if LORA_ALL_LINEAR in names:
            if len(names) > 1:
                raise ValueError(f"{LORA_ALL_LINEAR} already means all of {','.join(LORA_TARGETS)}: give it alone")
            return LORA_ALL_LINEAR
        unknown = [n for n in names if n not in LORA_TARGETS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], LORA_TARGETS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(
                f"unknown module {unknown[0]!r}{hint}: use Hugging Face names from {','.join(LORA_TARGETS)}, or {LORA_ALL_LINEAR}"
            )
        chosen = [n for n in LORA_TARGETS if n in names]
        return LORA_ALL_LINEAR if len(chosen) == len(LORA_TARGETS) else ",".join(chosen)

    @field_validator("override_imports", mode="before")
    @classmethod
    def _split_imports(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [part.strip() for part in v.split(",") if part.strip()]
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "RunConfig":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank ({self.node_rank}) must be below nnodes ({self.nnodes})")
        if self.val_split and self.val_dataset:
            raise ValueError("val_split and val_dataset are both set: pick one source of validation data")
        if self.merge and not self.lora:
            raise ValueError("merge needs lora: --merge writes base + adapter as one model folder")
        return self

    # --- derived values ------------------------------------------------------------------
    @property
    def is_builtin(self) -> bool:
        return self.model.startswith(BUILTIN_PREFIX)

    @property
    def model_name(self) -> str:
        """Last path component of the model id: ``Qwen3-4B-Instruct-2507``, ``tiny-qwen3``."""
        return model_name(self.model)

    @property
    def model_slug(self) -> str:
        return model_slug(self.model)

    @property
    def resolved_assets_dir(self) -> Path:
        if self.assets_dir is not None:
            return self.assets_dir
        local = _expand(self.model)
        if not self.is_builtin and "/" in self.model and local.is_dir() and (local / "config.json").exists():
            return local
        return Path("assets") / "hf" / self.model_name

    @property
    def resolved_checkpoint_dir(self) -> Path:
        return self.checkpoint_dir if self.checkpoint_dir is not None else default_checkpoint_dir(self.model, self.finetune)

    @property
    def data_kind(self) -> str:
        """The records this run's method reads: ``chat`` or ``preference`` (trnqwen.methods.registry)."""
        return methods.get(self.method).data

    @property
    def resolved_lora_alpha(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    @property
    def resolved_save_every(self) -> int | str:
        """Steps between resumable checkpoints ('epoch': the plan counts the steps of one epoch)."""
        return self.save_every or DEFAULT_SAVE_EVERY

    @property
    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else default_lr(self)[0]

    @property
    def lr_source(self) -> str:
        return "set" if self.lr is not None else default_lr(self)[1]

    @property
    def resolved_export_hf(self) -> bool:
        return self.finetune if self.export_hf is None else self.export_hf


def _expand(path: str) -> Path:
    """``Path(path).expanduser()``, but ``~nosuchuser`` stays as written instead of raising."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


DEFAULT_SAVE_EVERY = 500
DEFAULT_STEPS = 10  # without a dataset (the recipe's corpus): the recipe's 10 steps
DEFAULT_WARMUP_STEPS = 2  # torchtitan's Qwen3 recipes; never more than the run's steps


def default_lr(cfg: "RunConfig") -> tuple[float, str]:
    """The peak learning rate when --lr is not given, and why: the ONE rule (``config show`` and the
    plan print the reason).  Published weights are fine-tuned gently (LLaMA-Factory's full SFT of
    Qwen3 uses 1e-5); a LoRA adapter, which starts at zero, at 1e-4; a model from random init gets
    torchtitan's pre-training rate."""
    method = methods.find(getattr(cfg, "method", None))  # a method may declare its own (preference tuning: small)
    own = method and (method.lora_lr if cfg.lora else method.lr)
    if own:
        return own
    if cfg.lora:  # adapters start at zero: the peers' Qwen3 LoRA examples use 1e-4 to 2e-4
        return 1e-4, "default for LoRA"
    if cfg.finetune:
        return 1e-5, "default for a full fine-tune"
    return 8e-4, "default for pre-training from random init (torchtitan's)"


SETTINGS: tuple[Setting, ...] = settings(RunConfig)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
FIELD_NAMES: tuple[str, ...] = tuple(s.name for s in SETTINGS)  # every settable name (dotted in a sub-model)
PATH_FIELDS = {s.name for s in SETTINGS if s.is_path}
FORMER_NAMES: dict[str, str] = {old: s.name for s in SETTINGS for old in s.former}
ENV_NAMES: dict[str, str] = {s.env: s.name for s in SETTINGS}


def flag_of(name: str) -> str:
    """The flag that sets field ``name`` (what a source line names)."""
    s = BY_NAME.get(name)
    return s.flag if s is not None else "--" + name.replace("_", "-")


def flatten(values: dict[str, Any]) -> dict[str, Any]:
    """A dumped (or recorded) RunConfig by setting name: a sub-model's dict as dotted names, a
    field recorded before it moved under its name now."""
    return flatten_settings(values, BY_NAME, FORMER_NAMES)


# --- resolution with provenance -----------------------------------------------------------


@dataclass
class ResolvedConfig:
    """A validated :class:`RunConfig` plus where each value came from."""

    config: RunConfig
    sources: dict[str, str]
    config_file: Optional[Path] = None
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.config.model_dump(mode="json")

    def describe(self) -> list[dict[str, Any]]:
        """Rows of (field, value, source) for ``config show``, derived values included."""
        rows = [
            {"field": name, "value": value, "source": self.sources.get(name, "default")}
            for name, value in flatten(self.as_dict()).items()
        ]
        cfg = self.config
        for row in rows:  # a default that depends on the run names its reason
            if row["field"] == "lr" and cfg.lr is None:
                row["value"], row["source"] = default_lr(cfg)
            elif row["field"] == "steps" and cfg.steps is None:
                if cfg.dataset or cfg.datasets:
                    row["source"] = f"default: {cfg.epochs or 1:g} epoch(s) of --dataset (counted when it is tokenized)"
                else:
                    row["value"], row["source"] = DEFAULT_STEPS, "default without a dataset"
            elif row["field"] == "warmup" and cfg.warmup is None:
                row["value"], row["source"] = DEFAULT_WARMUP_STEPS, "default (steps; at most the run's)"
            elif row["field"] == "activation_checkpointing" and cfg.activation_checkpointing is None:
                row["source"] = "default: the backend's own (hf-v5 selective, native full, hf-trainer none)"
        derived = {
            "resolved_assets_dir": str(cfg.resolved_assets_dir),
            "resolved_checkpoint_dir": str(cfg.resolved_checkpoint_dir),
            "resolved_export_hf": cfg.resolved_export_hf,
            "resolved_save_every": cfg.resolved_save_every,
            "resolved_lr": cfg.resolved_lr,
        }
        rows += [{"field": k, "value": v, "source": "derived"} for k, v in derived.items()]
        return rows


def find_config_file(explicit: Optional[Path] = None, cwd: Optional[Path] = None) -> Optional[Path]:
    """The project file: ``--config-file``/``TRNQWEN_CONFIG_FILE``, else ./trnqwen.toml if present."""
    if explicit is None and os.environ.get("TRNQWEN_CONFIG_FILE"):
        explicit = Path(os.environ["TRNQWEN_CONFIG_FILE"])
    if explicit is not None:
        explicit = expand_user(explicit)
        if not explicit.is_file():
            raise ConfigError(
                [f"config file {explicit} does not exist or is not a file"],
                hint="pass an existing trnqwen.toml with --config-file, or drop the flag",
            )
        return explicit
    candidate = (cwd or Path.cwd()) / CONFIG_FILE_NAME
    if candidate.is_file():
        return candidate
    if candidate.exists() or candidate.is_symlink():  # a folder, a dangling link: never silently skipped
        what = "a folder" if candidate.is_dir() else "not a readable file"
        raise ConfigError(
            [f"{candidate} is {what}; trnqwen reads its settings from a trnqwen.toml file there"],
            hint=f"remove or rename {candidate}, or pass another file with --config-file",
        )
    return None


def closest_field(name: str) -> Optional[str]:
    matches = difflib.get_close_matches(name.replace("-", "_").lower(), FIELD_NAMES, n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unknown_key_message(key: str, where: str) -> str:
    guess = closest_field(key)
    tip = f" (did you mean '{guess}'?)" if guess else f" (known keys: {', '.join(FIELD_NAMES)})"
    return f"{where}: unknown key '{key}'{tip}"


def _takes_bool(name: str) -> bool:
    return "bool" in str(BY_NAME[name].info.annotation)


def _kind(name: str) -> str:
    """What a field takes, in words, for an error about a TOML boolean."""
    text = str(BY_NAME[name].info.annotation)
    if "Literal" in text and "int" not in text:
        words = re.findall(r"Literal\[([^\]]*)\]", text)
        return "value: one of " + ", ".join(w.strip(" '") for w in ",".join(words).split(","))
    if "float" in text:
        return "number"
    if "int" in text:
        return "whole number"
    return "list" if "list" in text else ("path" if "Path" in text else "string")


def _table_items(table: dict[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """A TOML table's (key, value) pairs, a sub-model's own table (``[name]``, ``name.key = ...``)
    as dotted keys."""
    for key, value in table.items():
        name = prefix + key.replace("-", "_")
        if isinstance(value, dict) and any(s.startswith(name + ".") for s in FIELD_NAMES):
            yield from _table_items(value, name + ".")
        else:
            yield prefix + key, value


def load_config_file(path: Path) -> dict[str, Any]:
    """Read trnqwen.toml: flat keys, or the same keys under a [run] table; a sub-model's fields
    in its own table (``[name]``) or as dotted keys (``name.key``)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"cannot read config file {path}: {exc.strerror or exc}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text"], hint="save trnqwen.toml as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: TOML syntax error: {exc}"], hint="fix the line shown; see docs/config.md") from None
    tables = [("", data)]
    if "run" in data and isinstance(data["run"], dict):
        tables = [("", {k: v for k, v in data.items() if k != "run"}), ("[run] ", data["run"])]
    problems: list[str] = []
    values: dict[str, Any] = {}
    written: dict[str, str] = {}  # field -> the key as written, where
    for where, table in tables:
        for key, value in _table_items(table):
            name = key.replace("-", "_")
            name = FORMER_NAMES.get(name, name)  # a key from before its field moved into a sub-model
            if name not in FIELD_NAMES:
                problems.append(_unknown_key_message(key, str(path)))
                continue
            if name in written:  # seq_len and seq-len, or steps and [run] steps: never pick one silently
                problems.append(f"{path}: {where}{key} sets {name} again (already set by {written[name]}): keep one")
                continue
            written[name] = f"{where}{key}"
            if isinstance(value, bool) and not _takes_bool(name):  # TOML true would become 1
                problems.append(f"{path}: {where}{key} = {str(value).lower()}: {name} takes a {_kind(name)}, not true/false")
                continue
            values[name] = value
    if problems:
        raise ConfigError(problems, hint="see `trnqwen config show` or docs/config.md for the known keys")
    base = path.parent
    for key in PATH_FIELDS & values.keys():
        if isinstance(values[key], str) and not _expand(values[key]).is_absolute():
            values[key] = str(base / values[key])
    return values


def env_values(environ: Optional[dict[str, str]] = None) -> tuple[dict[str, str], list[str]]:
    """TRNQWEN_<FIELD> variables -> field values; unknown TRNQWEN_* names become warnings."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    warnings: list[str] = []
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        key = ENV_NAMES.get(name) or FORMER_NAMES.get(name[len(ENV_PREFIX):].lower())
        if key is not None:
            values[key] = value
        else:
            guess = closest_field(name[len(ENV_PREFIX):].lower().replace("__", "."))
            warnings.append(
                f"ignoring environment variable {name}: not a config field"
                + (f" (did you mean {BY_NAME[guess].env}?)" if guess else "")
            )
    return values, warnings


def _setting_of(loc: tuple) -> Optional[str]:
    """The setting an error location names (``("name", "key")`` -> ``name.key``), if any."""
    parts = [str(p) for p in loc]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in BY_NAME:
            return ".".join(parts[:end])
    return parts[0] if parts else None


def _format_validation_error(exc: ValidationError, sources: dict[str, str]) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "config"
        field_name = _setting_of(err.get("loc") or ())
        given = err.get("input")
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "literal_error":
            msg = msg.replace("Input should be", "must be one of:")
        msg = msg.replace("Input should be", "must be").replace("greater than or equal to", ">=")
        msg = msg.replace("less than or equal to", "<=").replace("greater than", ">")
        where = sources.get(field_name, "") if field_name else ""
        given_txt = "" if isinstance(given, dict) else f" = {str(given) if isinstance(given, Path) else given!r}"
        problems.append(f"{loc}{given_txt}: {msg}" + (f" (from {where})" if where else ""))
    return problems


def resolve_config(
    cli: Optional[dict[str, Any]] = None,
    *,
    config_file: Optional[Path] = None,
    environ: Optional[dict[str, str]] = None,
    cwd: Optional[Path] = None,
    labels: Optional[dict[str, str]] = None,
    uses: Optional[Iterable[str]] = None,
) -> ResolvedConfig:
    """Merge defaults < trnqwen.toml < TRNQWEN_* < flags and validate once.

    ``cli`` holds only the flags the user actually gave (``None`` values are dropped).
    ``labels`` names what the command line calls a field when it is not the usual flag
    (``fetch REPO`` sets ``model``: an error must blame ``argument REPO``, not ``--model``).
    ``uses`` (a read-only command: inspect-logs, verify-ckpt, eval, data) names the fields the
    command reads: a ``TRNQWEN_*`` variable for any other field is not read, so a bad value meant
    for ``train`` does not stop it.
    """
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = find_config_file(config_file, cwd)
    if path is not None:
        for key, value in load_config_file(path).items():
            merged[key] = value
            sources[key] = f"file {path}"
    env_vals, warnings = env_values(environ)
    if uses is not None:
        wanted = set(uses)
        env_vals = {k: v for k, v in env_vals.items() if k in wanted}
    for key, value in env_vals.items():
        merged[key] = value
        sources[key] = f"env {BY_NAME[key].env}"
    for key, value in (cli or {}).items():
        if value is None:
            continue
        if key not in FIELD_NAMES:
            raise ConfigError([f"internal: flag maps to unknown field '{key}'"])
        merged[key] = value
        sources[key] = (labels or {}).get(key) or f"flag {flag_of(key)}"
    try:
        config = RunConfig(**nest(merged))
    except ValidationError as exc:
        raise ConfigError(
            _format_validation_error(exc, sources),
            hint="fix the value(s) above; `trnqwen config show` prints every field with its source",
        ) from None
    if config.steps is not None and config.epochs is not None:  # a recorded run may hold both (steps counted)
        raise ConfigError(
            [f"steps ({sources.get('steps')}) and epochs ({sources.get('epochs')}) are both set: pick one"],
            hint="--epochs N counts the steps from the data; --steps N sets them",
        )
    return ResolvedConfig(config=config, sources=sources, config_file=path, warnings=warnings)
