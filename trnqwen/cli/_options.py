"""Shared options as ``Annotated`` aliases, so every signature reads like documentation.

Every option that can also come from the environment or trnqwen.toml says so in its help.
Flags default to ``None`` = "not given", so lower-precedence sources still apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

# the options that need no RunConfig live in _base_options (a command that needs no config imports it alone)
from trnqwen.cli._base_options import ConfigFileOpt, JsonOpt, user_paths  # noqa: F401 (re-exported)
from trnqwen.config import RunConfig
from trnqwen.constants import BACKENDS, DEVICES


def _default(name: str) -> str:
    """``[default: X]`` from RunConfig itself, so each default is written once."""
    value = RunConfig.model_fields[name].default
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float):
        mantissa, exponent = f"{value:e}".split("e")
        text = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    else:
        text = str(value)
    return f"[default: {text}]"


ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help=f"Hub repo id or builtin:tiny-qwen3. Env: TRNQWEN_MODEL. {_default('model')}",
        show_default=False,
    ),
]
AssetsOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--assets",
        "--assets-dir",
        help="Local HF snapshot. Env: TRNQWEN_ASSETS_DIR. [default: ./assets/hf/<model name>]",
        show_default=False,
    ),
]
BackendOpt = Annotated[
    Optional[str],
    typer.Option(
        "--backend",
        "-b",
        help=f"Modeling backend: {', '.join(BACKENDS)}. Env: TRNQWEN_BACKEND. {_default('backend')}",
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--device",
        help=f"Device: {', '.join(DEVICES)}. Env: TRNQWEN_DEVICE. {_default('device')}",
        show_default=False,
    ),
]
StepsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--steps", help="Training steps (or --epochs). Env: TRNQWEN_STEPS. [default: one epoch with --dataset, else 10]",
        show_default=False,
    ),
]
CheckpointDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--checkpoint-dir",
        help="Checkpoint folder. Env: TRNQWEN_CHECKPOINT_DIR. [default: ./checkpoint_<slug>_<hash6>[_ft], "
        "the hash of the model's identity; the recipe's Qwen3-4B-Instruct-2507: ./checkpoint_qwen3_4b[_ft]]",
        show_default=False,
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show what would happen; change nothing.")]


# --- train run settings ---------------------------------------------------------------------
FinetuneOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--finetune/--no-finetune",
        help=f"Start from the published weights and export HF safetensors. Env: TRNQWEN_FINETUNE. {_default('finetune')}",
        show_default=False,
    ),
]
DatasetOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dataset",
        help="Local JSONL/Parquet/text file or folder, or a Hub dataset name. Env: TRNQWEN_DATASET.",
        show_default=False,
    ),
]
LocalBatchSizeOpt = Annotated[
    Optional[int],
    typer.Option("--local-batch-size", help=f"Sequences per rank per step. Env: TRNQWEN_LOCAL_BATCH_SIZE. {_default('local_batch_size')}", show_default=False),
]
GlobalBatchSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--global-batch-size",
        help="Sequences per step over all ranks (gradient accumulation when above local x dp). "
        "Env: TRNQWEN_GLOBAL_BATCH_SIZE. [default: local x dp]",
        show_default=False,
    ),
]
SeqLenOpt = Annotated[
    Optional[int],
    typer.Option("--seq-len", help=f"Sequence length in tokens. Env: TRNQWEN_SEQ_LEN. {_default('seq_len')}", show_default=False),
]
LrOpt = Annotated[
    Optional[float],
    typer.Option(
        "--lr", help="Peak learning rate. Env: TRNQWEN_LR. [default: 1e-5 for a full fine-tune, 8e-4 from random init]",
        show_default=False,
    ),
]
# --- the schedule: epochs, LR curve, optimizer, activation checkpointing (one block: train/schedule.py)
EpochsOpt = Annotated[
    Optional[float],
    typer.Option(
        "--epochs", help="Passes over the training data (0.5 is fine); the steps are counted from the tokenized "
        "--dataset. Not with --steps. Env: TRNQWEN_EPOCHS.", show_default=False,
    ),
]
LrScheduleOpt = Annotated[
    Optional[str],
    typer.Option(
        "--lr-schedule", help=f"LR after warm-up: cosine, linear or constant. Env: TRNQWEN_LR_SCHEDULE. {_default('lr_schedule')}",
        show_default=False,
    ),
]
WarmupOpt = Annotated[
    Optional[float],
    typer.Option(
        "--warmup", help="Linear warm-up: steps (20) or a fraction of the steps (0.03). Env: TRNQWEN_WARMUP. "
        "[default: 2 steps, at most the run's]", show_default=False,
    ),
]
MinLrRatioOpt = Annotated[
    Optional[float],
    typer.Option(
        "--min-lr-ratio", help=f"Lowest LR of the decay, as a fraction of --lr. Env: TRNQWEN_MIN_LR_RATIO. {_default('min_lr_ratio')}",
        show_default=False,
    ),
]
WeightDecayOpt = Annotated[
    Optional[float],
    typer.Option(
        "--weight-decay", help=f"AdamW weight decay. Env: TRNQWEN_WEIGHT_DECAY. {_default('weight_decay')}", show_default=False
    ),
]
MaxGradNormOpt = Annotated[
    Optional[float],
    typer.Option(
        "--max-grad-norm", help=f"Clip the gradient norm to this. Env: TRNQWEN_MAX_GRAD_NORM. {_default('max_grad_norm')}",
        show_default=False,
    ),
]
ActivationCheckpointingOpt = Annotated[
    Optional[str],
    typer.Option(
        "--activation-checkpointing", help="none, selective or full. Env: TRNQWEN_ACTIVATION_CHECKPOINTING. "
        "[default: the backend's: hf-v5 selective, native full, hf-trainer none]", show_default=False,
    ),
]
DpShardOpt = Annotated[
    Optional[int],
    typer.Option("--dp-shard", help=f"FSDP degree; -1 shards over all ranks. Env: TRNQWEN_DP_SHARD. {_default('dp_shard')}", show_default=False),
]
TpOpt = Annotated[
    Optional[int],
    typer.Option("--tp", help=f"Tensor-parallel degree. Env: TRNQWEN_TP. {_default('tp')}", show_default=False),
]
NprocPerNodeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nproc-per-node",
        help="Ranks per node. Env: TRNQWEN_NPROC_PER_NODE. [default: logical NeuronCores, GPUs, or 1 on CPU]",
        show_default=False,
    ),
]
OverrideImportsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--override-imports",
        help="torchtitan override to activate (module.function); repeatable. Env: TRNQWEN_OVERRIDE_IMPORTS (comma-separated).",
        show_default=False,
    ),
]
CompileOpt = Annotated[
    Optional[bool],
    typer.Option("--compile/--no-compile", help=f"torch.compile the model. Env: TRNQWEN_COMPILE. {_default('compile')}", show_default=False),
]
MoeLayersOpt = Annotated[
    Optional[int],
    typer.Option("--moe-layers", help=f"nki-moe: transformer layers kept. Env: TRNQWEN_MOE_LAYERS. {_default('moe_layers')}", show_default=False),
]
NumExpertsOpt = Annotated[
    Optional[int],
    typer.Option("--num-experts", help=f"nki-moe: experts per MoE layer. Env: TRNQWEN_NUM_EXPERTS. {_default('num_experts')}", show_default=False),
]
TopKOpt = Annotated[
    Optional[int],
    typer.Option("--top-k", help=f"nki-moe: experts per token. Env: TRNQWEN_TOP_K. {_default('top_k')}", show_default=False),
]
TensorboardOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--tensorboard/--no-tensorboard",
        help="TensorBoard events in the run dir (<run>/tb), validation included. Env: TRNQWEN_TENSORBOARD. [default: off]",
        show_default=False,
    ),
]
WandbOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--wandb/--no-wandb",
        help="Log to Weights & Biases (wandb installed and logged in; project trnqwen). Env: TRNQWEN_WANDB. [default: off]",
        show_default=False,
    ),
]
ExportHfOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--export-hf/--no-export-hf",
        help="Save the last step as HF safetensors. Env: TRNQWEN_EXPORT_HF. [default: on with --finetune]",
        show_default=False,
    ),
]
ExportConfigOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--export-config",
        help="Write the standalone torchtitan config module to FILE.py and print the torchrun line; train nothing.",
        show_default=False,
        metavar="FILE.py",
    ),
]

# --- multi-node (trnqwen.train.multinode / slurm / k8s) ---------------------------------------
LauncherOpt = Annotated[
    Optional[str],
    typer.Option(
        "--launcher",
        help="local (torchrun on this node), slurm (sbatch script, submitted) or k8s (Kubeflow manifest, see --k8s-api). "
        f"Env: TRNQWEN_LAUNCHER. {_default('launcher')}",
        show_default=False,
    ),
]
NnodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nnodes", "--nodes", help=f"Nodes in the job (--nodes for slurm/k8s). Env: TRNQWEN_NNODES. {_default('nnodes')}",
        show_default=False, min=1,
    ),
]
NodeRankOpt = Annotated[
    Optional[int],
    typer.Option("--node-rank", help=f"This node's rank, 0..N-1 (local launcher). Env: TRNQWEN_NODE_RANK. {_default('node_rank')}", show_default=False, min=0),
]
RdzvEndpointOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rdzv-endpoint", help="HOST:PORT of node 0, the same on every node. Env: TRNQWEN_RDZV_ENDPOINT.",
        show_default=False, metavar="HOST:PORT",
    ),
]
RdzvIdOpt = Annotated[
    Optional[str],
    typer.Option("--rdzv-id", help="Run id shared by all nodes; names the run dir. Env: TRNQWEN_RDZV_ID.", show_default=False),
]
MaxRestartsOpt = Annotated[
    Optional[int],
    typer.Option("--max-restarts", help=f"torchrun restarts of the worker group. Env: TRNQWEN_MAX_RESTARTS. {_default('max_restarts')}", show_default=False, min=0),
]
PartitionOpt = Annotated[
    Optional[str], typer.Option("--partition", help="SLURM partition. Env: TRNQWEN_PARTITION.", show_default=False)
]
TimeLimitOpt = Annotated[
    Optional[str],
    typer.Option("--time", help="SLURM time limit, e.g. 4:00:00. Env: TRNQWEN_TIME_LIMIT.", show_default=False),
]
ImageOpt = Annotated[
    Optional[str],
    typer.Option("--image", help="Container image with trnqwen (k8s launcher). Env: TRNQWEN_IMAGE.", show_default=False),
]
K8sApiOpt = Annotated[
    Optional[str],
    typer.Option(
        "--k8s-api",
        help="k8s launcher: trainjob (Kubeflow Trainer v2 TrainJob + TrainingRuntime) or pytorchjob "
        f"(the v1 training operator). Env: TRNQWEN_K8S_API. {_default('k8s_api')}",
        show_default=False,
    ),
]
SubmitOpt = Annotated[
    bool,
    typer.Option("--submit", help="k8s launcher: also `kubectl apply -f` the manifest (kubectl on PATH; --dry-run applies nothing)."),
]


# --- your data (trnqwen.dataset; docs/data.md) -------------------------------------------------
DatasetFormatOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dataset-format",
        help="Record format: auto, messages, sharegpt, alpaca, prompt-completion, text. "
        "Env: TRNQWEN_DATASET_FORMAT. [default: auto (detected from the records)]",
        show_default=False,
    ),
]
DatasetSplitOpt = Annotated[
    Optional[str],
    typer.Option("--dataset-split", help="Hub dataset split. Env: TRNQWEN_DATASET_SPLIT. " + _default("dataset_split"), show_default=False),
]
TrainOnInputsOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--train-on-inputs/--no-train-on-inputs",
        help="Train on every token, not only the assistant answers. Env: TRNQWEN_TRAIN_ON_INPUTS. " + _default("train_on_inputs"),
        show_default=False,
    ),
]
PackingOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--packing/--no-packing",
        help="Pack conversations into --seq-len rows (--no-packing: one per row, padded). Env: TRNQWEN_PACKING. " + _default("packing"),
        show_default=False,
    ),
]
LongConversationsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--long-conversations",
        help="Conversations longer than --seq-len: truncate or drop (counted either way). "
        "Env: TRNQWEN_LONG_CONVERSATIONS. " + _default("long_conversations"),
        show_default=False,
    ),
]
ValSplitOpt = Annotated[
    Optional[float],
    typer.Option(
        "--val-split",
        help="Fraction of records held out for validation, e.g. 0.05 (seeded). Env: TRNQWEN_VAL_SPLIT. [default: 0]",
        show_default=False,
    ),
]
ValDatasetOpt = Annotated[
    Optional[str],
    typer.Option(
        "--val-dataset",
        help="Validation records from another file, folder or Hub dataset. Env: TRNQWEN_VAL_DATASET.",
        show_default=False,
    ),
]
ValEveryOpt = Annotated[
    Optional[str],
    typer.Option("--val-every", help="Validate every N steps, or 'epoch'. Env: TRNQWEN_VAL_EVERY.", show_default=False,
                 metavar="N|epoch"),
]
DataCacheDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--data-cache-dir",
        help="Tokenized dataset cache. Env: TRNQWEN_DATA_CACHE_DIR. [default: ~/.cache/trnqwen/datasets]",
        show_default=False,
    ),
]


def given(**flags: object) -> dict[str, object]:
    """Only the flags the user actually passed (None = not given)."""
    return {k: v for k, v in flags.items() if v is not None}


# --- checkpoints, resume, preemption ------------------------------------------------------------
SaveEveryOpt = Annotated[
    Optional[str],
    typer.Option(
        "--save-every", metavar="N|epoch",
        help="Save a resumable checkpoint every N steps or 'epoch' (torchtitan checkpoint.interval, the Trainer's "
        "save_steps). Env: TRNQWEN_SAVE_EVERY. [default: 500; the last step and a preemption always save]",
        show_default=False,
    ),
]
KeepLastOpt = Annotated[
    Optional[int],
    typer.Option(
        "--keep-last",
        help="Resumable checkpoints kept; 0 keeps all (torchtitan keep_latest_k, the Trainer's "
        "save_total_limit). Env: TRNQWEN_KEEP_LAST. [default: 3]",
        show_default=False,
    ),
]
GraceSecondsOpt = Annotated[
    Optional[float],
    typer.Option(
        "--grace-seconds",
        help="On SIGTERM/SIGUSR1 the ranks save at the next step boundary within this many seconds, "
        "then exit 138. Env: TRNQWEN_GRACE_SECONDS. [default: 90]",
        show_default=False,
    ),
]
ResumeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--resume",
        metavar="[RUN_ID|last|auto]",
        help="Continue a run from its latest complete checkpoint, with the config in its run.json "
        "(alone: the last run; auto: a scheduler job's own run, named by --rdzv-id, if it started before). "
        "Only --steps, --time, node/rank counts, checkpoint cadence and scheduler settings may change.",
        show_default=False,
    ),
]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Start fresh even though the checkpoint folder holds another run's checkpoints (they are deleted).",
    ),
]

# --- LoRA (docs/lora.md) ---------------------------------------------------------------------------
LoraOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--lora/--no-lora",
        help="Train a LoRA adapter on the frozen base; the export is a PEFT adapter folder. Env: TRNQWEN_LORA. "
        + _default("lora"),
        show_default=False,
    ),
]
LoraRankOpt = Annotated[
    Optional[int],
    typer.Option("--lora-rank", help=f"LoRA rank r. Env: TRNQWEN_LORA_RANK. {_default('lora_rank')}", show_default=False),
]
LoraAlphaOpt = Annotated[
    Optional[float],
    typer.Option(
        "--lora-alpha",
        help="LoRA alpha; the update is scaled by alpha/r. Env: TRNQWEN_LORA_ALPHA. [default: 2 x rank]",
        show_default=False,
    ),
]
LoraDropoutOpt = Annotated[
    Optional[float],
    typer.Option(
        "--lora-dropout", help=f"Dropout on the adapter's input. Env: TRNQWEN_LORA_DROPOUT. {_default('lora_dropout')}",
        show_default=False,
    ),
]
LoraTargetsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--lora-targets",
        help="Modules to adapt, Hugging Face names, comma-separated (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        f"down_proj) or all-linear. Env: TRNQWEN_LORA_TARGETS. {_default('lora_targets')}",
        show_default=False,
    ),
]
MergeOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--merge/--no-merge",
        help="With --lora: also write the merged whole model folder beside the adapter (hf/step-N-merged). "
        "Env: TRNQWEN_MERGE. " + _default("merge"),
        show_default=False,
    ),
]

# --- preference tuning (docs/preference.md) --------------------------------------------------------
MethodOpt = Annotated[
    Optional[str],
    typer.Option(
        "--method",
        help="sft (supervised: the answers are the targets) or dpo (preference pairs: prompt, chosen, rejected). "
        "Env: TRNQWEN_METHOD. " + _default("method"),
        show_default=False,
    ),
]
BetaOpt = Annotated[
    Optional[float],
    typer.Option(
        "--beta",
        help="DPO: how strongly the tuned model is held to the reference (rewards are beta x log-ratio). "
        "Env: TRNQWEN_BETA. " + _default("beta"),
        show_default=False,
    ),
]
DpoLossOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dpo-loss",
        help="DPO loss: sigmoid (DPO's; ln 2 at step 1) or ipo. Env: TRNQWEN_DPO_LOSS. " + _default("dpo_loss"),
        show_default=False,
    ),
]
