"""A run's claim on its checkpoint folder: the lock first, then the checks again, then the owner file.

:func:`claim` is the first thing :func:`trnqwen.train.run.execute` does (before the run dir or
anything else is written); :func:`prepare_folder` runs under the lock.  Node 0 only
(``TrainPlan.owns_checkpoints``): it owns the folder for the whole job (docs/resume.md, "One
owner at a time").  Pure Python; no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.rundir import RunRecord
from trnqwen.train import folder_lock, resume
from trnqwen.train.plan import TrainPlan


def _abs(path: Path, cwd: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else cwd / path


def claim(plan: TrainPlan) -> Optional[folder_lock.FolderLock]:
    """A run's lock on its checkpoint folder (a resume without one: on its run dir), taken before
    anything is written; then what planning checked is checked again under it (another run's
    checkpoints arrived, or this run finished or was resumed meanwhile).  Node 0 only
    (``TrainPlan.owns_checkpoints``): it owns the folder for the whole job."""
    if not plan.owns_checkpoints:
        return None
    if plan.job.checkpoint_dir is not None:
        lock = folder_lock.acquire(_abs(plan.job.checkpoint_dir, plan.cwd), run_id=plan.run_id)
    elif plan.resume is not None:
        lock = folder_lock.acquire(plan.run_dir, run_id=plan.run_id, what="run directory")
    else:
        return None
    try:
        if plan.resume is not None:
            resume.recheck(plan.resume)
        elif plan.job.checkpoint_dir is not None:
            checkpoints.check_for_new_run(lock.folder, overwrite=plan.overwrite)
    except BaseException:
        lock.release()
        raise
    return lock


def prepare_folder(plan: TrainPlan, record: RunRecord) -> None:
    """Under the lock: --overwrite removes the old checkpoints, then the owner file names this run."""
    if plan.job.checkpoint_dir is None or not plan.owns_checkpoints:
        return
    root = _abs(plan.job.checkpoint_dir, plan.cwd)
    if plan.resume is None and plan.overwrite:
        removed = checkpoints.clear(checkpoints.scan(root))
        if removed:
            record.extra["overwrote"] = removed
    checkpoints.write_owner(root, run_id=plan.run_id, model=plan.base_model or plan.config.model,
                            backend=plan.config.backend, run_dir=plan.run_dir)


__all__ = ["claim", "prepare_folder"]
