"""``trnqwen serve --k8s FILE|DIR``: the vLLM Neuron server as a Kubernetes Deployment + Service (EKS).

The container runs the command ``trnqwen serve --engine vllm`` plans on the Trainium host
(:func:`trnqwen.serve.plan.plan_serve` on a trn2.48xlarge's 64 logical NeuronCores: tensor
parallel capped to divide the attention heads, ``--max-model-len`` from the run, an adapter as
``--enable-lora --lora-modules``, vLLM's LoRA rules checked), listening on every interface, with
the model folder read from the shared volume the training pods write (the PVC ``trnqwen-shared``
at ``/shared``, :mod:`trnqwen.train.k8s_pod`; a folder under this directory is
``/shared/<its relative path>``, as the training pods place it) and vLLM's compile cache on it
too, so a restarted pod reuses its NEFFs.  The pod asks for the Neuron devices the tensor-parallel
size needs (``aws.amazon.com/neuron``, the Neuron device plugin's resource: 4 logical cores per
trn2 device at LNC=2), tolerates the Neuron taint, and gets a memory-backed ``/dev/shm``.  A
startup probe on ``/health`` gives the first compile its time (``--ready-timeout``), a readiness
probe on it takes the pod out of the Service while it cannot answer.  The Deployment replaces its
pod with ``Recreate`` (a rolling update would need a second set of Neuron devices).  The Service
(ClusterIP) publishes the port in the cluster; ``kubectl port-forward`` reaches it from outside.

Nothing here runs kubectl or starts anything: the manifest is written and the lines to apply it
and reach the server are printed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import UsageError
from trnqwen.train import k8s_pod

if TYPE_CHECKING:
    from trnqwen.config import RunConfig
    from trnqwen.serve.plan import ServePlan

NODE_LOGICAL_CORES = 64  # trn2.48xlarge: 16 devices x 8 physical cores / LNC 2
PORT_NAME = "http"
HEALTH_PATH = "/health"  # vLLM's: 200 once the engine answers
PROBE_PERIOD_S = 10
MANIFEST_NAME = "serve.yaml"


def service_name(plan: ServePlan) -> str:
    """A DNS-1035 label (a Service's name rule, the stricter of the two) naming what is served:
    ``trnqwen-serve-<checkpoint folder>-<step>`` (an adapter: its served name)."""
    served = Path(plan.served)
    owner = served.parent.parent.name if served.parent.name == "hf" else served.parent.name
    what = plan.model if plan.kind == "adapter" else "-".join(p for p in (owner, served.name) if p)
    slug = re.sub(r"[^a-z0-9-]+", "-", f"trnqwen-serve-{what}".lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)[:63].rstrip("-")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", slug):
        raise UsageError(f"cannot make a Kubernetes name from {what!r}")
    return slug


def pod_path(path: Path, cwd: Path, mount: str = k8s_pod.SHARED_MOUNT) -> tuple[str, bool]:
    """(the path in the pod, whether it is on the shared volume): a path under ``cwd`` is
    ``<mount>/<relative path>``; another absolute path is kept (the image's or the volume's own
    layout, the user's to provide)."""
    path = Path(path).expanduser()
    absolute = path if path.is_absolute() else cwd / path
    try:
        rel = absolute.resolve().relative_to(cwd.resolve())
    except ValueError:
        return absolute.as_posix(), False
    return str(PurePosixPath(mount) / PurePosixPath(rel.as_posix())), True


def neuron_devices(tensor_parallel: int, lnc: int) -> int:
    """Devices a server of ``tensor_parallel`` logical cores needs (trn2: 8 physical cores each)."""
    from trnqwen.env.neuron import PHYSICAL_CORES_PER_CHIP

    per_device = PHYSICAL_CORES_PER_CHIP[k8s_pod.NODE_FAMILY] // lnc
    return max(1, math.ceil(tensor_parallel / per_device))


def manifests(plan: ServePlan, cfg: RunConfig, *, image: str, cwd: Path, ready_timeout_s: float = 1800.0,
              namespace: Optional[str] = None, pvc: str = k8s_pod.DEFAULT_PVC) -> tuple[list[dict[str, Any]], list[str]]:
    """(the Deployment and the Service, notes) for a vLLM ``plan`` made for a Neuron node (pure)."""
    from trnqwen.serve.plan import DEFAULT_COMPILE_CACHE

    if plan.engine != "vllm":
        raise UsageError("--k8s writes the vLLM Neuron server's manifest", hint="drop --engine transformers")
    name = service_name(plan)
    labels = {"app.kubernetes.io/name": "trnqwen-serve", "app.kubernetes.io/instance": name}
    notes: list[str] = []
    mapped: dict[str, str] = {}
    off_volume: list[str] = []
    for local in {p for p in (plan.served, plan.adapter) if p is not None}:
        inside, shared = pod_path(Path(local), cwd)
        mapped[str(local)] = inside
        if not shared:
            off_volume.append(inside)
    argv = ["vllm", *(_pod_arg(a, mapped) for a in plan.argv[1:])]
    argv[argv.index("--host") + 1] = "0.0.0.0"  # the pod's every interface: the Service forwards to it
    cache_dir = Path(cfg.compile_cache_dir or DEFAULT_COMPILE_CACHE)
    cache = PurePosixPath(cache_dir.as_posix())
    if not cache.is_absolute():
        cache = PurePosixPath(k8s_pod.SHARED_MOUNT) / cache
    lnc = k8s_pod.lnc(cfg)
    devices = neuron_devices(plan.tensor_parallel or 1, lnc)
    amounts = {k8s_pod.NEURON_RESOURCE: str(devices)}
    def probe(failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": HEALTH_PATH, "port": PORT_NAME}, "periodSeconds": PROBE_PERIOD_S,
                "failureThreshold": failures}

    container = {
        "name": "vllm",
        "image": image,
        "command": argv,
        "env": [{"name": "VLLM_CACHE_ROOT", "value": str(cache / "vllm")}],
        "ports": [{"name": PORT_NAME, "containerPort": int(plan.port), "protocol": "TCP"}],
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "volumeMounts": k8s_pod.volume_mounts(k8s_pod.SHARED_MOUNT),
        # the first start compiles the model (NEFFs): as long as --ready-timeout allows
        "startupProbe": probe(max(1, math.ceil(ready_timeout_s / PROBE_PERIOD_S))),
        "readinessProbe": probe(3),
    }
    meta = {"name": name, "labels": dict(labels), **({"namespace": namespace} if namespace else {})}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # a rolling update would hold two pods' Neuron devices
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [container],
                    "volumes": k8s_pod.volumes(pvc),
                    "tolerations": [{"key": k8s_pod.NEURON_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {**meta, "labels": dict(labels)},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(labels),
            "ports": [{"name": PORT_NAME, "port": int(plan.port), "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }
    notes.append(f"the pod reads {', '.join(mapped.values())} from the PVC {pvc} (mounted at {k8s_pod.SHARED_MOUNT}): "
                 "copy the folder there before applying (kubectl cp, or the volume's own sync)")
    if off_volume:
        notes.append(f"{', '.join(off_volume)} is outside this folder, so it is not on the shared volume's layout: "
                     "the image or the volume must hold it at that path")
    notes.append(f"{devices} Neuron device(s) ({k8s_pod.NEURON_RESOURCE}) for tensor parallel {plan.tensor_parallel} "
                 f"at LNC={lnc}; compile cache {cache}/vllm on the volume (a restarted pod reuses its NEFFs)")
    return [deployment, service], notes


def _pod_arg(arg: str, mapped: dict[str, str]) -> str:
    """An argv element with each local folder replaced by its pod path (``NAME=PATH`` too)."""
    if arg in mapped:
        return mapped[arg]
    head, sep, tail = arg.partition("=")
    if sep and tail in mapped:
        return f"{head}={mapped[tail]}"
    return arg


def output_path(given: Path) -> Path:
    """``--k8s FILE`` (a name with a .yaml/.yml/.json suffix) as given; ``--k8s DIR`` (an existing
    folder, or a name without one of those suffixes) -> ``DIR/serve.yaml``."""
    path = Path(given).expanduser()
    if path.is_dir() or path.suffix.lower() not in (".yaml", ".yml", ".json"):
        return path / MANIFEST_NAME
    return path


def write(plan: ServePlan, cfg: RunConfig, out: Path, *, image: Optional[str], cwd: Optional[Path] = None,
          ready_timeout_s: float = 1800.0) -> dict[str, Any]:
    """Write the manifest (atomically) and say how to apply and reach it."""
    import os

    image = image or cfg.image
    if not image:
        raise UsageError("--k8s needs the container image that runs vLLM Neuron",
                         hint="pass --image <registry>/<repo>:<tag> (an AWS Neuron vLLM DLC, e.g. from "
                         "public.ecr.aws/neuron), or set image in trnqwen.toml")
    cwd = Path(cwd or Path.cwd()).absolute()
    docs, notes = manifests(plan, cfg, image=image, cwd=cwd, ready_timeout_s=ready_timeout_s)
    text, fmt = k8s_pod.dump(docs)
    path = output_path(out).absolute()
    if fmt == "json" and path.suffix in (".yaml", ".yml"):
        path = path.with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    name = docs[0]["metadata"]["name"]
    command = docs[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    # clients name the model as vLLM does: its path in the pod (command[2]), or the adapter's name
    model = plan.model if plan.kind == "adapter" else command[2]
    return {
        "manifest": str(path), "format": fmt, "kinds": [d["kind"] for d in docs], "name": name, "image": image,
        "command": command,
        "apply": f"kubectl apply -f {path}",
        "wait": f"kubectl rollout status deployment/{name} --timeout={int(ready_timeout_s)}s",
        "port_forward": f"kubectl port-forward service/{name} {plan.port}:{plan.port}",
        "url": f"http://127.0.0.1:{plan.port}", "model": model,
        "notes": [n for n in plan.notes if not n.startswith("compile cache:")] + notes,
    }
