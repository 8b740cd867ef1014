"""``--launcher k8s`` (the default API): a Kubeflow Trainer v2 ``TrainJob`` and its ``TrainingRuntime``.

Kubeflow Trainer v2 (kubeflow/trainer v2.3.0, group ``trainer.kubeflow.org``, version
``v1alpha1``) runs a ``TrainJob`` as a JobSet built from the runtime it references.  trnqwen
writes both documents into one file, the runtime first (the TrainJob webhook looks it up):

* ``TrainingRuntime`` (namespaced, named like the job): ``mlPolicy.torch`` (the torch plugin
  injects ``PET_*``), one replicated job ``node`` labelled as the trainer ancestor whose
  container ``node`` carries what belongs to the node, not the run: the shared volume and
  ``/dev/shm`` (:mod:`.k8s_pod`), the Neuron toleration, the EFA/Neuron environment
  (``FI_*``, ``CCOM_SOCKET_IFNAME``, ``NEURON_LOGICAL_NC_CONFIG``), the grace period, and the
  restart policy (``OnFailure``: the kubelet starts a failed node's container again, in the same
  pod with the same ``PET_*``).
* ``TrainJob``: ``runtimeRef`` to it; ``trainer``: image, command, the run settings as
  ``TRNQWEN_*`` (``trainer.env``), ``numNodes``, ``resourcesPerNode`` (Neuron devices, EFA
  interfaces) and ``numProcPerNode`` set explicitly: Trainer's ``auto`` counts only resources
  named like GPUs and falls back to the CPU count on ``aws.amazon.com/neuron``.

The torch plugin gives the ``node`` container ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (the Job's completion index), ``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``)
and ``PET_MASTER_PORT`` (29500); the pod's command turns them into ``TRNQWEN_NNODES``,
``TRNQWEN_NPROC_PER_NODE``, ``TRNQWEN_NODE_RANK`` and ``TRNQWEN_RDZV_ENDPOINT`` and runs
``trnqwen train --resume auto``, so nothing about the rendezvous is written into the manifest,
and a restarted pod continues the run from its last checkpoint (:func:`trnqwen.train.resume.auto_run_id`).
Those five names are reserved: Trainer refuses a TrainJob whose ``trainer.env`` sets one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from trnqwen.train import k8s_pod, multinode

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

API_VERSION = "trainer.kubeflow.org/v1alpha1"
API_GROUP = "trainer.kubeflow.org"
KIND = "TrainJob"
RUNTIME_KIND = "TrainingRuntime"
NODE = "node"  # Trainer's name for the trainer replicated job and its container
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
# What the torch plugin injects (kubeflow/trainer pkg/constants: TorchRunReservedEnvNames).
PET_VARS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# Set per pod at run time from PET_*, so never written into trainer.env.
_FROM_PET = {"TRNQWEN_NNODES": "${PET_NNODES}", "TRNQWEN_NPROC_PER_NODE": "${PET_NPROC_PER_NODE}"}
NODE_COMMAND = ["trnqwen", "train", "--resume", "auto"]


def node_command() -> list[str]:
    """The ``node`` container's command: PET_* -> TRNQWEN_* at run time, then ``trnqwen train --resume auto``."""
    wrapper = multinode.node_wrapper("PET_NODE_RANK", "${PET_MASTER_ADDR}:${PET_MASTER_PORT}", more=_FROM_PET)
    return ["bash", "-c", wrapper, "trnqwen-node", *NODE_COMMAND]


def node_env(cfg: RunConfig) -> dict[str, str]:
    """What the node (not the run) needs: EFA for a multi-node Neuron job, the LNC the rank count assumes."""
    if not k8s_pod.on_neuron(cfg):
        return {}
    env = multinode.multinode_env("neuron", int(cfg.nnodes), kubernetes=True, environ={})
    env["NEURON_LOGICAL_NC_CONFIG"] = str(k8s_pod.lnc(cfg))
    return env


def run_env(cfg: RunConfig, *, run_id: str, mount: str) -> dict[str, str]:
    """The run settings for ``trainer.env``: every node resolves the same config (node count and
    ranks per node come from PET_* instead)."""
    env = multinode.node_env(cfg, rdzv_id=run_id, overrides=k8s_pod.pod_paths(cfg, mount))
    for name in _FROM_PET:
        env.pop(name, None)
    return env


def training_runtime(
    cfg: RunConfig,
    *,
    name: str,
    image: str,
    pvc: str = k8s_pod.DEFAULT_PVC,
    mount: str = k8s_pod.SHARED_MOUNT,
    namespace: Optional[str] = None,
) -> dict[str, Any]:
    """The ``TrainingRuntime`` (pure)."""
    nnodes = int(cfg.nnodes)
    container: dict[str, Any] = {
        "name": NODE,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": mount,
        "volumeMounts": k8s_pod.volume_mounts(mount),
    }
    env = node_env(cfg)
    if env:
        container["env"] = k8s_pod.env_list(env)
    pod_spec = k8s_pod.pod_basics(cfg, pvc)
    # OnFailure: a node whose trnqwen fails (its peer went away, exit 1; preempted after a
    # checkpoint, exit 138) starts again in the same pod, and --resume auto continues the run.
    pod_spec["restartPolicy"] = "OnFailure"
    pod_spec["containers"] = [container]
    labels = k8s_pod.labels(name)
    job = {
        "name": NODE,
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
            "spec": {
                # One failure restarts every node once (the others stop when their peer goes).
                "backoffLimit": 3 * nnodes,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        },
    }
    metadata: dict[str, Any] = {"name": name, "labels": {**labels, FRAMEWORK_LABEL: "torch"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": nnodes, "torch": {}},
            "template": {"spec": {"replicatedJobs": [job]}},
        },
    }


def train_job(
    cfg: RunConfig,
    *,
    run_id: str,
    name: str,
    image: str,
    mount: str = k8s_pod.SHARED_MOUNT,
    namespace: Optional[str] = None,
    neuron_devices: Optional[int] = None,
    efa_interfaces: Optional[int] = None,
) -> dict[str, Any]:
    """The ``TrainJob`` (pure); its runtime is the ``TrainingRuntime`` of the same name."""
    trainer: dict[str, Any] = {
        "image": image,
        "command": node_command(),
        "env": k8s_pod.env_list(run_env(cfg, run_id=run_id, mount=mount), cfg.k8s_secret),
        "numNodes": int(cfg.nnodes),
        "numProcPerNode": k8s_pod.procs_per_node(cfg, neuron_devices),
    }
    res = k8s_pod.resources(cfg, neuron_devices=neuron_devices, efa_interfaces=efa_interfaces)
    if res:
        trainer["resourcesPerNode"] = res
    metadata: dict[str, Any] = {"name": name, "labels": k8s_pod.labels(name)}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": name, "apiGroup": API_GROUP, "kind": RUNTIME_KIND}, "trainer": trainer},
    }


def manifests(
    cfg: RunConfig,
    *,
    run_id: str,
    image: Optional[str] = None,
    pvc: str = k8s_pod.DEFAULT_PVC,
    mount: str = k8s_pod.SHARED_MOUNT,
    namespace: Optional[str] = None,
    neuron_devices: Optional[int] = None,
    efa_interfaces: Optional[int] = None,
) -> list[dict[str, Any]]:
    """[TrainingRuntime, TrainJob]: the order ``kubectl apply`` must create them in."""
    image = k8s_pod.require_image(cfg, image)
    name = k8s_pod.job_name(run_id)
    runtime = training_runtime(cfg, name=name, image=image, pvc=pvc, mount=mount, namespace=namespace)
    job = train_job(
        cfg, run_id=run_id, name=name, image=image, mount=mount, namespace=namespace,
        neuron_devices=neuron_devices, efa_interfaces=efa_interfaces,
    )  # fmt: skip
    return [runtime, job]
