"""``trnqwen merge``: a LoRA adapter + its base -> one whole model folder (no peft needed to load).

Examples:
  trnqwen merge                                          # the last run's adapter, its base from the run
  trnqwen merge ./checkpoint_qwen3_4b_ft/hf/step-500
  trnqwen merge ./adapter --base assets/hf/Qwen3-4B-Instruct-2507 --out ./qwen3-4b-merged
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import JsonOpt, user_paths

HELP = "Merge a LoRA adapter into its base model: W + alpha/r x B A, written as a whole HF model folder."
EPILOG = (
    "Examples: trnqwen merge  |  trnqwen merge ./checkpoint_qwen3_4b_ft/hf/step-500  |  "
    "trnqwen merge ./adapter --base assets/hf/Qwen3-4B-Instruct-2507 --out ./merged. "
    "The same as `axolotl merge-lora` / `llamafactory-cli export`; `train --lora --merge` does it at the end of a run. "
    "Exit 0 ok, 1 the adapter is broken or does not fit the base (verify-ckpt's diagnosis), 2 usage error."
)


def merge(
    adapter: Annotated[
        Optional[Path],
        typer.Argument(
            help="The adapter folder (hf/step-N of a --lora run). [default: the last run's export]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    base: Annotated[
        Optional[Path],
        typer.Option(
            "--base",
            help="The base model folder. [default: the assets of the run that trained the adapter, else its "
            "adapter_config's base_model_name_or_path under ./assets/hf]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option("--out", help="Where the merged folder goes. [default: <adapter>.merged]", show_default=False,
                     callback=user_paths),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Merge a LoRA adapter into its base model."""
    from trnqwen import output
    from trnqwen.ckpt.merge import merge as merge_folders
    from trnqwen.config import resolve_config

    resolved = resolve_config({}, uses={"runs_dir"})
    if not json_out:
        what = adapter if adapter is not None else "the last run's adapter"
        output.info(f"merging {what} with its base" + (f" {base}" if base else ""))
    result = merge_folders(adapter, runs_dir=Path(resolved.config.runs_dir), base=base, out=out)
    if json_out:
        output.print_json(result.as_dict())
    else:
        output.result(f"merged {result.merged_modules} module(s) of {result.adapter} onto {result.base}: "
                      f"{result.out} ({result.seconds:.1f}s)")
