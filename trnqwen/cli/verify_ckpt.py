"""``trnqwen verify-ckpt``: prove an exported checkpoint is a standard, finite HF checkpoint.

Examples:
  trnqwen verify-ckpt                                   # the last run's checkpoint
  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft --step 10
  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft --quick --json
  trnqwen verify-ckpt ./ckpt --compare-to assets/hf/Qwen3-4B-Instruct-2507
  trnqwen verify-ckpt ./ckpt --generate "The capital of France is"
  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft/hf/step-100 --base assets/hf/Qwen3-4B-Instruct-2507   # a LoRA adapter
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import AssetsOpt, ConfigFileOpt, DeviceOpt, JsonOpt, ModelOpt, given, user_paths

HELP = (
    "Check an exported checkpoint: keys, shapes and dtypes against the model, every value finite "
    "(a LoRA adapter: against its base, and loaded with peft)."
)
EPILOG = """\
Examples:

  trnqwen verify-ckpt ./checkpoint_qwen3_4b_ft   # the newest export in it
  trnqwen verify-ckpt --quick --json             # the last run's, headers only
  trnqwen verify-ckpt ./ckpt --round-trip        # + the recipe's AutoModelForCausalLM load
  trnqwen verify-ckpt ./ckpt --compare-to assets/hf/Qwen3-4B-Instruct-2507 --generate 'Hello'

Exit 0 ok, 1 a check failed, 2 usage error (no such path, no config.json).
"""


def verify_ckpt(
    checkpoint: Annotated[
        Optional[Path],
        typer.Argument(
            help="Checkpoint folder (with step-N/ subfolders), a step-N folder, a folder of HF safetensors, "
            "or a PEFT LoRA adapter folder. [default: the last run's checkpoint]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    step: Annotated[
        Optional[int], typer.Option("--step", help="Which step-N folder to check. [default: the last one]", show_default=False)
    ] = None,
    assets: AssetsOpt = None,
    base: Annotated[
        Optional[Path],
        typer.Option(
            "--base",
            help="With a LoRA adapter: the base model's snapshot it is checked against. "
            "[default: the run's assets, else adapter_config.json's base_model_name_or_path]",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Headers only (keys, shapes, dtypes, index); skip the value scan.")
    ] = False,
    round_trip: Annotated[
        bool,
        typer.Option(
            "--round-trip",
            help="Also run the recipe's round trip for real: AutoModelForCausalLM on the meta device + "
            "load_state_dict(strict=False, assign=True) (imports torch; no tensor memory).",
        ),
    ] = False,
    compare_to: Annotated[
        Optional[Path],
        typer.Option(
            "--compare-to",
            help="Reference checkpoint (e.g. the base assets): per-tensor relative change ||a-b||/||b||.",
            show_default=False,
            callback=user_paths,
        ),
    ] = None,
    max_rel_change: Annotated[
        float, typer.Option("--max-rel-change", help="With --compare-to: a tensor that moved more than this has exploded.")
    ] = 1.0,
    generate: Annotated[
        Optional[str],
        typer.Option("--generate", help="Load the model and greedily continue this prompt.", show_default=False),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="With --generate: tokens to generate.")] = 16,
    device: DeviceOpt = None,
    trust_remote_code: Annotated[
        Optional[bool],
        typer.Option(
            "--trust-remote-code/--no-trust-remote-code",
            help="Let the model repo run its own code (--round-trip/--generate). Env: TRNQWEN_TRUST_REMOTE_CODE. [default: off]",
            show_default=False,
        ),
    ] = None,
    model: ModelOpt = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Verify an exported HF checkpoint."""
    import math

    from trnqwen import output
    from trnqwen.errors import UsageError
    from trnqwen.ckpt.report import run_verify
    from trnqwen.config import resolve_config

    if not math.isfinite(max_rel_change) or max_rel_change < 0:
        raise UsageError(
            f"--max-rel-change must be a finite number >= 0, got {max_rel_change}",
            hint="e.g. --max-rel-change 1.0 (a tensor that moved more than 1x its norm has exploded)",
        )
    resolved = resolve_config(
        given(model=model, device=device, trust_remote_code=trust_remote_code), config_file=config_file,
        uses={"model", "assets_dir", "device", "trust_remote_code", "runs_dir"},
    )
    for w in resolved.warnings:
        output.warn(w)
    run_verify(
        checkpoint=checkpoint,
        step=step,
        assets=assets,
        base=base,
        quick=quick,
        round_trip=round_trip,
        compare_to=compare_to,
        max_rel_change=max_rel_change,
        generate=generate,
        max_new_tokens=max_new_tokens,
        json_out=json_out,
        cfg=resolved.config,
    )
