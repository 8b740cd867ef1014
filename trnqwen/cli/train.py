"""``trnqwen train``: fine-tune Qwen3 with torchtitan over torchrun (thin: the work is in trnqwen.train.run)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from trnqwen.cli._options import (
    AssetsOpt,
    BackendOpt,
    CheckpointDirOpt,
    CompileOpt,
    ConfigFileOpt,
    DatasetOpt,
    DeviceOpt,
    DpShardOpt,
    DryRunOpt,
    ExportConfigOpt,
    ExportHfOpt,
    FinetuneOpt,
    LoraAlphaOpt,
    LoraDropoutOpt,
    MethodOpt,
    BetaOpt,
    DpoLossOpt,
    LoraOpt,
    LoraRankOpt,
    LoraTargetsOpt,
    MergeOpt,
    GlobalBatchSizeOpt,
    GraceSecondsOpt,
    ImageOpt,
    K8sApiOpt,
    JsonOpt,
    KeepLastOpt,
    LauncherOpt,
    LocalBatchSizeOpt,
    ActivationCheckpointingOpt,
    EpochsOpt,
    LrOpt,
    LrScheduleOpt,
    MaxGradNormOpt,
    MinLrRatioOpt,
    WarmupOpt,
    WeightDecayOpt,
    MaxRestartsOpt,
    ModelOpt,
    MoeLayersOpt,
    NnodesOpt,
    NodeRankOpt,
    NprocPerNodeOpt,
    NumExpertsOpt,
    OverrideImportsOpt,
    OverwriteOpt,
    PartitionOpt,
    RdzvEndpointOpt,
    RdzvIdOpt,
    ResumeOpt,
    SaveEveryOpt,
    SeqLenOpt,
    StepsOpt,
    SubmitOpt,
    TimeLimitOpt,
    TopKOpt,
    TpOpt,
    TensorboardOpt,
    WandbOpt,
    ValEveryOpt,
    DatasetFormatOpt,
    DatasetSplitOpt,
    TrainOnInputsOpt,
    PackingOpt,
    LongConversationsOpt,
    ValSplitOpt,
    ValDatasetOpt,
    DataCacheDirOpt,
    given,
)

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
  # preference tuning on prompt/chosen/rejected pairs; step 1 is ln 2 (docs/preference.md)
  trnqwen train --backend hf-v5 --finetune --method dpo --beta 0.1 --dataset prefs.jsonl
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
"""


def train(
    torchtitan_args: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="[-- TORCHTITAN_FLAGS...]",
            help="Raw torchtitan flags after `--`, passed through unchanged (e.g. -- --metrics.log_freq 5).",
            show_default=False,
        ),
    ] = None,
    model: ModelOpt = None,
    assets: AssetsOpt = None,
    backend: BackendOpt = None,
    finetune: FinetuneOpt = None,
    lora: LoraOpt = None,
    lora_rank: LoraRankOpt = None,
    lora_alpha: LoraAlphaOpt = None,
    lora_dropout: LoraDropoutOpt = None,
    lora_targets: LoraTargetsOpt = None,
    merge: MergeOpt = None,
    method: MethodOpt = None,
    beta: BetaOpt = None,
    dpo_loss: DpoLossOpt = None,
    dataset: DatasetOpt = None,
    dataset_format: DatasetFormatOpt = None,
    dataset_split: DatasetSplitOpt = None,
    train_on_inputs: TrainOnInputsOpt = None,
    packing: PackingOpt = None,
    long_conversations: LongConversationsOpt = None,
    val_split: ValSplitOpt = None,
    val_dataset: ValDatasetOpt = None,
    data_cache_dir: DataCacheDirOpt = None,
    steps: StepsOpt = None,
    local_batch_size: LocalBatchSizeOpt = None,
    global_batch_size: GlobalBatchSizeOpt = None,
    seq_len: SeqLenOpt = None,
    val_every: ValEveryOpt = None,
    lr: LrOpt = None,
    epochs: EpochsOpt = None,
    lr_schedule: LrScheduleOpt = None,
    warmup: WarmupOpt = None,
    min_lr_ratio: MinLrRatioOpt = None,
    weight_decay: WeightDecayOpt = None,
    max_grad_norm: MaxGradNormOpt = None,
    activation_checkpointing: ActivationCheckpointingOpt = None,
    dp_shard: DpShardOpt = None,
    tp: TpOpt = None,
    device: DeviceOpt = None,
    nproc_per_node: NprocPerNodeOpt = None,
    checkpoint_dir: CheckpointDirOpt = None,
    override_imports: OverrideImportsOpt = None,
    compile: CompileOpt = None,
    moe_layers: MoeLayersOpt = None,
    num_experts: NumExpertsOpt = None,
    top_k: TopKOpt = None,
    export_hf: ExportHfOpt = None,
    tensorboard: TensorboardOpt = None,
    wandb: WandbOpt = None,
    launcher: LauncherOpt = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: RdzvEndpointOpt = None,
    rdzv_id: RdzvIdOpt = None,
    max_restarts: MaxRestartsOpt = None,
    partition: PartitionOpt = None,
    time_limit: TimeLimitOpt = None,
    image: ImageOpt = None,
    k8s_api: K8sApiOpt = None,
    submit: SubmitOpt = False,
    save_every: SaveEveryOpt = None,
    keep_last: KeepLastOpt = None,
    grace_seconds: GraceSecondsOpt = None,
    resume: ResumeOpt = None,
    overwrite: OverwriteOpt = False,
    config_file: ConfigFileOpt = None,
    dry_run: DryRunOpt = False,
    export_config: ExportConfigOpt = None,
    show_log: Annotated[
        bool, typer.Option("--show-log", help="Stream rank 0's log to stderr above the status line.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Train Qwen3 with torchtitan over torchrun."""
    from trnqwen import output
    from trnqwen.config import resolve_config
    from trnqwen.errors import UsageError
    from trnqwen.train.run import execute, export_config as write_config_module, plan_train

    extra = list(torchtitan_args or [])
    if extra and not extra[0].startswith("-"):
        raise UsageError(
            f"unexpected argument '{extra[0]}'",
            hint="raw torchtitan flags go after `--`, e.g. trnqwen train -- --metrics.log_freq 5",
        )
    resolved = resolve_config(
        given(
            model=model,
            assets_dir=assets,
            backend=backend,
            finetune=finetune,
            lora=lora,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            lora_targets=lora_targets,
            merge=merge,
            method=method,
            beta=beta,
            dpo_loss=dpo_loss,
            dataset=dataset,
            dataset_format=dataset_format,
            dataset_split=dataset_split,
            train_on_inputs=train_on_inputs,
            packing=packing,
            long_conversations=long_conversations,
            val_split=val_split,
            val_dataset=val_dataset,
            data_cache_dir=data_cache_dir,
            steps=steps,
            local_batch_size=local_batch_size,
            global_batch_size=global_batch_size,
            seq_len=seq_len,
            val_every=val_every,
            lr=lr,
            epochs=epochs,
            lr_schedule=lr_schedule,
            warmup=warmup,
            min_lr_ratio=min_lr_ratio,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
            activation_checkpointing=activation_checkpointing,
            dp_shard=dp_shard,
            tp=tp,
            device=device,
            nproc_per_node=nproc_per_node,
            checkpoint_dir=checkpoint_dir,
            override_imports=override_imports or None,
            compile=compile,
            moe_layers=moe_layers,
            num_experts=num_experts,
            top_k=top_k,
            export_hf=export_hf,
            tensorboard=tensorboard,
            wandb=wandb,
            launcher=launcher,
            nnodes=nnodes,
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_id=rdzv_id,
            max_restarts=max_restarts,
            partition=partition,
            time_limit=time_limit,
            image=image,
            k8s_api=k8s_api,
            save_every=save_every,
            keep_last=keep_last,
            grace_seconds=grace_seconds,
        ),
        config_file=config_file,
    )
    if resolved.config.launcher != "local":  # SLURM / Kubernetes: every node runs `trnqwen train` itself
        if resume is not None:
            raise UsageError(
                f"--resume with --launcher {resolved.config.launcher}: a requeued or restarted job resumes by itself",
                hint="requeue the job (scontrol requeue JOBID) or let the Kubernetes job restart; see docs/resume.md",
            )
        _launch_on_scheduler(resolved.config, extra=extra, dry_run=dry_run, submit=submit, json_out=json_out)
        return
    if submit:
        raise UsageError(
            "--submit is for --launcher k8s (a local run starts here; --launcher slurm always submits)",
            hint="add --launcher k8s --image <registry>/<repo>:<tag>, or drop --submit",
        )
    point = None
    if resume is not None:
        from trnqwen.train.resume import prepare

        if overwrite:
            raise UsageError("--resume continues a run's checkpoints and --overwrite deletes them: pick one")
        ref = resume
        if resume == "auto":  # a requeued SLURM job / restarted pod continues its own run by itself
            from trnqwen.train.resume import auto_run_id

            ref = auto_run_id(resolved)
        if ref is not None:
            point = prepare(ref, resolved)
            resolved = point.resolved
    for w in resolved.warnings:
        output.warn(w)

    show_only = dry_run or export_config is not None
    plan = plan_train(resolved, extra_args=extra, dry_run=show_only, resume=point, overwrite=overwrite)
    if export_config is not None:  # --dry-run changes nothing: it only checks the file name
        write_config_module(plan, export_config, dry_run=dry_run)
    if show_only:
        _print_plan(plan, json_out=json_out, exported=export_config, written=not dry_run)
        if dry_run and not plan.preflight.ok:  # a CI gate built on --dry-run must see the refusal
            _raise_would_not_start(plan.preflight)
        return
    _print_findings(plan.preflight, quiet_info=json_out, notes=plan.job.notes, brief=plan.preflight.ok)
    plan.preflight.raise_for_errors()  # before announcing a run (and a log path) that will not exist
    if not json_out:
        resumed = f" resumed from step {point.from_step}" if point is not None else ""
        output.info(
            f"run {plan.run_id}{resumed}: {plan.config.backend} on {plan.device.type} x {plan.nproc_per_node} rank(s), "
            f"{plan.config.steps} step(s); log {plan.log_path}"
        )
    echo = sys.stderr.write if show_log else None
    outcome = execute(plan, echo=echo, status=True, note=output.warn)
    validation = None
    if outcome.exit_code == 0 and plan.config.finetune and outcome.exported is not None and plan.config.node_rank == 0:
        from trnqwen.evaluate.lifecycle import validation_before_after  # base vs export, when a val split exists

        validation = validation_before_after(plan.run_dir, device=plan.device.type)
    if json_out:
        output.print_json({**outcome.as_dict(), **({"validation": validation} if validation else {})})
    else:
        _print_outcome(outcome)
        if validation:
            output.info(validation["line"])
    outcome.raise_for_status()


def _launch_on_scheduler(cfg, *, extra: list, dry_run: bool, submit: bool, json_out: bool) -> None:
    """``--launcher slurm`` (write + sbatch) or ``--launcher k8s`` (write the manifest; ``--submit``: apply it)."""
    from trnqwen import output
    from trnqwen.errors import UsageError

    if extra:
        raise UsageError(
            f"raw torchtitan flags after `--` do not travel to {cfg.launcher} nodes",
            hint="set the run through trnqwen's flags or trnqwen.toml",
        )
    if cfg.launcher == "slurm":
        from trnqwen.train import slurm

        if submit:
            raise UsageError("--submit is for --launcher k8s: --launcher slurm always submits with sbatch")
        info = slurm.launch(cfg, dry_run=dry_run)
        text_key = "script_text"
    else:
        from trnqwen.train import k8s

        info = k8s.launch(cfg, dry_run=dry_run, submit=submit)
        text_key = "manifest_text"
    if json_out:
        output.print_json(info)
        return
    if dry_run:
        sys.stdout.write(info[text_key])
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
    for note in notes:
        output.warn(note)
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


def _raise_would_not_start(report) -> None:
    """Exit 1 with every finding that stops the run (the table above lists them with their fixes)."""
    from trnqwen.errors import CheckFailed

    errors = report.errors
    hints = [f.hint for f in errors if f.hint]
    raise CheckFailed(
        "dry run: would NOT start: " + "; ".join(f.message for f in errors),
        hint="; ".join(dict.fromkeys(hints)) or None,
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
