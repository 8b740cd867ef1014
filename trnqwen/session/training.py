"""``trnqwen train`` as one library call: a resolved config and the command's wishes in, a run
(or its plan, or a scheduler job) out.  The run policy lives here, once, for the CLI and the
quickstart alike:

* a scheduler launcher (slurm, k8s) writes and submits the job instead of running here, and
  refuses what cannot travel with it (``--resume``, raw torchtitan flags);
* ``--resume [RUN_ID|last|auto]`` continues a recorded run with its recorded config (and never
  together with ``--overwrite``, which deletes that run's checkpoints);
* ``--dry-run`` / ``--export-config`` plan and show; a dry run that would not start fails;
* a finished fine-tune is evaluated before/after on its validation split (in a child process);
* ``--push-to-hub OWNER/NAME``: the repo id, the token and online mode are checked before the run
  starts, and the export is pushed (:mod:`trnqwen.hub.push`: verified first) after it succeeded;
  a failed push is raised after the run's own result is shown, with the ``trnqwen push`` line
  that retries it.

What is printed is the caller's: :class:`TrainHooks` are told as the run goes.  No typer here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from trnqwen.config import ResolvedConfig, RunConfig
from trnqwen.errors import CheckFailed, TrnqwenError, UsageError
from trnqwen.evaluate.harness import HarnessReport, HarnessTask
from trnqwen.train.cache_data import DataProgress
from trnqwen.train.resume import RESUME_AUTO, ResumePoint
from trnqwen.train.run import TrainOutcome, TrainPlan


@dataclass
class TrainRequest:
    """A run's settings and what the command asks of them (none of it a run setting)."""

    resolved: Union[ResolvedConfig, RunConfig]
    extra_args: Sequence[str] = ()  # raw torchtitan flags (after `--`)
    resume: Optional[str] = None  # RUN_ID, "last" or "auto"
    overwrite: bool = False  # start fresh over another run's checkpoints
    submit: bool = False  # --launcher k8s: also kubectl apply
    dry_run: bool = False
    export_config: Optional[Path] = None  # write the torchtitan config module there
    evaluate: bool = True  # a fine-tune's before/after validation at the end
    cwd: Optional[Path] = None
    run_id: Optional[str] = None
    pythonpath: Sequence[Path] = ()
    push_to_hub: Optional[str] = None  # OWNER/NAME: push the export there when the run succeeded
    eval_tasks: Sequence[str] = ()  # lm-evaluation-harness tasks for the export and its base after the run
    eval_fail_below: Sequence[str] = ()  # TASK=DELTA gates on those (trnqwen.evaluate.harness)

    @property
    def config(self) -> RunConfig:
        return self.resolved.config if isinstance(self.resolved, ResolvedConfig) else self.resolved


def _nothing(*_args: Any) -> None:
    return None


@dataclass
class TrainHooks:
    """What the caller is told while the run goes (all optional)."""

    warn: Optional[Callable[[str], None]] = None  # config warnings, the launcher's one-line notes
    planned: Callable[[TrainPlan], None] = _nothing  # a run's plan, before preflight errors stop it
    starting: Callable[[TrainPlan, Optional[ResumePoint]], None] = _nothing  # preflight passed, starting now
    echo: Optional[Callable[[str], None]] = None  # rank 0's log lines (--show-log)
    status: bool = True  # the live status line
    # what takes a while after the ranks exit (a --merge, the closing eval), as it starts
    phase: Callable[[str], None] = _nothing
    data_progress: Optional[DataProgress] = None  # shown while the dataset is read and tokenized (a bar)


@dataclass
class TrainSession:
    """What came of a request: a scheduler job, a shown plan, or a run and its evaluation."""

    request: TrainRequest
    scheduled: Optional[dict[str, Any]] = None  # slurm/k8s: what was written (and submitted)
    plan: Optional[TrainPlan] = None
    point: Optional[ResumePoint] = None  # the run continued (--resume)
    outcome: Optional[TrainOutcome] = None  # None: only shown (--dry-run, --export-config)
    validation: Optional[dict[str, Any]] = None  # the before/after line of a fine-tune
    pushed: Optional[dict[str, Any]] = None  # --push-to-hub: what was pushed (trnqwen.hub.push.PushResult.as_dict)
    push_error: Optional[TrnqwenError] = None  # --push-to-hub failed after the run succeeded
    benchmarks: Optional[HarnessReport] = None  # --eval-tasks: the harness's scores, base and tuned
    benchmark_error: Optional[TrnqwenError] = None  # --eval-fail-below breached (or the harness failed)
    notes: list[str] = field(default_factory=list)

    @property
    def shown_only(self) -> bool:
        return self.plan is not None and self.outcome is None

    def raise_for_status(self) -> None:
        """A dry run that would not start exits 1 (a CI gate must see it); a failed or stopped run
        raises the error that names its root cause."""
        if self.shown_only and self.request.dry_run and not self.plan.preflight.ok:
            errors = self.plan.preflight.errors
            hints = [f.hint for f in errors if f.hint]
            raise CheckFailed(
                "dry run: would NOT start: " + "; ".join(f.message for f in errors),
                hint="; ".join(dict.fromkeys(hints)) or None,
            )
        if self.outcome is not None:
            self.outcome.raise_for_status()
        if self.push_error is not None:
            raise self.push_error
        if self.benchmark_error is not None:
            raise self.benchmark_error


def run_training(request: TrainRequest, hooks: Optional[TrainHooks] = None) -> TrainSession:
    """Carry out one ``trnqwen train``: schedule it, show it, or run it (see the module doc)."""
    hooks = hooks or TrainHooks()
    cfg = request.config
    if request.push_to_hub is not None:
        check_push(request)
    benchmark = check_benchmarks(request)
    if cfg.launcher != "local":  # SLURM / Kubernetes: every node runs `trnqwen train` itself
        return TrainSession(request, scheduled=schedule(request))
    if request.submit:
        raise UsageError(
            "--submit is for --launcher k8s (a local run starts here; --launcher slurm always submits)",
            hint="add --launcher k8s --image <registry>/<repo>:<tag>, or drop --submit",
        )
    resolved, point = resume_point(request)
    for warning in (resolved.warnings if isinstance(resolved, ResolvedConfig) else ()):
        if hooks.warn is not None:
            hooks.warn(warning)
    from trnqwen.train.run import execute, export_config, plan_train

    show_only = request.dry_run or request.export_config is not None
    plan = plan_train(
        resolved, extra_args=request.extra_args, dry_run=show_only, resume=point, overwrite=request.overwrite,
        cwd=request.cwd, run_id=request.run_id, pythonpath=request.pythonpath, data_progress=hooks.data_progress,
    )
    session = TrainSession(request, plan=plan, point=point)
    if request.export_config is not None:  # --dry-run changes nothing: it only checks the file name
        export_config(plan, request.export_config, dry_run=request.dry_run)
    if show_only:
        return session
    hooks.planned(plan)
    plan.preflight.raise_for_errors()  # before announcing a run (and a log path) that will not exist
    hooks.starting(plan, point)
    session.outcome = execute(plan, echo=hooks.echo, status=hooks.status, note=hooks.warn, phase=hooks.phase)
    if request.evaluate:
        session.validation = evaluate_after(session.outcome, announce=hooks.phase)
    if request.push_to_hub is not None:
        session.pushed, session.push_error = push_after(session.outcome, request.push_to_hub, announce=hooks.phase)
    if benchmark is not None:
        session.benchmarks, session.benchmark_error = benchmark_after(session.outcome, *benchmark, announce=hooks.phase)
    return session


def check_benchmarks(request: TrainRequest) -> Optional[tuple[list[HarnessTask], dict[str, float]]]:
    """``--eval-tasks``/``--eval-fail-below``: checked before the run (tasks exist, run offline when
    the Hub is off, gates name them); None when not asked for."""
    if not request.eval_tasks:
        if request.eval_fail_below:
            raise UsageError("--eval-fail-below gates --eval-tasks", hint="add --eval-tasks NAME (e.g. trnqwen_calculator)")
        return None
    if request.config.launcher != "local":
        raise UsageError(f"--eval-tasks with --launcher {request.config.launcher}: the nodes' jobs do not evaluate",
                         hint="evaluate the export when the job has finished: trnqwen eval RUN_ID --tasks ...")
    from trnqwen.evaluate.harness import check_request

    return check_request(request.eval_tasks, request.eval_fail_below)


def benchmark_after(outcome: TrainOutcome, tasks: list[HarnessTask], gates: dict[str, float],
                    announce: Callable[[str], None] = _nothing) -> tuple[Optional[HarnessReport], Optional[TrnqwenError]]:
    """A run that succeeded and exported, on node 0: its export and base through the harness.
    Returns (the report, None) or (the report or None, the error to raise once the run's result is shown)."""
    plan = outcome.plan
    if outcome.exit_code != 0 or plan.config.node_rank != 0 or outcome.exported is None:
        return None, None
    from trnqwen.evaluate.harness import benchmark_run

    announce(f"lm-evaluation-harness on the export and its base: {', '.join(t.name for t in tasks)} (--eval-tasks) ...")
    retry = f"trnqwen eval {plan.run_dir} --tasks {','.join(t.name for t in tasks)}"
    try:
        report, failures = benchmark_run(plan.run_dir, tasks, gates, device=plan.config.device,
                                         trust_remote_code=plan.config.trust_remote_code)
    except TrnqwenError as exc:
        return None, TrnqwenError(f"the run succeeded, but --eval-tasks failed: {exc.message}",
                                  hint=f"{exc.hint + '; ' if exc.hint else ''}evaluate it again: {retry}", exit_code=exc.exit_code)
    if failures:
        return report, CheckFailed("the run succeeded, but --eval-fail-below: " + "; ".join(failures),
                                   hint="the fine-tune lost more than allowed on these tasks against its base")
    return report, None


def check_push(request: TrainRequest) -> None:
    """``--push-to-hub``: what can be checked before a run: a local launcher (a scheduler's nodes
    get no such flag), the repo id, and (for a run that starts) online mode and a token."""
    from trnqwen.hub.push import check_ready, check_repo_id

    repo, launcher = request.push_to_hub or "", request.config.launcher
    if launcher != "local":
        raise UsageError(
            f"--push-to-hub with --launcher {launcher}: the nodes' jobs do not push",
            hint=f"drop it, and push the run's export when the job has finished: trnqwen push RUN_ID --repo {repo}",
        )
    if request.dry_run or request.export_config is not None:
        check_repo_id(repo, flag="--push-to-hub")
    else:
        check_ready(repo, flag="--push-to-hub")


def push_after(outcome: TrainOutcome, repo: str, announce: Callable[[str], None] = _nothing,
               ) -> tuple[Optional[dict[str, Any]], Optional[TrnqwenError]]:
    """A run that succeeded and exported, on node 0: its export pushed to ``repo`` (verified first).
    Returns (what was pushed, None), or (None, the error to raise once the run's result is shown)."""
    plan = outcome.plan
    if outcome.exit_code != 0 or plan.config.node_rank != 0:
        return None, None
    retry = f"trnqwen push {outcome.exported} --repo {repo}" if outcome.exported is not None else f"trnqwen push --repo {repo}"
    if outcome.exported is None:
        return None, CheckFailed(f"the run exported no checkpoint, so nothing was pushed to {repo}",
                                 hint="train with --finetune (it exports HF safetensors at the last step)")
    from trnqwen.hub.push import push

    announce(f"pushing {outcome.exported} to {repo} (--push-to-hub) ...")
    try:
        return push(str(outcome.exported), repo, cfg=plan.config).as_dict(), None
    except TrnqwenError as exc:
        hint = f"{exc.hint}; then push it again: {retry}" if exc.hint else f"push it again: {retry}"
        return None, TrnqwenError(f"the run succeeded, but its export was not pushed: {exc.message}", hint=hint,
                                  exit_code=exc.exit_code)


def resume_point(request: TrainRequest) -> tuple[Union[ResolvedConfig, RunConfig], Optional[ResumePoint]]:
    """``--resume``: the run to continue and the config it continues with (its run.json's, with
    the changes allowed); else the request's own config and None."""
    if request.resume is None:
        return request.resolved, None
    if request.overwrite:
        raise UsageError("--resume continues a run's checkpoints and --overwrite deletes them: pick one")
    from trnqwen.train.resume import auto_run_id, prepare

    resolved = request.resolved
    if not isinstance(resolved, ResolvedConfig):
        resolved = ResolvedConfig(config=resolved, sources={})
    ref: Optional[str] = request.resume
    if ref == RESUME_AUTO:  # a requeued SLURM job / restarted pod continues its own run by itself
        ref = auto_run_id(resolved)
    if ref is None:  # auto, and this job never ran before: a first start
        return resolved, None
    point = prepare(ref, resolved)
    return point.resolved, point


def schedule(request: TrainRequest) -> dict[str, Any]:
    """``--launcher slurm`` (write + sbatch) or ``--launcher k8s`` (write the manifest; ``submit``:
    apply it).  Returns what the launcher module reports (paths, job id, the text written)."""
    cfg = request.config
    if request.resume is not None:
        raise UsageError(
            f"--resume with --launcher {cfg.launcher}: a requeued or restarted job resumes by itself",
            hint="requeue the job (scontrol requeue JOBID) or let the Kubernetes job restart; see docs/resume.md",
        )
    if request.extra_args:
        raise UsageError(
            f"raw torchtitan flags after `--` do not travel to {cfg.launcher} nodes",
            hint="set the run through trnqwen's flags or trnqwen.toml",
        )
    if cfg.launcher == "slurm":
        from trnqwen.train import slurm

        if request.submit:
            raise UsageError("--submit is for --launcher k8s: --launcher slurm always submits with sbatch")
        return slurm.launch(cfg, dry_run=request.dry_run)
    from trnqwen.train import k8s

    return k8s.launch(cfg, dry_run=request.dry_run, submit=request.submit)


def evaluate_after(outcome: TrainOutcome, announce: Callable[[str], None] = _nothing) -> Optional[dict[str, Any]]:
    """A fine-tune that finished and exported, on node 0: validation loss of the base and the
    export (a preference method's run: its held-out accuracy too) when the run has a validation
    split; else None.  ``announce`` hears that it starts (it takes a while: two models loaded)."""
    plan = outcome.plan
    if outcome.exit_code != 0 or not plan.config.finetune or outcome.exported is None or plan.config.node_rank != 0:
        return None
    from trnqwen.evaluate.lifecycle import has_validation, validation_before_after

    if not has_validation(plan.run_dir):
        return None
    announce(f"closing eval: validation loss of the base and of {outcome.exported.name} ...")
    return validation_before_after(plan.run_dir, device=plan.device.type)
