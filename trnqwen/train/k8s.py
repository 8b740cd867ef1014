"""``trnqwen train --launcher k8s``: a Kubeflow training-operator ``PyTorchJob`` manifest.

One pod per node: ``Master`` (node 0, replicas 1) and ``Worker`` (nodes 1..N-1).  Each pod runs
``trnqwen train`` from the image with the run settings in its environment (``TRNQWEN_*``), and
the operator's own variables give each pod its place: ``PET_NODE_RANK`` (0 for the master),
``MASTER_ADDR``/``MASTER_PORT`` (the master pod's service and the container port named
``pytorchjob-port``).  So every pod builds the same torchrun command as a local multi-node run
(c10d rendezvous at the master, the run id shared).  Each pod requests the node's Neuron devices
(``aws.amazon.com/neuron``) and EFA interfaces (``vpc.amazonaws.com/efa``) and mounts one shared
volume (a PVC, e.g. FSx for Lustre) at ``/shared`` for assets, checkpoints, run dirs and the
compile cache.  trnqwen never talks to the cluster: it writes the file and prints the
``kubectl apply -f`` command.

The operator's rules (training-operator v1.9, pkg/webhooks/pytorch): a container named
``pytorch`` with an image, Master replicas exactly 1, DNS-1035 job name.  YAML through PyYAML
(installed with transformers) when available, else JSON (which kubectl also accepts).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import UsageError
from trnqwen.train import multinode

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"  # the training-operator requires this name
PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from this named port
DEFAULT_PORT = 23456  # the operator's default
NEURON_RESOURCE = "aws.amazon.com/neuron"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
DEFAULT_PVC = "trnqwen-shared"
SHARED_MOUNT = "/shared"
MANIFEST_NAME = "pytorchjob.yaml"
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def job_name(run_id: str) -> str:
    """A DNS-1035 label (lowercase, starts with a letter, <= 63 chars; replica names add ~14)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", f"trnqwen-{run_id}".lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)[:48].rstrip("-")
    if not _DNS1035.fullmatch(slug):
        raise UsageError(f"cannot make a Kubernetes job name from run id {run_id!r}")
    return slug


def pod_paths(cfg: RunConfig, mount: str = SHARED_MOUNT) -> dict[str, str]:
    """In-pod paths on the shared volume for everything a run reads or writes.

    Relative paths of the local config land under the mount (``./assets/hf/X`` ->
    ``/shared/assets/hf/X``); absolute ones are kept (the user knows the image/volume layout).
    """
    root = PurePosixPath(mount)

    def place(path: Path) -> str:
        p = PurePosixPath(Path(path).as_posix())
        return str(p) if p.is_absolute() else str(root / p)

    out = {
        "assets_dir": place(cfg.resolved_assets_dir),
        "runs_dir": place(cfg.runs_dir),
        "compile_cache_dir": place(cfg.compile_cache_dir or Path(".trnqwen/neff-cache")),
    }
    out["checkpoint_dir"] = place(cfg.resolved_checkpoint_dir)  # resume points: every pod must see them
    if cfg.dataset and not re.fullmatch(r"[\w.\-]+/[\w.\-]+", cfg.dataset) and ("/" in cfg.dataset or "." in cfg.dataset):
        out["dataset"] = place(Path(cfg.dataset))  # a local file/folder: it must be on the volume too
    return out


def manifest(
    cfg: RunConfig,
    *,
    run_id: str,
    image: Optional[str] = None,
    pvc: str = DEFAULT_PVC,
    mount: str = SHARED_MOUNT,
    port: int = DEFAULT_PORT,
    namespace: Optional[str] = None,
    neuron_devices: Optional[int] = None,
    efa_interfaces: Optional[int] = None,
) -> dict[str, Any]:
    """The PyTorchJob as a dict (pure)."""
    image = image or cfg.image
    if not image:
        raise UsageError(
            "the k8s launcher needs a container image with trnqwen and the Neuron stack",
            hint="pass --image <registry>/<repo>:<tag> (e.g. an AWS Neuron DLC with `pip install trnqwen`)",
        )
    nnodes = int(cfg.nnodes)
    if nnodes < 1:
        raise UsageError(f"--nodes must be >= 1, got {nnodes}")
    name = job_name(run_id)
    neuron = cfg.device in ("neuron", "auto")
    env = multinode.node_env(cfg, rdzv_id=run_id, overrides=pod_paths(cfg, mount))
    env.update(multinode.multinode_env("neuron" if neuron else cfg.device, nnodes, kubernetes=True, environ={}))
    env_list = [{"name": k, "value": v} for k, v in env.items()]
    resources: dict[str, Any] = {}
    if neuron:
        devices = neuron_devices or multinode.TRN2_NEURON_DEVICES
        efa = efa_interfaces if efa_interfaces is not None else (multinode.TRN2_EFA_INTERFACES if nnodes > 1 else 0)
        amounts = {NEURON_RESOURCE: str(devices)}
        if efa:
            amounts[EFA_RESOURCE] = str(efa)
        resources = {"requests": dict(amounts), "limits": dict(amounts)}
    # PET_NODE_RANK: 0 on the master, 1.. on workers; MASTER_ADDR/PORT: the master's service.
    wrapper = multinode.node_wrapper("PET_NODE_RANK", "${MASTER_ADDR}:${MASTER_PORT}")
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": mount,
        # --resume auto: a pod the restart policy starts again continues its own run (exit 138 =
        # preempted after a checkpoint, Kubeflow's code for a retryable error).
        "command": ["bash", "-c", wrapper, "trnqwen-node", "trnqwen", "train", "--resume", "auto"],
        "env": env_list,
        "ports": [{"name": PORT_NAME, "containerPort": int(port)}],
        "volumeMounts": [{"name": "shared", "mountPath": mount}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        # SIGTERM on eviction: the ranks save at the next step boundary within grace_seconds.
        "terminationGracePeriodSeconds": int(cfg.grace_seconds) + 30,
        "containers": [container],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": pvc}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if neuron:
        pod_spec["tolerations"] = [{"key": NEURON_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    labels = {"app.kubernetes.io/name": "trnqwen", "trnqwen/run-id": name}

    def replica(count: int) -> dict[str, Any]:
        # OnFailure: a worker that starts before the master's address resolves is restarted, and a
        # preempted pod (exit 138) restarts and resumes by itself (--resume auto).
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"metadata": {"labels": dict(labels)}, "spec": json.loads(json.dumps(pod_spec))},
        }

    specs = {"Master": replica(1)}
    if nnodes > 1:
        specs["Worker"] = replica(nnodes - 1)
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
        "pytorchReplicaSpecs": specs,
    }
    if cfg.nproc_per_node:
        spec["nprocPerNode"] = str(int(cfg.nproc_per_node))
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def dump(doc: dict[str, Any]) -> tuple[str, str]:
    """(text, format): YAML via PyYAML when installed, else JSON (kubectl reads both)."""
    try:
        import yaml
    except ImportError:
        return json.dumps(doc, indent=2) + "\n", "json"
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000), "yaml"


def apply_command(path: Path, namespace: Optional[str] = None) -> str:
    ns = f" -n {shlex.quote(namespace)}" if namespace else ""
    return f"kubectl apply{ns} -f {shlex.quote(str(path))}"


def launch(
    cfg: RunConfig,
    *,
    dry_run: bool = False,
    cwd: Optional[Path] = None,
    run_id: Optional[str] = None,
    out: Optional[Path] = None,
    pvc: str = DEFAULT_PVC,
) -> dict[str, Any]:
    """Write the manifest (default ``<runs_dir>/<run_id>/pytorchjob.yaml``) and say how to apply it.

    ``dry_run``: render only.  Nothing is sent to a cluster either way.
    """
    import time

    cwd = Path(cwd or Path.cwd()).absolute()
    runs_dir = Path(cfg.runs_dir).expanduser()
    runs_dir = runs_dir if runs_dir.is_absolute() else cwd / runs_dir
    run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.backend}"
    doc = manifest(cfg, run_id=run_id, pvc=pvc)
    text, fmt = dump(doc)
    path = Path(out) if out else runs_dir / run_id / (MANIFEST_NAME if fmt == "yaml" else "pytorchjob.json")
    info: dict[str, Any] = {
        "launcher": "k8s",
        "run_id": run_id,
        "job_name": doc["metadata"]["name"],
        "manifest": str(path),
        "format": fmt,
        "nodes": int(cfg.nnodes),
        "apply": apply_command(path),
        "logs": f"kubectl logs -f {doc['metadata']['name']}-master-0",
        "shared_volume": {"pvc": pvc, "mount": SHARED_MOUNT},
        "dry_run": dry_run,
        "manifest_text": text,
    }
    if dry_run:
        return info
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return info
