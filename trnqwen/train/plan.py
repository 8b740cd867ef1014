"""A run's plan: everything about it that can be known without starting it.

:func:`trnqwen.train.run.plan_train` builds a :class:`TrainPlan` (no side effects);
:func:`trnqwen.train.run.execute` runs it, and the folder's claim (:mod:`trnqwen.train.ownership`)
and how a stopped run ended (:mod:`trnqwen.train.stops`) read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trnqwen.config import RunConfig
from trnqwen.contract.topology import Topology
from trnqwen.env.device import DeviceInfo
from trnqwen.errors import redact_argv, redact_env
from trnqwen.rundir import LOG_NAME
from trnqwen.train import launcher, multinode
from trnqwen.train.job import TrainJob
from trnqwen.train.preflight import PreflightReport
from trnqwen.train.resume import ResumePoint


@dataclass
class TrainPlan:
    """Everything about a run that can be known without starting it."""

    config: RunConfig
    device: DeviceInfo
    job: TrainJob
    topology: Topology
    run_id: str
    run_dir: Path
    argv: list[str]
    env: dict[str, str]  # only what trnqwen sets for the ranks (merged over os.environ)
    preflight: PreflightReport
    cwd: Path
    extra_args: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    resume: Optional[ResumePoint] = None  # when continuing a run
    overwrite: bool = False  # --overwrite: replace the checkpoints already in the folder
    base_model: Optional[str] = None  # what the export names as its base (trnqwen.assets.base_identity)

    @property
    def nproc_per_node(self) -> int:
        return self.topology.nproc_per_node

    @property
    def owns_checkpoints(self) -> bool:
        """Only the first node claims, cleans and completes the checkpoint folder: global rank 0
        writes the export there, and on a shared filesystem two nodes finishing the same export
        race on its files."""
        return multinode.writes_run_record(self.config.node_rank)

    @property
    def log_path(self) -> Path:
        if self.config.nnodes > 1:  # each node's own log in the shared run dir
            return multinode.node_log_path(self.run_dir, self.config.node_rank)
        return self.run_dir / LOG_NAME

    @property
    def rank_log_dir(self) -> Path:
        if self.config.nnodes > 1:
            return multinode.node_rank_log_dir(self.run_dir, self.config.node_rank)
        return self.run_dir / launcher.RANK_LOGS_DIR

    @property
    def config_module_path(self) -> Optional[Path]:
        if not self.job.config_module:
            return None
        return self.run_dir / f"{self.job.config_module}.py"

    @property
    def shell_command(self) -> str:
        return launcher.shell_command(self.argv, self.env)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "backend": self.config.backend,
            "device": vars(self.device).copy(),
            "nproc_per_node": self.nproc_per_node,
            "world_size": self.topology.world_size,
            "command": redact_argv(self.argv),
            "shell_command": self.shell_command,
            "env": redact_env(self.env),
            "cwd": str(self.cwd),
            "config_module": self.job.config_module,
            "config_fn": self.job.config_fn,
            "config_module_text": self.job.config_module_text,
            "checkpoint_dir": str(self.job.checkpoint_dir) if self.job.checkpoint_dir else None,
            "preflight": self.preflight.as_dict(),
            "config": self.config.model_dump(mode="json"),
            "schedule": self.job.schedule.as_dict() if self.job.schedule is not None else None,
            "sources": dict(self.sources),
            "notes": list(self.notes) + list(self.job.notes or []),
        }
