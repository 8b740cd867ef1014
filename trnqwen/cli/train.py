"""``trnqwen train``: fine-tune Qwen3 with torchtitan over torchrun (thin: flags -> one RunConfig -> one
library call, :func:`trnqwen.session.training.run_training`, which holds the run policy)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import ConfigFileOpt, DryRunOpt, JsonOpt, takes_settings
from trnqwen.methods import registry

HELP = "Train (fine-tune) Qwen3 over torchrun: hf-v5, native, nki-moe (torchtitan) or hf-trainer backend."
EPILOG = """\
Examples:

\b
  # the recipe: Transformers v5 backend, published weights in, HF safetensors out
  trnqwen train --backend hf-v5 --finetune
  # torchtitan's own Qwen3, 20 steps, global batch 64
  trnqwen train --backend native --finetune --steps 20 --global-batch-size 64

  # LoRA on your chat data: a PEFT adapter out (docs/lora.md)
  trnqwen train --backend hf-v5 --finetune --lora --dataset mychat.jsonl --lr 1e-4
  # fine-tune, then push the verified export to a Hub repo (HF_TOKEN or `hf auth login`)
  trnqwen train --finetune --lora --dataset mychat.jsonl --push-to-hub my-org/qwen3-4b-chat-lora{method_examples}
  # the NKI mixture-of-experts recipe (Qwen3-30B-A3B cut to 4 layers, 64 experts)
  trnqwen train --backend nki-moe --model Qwen/Qwen3-30B-A3B --moe-layers 4 --num-experts 64 --top-k 4
  # the whole thing on a laptop: tiny offline model, 2 CPU ranks
  trnqwen fetch builtin:tiny-qwen3
  trnqwen train --model builtin:tiny-qwen3 --device cpu --nproc-per-node 2 --steps 3 --seq-len 256 --finetune
  # continue the last run where it stopped (or: --resume RUN_ID; --steps 40 extends a finished one)
  trnqwen train --resume
  # show the torchrun command, the generated config and the preflight report; start nothing
  trnqwen train --backend native --finetune --dry-run
  # a standalone torchtitan config module for running torchrun yourself
  trnqwen train --backend hf-v5 --finetune --export-config qwen3_ft.py
  # raw torchtitan flags go after `--`
  trnqwen train --finetune -- --metrics.log_freq 5 --training.max_norm 0.5
  # two trn2.48xlarge by hand: the same line on both, --node-rank 0 / 1 (docs/multi-node.md)
  trnqwen train --finetune --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.5:29400 --rdzv-id ft1
  # a SLURM cluster (ParallelCluster, HyperPod): write the sbatch script and submit it
  trnqwen train --finetune --launcher slurm --nodes 4 --partition trn2 --time 8:00:00
  # EKS: write a Kubeflow Trainer TrainJob (+ its TrainingRuntime) and print the `kubectl apply -f` line
  trnqwen train --finetune --launcher k8s --nodes 4 --image <ecr repo>/trnqwen:0.1
  # ... or apply it too (kubectl on PATH); --k8s-api pytorchjob for the v1 training operator
  trnqwen train --finetune --launcher k8s --nodes 4 --image <ecr repo>/trnqwen:0.1 --submit

Each run gets a folder under .trnqwen/runs/ (run.json, train.log, the config module, command.sh,
per-rank logs); `trnqwen inspect-logs` and `trnqwen verify-ckpt` find the newest one without paths.
Ctrl-C stops every rank at once (exit 130). SIGTERM or SIGUSR1 (a preemption notice) makes the
ranks save a resumable checkpoint at the next step boundary within --grace-seconds, then exit 138;
`trnqwen train --resume` continues the run exactly (docs/resume.md). A new run never resumes by
accident: a checkpoint folder holding another run's checkpoints is refused. On Trainium the compile cache is kept in
.trnqwen/neff-cache (TORCH_NEURONX_NEFF_CACHE_DIR wins), so a rerun of the same shapes skips
compilation.
""".format(method_examples="".join(f"\n  # {e.what}\n  {e.line}" for e in registry.examples("train")))


ExportConfigOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--export-config",
        help="Write the standalone torchtitan config module to FILE.py and print the torchrun line; train nothing.",
        show_default=False,
        metavar="FILE.py",
    ),
]
SubmitOpt = Annotated[
    bool,
    typer.Option("--submit", help="k8s launcher: also `kubectl apply -f` the manifest (kubectl on PATH; --dry-run applies nothing)."),
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
PushToHubOpt = Annotated[
    Optional[str],
    typer.Option(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="When the run succeeds, push its export (a LoRA run's adapter) to this Hub repo, as `trnqwen push` does: "
        "verified first, the repo created when missing. Token: HF_TOKEN or `hf auth login`, checked before the run.",
        show_default=False,
    ),
]
ShowLogOpt = Annotated[bool, typer.Option("--show-log", help="Stream rank 0's log to stderr above the status line.")]
EvalTasksOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--eval-tasks",
        metavar="TASKS",
        help="When the run succeeds, score its export and its base with lm-evaluation-harness, as "
        "`trnqwen eval RUN --tasks` does (e.g. trnqwen_calculator, gsm8k); checked before the run.",
        show_default=False,
    ),
]
EvalFailBelowOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--eval-fail-below",
        metavar="TASK=DELTA",
        help="With --eval-tasks: exit 1 when the export's score minus the base's is below DELTA on TASK; repeatable.",
        show_default=False,
    ),
]


@takes_settings  # one option per RunConfig setting (trnqwen.config), between the argument and these
def train(
    torchtitan_args: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="[-- TORCHTITAN_FLAGS...]",
            help="Raw torchtitan flags after `--`, passed through unchanged (e.g. -- --metrics.log_freq 5).",
            show_default=False,
        ),
    ] = None,
    submit: SubmitOpt = False,
    resume: ResumeOpt = None,
    overwrite: OverwriteOpt = False,
    config_file: ConfigFileOpt = None,
    dry_run: DryRunOpt = False,
    export_config: ExportConfigOpt = None,
    show_log: ShowLogOpt = False,
    push_to_hub: PushToHubOpt = None,
    eval_tasks: EvalTasksOpt = None,
    eval_fail_below: EvalFailBelowOpt = None,
    json_out: JsonOpt = False,
    settings: Optional[dict] = None,
) -> None:
    """Train Qwen3 with torchtitan over torchrun."""
    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.errors import UsageError
    from trnqwen.session.training import TrainHooks, TrainRequest, run_training

    extra = list(torchtitan_args or [])
    if extra and not extra[0].startswith("-"):
        raise UsageError(
            f"unexpected argument '{extra[0]}'",
            hint="raw torchtitan flags go after `--`, e.g. trnqwen train -- --metrics.log_freq 5",
        )
    request = TrainRequest(
        resolve_config(settings, config_file=config_file), extra_args=extra, resume=resume, overwrite=overwrite,
        submit=submit, dry_run=dry_run, export_config=export_config, push_to_hub=push_to_hub,
        eval_tasks=eval_tasks or (), eval_fail_below=eval_fail_below or (),
    )
    hooks = TrainHooks(
        warn=output.warn,
        planned=lambda plan: _print_findings(plan.preflight, quiet_info=json_out, notes=plan.job.notes, brief=plan.preflight.ok),
        starting=(lambda plan, point: None) if json_out else _announce,
        echo=sys.stderr.write if show_log else None,
        phase=output.info,  # on stderr, like the status line: never in --json's stdout
        # the bar `trnqwen data` shows while it reads (a terminal only; nothing with --json)
        data_progress=lambda: output.work_progress("Reading and tokenizing the dataset", quiet=json_out),
    )
    session = run_training(request, hooks)
    if session.scheduled is not None:
        _print_scheduled(session.request.config, session.scheduled, dry_run=dry_run, json_out=json_out)
    elif session.shown_only:
        _print_plan(session.plan, json_out=json_out, exported=export_config, written=not dry_run)
    else:
        validation = session.validation
        pushed = session.pushed
        benchmarks = session.benchmarks
        if json_out:
            output.print_json({**session.outcome.as_dict(), **({"validation": validation} if validation else {}),
                               **({"pushed": pushed} if pushed else {}),
                               **({"benchmarks": benchmarks.to_json()} if benchmarks else {})})
        else:
            _print_outcome(session.outcome)
            if validation:
                output.info(validation["line"])
            if pushed:
                output.result(f"pushed to {pushed['url']} @ {pushed['revision']}: {pushed['commit_url']}")
            if benchmarks:
                from trnqwen.evaluate.harness import render

                render(benchmarks)
    session.raise_for_status()


def _announce(plan, point) -> None:
    from trnqwen import output

    resumed = f" resumed from step {point.from_step}" if point is not None else ""
    output.info(
        f"run {plan.run_id}{resumed}: {plan.config.backend} on {plan.device.type} x {plan.nproc_per_node} rank(s), "
        f"{plan.config.steps} step(s); log {plan.log_path}"
    )


def _print_scheduled(cfg, info: dict, *, dry_run: bool, json_out: bool) -> None:
    """What ``--launcher slurm`` / ``--launcher k8s`` wrote (and submitted)."""
    from trnqwen import output

    if json_out:
        output.print_json(info)
        return
    for note in info.get("notes", ()):  # what the nodes will lack (k8s: a Secret not named)
        output.info(f"note: {note}")
    if dry_run:
        sys.stdout.write(info["script_text" if cfg.launcher == "slurm" else "manifest_text"])
        return
    if cfg.launcher == "slurm":
        output.info(f"submitted SLURM job {info['job_id']}: {info['nodes']} node(s), run {info['run_id']}")
        output.info(f"script: {info['script']}; per-node logs: {info['node_logs'][0]} ...")
        output.info("follow it with `squeue -j " + str(info["job_id"]) + "` and `trnqwen inspect-logs`")
    else:
        kinds = " + ".join(info["kinds"])
        output.info(f"wrote the {kinds} {info['job_name']} ({info['nodes']} node(s)) to {info['manifest']}")
        if info["submitted"]:
            output.info(f"applied it: {info['kubectl_output']}" if info.get("kubectl_output") else "applied it")
        else:
            output.info(f"start it with:  {info['apply']}")
        output.info(f"follow it with: {info['status']}")
        output.info(f"node 0's log:   {info['logs']}")


def _print_findings(report, *, quiet_info: bool = False, notes=(), brief: bool = False) -> None:
    """``brief`` (a run that will start): the memory estimates in one short line each; their
    breakdown is in ``--dry-run`` and in any warning or error."""
    from trnqwen import output

    short = {"memory": report.memory, "host-memory": report.host_memory} if brief else {}
    if not quiet_info:  # what the recipe planned (LoRA, the method, the model spec): facts, not warnings
        for note in notes:
            output.info(f"[dim]plan:[/dim] {note}")
    for f in report.findings:
        if f.severity == "warning":
            output.warn(f.message + (f" ({f.hint})" if f.hint else ""))
        elif f.severity == "info" and not quiet_info:
            estimate = short.get(f.check)
            text = estimate.brief() + " (breakdown: --dry-run)" if estimate is not None else f.message
            output.info(f"[dim]preflight:[/dim] {text}")


def _print_plan(plan, *, json_out: bool, exported: Optional[Path], written: bool = True) -> None:
    from trnqwen import output
    from trnqwen.train.run import hand_run_command

    if json_out:
        payload = plan.as_dict()
        if exported is not None:
            payload["exported_config" if written else "would_export_config"] = str(exported)
            payload["hand_run_command"] = hand_run_command(plan, exported)
        output.print_json(payload)
        return
    con = output.console(stderr=False)
    if exported is not None and not written:  # the whole dry run, then what --export-config would do
        _print_plan(plan, json_out=False, exported=None)
        con.print(f"--dry-run: would write the config module to {exported} (nothing written); run it by hand with:",
                  markup=False, soft_wrap=True)
        con.print(hand_run_command(plan, exported), markup=False, soft_wrap=True)
        return
    if exported is not None:
        con.print(f"Wrote the {plan.config.backend} torchtitan config module to {exported}")
        con.print("Run it by hand with:")
        con.print(hand_run_command(plan, exported), markup=False, soft_wrap=True)
        _print_findings(plan.preflight, notes=plan.job.notes)
        return
    if plan.job.schedule is not None:
        con.rule("schedule", align="left")
        con.print(plan.job.schedule.summary(), markup=False, soft_wrap=True)
    con.rule("command", align="left")
    con.print(plan.shell_command, markup=False, soft_wrap=True)
    con.rule(f"config module {plan.job.config_module}.py (--config {plan.job.config_fn})", align="left")
    con.print(plan.job.config_module_text or "(none: this backend has no torchtitan config module)", markup=False, soft_wrap=True)
    con.rule("preflight", align="left")
    rows = [(f.severity, f.check, f.message + (f" -> {f.hint}" if f.hint else "")) for f in plan.preflight.findings]
    rows += [("note", "recipe", note) for note in plan.job.notes]
    if not rows:
        rows = [("ok", "-", "no findings")]
    output.table("", ["severity", "check", "finding"], rows)
    verdict = "would start" if plan.preflight.ok else "would NOT start (errors above)"
    con.print(
        f"dry run: {verdict}: {plan.nproc_per_node} rank(s) on {plan.device.type}, run dir {plan.run_dir}",
        markup=False,
    )


def _print_outcome(outcome) -> None:
    from trnqwen import output

    r = outcome.result
    if r is None:
        return
    last = r.last_step or {}
    bits = [f"{r.ended_by} in {r.wall_s:.1f}s", f"{len(r.steps)} step(s) logged"]
    if last.get("loss") is not None:
        bits.append(f"last loss {last['loss']:.4f}")
    if r.time_to_first_step_s is not None:
        bits.append(f"first step after {r.time_to_first_step_s:.1f}s")
    if r.seconds_per_step is not None:
        bits.append(f"{r.seconds_per_step:.2f}s/step")
    output.info("train: " + ", ".join(bits))
    # the paths written are the result a script pipes: stdout; the summary above is status: stderr
    merged = (outcome.record.extra.get("merged") or {}) if outcome.record is not None else {}
    if outcome.exported is not None and outcome.plan.config.lora:
        output.result(f"LoRA adapter (PEFT): {outcome.exported}")
        if merged.get("out"):
            output.result(f"merged model: {merged['out']}")
        else:
            output.info("merge it: " + shlex.join(["trnqwen", "merge", str(outcome.exported)]))
        output.info("check it: " + shlex.join(["trnqwen", "verify-ckpt", str(outcome.exported)]))
    elif outcome.exported is not None:
        output.result(f"HF checkpoint: {outcome.exported}")
        output.info("check it: " + shlex.join(["trnqwen", "verify-ckpt", str(outcome.exported.parent)]))
    output.result(f"run dir: {outcome.plan.run_dir}")
