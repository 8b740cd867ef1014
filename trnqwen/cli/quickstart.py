"""``trnqwen quickstart``: the whole lifecycle on the built-in tiny Qwen3, here, in minutes.

Examples:
  trnqwen quickstart
  trnqwen quickstart --workdir /tmp/qs --steps 5 --json
  trnqwen quickstart --backend native --pretrain-steps 60
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import JsonOpt
from trnqwen.quickstart.types import stage_groups

HELP = (
    "Run the whole lifecycle on builtin:tiny-qwen3 here (no network, no accelerator): every command on every "
    "backend, LoRA and each training method, stage by stage (listed below)."
)
EPILOG = """\
Examples:

  trnqwen quickstart                               # what `make quickstart` runs
  trnqwen quickstart --workdir /tmp/qs --json      # one JSON summary on stdout
  trnqwen quickstart --backend native --steps 5    # one fine-tune backend, longer

Stages, in order: {stages}. The fine-tunes start from the pre-trained snapshot; inspect-logs judges
every run, checks that the fine-tunes' step-1 loss is far below the random-init run's, and writes
loss.png. Everything goes under --workdir (summary.json lists it). Exit 0 when every stage passed;
otherwise the failed stage is named, with its error's exit code (1 a failed check, 2 usage, 3 the
environment: a missing device, a full disk; 70 a trnqwen bug).
""".format(stages="; ".join(stage_groups()))

WorkdirOpt = Annotated[
    Optional[Path],
    typer.Option("--workdir", metavar="DIR", help="Working folder for everything the quickstart writes. [default: ./trnqwen-quickstart]", show_default=False),
]
QsDeviceOpt = Annotated[
    Optional[str], typer.Option("--device", help="Device for the runs: cpu, cuda, neuron or auto. [default: cpu]", show_default=False)
]
QsStepsOpt = Annotated[
    Optional[int], typer.Option("--steps", min=1, help="Steps of each fine-tune run. [default: 3]", show_default=False)
]
PretrainStepsOpt = Annotated[
    Optional[int],
    typer.Option("--pretrain-steps", min=2, help="Steps of the pre-training run from random init. [default: 20]", show_default=False),
]
QsNprocOpt = Annotated[
    Optional[int],
    typer.Option("--nproc-per-node", min=1, help="Ranks of each run. [default: 1 for pre-training, 2 for the fine-tunes]", show_default=False),
]
QsBackendOpt = Annotated[
    Optional[list[str]],
    typer.Option("--backend", "-b", help="Fine-tune backend (repeatable): native, hf-v5, hf-trainer. [default: all three]", show_default=False),
]


def quickstart(
    workdir: WorkdirOpt = None,
    device: QsDeviceOpt = None,
    steps: QsStepsOpt = None,
    pretrain_steps: PretrainStepsOpt = None,
    nproc_per_node: QsNprocOpt = None,
    backend: QsBackendOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the whole lifecycle on the built-in tiny Qwen3."""
    from trnqwen.constants import DEVICES
    from trnqwen.errors import UsageError
    from trnqwen.quickstart import DEFAULT_WORKDIR, FINETUNE_BACKENDS, result_of, run_quickstart

    device = (device or "cpu").lower()
    if device not in DEVICES:
        raise UsageError(f"--device {device}: use one of {', '.join(DEVICES)}")
    backends = tuple(dict.fromkeys(backend)) if backend else FINETUNE_BACKENDS
    try:
        result = run_quickstart(
            workdir or DEFAULT_WORKDIR, device=device, steps=steps, pretrain_steps=pretrain_steps,
            nproc_per_node=nproc_per_node, backends=backends,
        )
    except Exception as exc:  # what was done is shown; main's error table gives the exit code
        partial = result_of(exc)
        if partial is not None:
            _report(partial, json_out=json_out)
        raise
    _report(result, json_out=json_out)


def _report(result, *, json_out: bool) -> None:
    import os

    from trnqwen import output
    from trnqwen.quickstart import SUMMARY_COLUMNS, summary_rows

    if json_out:
        output.print_json(result.as_dict())
        return
    con = output.console(stderr=False)
    title = "quickstart: every stage passed" if result.ok else f"quickstart: stopped at '{result.failed_stage}'"
    if result.runs:
        output.table(f"{title} ({result.seconds:.0f}s, {result.device})", SUMMARY_COLUMNS, summary_rows(result))
    else:
        con.print(title, markup=False)
    c = result.comparison
    if c:
        con.print(
            f"Random init starts at loss {c['random_init_step1_loss']:.3f}; the fine-tunes from the pre-trained "
            f"weights start at " + ", ".join(f"{k} {v['step1_loss']:.3f}" for k, v in c["finetunes"].items())
            + " (the recipe: 12.43 vs 6.54 on Qwen3-4B).",
            markup=False,
        )
    con.print(f"Written under {result.workdir}:", markup=False, soft_wrap=True)
    width = max((len(k) for k in result.files), default=0)
    for what, path in sorted(result.files.items()):
        shown = os.path.relpath(path, result.workdir) if path.startswith(result.workdir) else path
        con.print(f"  {what.ljust(width)}  {shown}", markup=False, soft_wrap=True)
    if result.ok:
        con.print("Next, on a trn2.48xlarge (64 logical NeuronCores; see docs/getting-started.md):", markup=False)
        for line in result.next_commands:
            con.print(f"  {line}", markup=False, soft_wrap=True)
