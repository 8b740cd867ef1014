"""``--launcher k8s`` (default API): the Kubeflow Trainer v2 TrainJob and its TrainingRuntime,
validated against the published v2.3.0 CRDs (tests/data/kubeflow-trainer-v2.3.0, tests/k8s_schema.py);
``--submit`` through a kubectl double that records its argv; REAL 2-node loopback runs of the
pod command with the PET_* variables Trainer's torch plugin injects (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import k8s_schema
from tests.helpers import REPO_ROOT, assert_clean_error
from trnqwen.config import RunConfig
from trnqwen.train import k8s, k8s_trainjob

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trnqwen:0.1"
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _check(docs):
    runtime, job = docs
    problems = k8s_schema.errors(runtime, k8s_schema.TRAININGRUNTIME_CRD) + k8s_schema.errors(job, k8s_schema.TRAINJOB_CRD)
    for doc in docs:  # ObjectMeta is the API server's own: label values are at most 63 and DNS-like
        for value in doc["metadata"].get("labels", {}).values():
            if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
                problems.append(f"label value {value!r}")
    assert problems == [], "\n".join(problems)


def _docs(**fields):
    return k8s_trainjob.manifests(RunConfig(**{"image": IMAGE, "finetune": True, **fields}), run_id="20261129-101500-hf-v5")


def _node(runtime):
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]


def _pod(runtime):
    return _node(runtime)["template"]["spec"]["template"]["spec"]


def _env(items):
    return {e["name"]: e["value"] for e in items}


# --- the documents --------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_trainjob_and_runtime_validate_against_the_published_crds(nodes):
    docs = _docs(nnodes=nodes)
    _check(docs)
    runtime, job = docs
    assert [d["kind"] for d in docs] == ["TrainingRuntime", "TrainJob"]  # the runtime first: the job refers to it
    assert {d["apiVersion"] for d in docs} == {"trainer.kubeflow.org/v1alpha1"}
    assert job["metadata"]["name"] == runtime["metadata"]["name"] == "trnqwen-20261129-101500-hf-v5"
    assert job["spec"]["runtimeRef"] == {"name": runtime["metadata"]["name"], "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}
    assert job["spec"]["trainer"]["numNodes"] == runtime["spec"]["mlPolicy"]["numNodes"] == nodes
    assert runtime["spec"]["mlPolicy"]["torch"] == {}


def test_runtime_is_one_trainer_node_job_with_volume_shm_toleration_and_efa_env():
    runtime, job = _docs(nnodes=2)
    node = _node(runtime)
    # Trainer finds its trainer job by this label and its container by the name "node".
    assert node["name"] == "node" and node["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    pod = _pod(runtime)
    container = pod["containers"][0]
    assert container["name"] == "node" and container["image"] == IMAGE and container["workingDir"] == "/shared"
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "trnqwen-shared"}} in pod["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["restartPolicy"] == "OnFailure" and pod["terminationGracePeriodSeconds"] == 120
    env = _env(container["env"])
    assert env == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
                   "CCOM_SOCKET_IFNAME": "eth0", "NEURON_LOGICAL_NC_CONFIG": "2"}  # fmt: skip
    for side in ("requests", "limits"):
        assert job["spec"]["trainer"]["resourcesPerNode"][side] == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"}


@pytest.mark.parametrize(
    "fields, procs",
    [({}, 64), ({"lnc": 1}, 128), ({"nproc_per_node": 32}, 32), ({"device": "cpu"}, 1), ({"device": "cpu", "nproc_per_node": 4}, 4)],
)
def test_num_proc_per_node_is_explicit_from_the_logical_neuroncores(fields, procs):
    """Trainer's "auto" counts only GPU-named resources (the CPU count on aws.amazon.com/neuron)."""
    runtime, job = _docs(nnodes=2, **fields)
    assert job["spec"]["trainer"]["numProcPerNode"] == procs
    if fields.get("device") != "cpu":
        assert _env(_pod(runtime)["containers"][0]["env"])["NEURON_LOGICAL_NC_CONFIG"] == str(fields.get("lnc", 2))
    _check((runtime, job))


def test_the_pod_command_takes_the_rendezvous_from_pet_variables_only():
    runtime, job = _docs(nnodes=4, steps=7, model="Qwen/Qwen3-4B-Instruct-2507")
    trainer = job["spec"]["trainer"]
    cmd = trainer["command"]
    assert cmd[:2] == ["bash", "-c"] and cmd[-4:] == ["trnqwen", "train", "--resume", "auto"]
    for pet in k8s_trainjob.PET_VARS:
        assert "${" + pet + "}" in cmd[2]
    env = _env(trainer["env"])
    assert not set(env) & set(k8s_trainjob.PET_VARS)  # reserved: Trainer's webhook refuses them
    assert "TRNQWEN_NNODES" not in env and "TRNQWEN_NPROC_PER_NODE" not in env and "TRNQWEN_RDZV_ENDPOINT" not in env
    assert env["TRNQWEN_RDZV_ID"] == "20261129-101500-hf-v5" and env["TRNQWEN_LAUNCHER"] == "local"
    assert env["TRNQWEN_STEPS"] == "7" and env["TRNQWEN_CHECKPOINT_DIR"] == "/shared/checkpoint_qwen3_4b_ft"
    assert env["TRNQWEN_ASSETS_DIR"] == "/shared/assets/hf/Qwen3-4B-Instruct-2507"
    assert "TRNQWEN_IMAGE" not in env and "TRNQWEN_K8S_API" not in env
    text = json.dumps(job)
    assert "29500" not in text and "node-0-0" not in text  # nothing about the rendezvous is hard-coded


def test_the_pod_command_turns_pet_variables_into_the_node_settings():
    """The wrapper really runs: what `trnqwen train` sees comes from PET_* at run time."""
    cmd = k8s_trainjob.node_command()
    probe = ['bash', '-c', 'echo "$TRNQWEN_NODE_RANK|$TRNQWEN_NNODES|$TRNQWEN_NPROC_PER_NODE|$TRNQWEN_RDZV_ENDPOINT|$*"']
    pet = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "64", "PET_NODE_RANK": "3",
           "PET_MASTER_ADDR": "trnqwen-x-node-0-0.trnqwen-x", "PET_MASTER_PORT": "29500", "PATH": os.environ["PATH"]}  # fmt: skip
    out = subprocess.run([*cmd[:4], *probe, "x", *cmd[5:]], capture_output=True, text=True, env=pet, check=True)
    assert out.stdout.strip() == "3|4|64|trnqwen-x-node-0-0.trnqwen-x:29500|train --resume auto"


def test_cpu_job_asks_for_no_neuron_devices_or_efa():
    runtime, job = _docs(nnodes=2, device="cpu")
    _check((runtime, job))
    assert "resourcesPerNode" not in job["spec"]["trainer"]
    assert "env" not in _pod(runtime)["containers"][0] and "tolerations" not in _pod(runtime)


@pytest.mark.parametrize(
    "mutate, says",
    [
        (lambda r, j: j["spec"]["trainer"].update(numProcPerNode="auto"), "numProcPerNode"),
        (lambda r, j: j["spec"]["trainer"].update(numProcsPerNode=64), "numProcsPerNode"),
        (lambda r, j: j["spec"].pop("runtimeRef"), "runtimeRef"),
        (lambda r, j: j["metadata"].update(name="20261129-run"), "RFC 1035"),
        (lambda r, j: j["metadata"].update(name="t" * 64), "63 characters"),
        (lambda r, j: j["spec"]["trainer"]["resourcesPerNode"]["limits"].update({"aws.amazon.com/neuron": "sixteen"}), "sixteen"),
        (lambda r, j: r["spec"]["mlPolicy"].update(mpi={}), "Only one of the policy"),
        (lambda r, j: _pod(r).update(restartPolicy=7), "restartPolicy"),
        (lambda r, j: _pod(r)["containers"][0].pop("name"), "'name' is a required property"),
        (lambda r, j: _node(r).pop("template"), "'template' is a required property"),
    ],
)
def test_the_schema_check_catches_what_the_api_server_would_refuse(mutate, says):
    """The validation can fail: each of these is refused with the field named."""
    runtime, job = _docs(nnodes=2)
    mutate(runtime, job)
    problems = k8s_schema.errors(runtime, k8s_schema.TRAININGRUNTIME_CRD) + k8s_schema.errors(job, k8s_schema.TRAINJOB_CRD)
    assert any(says in p for p in problems), problems


# --- launch, the CLI and --submit -----------------------------------------------------------------


def _load_all(path_or_text):
    import yaml

    text = Path(path_or_text).read_text() if isinstance(path_or_text, Path) else path_or_text
    return list(yaml.safe_load_all(text))


def test_launch_writes_both_documents_in_one_file(tmp_path):
    cfg = RunConfig(nnodes=2, image=IMAGE, runs_dir=tmp_path / "runs")
    dry = k8s.launch(cfg, dry_run=True, cwd=tmp_path, run_id="r9")
    assert not Path(dry["manifest"]).exists()
    info = k8s.launch(cfg, cwd=tmp_path, run_id="r9")
    path = Path(info["manifest"])
    assert path == tmp_path / "runs" / "r9" / "trainjob.yaml" and info["kinds"] == ["TrainingRuntime", "TrainJob"]
    assert info["apply"] == f"kubectl apply -f {path}" and info["status"] == "kubectl get trainjob trnqwen-r9"
    docs = _load_all(path)
    _check(docs)
    assert docs == k8s_trainjob.manifests(cfg, run_id="r9") and not info["submitted"]


def test_without_pyyaml_both_documents_go_into_one_json_list(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises ImportError
    info = k8s.launch(RunConfig(nnodes=2, image=IMAGE, runs_dir=tmp_path / "runs"), cwd=tmp_path, run_id="r9")
    path = Path(info["manifest"])
    assert path.name == "trainjob.json" and info["format"] == "json"
    doc = json.loads(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")  # kubectl apply -f takes a List
    _check(doc["items"])


def test_cli_default_api_is_trainjob_and_dry_run_prints_it(cli, in_tmp):
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--finetune", "--dry-run")
    assert r.code == 0, r.text
    docs = _load_all(r.out)
    _check(docs)
    assert not (in_tmp / ".trnqwen").exists()


def test_cli_writes_and_prints_kubectl_apply(cli, in_tmp):
    r = cli("train", "--launcher", "k8s", "--nodes", "3", "--image", IMAGE)
    assert r.code == 0, r.text
    path = next((in_tmp / ".trnqwen" / "runs").glob("*/trainjob.yaml"))
    assert f"kubectl apply -f {path}" in r.text and "kubectl get trainjob trnqwen-" in r.text
    assert _load_all(path)[1]["spec"]["trainer"]["numNodes"] == 3


def _fake_kubectl(tmp_path: Path, code: int = 0) -> Path:
    """A kubectl double: records its argv and the file it was given, answers like kubectl apply."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {tmp_path}/kubectl.argv\n'
        f'prev=""; for a in "$@"; do [ "$prev" = "-f" ] && cp "$a" {tmp_path}/kubectl.applied; prev="$a"; done\n'
        + ('echo "trainingruntime.trainer.kubeflow.org/x created"; echo "trainjob.trainer.kubeflow.org/x created"\n' if code == 0
           else 'echo "error: resource mapping not found for kind \\"TrainJob\\"" >&2\n')
        + f"exit {code}\n"
    )  # fmt: skip
    script.chmod(0o755)
    return bin_dir


def test_cli_submit_applies_the_file_with_kubectl_and_prints_how_to_follow(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_kubectl(in_tmp)}{os.pathsep}{os.environ['PATH']}")
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--submit")
    assert r.code == 0, r.text
    path = next((in_tmp / ".trnqwen" / "runs").glob("*/trainjob.yaml"))
    assert (in_tmp / "kubectl.argv").read_text().split() == ["apply", "-f", str(path)]
    assert (in_tmp / "kubectl.applied").read_text() == path.read_text()  # the file was complete when applied
    name = _load_all(path)[1]["metadata"]["name"]
    assert f"kubectl get trainjob {name}" in r.text and "trainjob.trainer.kubeflow.org/x created" in r.text


def test_cli_submit_with_dry_run_applies_nothing(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_kubectl(in_tmp)}{os.pathsep}{os.environ['PATH']}")
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--submit", "--dry-run")
    assert r.code == 0, r.text
    _check(_load_all(r.out))
    assert not (in_tmp / "kubectl.argv").exists() and not (in_tmp / ".trnqwen").exists()


def test_cli_submit_refused_by_kubectl_is_a_clean_failure(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_kubectl(in_tmp, code=1)}{os.pathsep}{os.environ['PATH']}")
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--submit")
    assert_clean_error(r, code=1, contains="kubectl apply refused")
    assert 'mapping not found for kind "TrainJob"' in r.text


def test_cli_submit_without_kubectl_writes_nothing(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # python, no kubectl
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--submit")
    assert_clean_error(r, code=3, contains="kubectl")
    assert not (in_tmp / ".trnqwen").exists()


def test_cli_submit_needs_the_k8s_launcher(cli, in_tmp):
    assert_clean_error(cli("train", "--submit"), code=2, contains="--launcher k8s")


def test_cli_k8s_api_pytorchjob_keeps_the_v1_manifest(cli, in_tmp):
    r = cli("train", "--launcher", "k8s", "--k8s-api", "pytorchjob", "--nodes", "2", "--image", IMAGE, "--json")
    assert r.code == 0, r.text
    info = json.loads(r.out)
    assert info["kinds"] == ["PyTorchJob"] and info["manifest"].endswith("pytorchjob.yaml")
    assert _load_all(Path(info["manifest"]))[0]["apiVersion"] == "kubeflow.org/v1"
    assert info["status"] == f"kubectl get pytorchjob {info['job_name']}"
    assert_clean_error(cli("train", "--launcher", "k8s", "--k8s-api", "v1", "--image", IMAGE), code=2, contains="k8s_api")


# --- REAL: the pod command of a 2-node TrainJob on loopback ---------------------------------------

from tests.test_multinode import _free_port, _kill_tree, _work  # noqa: E402


def _loopback_job(work: Path, *, steps: int, save_every: int | None = None, run_id: str) -> list[dict]:
    """The documents trnqwen writes for a 2-node CPU job whose shared volume is ``work``."""
    cfg = RunConfig(
        model="builtin:tiny-qwen3", device="cpu", nproc_per_node=1, seq_len=128, finetune=True,
        steps=steps, save_every=save_every, nnodes=2, image="local",
    )  # fmt: skip
    docs = k8s_trainjob.manifests(cfg, run_id=run_id, mount=str(work))
    _check(docs)
    return docs


def _start_pod(docs: list[dict], rank: int, port: int, work: Path, tag: str = "") -> subprocess.Popen:
    """What the kubelet runs for node ``rank``: the runtime container's command (the TrainJob's),
    in its working dir, with its env + trainer.env + the PET_* Trainer's torch plugin injects."""
    runtime, job = docs
    trainer = job["spec"]["trainer"]
    container = _pod(runtime)["containers"][0]
    shim = work / "image-bin"  # the image's `trnqwen` on PATH
    if not shim.exists():
        shim.mkdir()
        (shim / "trnqwen").write_text(f'#!/bin/bash\nexec {sys.executable} -m trnqwen "$@"\n')
        (shim / "trnqwen").chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(_env(container.get("env", [])))
    env.update(_env(trainer["env"]))
    env.update({
        "PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
        "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
    })  # fmt: skip
    out = open(work / f"pod{rank}{tag}.out", "w")
    return subprocess.Popen(
        trainer["command"], cwd=container["workingDir"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_all(pods: list[subprocess.Popen], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in pods]
    finally:
        for p in pods:
            if p.poll() is None:
                _kill_tree(p)


@pytest.mark.slow
def test_trainjob_pod_command_trains_two_nodes_on_loopback(tmp_path):
    work = _work(tmp_path)
    docs = _loopback_job(work, steps=2, run_id="tj-e2e")
    port = _free_port()
    started = time.monotonic()
    codes = _wait_all([_start_pod(docs, r, port, work) for r in (0, 1)], timeout=420)
    wall = time.monotonic() - started
    outs = {r: (work / f"pod{r}.out").read_text(errors="replace")[-3000:] for r in (0, 1)}
    assert codes == [0, 0], outs
    print(f"\nTrainJob pod command, 2 nodes on loopback (tiny Qwen3, 1 CPU rank each, 2 steps): {wall:.1f} s wall")
    run_dir = work / ".trnqwen" / "runs" / "tj-e2e"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["extra"]["nnodes"] == 2 and record["extra"]["world_size"] == 2
    for r in (0, 1):  # torchrun ran as node r of 2 at PET_MASTER_ADDR:PET_MASTER_PORT
        cmd = (work / ".trnqwen" / "runs" / "tj-e2e" / "nodes" / f"node{r}" / "command.sh").read_text()
        assert "--nnodes 2" in cmd and f"--node-rank {r}" in cmd and f"127.0.0.1:{port}" in cmd and "--nproc_per_node 1" in cmd
    export = work / "checkpoint_tiny_qwen3_f7b2a8_ft" / "hf" / "step-2"
    assert (export / "model-00001-of-00001.safetensors").is_file() and (export / "README.md").is_file()


@pytest.mark.slow
def test_a_killed_node_restarted_with_the_same_environment_resumes(tmp_path):
    """Node 1 is killed mid-run; node 0 stops (its peer is gone); both start again with the same
    environment, as OnFailure does, and continue from the last checkpoint instead of step 1."""
    from trnqwen.contract import checkpoint_layout as checkpoints

    work = _work(tmp_path)
    steps, every = 12, 2
    docs = _loopback_job(work, steps=steps, save_every=every, run_id="tj-resume")
    ckpt_root = work / "checkpoint_tiny_qwen3_f7b2a8_ft"
    port = _free_port()
    pods = [_start_pod(docs, r, port, work) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            latest = checkpoints.scan(ckpt_root).latest_resume if ckpt_root.is_dir() else None
            if latest is not None:
                break
            assert all(p.poll() is None for p in pods), (work / "pod0.out").read_text()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint within 300 s:\n" + (work / "pod0.out").read_text()[-3000:])
        _kill_tree(pods[1])
        code0 = pods[0].wait(timeout=180)  # the survivor stops: its peer is gone
    finally:
        for p in pods:
            if p.poll() is None:
                _kill_tree(p)
    killed_after = checkpoints.scan(ckpt_root).latest_resume.step
    assert 0 < killed_after < steps and code0 != 0, (work / "pod0.out").read_text()[-3000:]
    logs = [work / ".trnqwen" / "runs" / "tj-resume" / "nodes" / f"node{r}" / "train.log" for r in (0, 1)]
    before = [log.stat().st_size for log in logs]

    codes = _wait_all([_start_pod(docs, r, port, work, tag="-restart") for r in (0, 1)], timeout=420)
    outs = {r: (work / f"pod{r}-restart.out").read_text(errors="replace")[-3000:] for r in (0, 1)}
    assert codes == [0, 0], outs
    after = [log.read_bytes()[offset:].decode("utf-8", "replace") for log, offset in zip(logs, before)]
    marks = [re.search(r"\[trnqwen\] resumed run tj-resume from step (\d+)", text) for text in after]
    assert all(marks), after[1][-3000:]  # each restarted node continued the job's run
    resumed_from = int(marks[0].group(1))
    assert int(marks[1].group(1)) == resumed_from >= killed_after
    logged = [int(s) for s in re.findall(r"step:\s*(\d+)", after[0])]  # rank 0's step lines are node 0's
    assert logged and min(logged) == resumed_from + 1 and max(logged) == steps  # continued, not started over
    print(f"\nnode 1 killed with a checkpoint of step {killed_after}; the restarted job resumed from step {resumed_from}")
    record = json.loads((work / ".trnqwen" / "runs" / "tj-resume" / "run.json").read_text())
    assert record["status"] == "succeeded" and record["extra"]["resumes"][-1]["from_step"] == resumed_from
    assert (ckpt_root / "hf" / f"step-{steps}" / "model-00001-of-00001.safetensors").is_file()
