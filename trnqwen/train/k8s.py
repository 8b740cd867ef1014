"""``trnqwen train --launcher k8s``: write the Kubeflow manifest, say how to apply it (or apply it).

``--k8s-api trainjob`` (default): a Kubeflow Trainer v2 ``TrainJob`` plus the
``TrainingRuntime`` it references, in one file (:mod:`.k8s_trainjob`).  ``--k8s-api
pytorchjob``: the v1 training operator's ``PyTorchJob`` (:mod:`.k8s_pytorchjob`).  Both run
``trnqwen train --resume auto`` once per node (:mod:`.k8s_pod`).

trnqwen writes ``<runs_dir>/<run id>/trainjob.yaml`` (or ``pytorchjob.yaml``) and prints the
``kubectl apply -f`` line; ``--submit`` runs that line itself (kubectl must be on PATH, checked
before anything is written) and prints how to follow the job.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trnqwen.errors import CheckFailed, EnvironmentProblem, redact
from trnqwen.train import k8s_pod, k8s_pytorchjob, k8s_trainjob

if TYPE_CHECKING:
    from trnqwen.config import RunConfig

APPLY_TIMEOUT_S = 120.0
# What each API's job is called by kubectl, and its manifest's file name.
RESOURCE = {"trainjob": "trainjob", "pytorchjob": "pytorchjob"}


def documents(cfg: RunConfig, *, run_id: str, pvc: str = k8s_pod.DEFAULT_PVC, **kwargs: Any) -> list[dict[str, Any]]:
    """The manifest's documents for ``cfg.k8s_api`` (pure)."""
    if cfg.k8s_api == "pytorchjob":
        return [k8s_pytorchjob.manifest(cfg, run_id=run_id, pvc=pvc, **kwargs)]
    return k8s_trainjob.manifests(cfg, run_id=run_id, pvc=pvc, **kwargs)


def apply_command(path: Path, namespace: Optional[str] = None) -> list[str]:
    return ["kubectl", "apply", *(["-n", namespace] if namespace else []), "-f", str(path)]


def follow_commands(api: str, name: str) -> tuple[str, str]:
    """(status, logs) lines for the job: ``kubectl get trainjob NAME`` and node 0's log."""
    if api == "pytorchjob":
        return f"kubectl get pytorchjob {name}", f"kubectl logs -f {name}-master-0"
    # JobSet names node 0's pod <job>-node-0-0-<suffix>; the Job's completion-index label finds it.
    return (
        f"kubectl get trainjob {name}",
        f"kubectl logs -f -l jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0",
    )


def launch(
    cfg: RunConfig,
    *,
    dry_run: bool = False,
    submit: bool = False,
    cwd: Optional[Path] = None,
    run_id: Optional[str] = None,
    out: Optional[Path] = None,
    pvc: str = k8s_pod.DEFAULT_PVC,
) -> dict[str, Any]:
    """Write the manifest (default ``<runs_dir>/<run_id>/<api>.yaml``) and say how to apply it.

    ``dry_run``: render only.  ``submit``: also ``kubectl apply -f`` it (kubectl on PATH).
    """
    import time

    cwd = Path(cwd or Path.cwd()).absolute()
    runs_dir = Path(cfg.runs_dir).expanduser()
    runs_dir = runs_dir if runs_dir.is_absolute() else cwd / runs_dir
    run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.backend}"
    api = cfg.k8s_api
    docs = documents(cfg, run_id=run_id, pvc=pvc)
    text, fmt = k8s_pod.dump(docs)
    name = docs[-1]["metadata"]["name"]
    path = Path(out) if out else runs_dir / run_id / f"{RESOURCE[api]}.{fmt}"
    status, logs = follow_commands(api, name)
    info: dict[str, Any] = {
        "launcher": "k8s",
        "api": api,
        "kinds": [d["kind"] for d in docs],
        "run_id": run_id,
        "job_name": name,
        "manifest": str(path),
        "format": fmt,
        "nodes": int(cfg.nnodes),
        "apply": shlex.join(apply_command(path)),
        "status": status,
        "logs": logs,
        "shared_volume": {"pvc": pvc, "mount": k8s_pod.SHARED_MOUNT},
        "dry_run": dry_run,
        "submitted": False,
        "manifest_text": text,
        "notes": k8s_pod.secret_notes(cfg) + k8s_pod.data_notes(cfg),
    }
    if dry_run:
        return info
    kubectl = _kubectl() if submit else None  # before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    if kubectl:
        info["kubectl_output"] = apply(path, kubectl=kubectl)
        info["submitted"] = True
    return info


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        raise EnvironmentProblem(
            "--submit needs kubectl on PATH, configured for the cluster",
            hint="install kubectl (and e.g. `aws eks update-kubeconfig --name CLUSTER`), or drop --submit and apply the file yourself",
        )
    return exe


def apply(path: Path, *, kubectl: str = "kubectl", timeout_s: float = APPLY_TIMEOUT_S) -> str:
    """``kubectl apply -f PATH``; its output, or CheckFailed with what kubectl said."""
    argv = [kubectl, *apply_command(path)[1:]]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CheckFailed(
            f"kubectl apply did not answer within {timeout_s:.0f} s", hint="check `kubectl cluster-info`"
        ) from None
    if proc.returncode != 0:
        said = redact((proc.stderr or proc.stdout).strip())[:500]
        raise CheckFailed(
            f"kubectl apply refused {path}: {said}",
            hint="the manifest stays there; fix the cluster side (CRDs installed? namespace? PVC?) and apply it again",
        )
    return redact(proc.stdout.strip())
