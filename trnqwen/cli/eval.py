"""``trnqwen eval``: held-out loss, perplexity and answers of the base model and the fine-tune.

Examples:
  trnqwen eval                                      # the last run's export vs its base, on its validation split
  trnqwen eval --generate 3                         # ... and three held-out answers side by side
  trnqwen eval 20261130-201500-native-sft --json    # a run id (or run directory)
  trnqwen eval ./checkpoint_qwen3_4b_ft/step-100 --dataset held_out.jsonl --no-base
  trnqwen eval ./adapter --base-dir assets/hf/Qwen3-4B-Instruct-2507   # a LoRA adapter away from its run
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, DeviceOpt, JsonOpt, given, user_paths

HELP = "Held-out loss, perplexity and answers of the fine-tune against its base model."
EPILOG = """\
Examples:

  trnqwen eval                                   # the last run's export vs its base, on its validation split
  trnqwen eval --generate 3                      # ... and three held-out answers side by side
  trnqwen eval RUN_ID --json                     # a run id (or run directory)
  trnqwen eval ./ckpt/step-100 --dataset held_out.jsonl --no-base

Exit 0 ok, 2 usage error (no such checkpoint or run, architecture mismatch, no trained tokens,
--generate without a chat template).
"""


def eval_cmd(
    checkpoints: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Model folders (an HF export or snapshot), checkpoint folders, run directories or run ids. "
            "[default: the last run's export]",
            show_default=False,
            metavar="CHECKPOINT",
        ),
    ] = None,
    dataset: Annotated[
        Optional[str],
        typer.Option(
            "--dataset",
            help="Data to score: a JSONL/Parquet file or folder, a Hub dataset, or a tokenized dataset cache. "
            "[default: the run's validation split]",
            show_default=False,
        ),
    ] = None,
    base: Annotated[
        Optional[bool],
        typer.Option(
            "--base/--no-base",
            help="Also evaluate the base model the run started from. [default: on when the run is known]",
            show_default=False,
        ),
    ] = None,
    base_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--base-dir",
            metavar="DIR",
            help="The base model's folder: what a LoRA adapter is loaded onto and what --base evaluates "
            "(like merge --base). [default: the run's assets, else adapter_config's base_model_name_or_path]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    generate: Annotated[
        int, typer.Option("--generate", help="Answer N held-out conversations greedily with every model.", metavar="N")
    ] = 0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="With --generate: tokens per answer.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass (one fixed shape).")] = 4,
    seq_len: Annotated[
        Optional[int],
        typer.Option("--seq-len", help="With --dataset FILE: sequence length. [default: the run's]", show_default=False),
    ] = None,
    device: DeviceOpt = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate checkpoints on held-out data."""
    from trnqwen.evaluate.run import run_eval

    run_eval(
        checkpoints or [],
        run_flags=given(device=device, seq_len=seq_len),
        config_file=config_file,
        dataset=dataset,
        base=base,
        base_dir=base_dir,
        generate=generate,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        json_out=json_out,
    )
