"""One node of an N-node job: rendezvous arguments, EFA environment, log paths.

Pure functions (no torch, no subprocess), shared by the local launcher (``trnqwen train
--nnodes N --node-rank R --rdzv-endpoint HOST:PORT``), the SLURM script (:mod:`.slurm`) and the
Kubernetes manifest (:mod:`.k8s`), so all three start exactly the same torchrun on every node.

Rendezvous (torchrun's c10d backend, documented at docs.pytorch.org/docs/stable/elastic/run.html):
every node runs ``torchrun --nnodes N --node-rank R --rdzv_backend c10d --rdzv_endpoint
HOST:PORT --rdzv_id ID``; the endpoint is node rank 0's address.  We also pass
``--rdzv_conf is_host=1`` on node 0 and ``is_host=0`` elsewhere: torchrun otherwise guesses
which process hosts the rendezvous store from the hostname, and on one machine (two "nodes" on
loopback, or containers sharing a host) the first process to start wins the race, so which
node's death takes the store down would be random.

Note: with c10d rendezvous torchrun assigns global ranks in join order; ``--node-rank`` names the
node (logs, the run record) but does not fix its ranks.  Global ranks on one node are
contiguous, so a tensor-parallel group stays inside a node when TP divides the ranks per node.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from trnqwen.errors import UsageError

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

# torchrun's default port for the c10d rendezvous when an endpoint has none.
DEFAULT_RDZV_PORT = 29400
NODES_DIR = "nodes"
# One node: a local c10d store on a free port.
LOCAL_RDZV_ENDPOINT = "localhost:0"

# --- Neuron / EFA environment for multi-node jobs ---------------------------------------------
#
# Neuron collectives between instances run over EFA through libfabric (no NCCL is involved, so
# no NCCL_* variable applies).  What AWS's own Neuron multi-node training launchers export:
#   * FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1 -- aws-neuron/neuronx-distributed,
#     examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama3_8B_hf_pretrain.sh
#     (set when running under SLURM) and the same pattern in the aws-neuron-samples /
#     aws-neuron-parallelcluster-samples training scripts;
#   * FI_EFA_FORK_SAFE=1 -- the same Neuron training scripts (neuronx-distributed-training /
#     neuronx-nemo-megatron launchers): the data loader forks while EFA memory is registered;
#   * CCOM_SOCKET_IFNAME=eth0 -- Neuron's collectives bootstrap interface, "often required on
#     EKS" (aws-neuron EKS training launchers), so set only for the Kubernetes launcher.
# Prerequisite per the Neuron docs ("How to use torch.distributed on Neuron", For multi-node
# execution): EFA installed and configured on every node, same package versions on all nodes.
# Values the user already exported win over these defaults.
NEURON_EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
}
NEURON_EKS_ENV: dict[str, str] = {"CCOM_SOCKET_IFNAME": "eth0"}
# Devices / interfaces a trn2.48xlarge exposes to Kubernetes (Neuron device plugin: 16 Trainium2
# chips = 64 logical cores at LNC=2; EFA device plugin: 16 EFA interfaces).
TRN2_NEURON_DEVICES = 16
TRN2_EFA_INTERFACES = 16


def parse_endpoint(endpoint: str, *, default_port: int = DEFAULT_RDZV_PORT) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``, or ``HOST`` alone) -> (host, port); UsageError otherwise."""
    text = (endpoint or "").strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?", text) or re.fullmatch(
        r"([A-Za-z0-9_.\-]+)(?::(\d{1,5}))?", text
    )
    if not m:
        raise UsageError(
            f"rendezvous endpoint {endpoint!r} is not HOST:PORT",
            hint="pass --rdzv-endpoint with node 0's address, e.g. --rdzv-endpoint 10.0.0.5:29400",
        )
    host, port_text = m.group(1), m.group(2)
    port = int(port_text) if port_text else default_port
    if not 0 < port < 65536:
        raise UsageError(f"rendezvous port {port} is out of range", hint="pick a port between 1024 and 65535")
    return host, port


def rendezvous_argv(cfg: "RunConfig", nproc_per_node: int) -> list[str]:
    """torchrun's topology and rendezvous flags for this node: the launcher's only source of them.

    One node: ``--nproc_per_node N --rdzv_backend c10d --rdzv_endpoint localhost:0`` (plus
    ``--rdzv_id`` / ``--max-restarts`` when set).  N nodes: ``--nnodes N --node-rank R`` first,
    node 0's shared endpoint, and ``--rdzv_conf is_host=0|1`` (see the module docstring).
    """
    nnodes = int(cfg.nnodes)
    argv: list[str] = []
    if nnodes > 1:
        check_topology(nnodes=nnodes, node_rank=cfg.node_rank, endpoint=cfg.rdzv_endpoint, rdzv_id=cfg.rdzv_id)
        argv += ["--nnodes", str(nnodes), "--node-rank", str(cfg.node_rank)]
    argv += ["--nproc_per_node", str(nproc_per_node)]
    argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", cfg.rdzv_endpoint or LOCAL_RDZV_ENDPOINT]
    if cfg.rdzv_id:
        argv += ["--rdzv_id", str(cfg.rdzv_id)]
    if nnodes > 1:  # node 0 hosts the rendezvous store, never a race
        argv += ["--rdzv_conf", f"is_host={1 if int(cfg.node_rank) == 0 else 0}"]
    if cfg.max_restarts:
        argv += ["--max-restarts", str(cfg.max_restarts)]
    return argv


_RDZV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def check_topology(*, nnodes: int, node_rank: int, endpoint: Optional[str], rdzv_id: Optional[str]) -> None:
    """The facts every node must agree on, checked before anything starts."""
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise UsageError(
            f"--node-rank {node_rank} is outside 0..{nnodes - 1}",
            hint=f"give each of the {nnodes} nodes its own rank from 0 to {nnodes - 1}",
        )
    if rdzv_id is not None and not _RDZV_ID.fullmatch(rdzv_id):  # it names a folder, on one node too
        raise UsageError(
            f"--rdzv-id {rdzv_id!r} must be letters, digits, '.', '_' or '-' (at most 128)",
            hint="it names the run directory shared by the nodes",
        )
    if nnodes == 1:
        return
    if not endpoint:
        raise UsageError(
            f"a {nnodes}-node run needs the rendezvous endpoint",
            hint="pass --rdzv-endpoint HOST:PORT with node 0's address, the same on every node",
        )
    parse_endpoint(endpoint)
    if not rdzv_id:
        raise UsageError(
            f"a {nnodes}-node run needs a rendezvous id shared by all nodes",
            hint="pass the same --rdzv-id on every node (e.g. --rdzv-id qwen3-ft-1); it also names the run directory",
        )


# --- environment ------------------------------------------------------------------------------


def multinode_env(
    device_type: str,
    nnodes: int,
    *,
    kubernetes: bool = False,
    environ: Optional[Mapping[str, str]] = None,
) -> dict[str, str]:
    """The EFA/Neuron variables a multi-node Neuron job needs, minus any the user already set.

    Empty for one node and for non-Neuron devices (CPU runs over gloo/TCP need nothing).
    """
    if nnodes <= 1 or device_type != "neuron":
        return {}
    base = os.environ if environ is None else environ
    wanted = dict(NEURON_EFA_ENV)
    if kubernetes:
        wanted.update(NEURON_EKS_ENV)
    return {k: v for k, v in wanted.items() if k not in base}


# --- where each node writes -------------------------------------------------------------------


def node_dir(run_dir: Path, node_rank: int) -> Path:
    """``<run_dir>/nodes/node<R>``: one node's files in a run directory shared by the nodes."""
    return Path(run_dir) / NODES_DIR / f"node{int(node_rank)}"


def node_log_path(run_dir: Path, node_rank: int) -> Path:
    """``<run_dir>/nodes/node<R>/train.log``."""
    from trnqwen.rundir import LOG_NAME

    return node_dir(run_dir, node_rank) / LOG_NAME


def node_rank_log_dir(run_dir: Path, node_rank: int) -> Path:
    """torchrun's per-rank ``--log-dir`` for one node (rank numbers repeat across nodes)."""
    return node_dir(run_dir, node_rank) / "ranks"


def node_logs(run_dir: Path) -> dict[int, Path]:
    """Every node log present in a run directory, by node rank."""
    found: dict[int, Path] = {}
    for path in (Path(run_dir) / NODES_DIR).glob("node*/train.log"):
        m = re.fullmatch(r"node(\d+)", path.parent.name)
        if m:
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def writes_run_record(node_rank: int) -> bool:
    """Only node 0 writes ``run.json`` at the run dir's top; the others keep theirs in nodes/."""
    return int(node_rank) == 0


# --- failures ---------------------------------------------------------------------------------

_PEER_LOSS = re.compile(
    r"(Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
    r"RendezvousTimeoutError|RendezvousClosedError|RendezvousConnectionError|DistNetworkError|"
    r"failed to send a keep-alive heartbeat|wait timeout after \d+ms|Socket Timeout|"
    r"timed out after \d+ms)",
    re.IGNORECASE,
)


def explain_failure(error: Optional[str], *, nnodes: int, node_rank: int, run_dir: Optional[Path] = None) -> Optional[tuple[str, str]]:
    """(message, hint) when a multi-node run ended because a peer node went away, else None.

    The ranks' own error ("Connection reset by peer" from gloo, a rendezvous timeout...) is
    true but says nothing about *which* problem the user has: another node stopped.
    """
    if nnodes <= 1 or not error or not _PEER_LOSS.search(error):
        return None
    logs = node_logs(run_dir) if run_dir is not None else {}
    where = f" ({', '.join(str(p) for p in logs.values())})" if logs else ""
    message = (
        f"node {node_rank}: another node of the {nnodes}-node job stopped or became unreachable, "
        f"so this node stopped too: {error}"
    )
    hint = (
        "look at the other nodes' logs for the first failure" + where + "; then start the job again on "
        "every node with the same --rdzv-id (with --max-restarts K the survivors instead wait up to the "
        "rendezvous join timeout for the group to re-form)"
    )
    return message, hint


# --- the per-node command the schedulers run -------------------------------------------------

# Fields that are decided per node or per launch, never copied from the submitting machine.
_NOT_EXPORTED = {"launcher", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id", "partition", "time_limit", "image", "k8s_api", "k8s_secret"}


def config_env(cfg: RunConfig, *, overrides: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
    """The run settings as ``TRNQWEN_<FIELD>`` variables, so every node resolves the same config.

    Environment beats ./trnqwen.toml in trnqwen's precedence, so a node's own project file
    cannot silently change a job; flags given on the node (rank, endpoint) still win.  Values
    that are unset (None) are left out.  ``overrides`` replace fields (e.g. in-pod paths).
    """
    from trnqwen.config import ENV_PREFIX

    values = cfg.model_dump(mode="json")
    values.update(overrides or {})
    env: dict[str, str] = {}
    for name, value in values.items():
        if name in _NOT_EXPORTED or value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
            # [[datasets]] tables: the JSON list their variable reads (unset keys left out)
            text = json.dumps([{k: v for k, v in entry.items() if v is not None} for entry in value])
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            text = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            # a mapping setting as its flag writes it: role=from,content=value; user=human,assistant=gpt,assistant=bot
            text = ",".join(f"{k}={item}" for k, v in value.items() for item in (v if isinstance(v, list) else [v]))
        else:
            text = str(value)
        env[f"{ENV_PREFIX}{name.upper()}"] = text
    return env


def node_env(cfg: RunConfig, *, rdzv_id: str, overrides: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
    """Everything one node's ``trnqwen train`` needs except its rank and the endpoint.

    :func:`config_env` plus ``TRNQWEN_LAUNCHER=local`` (on the node, trnqwen runs torchrun
    itself), ``TRNQWEN_NNODES`` and the shared ``TRNQWEN_RDZV_ID``.  The scheduler script adds
    ``TRNQWEN_NODE_RANK`` (SLURM_NODEID, PET_NODE_RANK) and ``TRNQWEN_RDZV_ENDPOINT`` (the head
    node / master service) when the node starts.
    """
    from trnqwen.config import ENV_PREFIX

    env = config_env(cfg, overrides=overrides)
    env[f"{ENV_PREFIX}LAUNCHER"] = "local"
    env[f"{ENV_PREFIX}NNODES"] = str(int(cfg.nnodes))
    env[f"{ENV_PREFIX}RDZV_ID"] = rdzv_id
    return env


def node_command(trnqwen: Optional[Sequence[str]] = None) -> list[str]:
    """``<trnqwen> train --resume auto``: what runs once per node (the settings travel in the
    environment); a requeued job or restarted pod continues its own run (trnqwen.train.resume)."""
    import sys

    return [*(list(trnqwen) if trnqwen else [sys.executable, "-m", "trnqwen"]), "train", "--resume", "auto"]


def node_wrapper(rank_var: str, endpoint_expr: Optional[str] = None, *, more: Optional[Mapping[str, str]] = None) -> str:
    """The ``bash -c`` body that turns the scheduler's node index into ``TRNQWEN_NODE_RANK``.

    ``more``: further ``TRNQWEN_*`` variables read from the scheduler's at run time (Kubeflow
    Trainer's ``PET_NNODES``...).  The command itself follows as positional arguments
    (``bash -c BODY NAME cmd args...``), so no user value is ever re-parsed by a shell.
    """
    parts = [f'export TRNQWEN_NODE_RANK="${{{rank_var}}}"']
    if endpoint_expr:
        parts.append(f'export TRNQWEN_RDZV_ENDPOINT="{endpoint_expr}"')
    parts += [f'export {name}="{expr}"' for name, expr in (more or {}).items()]
    parts.append('exec "$@"')
    return "; ".join(parts)
