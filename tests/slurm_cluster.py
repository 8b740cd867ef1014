"""A REAL SLURM cluster on this machine for the tests: munged + slurmctld + slurmd(s) on localhost.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install -y slurm-wlm munge``).  Everything lives in
a temp folder: a private munge key and socket, a slurm.conf on free ports, state/spool/logs; the
daemons run in the foreground as children of the test process and are stopped by their pids.
Two slurmd "nodes" (``-N tq1``/``-N tq2`` on two ports) are tried first; if the second does not
come up, one node.  Where a daemon cannot start at all (not installed, not root, no munge) the
fixture skips and says why.  Every wait is bounded.

Use ``slurm_cluster`` (session-scoped) from a test module::

    from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the fixture)

    def test_x(slurm_cluster):
        env = slurm_cluster.env   # SLURM_CONF etc. for sbatch/squeue/scontrol
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")
START_TIMEOUT_S = 30.0


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: list[str]
    partition: str
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    why_one_node: Optional[str] = None

    def run(self, *argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})

    def logs(self) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*.log")):
            out.append(f"==> {path.name} <==\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        try:
            self.run("scancel", "--full", "--partition", self.partition, timeout=10)
        except Exception:
            pass
        _stop_all(self.procs)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for proc in reversed(procs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait(predicate, timeout_s: float, poll_s: float = 0.3) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def _missing_tools() -> list[str]:
    return [name for name in DAEMONS + CLIENTS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin") / name)


def _write_conf(root: Path, host: str, nodes: list[str], ports: dict[str, int], partition: str) -> Path:
    cpus = max(1, os.cpu_count() or 1)
    lines = [
        "ClusterName=trnqwentest",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ports['ctld']}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SlurmdParameters=config_overrides",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",
    ]
    for name in nodes:
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[name]} "
            f"CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        )
    lines.append(f"PartitionName={partition} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO")
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _start_munge(root: Path, procs: list[subprocess.Popen]) -> Optional[str]:
    mdir = root / "munge"
    mdir.mkdir(mode=0o700)
    key = mdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    log = open(root / "log" / "munged.log", "w")
    proc = subprocess.Popen(
        [
            _exe("munged"), "--foreground", "--force",
            f"--socket={mdir / 'munge.socket'}", f"--key-file={key}",
            f"--pid-file={mdir / 'munged.pid'}", f"--seed-file={mdir / 'munged.seed'}",
            f"--log-file={root / 'log' / 'munged.log'}",
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    procs.append(proc)
    if not _wait(lambda: (mdir / "munge.socket").exists() or proc.poll() is not None, 10):
        return "munged did not create its socket within 10 s"
    if proc.poll() is not None:
        return f"munged exited with code {proc.returncode}: {(root / 'log' / 'munged.log').read_text()[-500:]}"
    return None


def _nodes_idle(env: dict[str, str], nodes: list[str]) -> bool:
    try:
        proc = subprocess.run(
            [_exe("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=5, env={**os.environ, **env}
        )
    except subprocess.TimeoutExpired:
        return False
    states = dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)
    return all(states.get(n, "").rstrip("*~#") in ("idle", "mix", "alloc") for n in nodes)


def _distinct_node_ids(env: dict[str, str], count: int) -> Optional[str]:
    """None when a ``count``-node step gives every task its own SLURM_NODEID, else why not.

    Several slurmd on one host only behave as separate nodes in a build with multiple-slurmd
    support; without it every task of a 2-node step reports node 0 (seen with Debian's 22.05).
    """
    if count == 1:
        return None
    # Probe the way trnqwen's script runs: srun inside an sbatch job (an interactive srun
    # numbered the nodes correctly here while the batch-launched one did not).
    out_dir = Path(env["SLURM_CONF"]).parent / "probe"
    out_dir.mkdir(exist_ok=True)
    full_env = {**os.environ, **env}
    try:
        sub = subprocess.run(
            [_exe("sbatch"), "--parsable", f"--nodes={count}", "--ntasks-per-node=1", "--time=1",
             f"--output={out_dir / 'batch.out'}",
             "--wrap", f"srun --ntasks-per-node=1 bash -c 'echo \"id=$SLURM_NODEID\" > {out_dir}/node-$$-$RANDOM.txt'"],
            capture_output=True, text=True, timeout=15, env=full_env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "sbatch did not answer within 15 s"
    if sub.returncode != 0:
        return f"sbatch of a {count}-node probe failed: {sub.stderr.strip()[:200]}"
    _wait(lambda: len(list(out_dir.glob("node-*.txt"))) >= count, 30)
    time.sleep(0.5)
    ids = sorted(p.read_text().strip().removeprefix("id=") for p in out_dir.glob("node-*.txt"))
    if ids == [str(i) for i in range(count)]:
        return None
    return (
        f"{count} slurmd ran on this host but a {count}-node step saw SLURM_NODEID {ids or 'none'} "
        "(this SLURM build lacks multiple-slurmd support), so the cluster has 1 node"
    )


def start_cluster(root: Path, *, want_nodes: int = 2) -> tuple[Optional[SlurmCluster], str]:
    """Start the daemons; (cluster, "") or (None, why it could not start)."""
    missing = _missing_tools()
    if missing:
        return None, f"SLURM/munge not installed ({', '.join(missing)} missing); apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return None, "the single-host SLURM cluster needs root (slurmd runs jobs as their users)"
    host = socket.gethostname().split(".")[0]
    partition = "tq"
    attempts = [want_nodes, 1] if want_nodes > 1 else [1]
    why_fewer = None
    last_error = ""
    for count in attempts:
        base = root / f"cluster{count}"
        for sub in ("state", "spool", "run", "log"):
            (base / sub).mkdir(parents=True)
        procs: list[subprocess.Popen] = []
        nodes = [f"tq{i + 1}" for i in range(count)]
        ports_list = _free_ports(count + 1)
        ports = {"ctld": ports_list[0], **{n: p for n, p in zip(nodes, ports_list[1:])}}
        problem = _start_munge(base, procs)
        if problem:
            _stop_all(procs)
            return None, problem
        conf = _write_conf(base, host, nodes, ports, partition)
        env = {"SLURM_CONF": str(conf)}
        full_env = {**os.environ, **env}
        ctld = subprocess.Popen(
            [_exe("slurmctld"), "-D", "-i", "-f", str(conf)],
            stdout=open(base / "log" / "slurmctld.out", "w"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=full_env,
        )  # fmt: skip
        procs.append(ctld)
        up = _wait(
            lambda: ctld.poll() is not None
            or subprocess.run([_exe("scontrol"), "ping"], capture_output=True, text=True, timeout=5, env=full_env).stdout.find("UP") >= 0,
            START_TIMEOUT_S,
        )
        if not up or ctld.poll() is not None:
            last_error = f"slurmctld did not start: {(base / 'log' / 'slurmctld.log').read_text(errors='replace')[-800:] if (base / 'log' / 'slurmctld.log').exists() else ''}"
            _stop_all(procs)
            return None, last_error
        for name in nodes:
            procs.append(
                subprocess.Popen(
                    [_exe("slurmd"), "-D", "-N", name, "-f", str(conf)],
                    stdout=open(base / "log" / f"slurmd-{name}.out", "w"), stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=full_env,
                )  # fmt: skip
            )
        if _wait(lambda: _nodes_idle(env, nodes) or any(p.poll() is not None for p in procs), START_TIMEOUT_S) and _nodes_idle(env, nodes):
            distinct = _distinct_node_ids(env, count)
            if distinct is None:
                cluster = SlurmCluster(root=base, conf=conf, nodes=nodes, partition=partition, env=env, procs=procs, why_one_node=why_fewer)
                return cluster, ""
            last_error = distinct
        else:
            logs = "\n".join(
                p.read_text(errors="replace")[-600:] for p in sorted((base / "log").glob("slurmd-*")) if p.is_file()
            )
            last_error = f"{count} slurmd node(s) did not become idle within {START_TIMEOUT_S:.0f} s: {logs[-1200:]}"
        why_fewer = last_error
        _stop_all(procs)
    return None, last_error


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running single-host SLURM cluster (2 nodes if this host allows, else 1), or a skip saying why."""
    root = tmp_path_factory.mktemp("slurm")
    cluster, why = start_cluster(root, want_nodes=2)
    if cluster is None:
        pytest.skip(f"no local SLURM cluster: {why}")
    try:
        yield cluster
    finally:
        cluster.stop()


# --- a submitted job, watched the way a person would (squeue / scontrol) ------------------------


def job_state(job_id: str, *, timeout_s: float = 10.0) -> Optional[str]:
    """The job's state from ``squeue`` (while queued/running) or ``sacct``/``scontrol``, else None."""
    for argv in (
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        ["scontrol", "show", "job", job_id, "-o"],
    ):
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        out = proc.stdout.strip()
        if proc.returncode != 0 or not out:
            continue
        if argv[0] == "scontrol":
            m = re.search(r"JobState=(\S+)", out)
            if m:
                return m.group(1)
            continue
        return out.splitlines()[0].strip()
    return None


TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def wait_for_job(job_id: str, *, timeout_s: float, poll_s: float = 1.0) -> Optional[str]:
    """Poll until the job reaches a terminal state (returned) or ``timeout_s`` passes (None)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = job_state(job_id)
        if last is not None and last.split()[0].rstrip("+") in TERMINAL_STATES:
            return last.split()[0].rstrip("+")
        time.sleep(poll_s)
    return None
