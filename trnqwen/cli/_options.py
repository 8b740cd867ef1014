"""Shared options as ``Annotated`` aliases, so every signature reads like documentation.

Every option that can also come from the environment or trnqwen.toml says so in its help.
Flags default to ``None`` = "not given", so lower-precedence sources still apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.constants import BACKENDS, DEVICES

ConfigFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--config-file",
        "-c",
        help="Project config file (default: ./trnqwen.toml if present). Env: TRNQWEN_CONFIG_FILE.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Hub repo id or builtin:tiny-qwen3. Env: TRNQWEN_MODEL. [default: Qwen/Qwen3-4B-Instruct-2507]",
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
        help=f"Modeling backend: {', '.join(BACKENDS)}. Env: TRNQWEN_BACKEND. [default: hf-v5]",
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--device",
        help=f"Device: {', '.join(DEVICES)}. Env: TRNQWEN_DEVICE. [default: auto]",
        show_default=False,
    ),
]
StepsOpt = Annotated[
    Optional[int],
    typer.Option("--steps", help="Training steps. Env: TRNQWEN_STEPS. [default: 10]", show_default=False),
]
CheckpointDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--checkpoint-dir",
        help="Checkpoint folder. Env: TRNQWEN_CHECKPOINT_DIR. [default: ./checkpoint_<model>_ft]",
        show_default=False,
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show what would happen; change nothing.")]


# --- train run settings ---------------------------------------------------------------------
FinetuneOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--finetune/--no-finetune",
        help="Start from the published weights and export HF safetensors. Env: TRNQWEN_FINETUNE. [default: off]",
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
    typer.Option("--local-batch-size", help="Sequences per rank per step. Env: TRNQWEN_LOCAL_BATCH_SIZE. [default: 1]", show_default=False),
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
    typer.Option("--seq-len", help="Sequence length in tokens. Env: TRNQWEN_SEQ_LEN. [default: 2048]", show_default=False),
]
LrOpt = Annotated[
    Optional[float],
    typer.Option("--lr", help="Peak learning rate. Env: TRNQWEN_LR. [default: 8e-4]", show_default=False),
]
DpShardOpt = Annotated[
    Optional[int],
    typer.Option("--dp-shard", help="FSDP degree; -1 shards over all ranks. Env: TRNQWEN_DP_SHARD. [default: -1]", show_default=False),
]
TpOpt = Annotated[
    Optional[int],
    typer.Option("--tp", help="Tensor-parallel degree. Env: TRNQWEN_TP. [default: 1]", show_default=False),
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
    typer.Option("--compile/--no-compile", help="torch.compile the model. Env: TRNQWEN_COMPILE. [default: off]", show_default=False),
]
MoeLayersOpt = Annotated[
    Optional[int],
    typer.Option("--moe-layers", help="nki-moe: transformer layers kept. Env: TRNQWEN_MOE_LAYERS. [default: 4]", show_default=False),
]
NumExpertsOpt = Annotated[
    Optional[int],
    typer.Option("--num-experts", help="nki-moe: experts per MoE layer. Env: TRNQWEN_NUM_EXPERTS. [default: 64]", show_default=False),
]
TopKOpt = Annotated[
    Optional[int],
    typer.Option("--top-k", help="nki-moe: experts per token. Env: TRNQWEN_TOP_K. [default: 4]", show_default=False),
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
        help="local (torchrun on this node), slurm (sbatch script, submitted) or k8s (PyTorchJob manifest). "
        "Env: TRNQWEN_LAUNCHER. [default: local]",
        show_default=False,
    ),
]
NnodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nnodes", "--nodes", help="Nodes in the job (--nodes for slurm/k8s). Env: TRNQWEN_NNODES. [default: 1]",
        show_default=False, min=1,
    ),
]
NodeRankOpt = Annotated[
    Optional[int],
    typer.Option("--node-rank", help="This node's rank, 0..N-1 (local launcher). Env: TRNQWEN_NODE_RANK. [default: 0]", show_default=False, min=0),
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
    typer.Option("--max-restarts", help="torchrun restarts of the worker group. Env: TRNQWEN_MAX_RESTARTS. [default: 0]", show_default=False, min=0),
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


def given(**flags: object) -> dict[str, object]:
    """Only the flags the user actually passed (None = not given)."""
    return {k: v for k, v in flags.items() if v is not None}
