"""``trnqwen train --resume [RUN_ID|last|auto]``: continue a recorded run exactly where it stopped.

The run's own ``run.json`` is the configuration; the flags given with ``--resume`` may only
change what does not change the run (:data:`MAY_CHANGE`: steps, time limit, node and rank
counts, checkpoint cadence, scheduler settings); any other field that differs is refused by
name.  Every refusal is a :class:`UsageError` raised before anything is written.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.config import FIELD_NAMES, ResolvedConfig, RunConfig, flatten
from trnqwen.settings import nest, value_of
from trnqwen.errors import UsageError
from trnqwen.fsutil import first_match
from trnqwen.rundir import RUN_RECORD, RunRecord, last_run_dir, live_launcher
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.train import multinode

# Fields a resumed run may take from the new command line: they do not change what is trained.
MAY_CHANGE = frozenset({
    "steps", "time_limit", "nnodes", "nproc_per_node", "node_rank", "rdzv_endpoint", "rdzv_id",
    "max_restarts", "partition", "image", "k8s_api", "k8s_secret", "launcher", "save_every", "keep_last", "grace_seconds",
    "compile_cache_dir", "runs_dir",  # where files go, not what is trained
    "device",  # only as another way to name the same kind of device: refuse_other_device
    "merge",  # LoRA: also write the merged folder at the end (after training; the adapter is the same)
    "disk_check",  # preflight's disk-space check: whether to trust the disk, not what is trained
})
RESUME_LAST = "last"
RESUME_AUTO = "auto"  # schedulers: continue this job's own run (--rdzv-id) if it started before
RESUMED_MARK = "[trnqwen] resumed"
PREEMPTED_MARK = "[trnqwen] preempted:"  # written by trnqwen.runtime.resume_state in the ranks
_PREEMPTED_STEP = re.compile(r"\[trnqwen\] preempted: (.+?) at step (\d+)")


@dataclass
class ResumePoint:
    """A run to continue, the config it continues with and where its state comes from."""

    record: RunRecord
    resolved: ResolvedConfig
    cwd: Path
    from_step: int  # 0 = no complete checkpoint: the run starts over from its beginning
    checkpoint: Optional[Path]
    changes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.record.run_id

    def entry(self, line: int) -> dict[str, Any]:
        """What ``run.json`` keeps about this resume (``inspect-logs`` reads ``from_step`` / ``line``)."""
        return {
            "from_step": self.from_step, "line": line, "at": time.time(),
            "checkpoint": str(self.checkpoint) if self.checkpoint else None, "changes": self.changes,
            # how the attempt before this one ended (138 preempted, 140 before its first step, ...)
            "previous": {"status": self.record.status, "exit_code": self.record.exit_code, "ended_by": self.record.ended_by},
        }


def resume_command(run_id: str) -> str:
    return f"trnqwen train --resume {run_id}"


def auto_run_id(resolved: ResolvedConfig) -> Optional[str]:
    """``--resume auto`` (the sbatch script, the PyTorchJob): the job's own run when this node ran
    it before (a requeued job, a restarted pod), else None (a first start).

    Only ever the run named by ``--rdzv-id``: never another run's checkpoints.
    """
    cfg = resolved.config
    if not cfg.rdzv_id:
        raise UsageError(
            "--resume auto is for scheduler jobs and needs the job's run id (--rdzv-id / TRNQWEN_RDZV_ID)",
            hint="by hand, use --resume RUN_ID or --resume last",
        )
    run_dir = Path(cfg.runs_dir).expanduser() / cfg.rdzv_id
    if cfg.nnodes > 1:
        from trnqwen.train import multinode

        started = multinode.node_dir(run_dir, cfg.node_rank).is_dir()
    else:
        started = False
        if (run_dir / RUN_RECORD).is_file():
            try:
                started = RunRecord.load(run_dir).status not in ("submitted",)
            except (OSError, ValueError, TypeError):
                started = False
    return cfg.rdzv_id if started else None


def find_run(ref: str, runs_dir: Path) -> Path:
    runs_dir = Path(runs_dir).expanduser()
    if ref in ("", RESUME_LAST):
        found = last_run_dir(runs_dir) if runs_dir.is_dir() else None
        if found is None:
            raise UsageError(
                f"--resume: there is no earlier run under {runs_dir} to continue",
                hint="start one with `trnqwen train ...` (or set runs_dir in trnqwen.toml, or TRNQWEN_RUNS_DIR, to where your runs are)",
            )
        return found
    if "/" in ref or ref in (".", ".."):
        raise UsageError(f"--resume takes a run id (a folder name under {runs_dir}) or 'last', got {ref!r}")
    run_dir = runs_dir / ref
    if not (run_dir / RUN_RECORD).is_file():
        known = sorted(p.parent.name for p in runs_dir.glob(f"*/{RUN_RECORD}"))[-3:] if runs_dir.is_dir() else []
        raise UsageError(
            f"--resume: no run {ref!r} under {runs_dir}",
            hint=f"recent runs: {', '.join(known)}" if known else "there is no earlier run; start one with `trnqwen train ...`",
        )
    return run_dir


def prepare(ref: str, resolved: ResolvedConfig) -> ResumePoint:
    """Check that run ``ref`` can be continued with the flags in ``resolved``, or refuse clearly."""
    run_dir = find_run(ref, resolved.config.runs_dir)
    try:
        record = RunRecord.load(run_dir)
        recorded_values = recorded_config(record.config)
        recorded = RunConfig(**nest(recorded_values))
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read {run_dir / RUN_RECORD}: {exc}") from None
    changes = _allowed_changes(recorded, resolved, record.run_id)
    config = recorded.model_copy(update=changes)
    sources = {k: f"run.json of {record.run_id}" for k in FIELD_NAMES if k in recorded_values}
    sources.update({k: resolved.sources.get(k, "flag") for k in changes})
    cwd = Path(record.extra.get("cwd") or Path.cwd())
    if multinode.writes_run_record(config.node_rank):  # node 0 owns run.json (and its pid)
        _refuse_if_running(record)
    _require_inputs(config, cwd, record.run_id)
    root = Path(record.checkpoint_dir) if record.checkpoint_dir else _abs(config.resolved_checkpoint_dir, cwd)
    found = checkpoints.scan(root)
    if found.foreign:
        raise UsageError(
            f"--resume: checkpoint folder {root} holds something that is not a torchtitan or Trainer checkpoint "
            f"({', '.join(found.foreign[:3])})",
            hint="move those files away (trnqwen never deletes files it does not know), then resume again",
        )
    owner = (found.owner or {}).get("run_id")
    if owner and owner != record.run_id:
        raise UsageError(
            f"--resume: checkpoint folder {root} now belongs to run {owner}, not {record.run_id}",
            hint=f"resume {owner} instead (`{resume_command(owner)}`), or start a new run",
        )
    latest = found.latest_resume
    _refuse_if_checkpoints_lost(record, root, found)
    from_step = latest.step if latest else 0
    done_steps = int(record.config.get("steps") or 0)
    if record.status == "succeeded" and config.steps <= max(from_step, done_steps):
        raise UsageError(
            f"run {record.run_id} already completed all {done_steps} steps; there is nothing to resume",
            hint=f"to train it further, give more steps: trnqwen train --resume {record.run_id} --steps {done_steps * 2}",
        )
    if config.steps <= from_step:
        raise UsageError(
            f"--resume: run {record.run_id} has a checkpoint of step {from_step}, and --steps {config.steps} is not beyond it",
            hint=f"pass --steps above {from_step}",
        )
    warnings = []
    if latest is None:
        warnings.append(
            f"run {record.run_id} has no complete checkpoint in {checkpoints.resume_dir(root)}: it starts over from step 1"
        )
    resolved_new = ResolvedConfig(config=config, sources=sources, config_file=resolved.config_file, warnings=resolved.warnings)
    return ResumePoint(record, resolved_new, cwd, from_step, latest.path if latest else None, changes, warnings)


def recorded_config(values: dict[str, Any]) -> dict[str, Any]:
    """A run.json config as today's settings, by name (``flatten``: a sub-model's table as dotted
    names, a field recorded before it moved under its name now; runs recorded before ``warmup``
    replaced ``warmup_steps``)."""
    values = flatten(dict(values))
    if "warmup_steps" in values:
        values.setdefault("warmup", values.pop("warmup_steps"))
    return values
def saved_steps(record: RunRecord) -> list[int]:
    """The resume points run.json says this run saved (recorded at the end of every attempt, and
    the step of a preemption), oldest first."""
    steps = {int(s) for s in record.extra.get("saved_checkpoints") or [] if str(s).isdigit()}
    if isinstance(record.extra.get("interrupted_at_step"), int):
        steps.add(record.extra["interrupted_at_step"])
    for entry in record.extra.get("resumes") or []:
        if isinstance(entry, dict) and isinstance(entry.get("from_step"), int) and entry["from_step"] > 0:
            steps.add(entry["from_step"])
    return sorted(steps)


def _refuse_if_checkpoints_lost(record: RunRecord, root: Path, found: checkpoints.FolderScan) -> None:
    """A run that saved resume points which are gone now never silently starts over from step 1."""
    saved = saved_steps(record)
    latest = found.latest_resume
    if not saved or (latest is not None and latest.step >= saved[-1]):
        return
    where = checkpoints.resume_dir(root)
    now = f"; the newest there now is step {latest.step}" if latest is not None else ""
    raise UsageError(
        f"--resume: run {record.run_id} saved resumable checkpoints (steps {', '.join(map(str, saved))}) in {where}, "
        f"and step {saved[-1]} is gone{now}",
        hint=f"put the checkpoint folder back at {root} and resume again, or start a new run (without --resume)",
    )


def recheck(point: ResumePoint) -> None:
    """Under the run's lock: the run is still the one :func:`prepare` planned to continue (no other
    resume ran in between and it did not finish meanwhile)."""
    try:
        now = RunRecord.load(Path(point.record.run_dir))
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read {Path(point.record.run_dir) / RUN_RECORD}: {exc}") from None
    before = point.record
    if len(now.extra.get("resumes") or []) != len(before.extra.get("resumes") or []) or now.status != before.status:
        raise UsageError(
            f"--resume: run {point.run_id} was resumed by another trnqwen while this one started "
            f"(it is now {now.status})",
            hint=f"see `trnqwen inspect-logs {now.run_dir}`; resume it again if it stopped",
        )


def _allowed_changes(recorded: RunConfig, resolved: ResolvedConfig, run_id: str) -> dict[str, Any]:
    """New values for the fields that may change; a refusal naming the first field that may not."""
    new = resolved.config
    changes: dict[str, Any] = {}
    refused = []
    for name, source in resolved.sources.items():
        before, after = value_of(recorded, name), value_of(new, name)
        if _same(before, after):
            continue
        if name in MAY_CHANGE:
            changes[name] = after
        else:
            refused.append((name, source, before, after))
    if refused:
        name, source, before, after = refused[0]
        more = f" (and {', '.join(r[0] for r in refused[1:])})" if len(refused) > 1 else ""
        raise UsageError(
            f"--resume: {name} would change from {_show(before)} to {_show(after)} ({source}){more}; "
            f"a resumed run keeps the settings of run {run_id}",
            hint="only steps, time limit, node/rank counts, checkpoint cadence and scheduler settings may change; "
            "start a new run (without --resume) to change the rest",
        )
    return changes


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Path) or isinstance(b, Path):
        return str(a) == str(b)
    return a == b


def _show(value: Any) -> str:
    return repr(str(value)) if isinstance(value, Path) else repr(value)


def _abs(path: Path, cwd: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else cwd / path


def _refuse_if_running(record: RunRecord) -> None:
    pid = live_launcher(record)
    if pid is not None:
        raise UsageError(
            f"run {record.run_id} is still running (launcher pid {pid})",
            hint=f"stop it first (kill -TERM {pid} saves a checkpoint at the next step boundary; Ctrl-C stops it "
            "without one), then resume it",
        )


def _require_inputs(config: RunConfig, cwd: Path, run_id: str) -> None:
    assets = _abs(config.resolved_assets_dir, cwd)
    if not (assets / "config.json").is_file():
        raise UsageError(
            f"--resume: the model assets of run {run_id} are gone ({assets / 'config.json'} is missing)",
            hint=f"fetch them again: trnqwen fetch {config.model}" + (f" --dest {assets}" if config.assets_dir else ""),
        )
    dataset = config.dataset
    if dataset and (dataset.startswith((".", "/", "~")) or Path(dataset).suffix) and not _abs(Path(dataset), cwd).exists():
        raise UsageError(
            f"--resume: the training data of run {run_id} is gone ({_abs(Path(dataset), cwd)} does not exist)",
            hint="put the data back at that path (a resumed run must see the same data to continue exactly)",
        )


def refuse_other_device(point: "ResumePoint", device_type: str) -> None:
    """``device`` may be given again (``auto`` or the same kind), but a resumed run continues on the kind
    of device it trained on: another one computes differently, so the run would not continue exactly."""
    recorded = (point.record.extra.get("device") or {}).get("type")
    if point.from_step == 0 or not recorded or recorded == device_type:
        return
    raise UsageError(
        f"--resume: run {point.run_id} trained on {recorded}, and this run would continue on {device_type}; "
        "a resumed run continues exactly only on the same kind of device",
        hint=f"resume it on a {recorded} host (--device {recorded}), or start a new run (without --resume) here",
    )


def refuse_changed_data(point: "ResumePoint", cache_dir: Optional[Path]) -> None:
    """A resume whose data now tokenizes to another cache is refused before any rank starts (the ranks'
    saved read position belongs to the old rows; they would fail on it seconds later)."""
    before = point.record.extra.get("dataset_cache")
    if point.from_step == 0 or not before:  # nothing to continue exactly: it starts over
        return
    now = Path(cache_dir).name if cache_dir is not None else None
    if now == Path(before).name:  # the cache folder is named by the content key
        return
    data = point.resolved.config.dataset or "the data"
    what = f"now tokenizes to cache {now[:12]}" if now else "is no longer a token cache"
    raise UsageError(
        f"--resume: the training data of run {point.run_id} changed since it was saved: step {point.from_step} was "
        f"trained on token cache {Path(before).name[:12]}, and {data} {what}",
        hint="put the data back as it was (a resumed run must read the same tokens to continue exactly), "
        "or start a new run (without --resume) on the new data",
    )


def preempted_step(log_path: Path, offset: int = 0) -> Optional[tuple[int, str]]:
    """(step, signal) of a preemption, from the ranks' ``[trnqwen] preempted:`` line after ``offset``."""
    m = first_match(log_path, _PREEMPTED_STEP, b"[trnqwen] preempted:", offset)
    return (int(m.group(2)), m.group(1)) if m else None
