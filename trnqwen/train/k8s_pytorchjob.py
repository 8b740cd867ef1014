"""``--launcher k8s --k8s-api pytorchjob``: the Kubeflow training-operator v1 ``PyTorchJob``.

For clusters that still run the v1 training operator (removed upstream in favour of Trainer v2,
:mod:`.k8s_trainjob`).  One pod per node: ``Master`` (node 0, replicas 1) and ``Worker`` (nodes
1..N-1), each as :mod:`.k8s_pod` describes.  The operator's own variables give each pod its
place: ``PET_NODE_RANK`` (0 for the master), ``MASTER_ADDR``/``MASTER_PORT`` (the master pod's
service and the container port named ``pytorchjob-port``).

The operator's rules (training-operator v1.9, pkg/webhooks/pytorch): a container named
``pytorch`` with an image, Master replicas exactly 1, DNS-1035 job name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from trnqwen.train import k8s_pod, multinode

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"  # the training-operator requires this name
PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from this named port
DEFAULT_PORT = 23456  # the operator's default


def manifest(
    cfg: RunConfig,
    *,
    run_id: str,
    image: Optional[str] = None,
    pvc: str = k8s_pod.DEFAULT_PVC,
    mount: str = k8s_pod.SHARED_MOUNT,
    port: int = DEFAULT_PORT,
    namespace: Optional[str] = None,
    neuron_devices: Optional[int] = None,
    efa_interfaces: Optional[int] = None,
) -> dict[str, Any]:
    """The PyTorchJob as a dict (pure)."""
    image = k8s_pod.require_image(cfg, image)
    nnodes = int(cfg.nnodes)
    name = k8s_pod.job_name(run_id)
    neuron = k8s_pod.on_neuron(cfg)
    env = multinode.node_env(cfg, rdzv_id=run_id, overrides=k8s_pod.pod_paths(cfg, mount))
    env.update(multinode.multinode_env("neuron" if neuron else cfg.device, nnodes, kubernetes=True, environ={}))
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
        "env": k8s_pod.env_list(env, cfg.k8s_secret),
        "ports": [{"name": PORT_NAME, "containerPort": int(port)}],
        "volumeMounts": k8s_pod.volume_mounts(mount),
    }
    res = k8s_pod.resources(cfg, neuron_devices=neuron_devices, efa_interfaces=efa_interfaces)
    if res:
        container["resources"] = res
    pod_spec = k8s_pod.pod_basics(cfg, pvc)
    pod_spec["containers"] = [container]
    labels = k8s_pod.labels(name)

    def replica(count: int) -> dict[str, Any]:
        # OnFailure: a worker that starts before the master's address resolves is restarted, and a
        # preempted pod (exit 138) restarts and resumes by itself (--resume auto).
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"metadata": {"labels": dict(labels)}, "spec": k8s_pod.copy(pod_spec)},
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
