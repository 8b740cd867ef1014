"""``trnqwen train --launcher slurm``: an sbatch script that runs ``trnqwen train`` once per node.

The script (written into the run directory, printed by ``--dry-run``)::

    #SBATCH --nodes=N --ntasks-per-node=1 --exclusive [--partition P] [--time T]
    #SBATCH --output=<run dir>/slurm-%j.out
    head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    export TRNQWEN_RDZV_ENDPOINT=<head node's address>:<port>
    export TRNQWEN_...                      # the resolved run settings, identical on every node
    srun --ntasks-per-node=1 --kill-on-bad-exit=1 --output=<run dir>/slurm-%j-node%n.out \\
         bash -c 'export TRNQWEN_NODE_RANK="${SLURM_NODEID}"; exec "$@"' trnqwen-node \\
         <python> -m trnqwen train

so each node's trnqwen builds the same torchrun command (``--nnodes N --node_rank R
--rdzv_backend c10d --rdzv_endpoint HEAD:PORT --rdzv_id <run id>``, see
:mod:`trnqwen.train.multinode`) and writes ``<run dir>/nodes/node<R>/train.log``.  The run
directory, the Python environment and the checkpoint folder must be on storage every node sees
(ParallelCluster's /fsx or /home).  ``--kill-on-bad-exit`` ends the whole step when one node's
trnqwen fails, so no node waits forever for a dead peer.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from trnqwen.errors import EXIT_PREEMPTED, EXIT_PREEMPTED_BEFORE_START, CheckFailed, EnvironmentProblem, UsageError, redact
from trnqwen.train import multinode

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

SCRIPT_NAME = "job.sbatch"
JOB_RECORD = "slurm.json"
SUBMIT_TIMEOUT_S = 60.0
_TIME_LIMIT = re.compile(r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|infinite|UNLIMITED)")
_PARTITION = re.compile(r"[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*")


@dataclass
class SlurmJob:
    """What goes into one sbatch script."""

    job_name: str
    nodes: int
    run_dir: Path
    workdir: Path
    command: list[str]  # run once per node (``python -m trnqwen train``)
    env: dict[str, str]  # exported before srun: the run settings and launcher variables
    rdzv_port: int = multinode.DEFAULT_RDZV_PORT
    partition: Optional[str] = None
    time_limit: Optional[str] = None
    exclusive: bool = True
    extra_sbatch: list[str] = field(default_factory=list)
    grace_seconds: float = 90.0  # the ranks' time to save after the signal (RunConfig.grace_seconds)

    @property
    def signal_lead_s(self) -> int:
        """How long before the time limit SLURM sends SIGUSR1: the grace period plus time to exit."""
        return int(self.grace_seconds) + 30

    @property
    def script_path(self) -> Path:
        return self.run_dir / SCRIPT_NAME

    @property
    def output_pattern(self) -> Path:
        """sbatch's own output (the batch step: head node lookup, srun's messages)."""
        return self.run_dir / "slurm-%j.out"

    @property
    def node_output_pattern(self) -> Path:
        """srun's per-node output (``%n`` = node index in the job = the node rank)."""
        return self.run_dir / "slurm-%j-node%n.out"


def check_options(*, nodes: int, partition: Optional[str], time_limit: Optional[str]) -> None:
    if nodes < 1:
        raise UsageError(f"--nodes must be >= 1, got {nodes}")
    if partition is not None and not _PARTITION.fullmatch(partition):
        raise UsageError(f"--partition {partition!r} is not a SLURM partition name", hint="see `sinfo -s` for the partitions")
    if time_limit is not None and not _TIME_LIMIT.fullmatch(time_limit):
        raise UsageError(
            f"--time {time_limit!r} is not a SLURM time limit",
            hint="use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. --time 4:00:00)",
        )


def sbatch_script(job: SlurmJob) -> str:
    """The sbatch script as text (pure)."""
    check_options(nodes=job.nodes, partition=job.partition, time_limit=job.time_limit)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(job.job_name)}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.exclusive:
        lines.append("#SBATCH --exclusive")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    if job.time_limit:
        lines.append(f"#SBATCH --time={job.time_limit}")
    lines += [
        f"#SBATCH --output={q(str(job.output_pattern))}",
        f"#SBATCH --chdir={q(str(job.workdir))}",
        # Preemption: SIGUSR1 to every node's trnqwen ahead of the time limit (the ranks save at the
        # next step boundary, exit 138) and the job may be requeued; a requeued job resumes by itself.
        f"#SBATCH --signal=USR1@{job.signal_lead_s}",
        "#SBATCH --requeue",
        *[f"#SBATCH {opt}" for opt in job.extra_sbatch],
        "",
        "# Written by `trnqwen train --launcher slurm`. One `trnqwen train` (one torchrun) per node;",
        "# they meet at node 0 (the first host of the allocation) through torchrun's c10d rendezvous.",
        "set -euo pipefail",
        "",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "# The head node's address as SLURM knows it (NodeAddr), falling back to its name.",
        'head_addr=$(scontrol show node "$head_node" -o 2>/dev/null | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        'head_addr=${head_addr:-$head_node}',
        f'export TRNQWEN_RDZV_ENDPOINT="${{head_addr}}:{int(job.rdzv_port)}"',
        "",
        "# The run settings, identical on every node (environment beats a node's trnqwen.toml).",
    ]
    for key, value in job.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"cannot export {key!r} in an sbatch script")
        lines.append(f"export {key}={q(value)}")
    lines += [
        "",
        'echo "trnqwen: job ${SLURM_JOB_ID} on ${SLURM_JOB_NUM_NODES} node(s): ${SLURM_JOB_NODELIST}; rendezvous ${TRNQWEN_RDZV_ENDPOINT}"',
        "rc=0",
        f"srun --nodes={job.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        f"  --output={q(str(job.node_output_pattern))} \\",
        f"  bash -c {q(multinode.node_wrapper('SLURM_NODEID'))} trnqwen-node \\",
        "  " + shlex.join(job.command) + " || rc=$?",
        f"# {EXIT_PREEMPTED}: preempted after saving a resumable checkpoint; {EXIT_PREEMPTED_BEFORE_START}: preempted before",
        "# the first step (nothing trained). Either way: requeue; the job continues where it stopped.",
        f'if [ "$rc" -eq {EXIT_PREEMPTED} ] || [ "$rc" -eq {EXIT_PREEMPTED_BEFORE_START} ]; then',
        '  echo "trnqwen: preempted (exit ${rc}); requeueing job ${SLURM_JOB_ID}"',
        '  scontrol requeue "${SLURM_JOB_ID}" && exit 0',
        "fi",
        'exit "$rc"',
        "",
    ]
    return redact("\n".join(lines))


def job_from_config(
    cfg: RunConfig,
    *,
    run_id: str,
    run_dir: Path,
    workdir: Path,
    trnqwen: Optional[Sequence[str]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> SlurmJob:
    """A :class:`SlurmJob` for a resolved RunConfig (``launcher = "slurm"``).

    ``cfg.nnodes`` nodes; the rendezvous port is the one in ``--rdzv-endpoint`` if given (its
    host is replaced by the head node's address), else torchrun's default 29400; the run id
    doubles as the rendezvous id so every node writes into this run directory.
    """
    check_options(nodes=int(cfg.nnodes), partition=cfg.partition, time_limit=cfg.time_limit)
    port = multinode.DEFAULT_RDZV_PORT
    if cfg.rdzv_endpoint:
        port = multinode.parse_endpoint(cfg.rdzv_endpoint)[1]
    overrides = {"runs_dir": str(Path(run_dir).parent)}
    env = multinode.node_env(cfg, rdzv_id=run_id, overrides=overrides)
    device = "neuron" if cfg.device in ("neuron", "auto") else cfg.device
    env.update(multinode.multinode_env(device, int(cfg.nnodes), environ=environ or {}))
    return SlurmJob(
        job_name=f"trnqwen-{run_id}",
        nodes=int(cfg.nnodes),
        run_dir=Path(run_dir),
        workdir=Path(workdir),
        command=multinode.node_command(trnqwen),
        env=env,
        rdzv_port=port,
        partition=cfg.partition,
        time_limit=cfg.time_limit,
        grace_seconds=float(cfg.grace_seconds),
    )


def write_script(job: SlurmJob) -> Path:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    path = job.script_path
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(sbatch_script(job))
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


_JOB_ID = re.compile(r"^(\d+)(?:_\d+)?(?:;[\w.\-]+)?\s*$")


def parse_job_id(sbatch_stdout: str) -> str:
    """``sbatch --parsable`` prints ``<jobid>[;<cluster>]``; older/other setups ``Submitted batch job N``."""
    for line in sbatch_stdout.strip().splitlines()[::-1]:
        line = line.strip()
        m = _JOB_ID.match(line) or re.search(r"Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
    raise CheckFailed(f"could not read a job id from sbatch's output: {sbatch_stdout.strip()[:200]!r}")


def submit(script: Path, *, sbatch: str = "sbatch", timeout_s: float = SUBMIT_TIMEOUT_S, env: Optional[Mapping[str, str]] = None) -> str:
    """``sbatch --parsable <script>`` -> the job id."""
    exe = shutil.which(sbatch)
    if exe is None:
        raise EnvironmentProblem(
            "sbatch is not on PATH: this machine is not a SLURM submit host",
            hint="run on the cluster's login/head node, or use --dry-run to print the script",
        )
    try:
        proc = subprocess.run(
            [exe, "--parsable", str(script)],
            capture_output=True, text=True, timeout=timeout_s, env=dict(env) if env is not None else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"sbatch did not answer within {timeout_s:.0f} s", hint="check `sinfo` and slurmctld") from None
    if proc.returncode != 0:
        raise CheckFailed(
            f"sbatch refused the job: {(proc.stderr or proc.stdout).strip()[:500]}",
            hint=f"the script is {script}; check --partition/--time/--nodes against `sinfo -s`",
        )
    return parse_job_id(proc.stdout)


def launch(
    cfg: RunConfig,
    *,
    dry_run: bool = False,
    cwd: Optional[Path] = None,
    run_id: Optional[str] = None,
    trnqwen: Optional[Sequence[str]] = None,
) -> dict[str, Any]:
    """Write the script into a new run directory and submit it (``dry_run``: only render it).

    Returns what the CLI prints: run id and dir, script path and text, job id, log paths.
    The run record (``run.json``, status ``submitted``) points at node 0's log, so
    ``trnqwen inspect-logs`` and ``verify-ckpt`` find the job like a local run; node 0's
    trnqwen rewrites it when the job starts.
    """
    from trnqwen.fsutil import write_json_atomic
    from trnqwen.rundir import RunRecord, point_last

    cwd = Path(cwd or Path.cwd()).absolute()
    runs_dir = Path(cfg.runs_dir).expanduser()
    runs_dir = runs_dir if runs_dir.is_absolute() else cwd / runs_dir
    run_id = run_id or _new_run_id(runs_dir, cfg)
    run_dir = runs_dir / run_id
    job = job_from_config(cfg, run_id=run_id, run_dir=run_dir, workdir=cwd, trnqwen=trnqwen, environ=os.environ)
    text = sbatch_script(job)
    info: dict[str, Any] = {
        "launcher": "slurm",
        "run_id": run_id,
        "run_dir": str(run_dir),
        "script": str(job.script_path),
        "nodes": job.nodes,
        "job_id": None,
        "node_logs": [str(multinode.node_log_path(run_dir, r)) for r in range(job.nodes)],
        "slurm_output": str(job.output_pattern),
        "dry_run": dry_run,
        "script_text": text,
    }
    if dry_run:
        return info
    if shutil.which("sbatch") is None:  # before anything is written
        submit(job.script_path)
    run_dir.mkdir(parents=True, exist_ok=False)
    write_script(job)
    record = RunRecord(
        run_id=run_id,
        run_dir=str(run_dir),
        status="submitted",
        config=cfg.model_dump(mode="json"),
        command=["sbatch", "--parsable", str(job.script_path)],
        env={k: v for k, v in job.env.items() if not k.startswith("TRNQWEN_")},
        log_path=info["node_logs"][0],
        backend=cfg.backend,
        steps=cfg.steps,
        extra={"launcher": "slurm", "script": str(job.script_path), "nodes": job.nodes},
    )
    record.save()
    job_id = submit(job.script_path)
    info["job_id"] = job_id
    info["slurm_output"] = str(job.output_pattern).replace("%j", job_id)
    write_json_atomic(run_dir / JOB_RECORD, {k: v for k, v in info.items() if k != "script_text"})
    record.extra["slurm_job_id"] = job_id
    # node 0 may already have rewritten run.json (a fast scheduler): only fill in a still-'submitted' record.
    try:
        current = RunRecord.load(run_dir)
    except (OSError, ValueError):
        current = None
    if current is None or current.status == "submitted":
        record.save()
    point_last(runs_dir, run_id)
    return info


def _new_run_id(runs_dir: Path, cfg: RunConfig) -> str:
    from trnqwen.rundir import next_run_id

    return next_run_id(runs_dir, cfg.backend, method=cfg.method, lora=cfg.lora)
