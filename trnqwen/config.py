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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trnqwen.errors import ConfigError
from trnqwen.fsutil import expand_user
from trnqwen.methods import registry as methods

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trnqwen.constants import (  # noqa: E402,F401
    BACKENDS, BUILTIN_PREFIX, CONFIG_FILE_NAME, DEFAULT_MODEL, DEVICES, LORA_ALL_LINEAR, LORA_TARGETS,
)

ENV_PREFIX = "TRNQWEN_"
# TRNQWEN_* variables that are not run fields.
RESERVED_ENV = {"TRNQWEN_DEBUG", "TRNQWEN_CONFIG_FILE", "TRNQWEN_NO_COLOR", "TRNQWEN_HOME", "TRNQWEN_SYSFS_ROOT",
                "TRNQWEN_FAULT_PREEMPT_AT_STEP",
                "TRNQWEN_SCAN_THREADS",  # verify-ckpt's scan threads (ckpt/scan.py)
                "TRNQWEN_LOG_WORKERS",  # inspect-logs' extra processes (logs/parallel.py, logs/halves.py)
                "TRNQWEN_METRICS_PATH"}  # set by the launcher for the ranks: where the metrics stream goes

Backend = Literal["hf-v5", "native", "nki-moe", "hf-trainer"]
Device = Literal["auto", "neuron", "cuda", "cpu"]
Launcher = Literal["local", "slurm", "k8s"]
K8sApi = Literal["trainjob", "pytorchjob"]
DatasetFormat = Literal[
    "auto", "messages", "sharegpt", "alpaca", "prompt-completion", "text",
    "prompt-chosen-rejected", "conversation-chosen-rejected",  # a method that reads preference pairs
]
LongConversations = Literal["truncate", "drop"]
LrSchedule = Literal["cosine", "linear", "constant"]
Method = Literal[methods.NAMES]  # the registry's methods (trnqwen/methods/registry.py)
# each method's settings, declared in its folder (methods/<name>/settings.py): name -> (type, field)
METHOD_SETTINGS = {name: (info.annotation, info) for model in methods.settings_models()
                   for name, info in model.model_fields.items()}
ActivationCheckpointing = Literal["none", "selective", "full"]
EPOCH = "epoch"  # --val-every / --save-every epoch: once per pass over the training data
EveryN = Union[Annotated[int, Field(ge=1)], Literal["epoch"]]



class RunConfig(BaseModel):
    """Everything that describes one fine-tune run.  Field descriptions double as docs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    # --- what to train -------------------------------------------------------------
    model: str = Field(DEFAULT_MODEL, description="Hub repo id, or builtin:tiny-qwen3 for the offline tiny model (random weights).")
    assets_dir: Optional[Path] = Field(
        None, description="Local HF snapshot of the model (default ./assets/hf/<model name>)."
    )
    backend: Backend = Field("hf-v5", description="Modeling backend: hf-v5, native, nki-moe or hf-trainer.")
    finetune: bool = Field(False, description="Load the published weights and export the result as HF safetensors.")
    dataset: Optional[str] = Field(
        None, description="Local JSONL/Parquet/text file or folder, or a Hub dataset name (default: per model)."
    )
    # --- your data (trnqwen.dataset: formats, chat template, labels, packing, cache) -------
    dataset_format: Optional[DatasetFormat] = Field(
        None, description="Record format: auto (detect), messages, sharegpt, alpaca, prompt-completion or text."
    )
    dataset_split: str = Field("train", description="Split of a Hub dataset to train on.")
    train_on_inputs: bool = Field(False, description="Train on every token, not only the assistant answers.")
    packing: bool = Field(True, description="Pack conversations into --seq-len rows (off: one per row, padded).")
    long_conversations: LongConversations = Field(
        "truncate", description="A conversation longer than --seq-len: truncate or drop (both counted)."
    )
    val_split: float = Field(0.0, ge=0.0, lt=1.0, allow_inf_nan=False, description="Fraction of records held out for validation (seeded).")
    val_dataset: Optional[str] = Field(None, description="Validation records from another file/folder/Hub dataset.")
    val_every: Optional[EveryN] = Field(None, description="Validate every N steps, or 'epoch' (needs validation data).")
    data_cache_dir: Optional[Path] = Field(
        None, description="Tokenized dataset cache (default $XDG_CACHE_HOME/trnqwen/datasets)."
    )
    # --- schedule ---------------------------------------------------------------------
    steps: Optional[int] = Field(
        None, ge=1, description="Training steps (default: one epoch with --dataset, else 10). Excludes --epochs."
    )
    local_batch_size: int = Field(1, ge=1, description="Sequences per rank per step.")
    global_batch_size: Optional[int] = Field(
        None, ge=1, description="Sequences per step over all ranks (default local batch x data-parallel degree)."
    )
    seq_len: int = Field(2048, ge=8, le=1_048_576, description="Sequence length in tokens (fixed: no recompiles).")
    lr: Optional[float] = Field(
        None, gt=0, le=1.0, allow_inf_nan=False,
        description="Peak learning rate (default: 1e-5 for a full fine-tune, 8e-4 from random init).",
    )
    seed: Optional[int] = Field(42, ge=0, description="Random seed (none = torchtitan's default).")
    # --- LoRA (trnqwen.train.lora: targets; runtime.lora: in the ranks; ckpt.lora: the PEFT adapter) ---
    lora: bool = Field(False, description="Train a LoRA adapter on a frozen base; the export is a PEFT adapter folder.")
    lora_rank: int = Field(16, ge=1, le=4096, description="LoRA rank r.")
    lora_alpha: Optional[float] = Field(
        None, gt=0, allow_inf_nan=False, description="LoRA alpha; the update is scaled by alpha/r (default 2 x rank)."
    )
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, allow_inf_nan=False, description="Dropout on the adapter's input.")
    lora_targets: str = Field(
        "all-linear",
        description="Modules to adapt, Hugging Face names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj); "
        "all-linear = those seven.",
    )
    merge: bool = Field(False, description="With --lora: also write the merged whole model folder beside the adapter.")
    # --- the training method (trnqwen/methods/<name>/: one folder each; their settings declared there) ---
    method: Method = Field(methods.DEFAULT, description=methods.help_text())
    beta: METHOD_SETTINGS["beta"][0] = METHOD_SETTINGS["beta"][1]
    dpo_loss: METHOD_SETTINGS["dpo_loss"][0] = METHOD_SETTINGS["dpo_loss"][1]
    # --- fine-tune schedule: epochs, LR curve, optimizer, memory (the same on every backend) ----
    epochs: Optional[float] = Field(
        None, gt=0, le=1_000_000, allow_inf_nan=False,
        description="Passes over the training data (0.5 is fine); steps come from the tokenized cache. Excludes --steps.",
    )
    lr_schedule: LrSchedule = Field("cosine", description="LR after warm-up: cosine, linear (decay to --min-lr-ratio) or constant.")
    warmup: Optional[Union[int, float]] = Field(
        None, ge=0, allow_inf_nan=False,
        description="Linear warm-up: steps (20), or a fraction of the steps (0.03). Default 2 steps (at most the run's).",
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False, description="Lowest LR of the decay, as a fraction of --lr.")
    weight_decay: float = Field(0.1, ge=0.0, allow_inf_nan=False, description="AdamW weight decay (torchtitan's default 0.1).")
    max_grad_norm: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="Clip the gradient norm to this value.")
    activation_checkpointing: Optional[ActivationCheckpointing] = Field(
        None, description="none, selective or full (default: the backend's own: hf-v5 selective, native full, hf-trainer none)."
    )
    # --- parallelism & device ------------------------------------------------------------
    dp_shard: int = Field(-1, description="FSDP degree; -1 shards over all ranks.")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    device: Device = Field("auto", description="neuron, cuda, cpu, or auto (neuron, else cuda, else cpu).")
    nproc_per_node: Optional[int] = Field(
        None, ge=1, description="Ranks per node (default: logical NeuronCores, GPUs, or 1 on CPU)."
    )
    lnc: Optional[Literal[1, 2]] = Field(None, description="Logical NeuronCore config (default: the instance's).")
    compile: bool = Field(False, description="torch.compile the model (backend neuron on Trainium).")
    override_imports: list[str] = Field(
        default_factory=list, description="Override modules/factories to import (torchtitan --override.imports)."
    )
    # --- nki-moe ---------------------------------------------------------------------------
    moe_layers: int = Field(4, ge=1, description="nki-moe: transformer layers kept.")
    num_experts: int = Field(64, ge=1, description="nki-moe: experts per MoE layer (not an EP degree).")
    top_k: int = Field(4, ge=1, description="nki-moe: experts each token is routed to.")
    # --- outputs ---------------------------------------------------------------------------
    checkpoint_dir: Optional[Path] = Field(
        None, description="Where checkpoints go (default ./checkpoint_<slug>_<hash6>, _ft appended when fine-tuning)."
    )
    export_hf: Optional[bool] = Field(
        None, description="Save the last step as HF safetensors (default: on with --finetune)."
    )
    save_every: Optional[EveryN] = Field(
        None, description="Save a resumable checkpoint every N steps or 'epoch' (torchtitan checkpoint.interval; "
        "the Trainer's save_steps). Default 500; the last step and a preemption always save."
    )
    keep_last: int = Field(
        3, ge=0, description="Resumable checkpoints kept (torchtitan keep_latest_k; the Trainer's save_total_limit); 0 keeps all."
    )
    grace_seconds: float = Field(
        90.0, gt=0, le=3600, description="On SIGTERM/SIGUSR1: seconds the ranks get to save at the next step boundary."
    )
    runs_dir: Path = Field(Path(".trnqwen/runs"), description="Where run directories (logs, records) are kept.")
    tensorboard: bool = Field(False, description="Write TensorBoard events into the run dir (the trainer's own writer).")
    wandb: bool = Field(False, description="Log to Weights & Biases (needs wandb installed and logged in).")
    compile_cache_dir: Optional[Path] = Field(
        None, description="Neuron compile cache (default .trnqwen/neff-cache; TORCH_NEURONX_NEFF_CACHE_DIR wins)."
    )
    trust_remote_code: bool = Field(False, description="Allow model repos to run their own code (off by default).")
    # --- multi-node ------------------------------------------------------------------------
    launcher: Launcher = Field("local", description="local (torchrun here), slurm (sbatch) or k8s (Kubeflow manifest).")
    nnodes: int = Field(1, ge=1, description="Nodes in the job.")
    node_rank: int = Field(0, ge=0, description="This node's rank (local launcher, multi-node).")
    rdzv_endpoint: Optional[str] = Field(None, description="HOST:PORT of the c10d rendezvous (multi-node).")
    rdzv_id: Optional[str] = Field(None, description="Shared rendezvous/run id (multi-node).")
    max_restarts: int = Field(0, ge=0, description="torchrun --max-restarts.")
    partition: Optional[str] = Field(None, description="SLURM partition.")
    time_limit: Optional[str] = Field(None, description="SLURM --time.")
    image: Optional[str] = Field(None, description="Container image (k8s launcher).")
    k8s_api: K8sApi = Field(
        "trainjob", description="k8s launcher: trainjob (Kubeflow Trainer v2 TrainJob + TrainingRuntime) or pytorchjob (v1 operator)."
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
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        return default_checkpoint_dir(self.model, self.finetune)

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


def model_name(model: str) -> str:
    if model.startswith(BUILTIN_PREFIX):
        return model[len(BUILTIN_PREFIX):]
    return model.rstrip("/").split("/")[-1]


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


def default_checkpoint_dir(model: str, finetune: bool) -> Path:
    """``checkpoint_<slug>_<hash6>[_ft]``: readable, and different models never share a folder.

    The hash is of the model's identity (the Hub id as given, ``builtin:<name>``, or a local
    folder's resolved path), so ``Qwen3-4B-Instruct-2507`` and ``Qwen3-4B-Base`` (one slug) or two
    local folders both called ``model`` get different folders.  The recipe's own model keeps the
    recipe's folder name, ``checkpoint_qwen3_4b[_ft]`` (what its users type); being one fixed
    identity, it cannot collide with any other model, which always carries a hash.
    """
    import hashlib

    if model == DEFAULT_MODEL:
        return Path(f"checkpoint_{model_slug(model)}{'_ft' if finetune else ''}")
    identity = model
    local = _expand(model)
    if not model.startswith(BUILTIN_PREFIX) and local.exists():
        identity = str(local.resolve())
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return Path(f"checkpoint_{model_slug(model)}_{digest}{'_ft' if finetune else ''}")


_SLUG_DROP = re.compile(r"-(instruct|base|chat|it|fp8|awq|gptq|\d{4})$", re.IGNORECASE)


def model_slug(model: str) -> str:
    """``Qwen/Qwen3-4B-Instruct-2507`` -> ``qwen3_4b``, as in the recipe's checkpoint_qwen3_4b_ft.

    Unicode-aware (NFKC, casefolded, Unicode word characters kept) so non-ASCII names stay
    readable: ``./模型-v1`` -> ``模型_v1``.
    """
    import unicodedata

    name = unicodedata.normalize("NFKC", model_name(model))
    previous = None
    while previous != name:
        previous, name = name, _SLUG_DROP.sub("", name)
    slug = re.sub(r"[\W_]+", "_", name.casefold()).strip("_")
    return slug[:40].rstrip("_") or "model"


FIELD_NAMES: tuple[str, ...] = tuple(RunConfig.model_fields)
PATH_FIELDS = {name for name, f in RunConfig.model_fields.items() if "Path" in str(f.annotation)}
# The command-line flag of each field is --<field-name> except these.
FLAGS = {"assets_dir": "--assets", "time_limit": "--time"}


def flag_of(name: str) -> str:
    """The flag that sets field ``name`` (what a source line names)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


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
            for name, value in self.as_dict().items()
        ]
        cfg = self.config
        for row in rows:  # a default that depends on the run names its reason
            if row["field"] == "lr" and cfg.lr is None:
                row["value"], row["source"] = default_lr(cfg)
            elif row["field"] == "steps" and cfg.steps is None:
                if cfg.dataset:
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
    return "bool" in str(RunConfig.model_fields[name].annotation)


def _kind(name: str) -> str:
    """What a field takes, in words, for an error about a TOML boolean."""
    text = str(RunConfig.model_fields[name].annotation)
    if "Literal" in text and "int" not in text:
        words = re.findall(r"Literal\[([^\]]*)\]", text)
        return "value: one of " + ", ".join(w.strip(" '") for w in ",".join(words).split(","))
    if "float" in text:
        return "number"
    if "int" in text:
        return "whole number"
    return "list" if "list" in text else ("path" if "Path" in text else "string")


def load_config_file(path: Path) -> dict[str, Any]:
    """Read trnqwen.toml: flat keys, or the same keys under a [run] table."""
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
        for key, value in table.items():
            name = key.replace("-", "_")
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
        key = name[len(ENV_PREFIX):].lower()
        if key in FIELD_NAMES:
            values[key] = value
        else:
            guess = closest_field(key)
            warnings.append(
                f"ignoring environment variable {name}: not a config field"
                + (f" (did you mean {ENV_PREFIX}{guess.upper()}?)" if guess else "")
            )
    return values, warnings


def _format_validation_error(exc: ValidationError, sources: dict[str, str]) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "config"
        field_name = str(err["loc"][0]) if err.get("loc") else None
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
        sources[key] = f"env {ENV_PREFIX}{key.upper()}"
    for key, value in (cli or {}).items():
        if value is None:
            continue
        if key not in FIELD_NAMES:
            raise ConfigError([f"internal: flag maps to unknown field '{key}'"])
        merged[key] = value
        sources[key] = (labels or {}).get(key) or f"flag {flag_of(key)}"
    try:
        config = RunConfig(**merged)
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
