"""``trnqwen eval``: held-out loss, perplexity and answers of the base model and the fine-tune.

Examples:
  trnqwen eval                                      # the last run's export vs its base, on its validation split
  trnqwen eval --generate 3                         # ... and three held-out answers side by side
  trnqwen eval 20261130-201500-native-sft --json    # a run id (or run directory)
  trnqwen eval ./checkpoint_qwen3_4b_ft/step-100 --dataset held_out.jsonl --no-base
  trnqwen eval ./adapter --base-dir assets/hf/Qwen3-4B-Instruct-2507   # a LoRA adapter away from its run
  trnqwen eval --tasks trnqwen_calculator,gsm8k --limit 100 --fail-below gsm8k=-0.02   # harness benchmarks
  trnqwen eval RUN_ID --tasks trnqwen_calculator_gen --endpoint http://127.0.0.1:8000   # through trnqwen serve
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, DeviceOpt, JsonOpt, given, user_paths

HELP = "Held-out loss, perplexity and answers of the fine-tune against its base model (or harness benchmarks)."
EPILOG = """\
Examples:

  trnqwen eval                                   # the last run's export vs its base, on its validation split
  trnqwen eval --generate 3                      # ... and three held-out answers side by side
  trnqwen eval RUN_ID --json                     # a run id (or run directory)
  trnqwen eval ./ckpt/step-100 --dataset held_out.jsonl --no-base

  # lm-evaluation-harness, base and tuned side by side (trnqwen_calculator is offline and built in)
  trnqwen eval --tasks trnqwen_calculator
  trnqwen eval RUN_ID --tasks gsm8k,ifeval --limit 200 --fail-below gsm8k=-0.02   # a gate for CI
  trnqwen eval --tasks ./my_task.yaml                                           # a task file, local data

  # generative tasks through OpenAI-compatible servers (trnqwen serve, vLLM): only what is given is scored
  trnqwen eval RUN_ID --tasks trnqwen_calculator_gen --endpoint http://127.0.0.1:8000
  trnqwen eval RUN_ID --tasks gsm8k --endpoint http://tuned:8000 --base-endpoint http://base:8000

Exit 0 ok, 1 a --fail-below gate failed, 2 usage error (no such checkpoint, run or task, architecture
mismatch, no trained tokens, --generate without a chat template, a task that downloads while offline,
a log-likelihood task through an endpoint), 3 lm-evaluation-harness not installed or no server at an endpoint.
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
    tasks: Annotated[
        Optional[list[str]],
        typer.Option(
            "--tasks",
            help="lm-evaluation-harness tasks instead of the held-out loss: trnqwen_calculator (built in, offline), "
            "a harness task or group name, or a task YAML file; comma-separated or repeated.",
            metavar="TASKS",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        Optional[float],
        typer.Option("--limit", help="With --tasks: at most N samples per task (a fraction below 1: that share).",
                     metavar="N", show_default=False),
    ] = None,
    fail_below: Annotated[
        Optional[list[str]],
        typer.Option(
            "--fail-below",
            help="With --tasks: exit 1 when the tuned model's score minus the base's is below DELTA on TASK "
            "(e.g. gsm8k=-0.02); repeatable.",
            metavar="TASK=DELTA",
            show_default=False,
        ),
    ] = None,
    endpoint: Annotated[
        Optional[str],
        typer.Option(
            "--endpoint",
            help="With --tasks: score the model through this OpenAI-compatible server (trnqwen serve's, vLLM's) "
            "instead of loading it: /v1/chat/completions, greedy, generative tasks only. CHECKPOINT names what "
            "it serves (its tokenizer, the run the results go to).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
    base_endpoint: Annotated[
        Optional[str],
        typer.Option(
            "--base-endpoint",
            help="With --endpoint: score the base model through this server too (without it, no base is scored).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
    device: DeviceOpt = None,
    config_file: ConfigFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate checkpoints on held-out data."""
    from trnqwen.errors import UsageError

    if tasks:
        from trnqwen.evaluate.harness import run_tasks

        mixed = [flag for flag, on in (("--dataset", dataset), ("--generate", generate), ("--seq-len", seq_len)) if on]
        if mixed:
            raise UsageError(f"--tasks runs harness benchmarks; {', '.join(mixed)} belong to the held-out evaluation",
                             hint="run them as two commands")
        run_tasks(checkpoints or [], tasks=tasks, run_flags=given(device=device), config_file=config_file, base=base,
                  base_dir=base_dir, limit=limit, fail_below=fail_below or [], batch_size=batch_size, json_out=json_out,
                  endpoint=endpoint, base_endpoint=base_endpoint)
        return
    if limit is not None or fail_below:
        raise UsageError("--limit and --fail-below apply to --tasks", hint="add --tasks NAME (e.g. --tasks trnqwen_calculator)")
    if endpoint or base_endpoint:
        raise UsageError("--endpoint and --base-endpoint score harness tasks through a server",
                         hint="add --tasks NAME (e.g. --tasks trnqwen_calculator_gen)")
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
