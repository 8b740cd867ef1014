"""What every trnqwen pod on Kubernetes has, whichever Kubeflow API runs it (pure functions).

One pod per node runs ``trnqwen train --resume auto`` from the image with the run settings in
its environment (``TRNQWEN_*``, :func:`trnqwen.train.multinode.node_env`).  Each pod requests
the node's Neuron devices (``aws.amazon.com/neuron``, the Neuron device plugin) and EFA
interfaces (``vpc.amazonaws.com/efa``, the EFA device plugin), tolerates the Neuron taint,
mounts one shared volume (a PVC, e.g. FSx for Lustre) at ``/shared`` for assets, checkpoints,
run dirs and the compile cache, and a memory-backed ``/dev/shm``.  The v1 ``PyTorchJob``
(:mod:`.k8s_pytorchjob`) and the Trainer v2 ``TrainJob`` (:mod:`.k8s_trainjob`) build on these.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import UsageError
from trnqwen.train import multinode

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

NEURON_RESOURCE = "aws.amazon.com/neuron"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
DEFAULT_PVC = "trnqwen-shared"
SHARED_MOUNT = "/shared"
SHARED_VOLUME = "shared"
SHM_VOLUME = "dshm"
SECRET_KEYS = ("HF_TOKEN", "WANDB_API_KEY")  # what a pod may need from --k8s-secret: the Hub, W&B
NODE_FAMILY = "trn2"  # the instance the defaults describe (trn2.48xlarge)
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def job_name(run_id: str) -> str:
    """A DNS-1035 label (lowercase, starts with a letter, <= 48 chars: pod and host names add ~15)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", f"trnqwen-{run_id}".lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)[:48].rstrip("-")
    if not _DNS1035.fullmatch(slug):
        raise UsageError(f"cannot make a Kubernetes job name from run id {run_id!r}")
    return slug


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "trnqwen", "trnqwen/run-id": name}


def require_image(cfg: RunConfig, image: Optional[str] = None) -> str:
    image = image or cfg.image
    if not image:
        raise UsageError(
            "the k8s launcher needs a container image with trnqwen and the Neuron stack",
            hint="pass --image <registry>/<repo>:<tag> (e.g. an AWS Neuron DLC with `pip install trnqwen`)",
        )
    if int(cfg.nnodes) < 1:
        raise UsageError(f"--nodes must be >= 1, got {cfg.nnodes}")
    return image


def on_neuron(cfg: RunConfig) -> bool:
    """The pods run on Trainium unless the run says otherwise (``--device cpu`` for a try-out)."""
    return cfg.device in ("neuron", "auto")


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
    # the data the run names on this machine must be on the volume too: the one dataset, the validation
    # set, a template file, and every local dataset of a [[datasets]] mixture (Hub names stay names)
    for name in ("dataset", "val_dataset", "chat_template"):
        value = getattr(cfg, name, None)
        if value and is_local(value):
            out[name] = place(_checked(value, name.replace("_", "-")))
    if getattr(cfg, "datasets", None):
        out["datasets"] = [
            {**entry.model_dump(mode="json"), "path": place(_checked(entry.path, "[[datasets]] path"))}
            if is_local(entry.path) else entry.model_dump(mode="json")
            for entry in cfg.datasets
        ]
    return out


_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".jinja")


def is_local(name: str) -> bool:
    """A path on this machine (it exists here, or is written as a path: ./x, /x, ~/x, x.jsonl), not a
    Hub dataset name (org/name), a built-in template name (chatml) or a dataset torchtitan streams (c4)."""
    return (Path(name).expanduser().exists() or name.startswith((".", "/", "~"))
            or PurePosixPath(name).suffix.lower() in _LOCAL_SUFFIXES)


def _checked(value: str, what: str) -> Path:
    """A local path the pods can be given: relative (under the volume) or absolute (the image's or the
    volume's own layout); one in this machine's home folder (~) cannot reach them."""
    if value.startswith("~"):
        raise UsageError(
            f"{what} {value} is in this machine's home folder, which the pods do not see",
            hint=f"copy it onto the shared volume and name it by its path there, relative to the volume's root "
            f"(mounted at {SHARED_MOUNT} in the pods; ./data/x.jsonl is {SHARED_MOUNT}/data/x.jsonl)",
        )
    return Path(value)


def data_notes(cfg: RunConfig, mount: str = SHARED_MOUNT) -> list[str]:
    """Where the pods read the run's local data (nothing copies it there): one note naming every path."""
    placed = pod_paths(cfg, mount)
    local = [placed[name] for name in ("dataset", "val_dataset", "chat_template") if name in placed]
    local += [entry["path"] for entry, own in zip(placed.get("datasets", []), cfg.datasets or []) if is_local(own.path)]
    if not local:
        return []
    return [f"the pods read the run's data from the shared volume ({', '.join(local)}): copy it there before "
            "the job starts (kubectl cp, or the volume's own sync)"]


def lnc(cfg: RunConfig) -> int:
    from trnqwen.env.neuron import DEFAULT_LNC

    return int(cfg.lnc or DEFAULT_LNC[NODE_FAMILY])


def procs_per_node(cfg: RunConfig, neuron_devices: Optional[int] = None) -> int:
    """Ranks per pod: ``--nproc-per-node``, else the node's logical NeuronCores (devices x
    physical cores per device / LNC: 16 x 8 / 2 = 64 on a trn2.48xlarge), else 1."""
    from trnqwen.env.neuron import PHYSICAL_CORES_PER_CHIP

    if cfg.nproc_per_node:
        return int(cfg.nproc_per_node)
    if not on_neuron(cfg):
        return 1
    devices = neuron_devices or multinode.TRN2_NEURON_DEVICES
    return devices * PHYSICAL_CORES_PER_CHIP[NODE_FAMILY] // lnc(cfg)


def resources(cfg: RunConfig, *, neuron_devices: Optional[int] = None, efa_interfaces: Optional[int] = None) -> dict[str, Any]:
    """Requests = limits for the node's Neuron devices and (multi-node) its EFA interfaces; {} off Neuron."""
    if not on_neuron(cfg):
        return {}
    devices = neuron_devices or multinode.TRN2_NEURON_DEVICES
    efa = efa_interfaces if efa_interfaces is not None else (multinode.TRN2_EFA_INTERFACES if cfg.nnodes > 1 else 0)
    amounts = {NEURON_RESOURCE: str(devices)}
    if efa:
        amounts[EFA_RESOURCE] = str(efa)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def volumes(pvc: str) -> list[dict[str, Any]]:
    return [
        {"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": pvc}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]


def volume_mounts(mount: str) -> list[dict[str, Any]]:
    return [{"name": SHARED_VOLUME, "mountPath": mount}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]


def pod_basics(cfg: RunConfig, pvc: str) -> dict[str, Any]:
    """The pod-spec fields both APIs share: grace period, volumes, the Neuron toleration."""
    spec: dict[str, Any] = {
        # SIGTERM on eviction: the ranks save at the next step boundary within grace_seconds.
        "terminationGracePeriodSeconds": int(cfg.grace_seconds) + 30,
        "volumes": volumes(pvc),
    }
    if on_neuron(cfg):
        spec["tolerations"] = [{"key": NEURON_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return spec


def env_list(env: dict[str, str], secret: Optional[str] = None) -> list[dict[str, Any]]:
    """The container's ``env``: each setting by value, and with ``secret`` (``--k8s-secret``) each of
    :data:`SECRET_KEYS` by ``secretKeyRef``, optional so that a Secret holding only one of them
    works. A secret's value stays in the cluster: it is never written into the manifest."""
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    if secret:
        out += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
                for key in SECRET_KEYS]
    return out


def secret_notes(cfg: RunConfig) -> list[str]:
    """What the pods will lack without ``--k8s-secret``: W&B's key for ``--wandb``; the Hub token
    for a gated model the pods would fetch. Empty when a Secret is named."""
    if cfg.k8s_secret:
        return []
    make = "kubectl create secret generic trnqwen-secrets --from-literal={key}=... and pass --k8s-secret trnqwen-secrets"
    notes = []
    if cfg.wandb:
        notes.append("--wandb: the pods get no WANDB_API_KEY, so W&B cannot log in; " + make.format(key="WANDB_API_KEY"))
    if not cfg.is_builtin:
        notes.append(f"the pods get no HF_TOKEN: fine when {cfg.model}'s files are already on the shared volume; "
                     "for a gated or private model " + make.format(key="HF_TOKEN"))
    return notes


def copy(doc: Any) -> Any:
    return json.loads(json.dumps(doc))


def dump(docs: list[dict[str, Any]]) -> tuple[str, str]:
    """(text, format) for one or more documents: YAML via PyYAML when installed (``---``
    between documents), else JSON (one object, or a ``v1`` ``List`` of them); kubectl reads both."""
    try:
        import yaml
    except ImportError:
        body = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        return json.dumps(body, indent=2) + "\n", "json"
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=1000), "yaml"
