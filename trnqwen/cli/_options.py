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


def given(**flags: object) -> dict[str, object]:
    """Only the flags the user actually passed (None = not given)."""
    return {k: v for k, v in flags.items() if v is not None}
