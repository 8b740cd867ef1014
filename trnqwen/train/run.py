"""``trnqwen train`` end to end: device -> topology -> job -> argv -> preflight -> run dir -> launch -> record.

:func:`plan_train` does everything up to (not including) starting processes; the CLI always
builds that plan, then shows it (``--dry-run``), exports it (``--export-config``) or runs it
with :func:`execute`, which creates the run directory and supervises torchrun.  Quickstart and
the scheduler launchers reuse the same two steps.  Core library: no typer, no torch (the
launcher process must never initialize a device runtime).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from trnqwen.assets import base_identity
from trnqwen.config import ResolvedConfig, RunConfig
from trnqwen.contract import metrics_stream
from trnqwen.env.device import DeviceInfo
from trnqwen.env.versions import package_versions
from trnqwen.errors import (
    EXIT_FAILED,
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_BEFORE_START,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_USAGE,
    CheckFailed,
    EnvironmentProblem,
    TrnqwenError,
    UsageError,
    redact,
    redact_argv,
    redact_env,
)
from trnqwen.fsutil import disk_full_at, write_text_atomic
from trnqwen.naming import default_checkpoint_dir
from trnqwen.train.shown_log import ShownLog
from trnqwen.rundir import RunRecord, next_run_id, point_last
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.train import folder_lock, launcher, multinode, ownership, stops
from trnqwen.train.job import TrainJob
from trnqwen.train.launch_result import LaunchResult
from trnqwen.train.plan import TrainPlan
from trnqwen.train.preflight import ERROR, INFO, WARNING, Finding, preflight
from trnqwen.train.recipes import build_job
from trnqwen.train.cache_data import DataProgress, data_record
from trnqwen.train.status import StatusLine
from trnqwen.train.resume import ResumePoint, refuse_changed_data, refuse_other_device, resume_command
from trnqwen.train.schedule import Schedule
from trnqwen.train.topology import plan_topology

COMMAND_SCRIPT = "command.sh"
VERSION_PACKAGES = (
    "trnqwen", "torch", "torchtitan", "transformers", "safetensors", "tokenizers",
    "torch-neuronx", "torchtitan-neuron", "neuronx-cc",
)

# What a Trainium run looks like when --dry-run is asked on a machine without one.
NOMINAL_DEVICES = {
    "neuron": DeviceInfo(
        type="neuron", count=64, lnc=2, memory_bytes_per_rank=24 * 1024**3,
        instance_type="trn2.48xlarge (nominal)", peak_flops_per_rank=157e12,
        host_memory_bytes=2048 * 1024**3,  # trn2.48xlarge: 2 TiB of host memory
    ),
    "cuda": DeviceInfo(type="cuda", count=1),
}


@dataclass
class TrainOutcome:
    plan: TrainPlan
    result: Optional[LaunchResult] = None
    record: Optional[RunRecord] = None
    exported: Optional[Path] = None  # the HF export of the last step, when there is one

    @property
    def exit_code(self) -> int:
        return 0 if self.result is None else self.result.exit_code

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run_id": self.plan.run_id,
            "run_dir": str(self.plan.run_dir),
            "log": str(self.plan.log_path),
            "backend": self.plan.config.backend,
            "nproc_per_node": self.plan.nproc_per_node,
            "checkpoint_dir": str(self.plan.job.checkpoint_dir) if self.plan.job.checkpoint_dir else None,
            "exported": str(self.exported) if self.exported else None,
            "status": self.record.status if self.record else None,
        }
        if self.result is not None:
            out.update(self.result.summary())
        return out

    def raise_for_status(self) -> None:
        """A failed or interrupted run becomes the error the CLI prints (root cause + log path)."""
        if self.result is None or self.result.exit_code == 0:
            return
        r = self.result
        if r.exit_code == EXIT_PREEMPTED:
            step = self.record.extra.get("interrupted_at_step") if self.record else None
            raise TrnqwenError(
                f"training preempted by {r.ended_by} at step {step}: a resumable checkpoint was saved",
                hint=f"continue it with: {self.record.extra.get('resume_command') if self.record else 'trnqwen train --resume last'}",
                exit_code=EXIT_PREEMPTED,
            )
        if r.exit_code == EXIT_PREEMPTED_BEFORE_START:
            command = self.record.extra.get("resume_command") if self.record else None
            raise TrnqwenError(
                f"training preempted by {r.ended_by} before its first step: nothing was trained, nothing was lost",
                hint=f"start it again with: {command or 'trnqwen train --resume last'}",
                exit_code=EXIT_PREEMPTED_BEFORE_START,
            )
        if r.exit_code in (EXIT_SIGINT, EXIT_SIGTERM):
            raise TrnqwenError(
                f"training stopped by {r.ended_by} after {len(r.steps)} logged step(s); every rank was stopped",
                hint=f"continue it with `{resume_command(self.plan.run_id)}` (from its newest complete checkpoint; "
                f"without one it starts over from step 1); the log so far is in {self.plan.log_path}",
                exit_code=r.exit_code,
            )
        if r.exit_code == EXIT_USAGE:  # a user's mistake the ranks found (contract/rank_errors.py)
            raise UsageError(r.error or "a rank stopped on a usage error", hint=r.error_hint)
        removed = (self.record.extra.get("removed_incomplete_checkpoints") if self.record else None) or []
        cleaned = f"; removed the half-written checkpoint {', '.join(removed)}" if removed else ""
        if r.error and ("No space left on device" in r.error or "Errno 28" in r.error):
            where = self.plan.job.checkpoint_dir or self.plan.run_dir
            raise CheckFailed(
                f"training failed: disk full while writing ({r.error}){cleaned}",
                hint=f"free space on the disk holding {where} (df -h) and run again; full log: {self.plan.log_path}",
            )
        raise CheckFailed(
            f"training failed: {r.error or 'a rank failed'}{cleaned}",
            hint=f"full log: {self.plan.log_path} (per-rank logs in {self.plan.rank_log_dir})",
        )


# --- device -----------------------------------------------------------------------------------


def resolve_device(cfg: RunConfig, *, dry_run: bool = False) -> tuple[DeviceInfo, list[str]]:
    """The device the run gets.  ``--dry-run`` for an absent neuron/cuda device shows a nominal one."""
    from trnqwen.env.device import detect_device

    try:
        device = detect_device(cfg.device)
    except EnvironmentProblem as exc:
        if dry_run and cfg.device in NOMINAL_DEVICES:
            nominal = NOMINAL_DEVICES[cfg.device]
            return nominal, [f"{exc.message}; showing the command for a {nominal.instance_type or cfg.device}"]
        raise
    if dry_run and cfg.backend == "nki-moe" and cfg.device == "auto" and device.type != "neuron":
        # NKI kernels run only on Trainium: a dry run elsewhere shows the Trainium command.
        nominal = NOMINAL_DEVICES["neuron"]
        return nominal, [f"nki-moe runs only on Neuron; showing the command for a {nominal.instance_type}"]
    return device, []


# --- planning ---------------------------------------------------------------------------------


def plan_train(
    resolved: ResolvedConfig | RunConfig,
    *,
    extra_args: Sequence[str] = (),
    device: Optional[DeviceInfo] = None,
    dry_run: bool = False,
    cwd: Optional[Path] = None,
    run_id: Optional[str] = None,
    python: Optional[str] = None,
    resume: Optional[ResumePoint] = None,
    overwrite: bool = False,
    pythonpath: Sequence[Path] = (),
    data_progress: Optional[DataProgress] = None,
) -> TrainPlan:
    """Resolve the device and ranks, build the job, the argv and the env, and run preflight.

    Nothing is created on disk.  The plan's ``run_dir`` is where :func:`execute` will put the run.
    ``pythonpath`` folders go first on the ranks' ``PYTHONPATH`` (where an ``--override-imports``
    module lives), so preflight looks for the module exactly where the ranks will.  ``data_progress``:
    a progress display opened while the dataset is prepared (the CLI's bar; cache_data.DataProgress).
    """
    if resume is not None:  # the run's own config, folder and working directory
        resolved, cwd, run_id = resume.resolved, resume.cwd, resume.run_id
    cfg = resolved.config if isinstance(resolved, ResolvedConfig) else resolved
    sources = resolved.sources if isinstance(resolved, ResolvedConfig) else {}
    cwd = Path(cwd or Path.cwd()).absolute()
    notes: list[str] = []
    if device is None:
        device, notes = resolve_device(cfg, dry_run=dry_run)
    if resume is not None:
        refuse_other_device(resume, device.type)
    topo = plan_topology(cfg, device)
    runs_dir = _abs(cfg.runs_dir, cwd)
    if cfg.nnodes > 1 or cfg.rdzv_id:  # every node names the shared run dir after the rendezvous id
        multinode.check_topology(
            nnodes=cfg.nnodes, node_rank=cfg.node_rank, endpoint=cfg.rdzv_endpoint, rdzv_id=cfg.rdzv_id
        )
    # every node names the shared run dir after the rendezvous id; a scheduler's one-node job too,
    # so that its restart (`--resume auto`) finds its own run
    run_id = run_id or cfg.rdzv_id or next_run_id(runs_dir, cfg.backend, method=cfg.method, lora=cfg.lora)
    run_dir = runs_dir / run_id
    base_model, base_note = base_identity(cfg.model, _abs(cfg.assets_dir, cwd) if cfg.assets_dir else None)
    if base_model != cfg.model and cfg.checkpoint_dir is None and resume is None:  # named after what is trained
        cfg = cfg.model_copy(update={"checkpoint_dir": default_checkpoint_dir(base_model, cfg.finetune)})
        sources = {**sources, "checkpoint_dir": f"named after the model in --assets ({base_model})"}
    with _no_device_backend_autoload(device):
        job = build_job(cfg, device, run_dir, topology=topo, check_runtime=not dry_run, data_progress=data_progress)
    if resume is not None:
        refuse_changed_data(resume, job.dataset_cache)
    if job.schedule is not None:  # the counted steps and the chosen LR: what run.json, resume and the status line see
        cfg, sources = _with_schedule(cfg, dict(sources), job.schedule)
    extra = [str(a) for a in extra_args]
    argv = launcher.build_torchrun_argv(
        cfg, job, topo, python=python, extra_args=extra,
        log_dir=multinode.node_rank_log_dir(run_dir, cfg.node_rank) if cfg.nnodes > 1 else run_dir / launcher.RANK_LOGS_DIR,
    )
    env = launcher.rank_env(cfg, job, device, run_dir)
    env.update(multinode.multinode_env(device.type, cfg.nnodes))  # EFA on multi-node Neuron; user values win
    if pythonpath:
        rest = env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), *([rest] if rest else [])])
    # where the ranks look for --override-imports modules: their cwd (`-m` puts it first), PYTHONPATH
    rank_path = [str(cwd), *(p for p in env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep) if p)]
    report = preflight(
        cfg, device, job, topo, assets_dir=_abs(cfg.resolved_assets_dir, cwd), search_path=[*rank_path, *sys.path]
    )
    for note in notes + (list(resume.warnings) if resume is not None else []):
        report.findings.insert(0, Finding(WARNING, "device" if resume is None else "resume", note))
    if base_note:  # the first thing said: the export will not name --model as its base
        report.findings.insert(0, Finding(WARNING, "assets", base_note))
    if resume is None and job.checkpoint_dir is not None and multinode.writes_run_record(cfg.node_rank):
        try:  # no silent resume: a folder with another run's checkpoints stops the run here
            found = checkpoints.check_for_new_run(_abs(job.checkpoint_dir, cwd), overwrite=overwrite)
            doomed = [str(p.relative_to(found.root)) for p in checkpoints.step_folders(found)] if overwrite else []
            if doomed:  # what --overwrite will delete (a --dry-run lists it)
                report.add(INFO, "outputs", f"--overwrite deletes from {found.root}: {', '.join(doomed)} and its owner file")
        except UsageError as exc:
            report.findings.insert(0, Finding(ERROR, "outputs", exc.message, exc.hint))
    if job.checkpoint_dir is not None and multinode.writes_run_record(cfg.node_rank):
        holder = folder_lock.holder_of(_abs(job.checkpoint_dir, cwd))
        if holder is not None:  # told now, before anything is announced; execute() takes the lock for real
            exc = folder_lock.refusal(_abs(job.checkpoint_dir, cwd), holder)
            report.findings.insert(0, Finding(ERROR, "outputs", exc.message, exc.hint))
    return TrainPlan(
        config=cfg, device=device, job=job, topology=topo, run_id=run_id, run_dir=run_dir,
        argv=argv, env=env, preflight=report, cwd=cwd, extra_args=extra, sources=dict(sources), notes=notes,
        resume=resume, overwrite=overwrite, base_model=base_model,
    )


def _with_schedule(cfg: RunConfig, sources: dict[str, str], schedule: Schedule) -> tuple[RunConfig, dict[str, str]]:
    """``cfg`` with the schedule's step count and LR filled in, their sources saying how."""
    if cfg.steps is None:
        sources["steps"] = schedule.explain
    if cfg.lr is None:
        sources["lr"] = schedule.lr_source
    return cfg.model_copy(update={"steps": schedule.steps, "lr": schedule.lr}), sources


@contextlib.contextmanager
def _no_device_backend_autoload(device: DeviceInfo):
    """On Neuron, a recipe importing torch here must not auto-load torch_neuronx's device backend.

    The launcher process must never touch the Neuron runtime (ranks would find their cores
    claimed).  torch reads TORCH_DEVICE_BACKEND_AUTOLOAD at import; the ranks' environment is
    restored afterwards, so they still load the backend.
    """
    if device.type != "neuron" or "torch" in sys.modules:
        yield
        return
    previous = os.environ.get(_AUTOLOAD)
    os.environ[_AUTOLOAD] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_AUTOLOAD, None)
        else:
            os.environ[_AUTOLOAD] = previous


_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def _abs(path: Path, cwd: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else cwd / path


# --- the run directory --------------------------------------------------------------------------


def run_versions() -> dict[str, Optional[str]]:
    """What run.json records: Python and the packages a run depends on."""
    return {"python": platform.python_version(), **package_versions(VERSION_PACKAGES)}


def create_run_dir(plan: TrainPlan) -> RunRecord:
    """Make the run dir (config module, command.sh, run.json) and point ``LAST`` at it."""
    if plan.resume is not None:
        return _reopen_run_dir(plan)
    plan.run_dir.parent.mkdir(parents=True, exist_ok=True)
    multi = plan.config.nnodes > 1
    node_dir = multinode.node_dir(plan.run_dir, plan.config.node_rank)
    try:
        # the nodes of a multi-node run share it; a scheduler job's dir exists from its submission
        plan.run_dir.mkdir(exist_ok=multi or _submitted(plan.run_dir))
        if multi:
            node_dir.mkdir(parents=True)
    except FileExistsError:
        if multi:
            raise UsageError(
                f"node {plan.config.node_rank} of run {plan.run_id} already ran ({node_dir} exists)",
                hint="give every new multi-node run its own --rdzv-id",
            ) from None
        raise UsageError(f"run directory {plan.run_dir} already exists", hint="start the run again") from None
    if plan.config_module_path is not None and plan.job.config_module_text is not None:
        write_text_atomic(plan.config_module_path, plan.job.config_module_text)
    cache = plan.env.get(launcher.NEFF_CACHE_VAR)
    if cache:  # the persistent compile cache outlives every run
        Path(cache).mkdir(parents=True, exist_ok=True)
    script = (node_dir if multi else plan.run_dir) / COMMAND_SCRIPT
    # executable, but no more readable than the user's umask allows
    write_text_atomic(script, launcher.command_script(plan.argv, plan.env, plan.cwd), mode=0o777)
    record = RunRecord(
        run_id=plan.run_id,
        run_dir=str(plan.run_dir),
        status="created",
        config=plan.config.model_dump(mode="json"),
        command=redact_argv(plan.argv),
        env=redact_env(plan.env),
        versions=run_versions(),
        log_path=str(plan.log_path),
        checkpoint_dir=str(_abs(plan.job.checkpoint_dir, plan.cwd)) if plan.job.checkpoint_dir else None,
        assets_dir=str(_abs(plan.config.resolved_assets_dir, plan.cwd)),
        backend=plan.config.backend,
        steps=plan.config.steps,
        extra={
            "device": vars(plan.device).copy(),
            "nproc_per_node": plan.nproc_per_node,
            "world_size": plan.topology.world_size,
            "cwd": str(plan.cwd),
            # the base the export names (trnqwen.assets.base_identity: --model, or what --assets holds)
            "base_model": plan.base_model or plan.config.model,
            "sources": plan.sources,
            "schedule": plan.job.schedule.as_dict() if plan.job.schedule is not None else None,
            "preflight": plan.preflight.as_dict(),
            "extra_args": redact_argv(plan.extra_args),
            "config_module": plan.job.config_module,
            "config_fn": plan.job.config_fn,
            "rank_log_dir": str(plan.rank_log_dir),
            "launcher_pid": os.getpid(),
            # The token cache the ranks read (trnqwen eval finds the run's validation split here).
            "dataset_cache": str(plan.job.dataset_cache) if plan.job.dataset_cache else None,
            "data": data_record(plan.job.dataset_cache),  # each source's share of the trained tokens, the packing
            "launcher_started_at": _process_start_time(),
            "resume_command": f"trnqwen train --resume {plan.run_id}",
        },
    )
    if multi:
        record.extra.update(nnodes=plan.config.nnodes, node_rank=plan.config.node_rank, rdzv_id=plan.config.rdzv_id)
        if not multinode.writes_run_record(plan.config.node_rank):
            record.run_dir = str(node_dir)  # only node 0 writes <run dir>/run.json and LAST
            record.save()
            return record
    record.save()
    point_last(plan.run_dir.parent, plan.run_id)
    return record


def _reopen_run_dir(plan: TrainPlan) -> RunRecord:
    """A resumed run keeps its run dir: the config module and command.sh follow the new settings
    (steps, ranks), run.json keeps its history and LAST points at it again."""
    import copy

    record = copy.deepcopy(plan.resume.record)
    multi = plan.config.nnodes > 1
    node_dir = multinode.node_dir(plan.run_dir, plan.config.node_rank)
    if multi:  # each node keeps its own folder; only node 0 writes <run dir>/run.json and LAST
        node_dir.mkdir(parents=True, exist_ok=True)
        if not multinode.writes_run_record(plan.config.node_rank):
            try:
                record = RunRecord.load(node_dir)
            except (OSError, ValueError, TypeError):
                record.run_dir = str(node_dir)
    if plan.config_module_path is not None and plan.job.config_module_text is not None:
        write_text_atomic(plan.config_module_path, plan.job.config_module_text)
    script_dir = node_dir if multi else plan.run_dir
    write_text_atomic(script_dir / COMMAND_SCRIPT, launcher.command_script(plan.argv, plan.env, plan.cwd), mode=0o777)
    record.config = plan.config.model_dump(mode="json")
    record.command = redact_argv(plan.argv)
    record.env = redact_env(plan.env)
    record.steps = plan.config.steps
    record.status = "created"
    record.exit_code = record.ended_by = record.error = None
    for stale in ("interrupted_at_step", "interrupted", "exported", "removed_incomplete_checkpoints"):
        record.extra.pop(stale, None)
    record.extra.update(
        nproc_per_node=plan.nproc_per_node, world_size=plan.topology.world_size,
        launcher_pid=os.getpid(), launcher_started_at=_process_start_time(),
    )
    record.save()
    if not multi or multinode.writes_run_record(plan.config.node_rank):
        point_last(plan.run_dir.parent, plan.run_id)
    return record


def _submitted(run_dir: Path) -> bool:
    """The run dir ``trnqwen train --launcher slurm`` made at submission (status ``submitted``)."""
    try:
        return RunRecord.load(run_dir).status == "submitted"
    except (OSError, ValueError, TypeError):
        return False


def _process_start_time() -> Optional[float]:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:
        return None


def find_export(checkpoint_dir: Optional[Path], cwd: Path) -> Optional[Path]:
    """The newest complete HF export under the checkpoint dir (``hf/step-N``), if any."""
    return checkpoints.find_export(_abs(Path(checkpoint_dir), cwd) if checkpoint_dir is not None else None)


def _mark_resume(plan: TrainPlan, record: RunRecord) -> None:
    """Append ``[trnqwen] resumed ...`` to the log and the resume to run.json (inspect-logs reads both)."""
    from trnqwen.train.resume import RESUMED_MARK

    plan.log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(plan.log_path, "rb") as fh:
            line = sum(1 for _ in fh) + 1
    except OSError:
        line = 1
    point = plan.resume
    text = (
        f"{RESUMED_MARK} run {plan.run_id} from step {point.from_step}"
        + (f" ({point.checkpoint})" if point.checkpoint else " (no complete checkpoint: from the beginning)")
        + (f"; changed: {', '.join(f'{k}={v}' for k, v in point.changes.items())}" if point.changes else "")
    )
    with open(plan.log_path, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    record.extra.setdefault("resumes", []).append(point.entry(line))
    record.save()


# --- running ------------------------------------------------------------------------------------


def execute(
    plan: TrainPlan,
    *,
    status: bool = True,
    echo: Optional[Callable[[str], None]] = None,
    grace_s: Optional[float] = None,
    status_stream: Any = None,
    note: Optional[Callable[[str], None]] = None,
    phase: Optional[Callable[[str], None]] = None,
) -> TrainOutcome:
    """Take the checkpoint folder, create the run dir, start torchrun, supervise it, record how it ended.

    Raises :class:`CheckFailed` when preflight found errors and :class:`UsageError` when another
    run holds the checkpoint folder (nothing is created then).  ``note`` gets one-line notes
    (a lock taken over from a killed run); ``phase`` what takes a while after the ranks exit
    (``merging the adapter ...``), as it starts.
    """
    plan.preflight.raise_for_errors()
    lock = ownership.claim(plan)
    try:
        if lock is not None and lock.took_over and note is not None:
            note(lock.takeover_note())
        return _execute(plan, lock, status=status, echo=echo, grace_s=grace_s, status_stream=status_stream,
                        phase=phase or (lambda _text: None))
    finally:
        if lock is not None:
            lock.release()


def _execute(
    plan: TrainPlan,
    lock: Optional[folder_lock.FolderLock],
    *,
    status: bool,
    echo: Optional[Callable[[str], None]],
    grace_s: Optional[float],
    status_stream: Any,
    phase: Callable[[str], None],
) -> TrainOutcome:
    """:func:`execute` holding the folder's lock."""
    record = create_run_dir(plan)
    if lock is not None and lock.took_over:
        record.extra["lock_taken_over"] = lock.took_over
    ownership.prepare_folder(plan, record)
    if plan.resume is not None:
        _mark_resume(plan, record)
    grace_s = plan.config.grace_seconds if grace_s is None else grace_s
    log_offset = plan.log_path.stat().st_size if plan.log_path.is_file() else 0
    line = StatusLine(stream=status_stream, total_steps=plan.config.steps, enabled=status, mfu=plan.device.type != "cpu",
                      closing=closing_phase(plan.config))
    if echo is not None and status:
        # Log lines go above the live status line so it keeps its place at the bottom.
        echo = line.print_above
    shown = ShownLog(echo) if echo is not None else None  # less torchrun's traceback of a preemption

    def started(pid: int) -> None:
        record.status = "running"
        record.started_at = time.time()
        record.extra["torchrun_pid"] = pid
        record.extra["launcher_startup_s"] = _seconds_since_process_start(record.started_at)
        record.save()

    ckpt_root = _abs(plan.job.checkpoint_dir, plan.cwd) if plan.job.checkpoint_dir is not None else None
    steps_before = checkpoints.step_paths(ckpt_root)
    result = launcher.supervise(
        plan.argv, env=plan.env, cwd=plan.cwd, log_path=plan.log_path, rank_log_dir=plan.rank_log_dir, status=line,
        grace_s=grace_s, echo=shown, on_start=started,
        metrics_path=plan.run_dir / metrics_stream.FILE_NAME,  # global rank 0 writes it (node 0's run dir)
    )
    if result.exit_code != 0 and plan.config.nnodes > 1:  # say that a peer node went away
        why = multinode.explain_failure(
            result.error, nnodes=plan.config.nnodes, node_rank=plan.config.node_rank, run_dir=plan.run_dir
        )
        if why is not None:
            result.error = why[0]
    record.ended_at = time.time()
    record.exit_code = result.exit_code
    record.ended_by = result.ended_by
    record.error = result.error
    record.status = {
        "completed": "succeeded",
        "SIGINT": "interrupted",
        "SIGTERM": "interrupted",
        "SIGUSR1": "interrupted",
    }.get(result.ended_by, "failed")
    record.extra["summary"] = result.summary()
    stops.classify(plan, result, record, log_offset, ckpt_root)  # 138 / 140 / finished anyway
    if shown is not None:
        shown.finish(expected_stop=result.exit_code in (0, EXIT_PREEMPTED, EXIT_PREEMPTED_BEFORE_START))
    if result.exit_code not in (0, EXIT_PREEMPTED, EXIT_PREEMPTED_BEFORE_START) and result.error and "No space left" not in result.error:
        full = disk_full_at(ckpt_root)  # torch's zip writer fails on a full disk without saying so
        if full:
            result.error = record.error = f"{result.error}; No space left on device ({full})"
    if not plan.owns_checkpoints:  # node 0 cleans, completes and checks the export
        record.save()
        return TrainOutcome(plan=plan, result=result, record=record, exported=None)
    if result.exit_code != 0:
        removed = checkpoints.remove_incomplete(ckpt_root, steps_before)
        if removed:
            record.extra["removed_incomplete_checkpoints"] = removed
    if ckpt_root is not None:  # what a later --resume must find (trnqwen.train.resume.saved_steps)
        saved = [s.step for s in checkpoints.scan(ckpt_root).resume if s.complete]
        record.extra["saved_checkpoints"] = sorted(set(record.extra.get("saved_checkpoints") or []) | set(saved))
    # the export of the last step THIS run trained, never an older one left in the folder
    trained = (result.last_step or {}).get("step")
    wanted = result.exit_code == 0 and plan.config.resolved_export_hf and trained is not None
    exported = checkpoints.find_export(ckpt_root, step=trained) if wanted else None
    if exported is not None:
        record.extra["exported"] = str(exported)
        from trnqwen.ckpt.model_folder import complete_run_export  # a whole model folder (issue 15)

        record.extra["export_files"] = complete_run_export(record, exported)
        if plan.config.lora and result.exit_code == 0:  # the adapter, never the base; --merge beside it
            from trnqwen.adapters.lora.plan import finish_export
            from trnqwen.ckpt.merge import merge_in_child

            record.save()  # the merge (a child process) reads the run's facts for its model card
            if plan.config.merge:
                phase(f"merging the adapter into the base model (--merge) beside {exported.name} ...")
            failure = finish_export(plan.config, exported, Path(record.assets_dir), record.extra, merge=merge_in_child)
            if failure is not None:
                _fail(result, record, *failure)
    if result.exit_code == 0 and plan.config.resolved_export_hf and plan.job.checkpoint_dir and exported is None:
        _fail(result, record, "no export",
              f"training finished but no HF export of step {trained} appeared under {plan.job.checkpoint_dir}")
    record.save()
    got = record.extra.get("signal_received")
    if got:  # a stop signal during the final export: what was done instead (trnqwen.train.stops)
        from trnqwen import output

        output.warn(f"{got['signal']} received during {got['during']}: {got['done']}")
    _say_if_run_dir_lost(plan, record, result)
    return TrainOutcome(plan=plan, result=result, record=record, exported=exported)


def _say_if_run_dir_lost(plan: TrainPlan, record: RunRecord, result: LaunchResult) -> None:
    """The run dir (or its log) was deleted while the run trained: say what is lost and what is
    not.  run.json has been written again (RunRecord.save); LAST is pointed at the run again."""
    lost = record.extra.get("run_dir_lost")
    if not lost:
        return
    from trnqwen import output
    from trnqwen.rundir import read_last_pointer

    if read_last_pointer(plan.run_dir.parent) is None:
        point_last(plan.run_dir.parent, plan.run_id)
    if result.log_recovered:
        lost["recovered"] = ["train.log"]
        record.save()
        gone = "its per-rank logs and metrics are lost (train.log was written back from the launcher's open copy)"
    else:
        gone = "its log (train.log), per-rank logs and metrics are lost"
    if record.status == "succeeded":
        how = "the training itself completed"
        if record.extra.get("exported"):
            how += f" and its export is whole ({record.extra['exported']})"
    else:
        how = f"the run ended: {record.ended_by} (exit {record.exit_code})"
    output.warn(f"the run directory {plan.run_dir} was deleted during the run: {gone}; "
                f"{how}; run.json was written again from what the launcher knew")


def closing_phase(cfg: RunConfig) -> str:
    """What the ranks do between the last step and their exit, as the status line says it."""
    if cfg.resolved_export_hf:
        return "exporting the LoRA adapter (PEFT)" if cfg.lora else "exporting HF safetensors"
    return "saving the last checkpoint, stopping the ranks"


def _fail(result: LaunchResult, record: RunRecord, ended_by: str, error: str) -> None:
    """A run that trained but whose result is not what it promised: failed, with why."""
    record.status, record.ended_by, record.error = "failed", ended_by, error
    result.exit_code = record.exit_code = EXIT_FAILED
    result.ended_by, result.error = ended_by, error


def _seconds_since_process_start(now: float) -> Optional[float]:
    """How long this process took from its start to launching torchrun (trnqwen's own overhead)."""
    try:
        import psutil

        return round(now - psutil.Process().create_time(), 3)
    except Exception:
        return None


def export_config(plan: TrainPlan, dest: Path, *, dry_run: bool = False) -> Path:
    """Write the standalone torchtitan config module of this plan to ``dest`` (a .py file); with
    ``dry_run``, only check the name."""
    dest = Path(dest).expanduser()
    if dest.suffix != ".py":
        raise UsageError(f"--export-config wants a .py file name, got {dest}", hint="e.g. --export-config my_qwen3.py")
    if not dest.stem.isidentifier():
        raise UsageError(
            f"{dest.name}: the file name must be a Python module name (letters, digits, _)",
            hint="torchtitan imports it with --module <name>; e.g. --export-config qwen3_ft.py",
        )
    if dry_run:
        return dest
    from trnqwen.train.recipes import render_config_module

    # without the run dir: an exported module writes no dump folder into a run that never was
    text = render_config_module(plan.config, plan.device, topology=plan.topology)
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(dest, text)
    return dest


def hand_run_command(plan: TrainPlan, module_file: Path) -> str:
    """The torchrun line a user types to run an exported config module by hand."""
    module_file = Path(module_file)
    entry_args = list(plan.job.entry_args)  # the recipe's own: device flag, override imports
    entry_args[entry_args.index("--module") + 1] = module_file.stem
    job = TrainJob(backend=plan.job.backend, entry_module=plan.job.entry_module, entry_args=entry_args)
    full = launcher.build_torchrun_argv(plan.config, job, plan.topology, extra_args=plan.extra_args)
    argv = ["torchrun", *full[3:]]  # drop "<python> -m torch.distributed.run"
    env = {k: v for k, v in plan.env.items() if k != "PYTHONPATH"}
    parent = str(module_file.parent.absolute())
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # the folder quoted, the shell expansion of an existing PYTHONPATH left to the shell
    prefix = (prefix + " " if prefix else "") + "PYTHONPATH=" + shlex.quote(parent) + '"${PYTHONPATH:+:$PYTHONPATH}"'
    return redact(f"{prefix} {shlex.join(redact_argv(argv))}")


__all__ = [
    "TrainPlan", "TrainOutcome", "plan_train", "execute", "resolve_device",
    "create_run_dir", "export_config", "hand_run_command", "find_export", "run_versions",
]

if sys.version_info < (3, 10):  # pragma: no cover
    raise ImportError("trnqwen needs Python 3.10+")
