"""The k8s launcher's v1 PyTorchJob (``--k8s-api pytorchjob``), validated against a schema written
from the training-operator's CRD and webhook (tests/data/pytorchjob.schema.json)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from trnqwen.config import RunConfig
from trnqwen.errors import UsageError
from trnqwen.train import k8s, k8s_pod, k8s_pytorchjob

SCHEMA = json.loads((Path(__file__).parent / "data" / "pytorchjob.schema.json").read_text())
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trnqwen:0.1"


def _validate(doc):
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def _container(doc, role="Master"):
    return doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]


def _env(container):
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_manifest_is_a_valid_pytorchjob(nodes):
    cfg = RunConfig(nnodes=nodes, image=IMAGE, finetune=True)
    doc = k8s_pytorchjob.manifest(cfg, run_id="20261129-101500-hf-v5")
    _validate(doc)
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert (specs.get("Worker") or {}).get("replicas", 0) == nodes - 1
    assert doc["metadata"]["name"] == "trnqwen-20261129-101500-hf-v5"


def test_each_pod_requests_neuron_devices_efa_and_the_shared_volume():
    doc = k8s_pytorchjob.manifest(RunConfig(nnodes=2, image=IMAGE, finetune=True), run_id="r1")
    for role in ("Master", "Worker"):
        c = _container(doc, role)
        assert c["name"] == "pytorch" and c["image"] == IMAGE
        for side in ("requests", "limits"):
            assert c["resources"][side] == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "16"}
        pod = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "trnqwen-shared"}} in pod["volumes"]
        assert {"name": "shared", "mountPath": "/shared"} in c["volumeMounts"]
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]


def test_pods_run_trnqwen_train_with_the_run_settings_on_the_volume():
    cfg = RunConfig(nnodes=2, image=IMAGE, finetune=True, steps=7, model="Qwen/Qwen3-4B-Instruct-2507")
    c = _container(k8s_pytorchjob.manifest(cfg, run_id="r1"))
    assert c["command"][:2] == ["bash", "-c"] and c["command"][-4:] == ["trnqwen", "train", "--resume", "auto"]
    assert 'TRNQWEN_NODE_RANK="${PET_NODE_RANK}"' in c["command"][2]
    assert "${MASTER_ADDR}:${MASTER_PORT}" in c["command"][2]
    env = _env(c)
    assert env["TRNQWEN_NNODES"] == "2" and env["TRNQWEN_RDZV_ID"] == "r1" and env["TRNQWEN_LAUNCHER"] == "local"
    assert env["TRNQWEN_STEPS"] == "7" and env["TRNQWEN_FINETUNE"] == "true"
    assert env["TRNQWEN_ASSETS_DIR"] == "/shared/assets/hf/Qwen3-4B-Instruct-2507"
    assert env["TRNQWEN_CHECKPOINT_DIR"] == "/shared/checkpoint_qwen3_4b_ft"
    assert env["TRNQWEN_RUNS_DIR"] == "/shared/.trnqwen/runs"
    assert env["FI_PROVIDER"] == "efa" and env["CCOM_SOCKET_IFNAME"] == "eth0"
    assert "TRNQWEN_IMAGE" not in env


def test_cpu_job_requests_no_neuron_or_efa():
    doc = k8s_pytorchjob.manifest(RunConfig(nnodes=2, image=IMAGE, device="cpu"), run_id="r1")
    _validate(doc)
    c = _container(doc)
    assert "resources" not in c and "FI_PROVIDER" not in _env(c)


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "replicas"),
        (lambda d: _container(d).update(name="trainer"), "pytorch"),
        (lambda d: _container(d).pop("image"), "image"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"].update(Chief=d["spec"]["pytorchReplicaSpecs"]["Master"]), "Chief"),
        (lambda d: d["spec"].update(pytorchReplicaSpec={}), "pytorchReplicaSpec"),
        (lambda d: _container(d)["resources"]["limits"].update({"aws.amazon.com/neuron": "sixteen"}), "sixteen"),
        (lambda d: d["metadata"].update(name="20261129-run"), "20261129-run"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(restartPolicy="Sometimes"), "Sometimes"),
    ],
)
def test_schema_catches_what_the_operator_would_reject(mutate, where):
    doc = k8s_pytorchjob.manifest(RunConfig(nnodes=2, image=IMAGE), run_id="r1")
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError) as exc:
        _validate(doc)
    assert where in str(exc.value)


def test_job_name_is_dns1035():
    assert k8s_pod.job_name("20261129-101500-hf_v5") == "trnqwen-20261129-101500-hf-v5"
    assert len(k8s_pod.job_name("x" * 200)) <= 48


def test_image_is_required():
    with pytest.raises(UsageError) as exc:
        k8s_pytorchjob.manifest(RunConfig(nnodes=2), run_id="r1")
    assert "--image" in exc.value.hint


def test_launch_writes_yaml_and_prints_kubectl(tmp_path):
    import yaml

    cfg = RunConfig(nnodes=2, image=IMAGE, runs_dir=tmp_path / "runs", k8s_api="pytorchjob")
    dry = k8s.launch(cfg, dry_run=True, cwd=tmp_path, run_id="r9")
    assert not Path(dry["manifest"]).exists()
    info = k8s.launch(cfg, cwd=tmp_path, run_id="r9")
    path = Path(info["manifest"])
    assert path == tmp_path / "runs" / "r9" / "pytorchjob.yaml" and info["format"] == "yaml"
    assert info["apply"] == f"kubectl apply -f {path}"
    doc = yaml.safe_load(path.read_text())
    _validate(doc)
    assert doc == k8s_pytorchjob.manifest(cfg, run_id="r9")


def test_cli_dry_run_prints_a_valid_manifest_and_writes_nothing(cli, in_tmp):
    import yaml

    r = cli("train", "--launcher", "k8s", "--k8s-api", "pytorchjob", "--nodes", "2", "--image", IMAGE, "--finetune", "--dry-run")
    assert r.code == 0, r.text
    _validate(yaml.safe_load(r.out))
    assert not (in_tmp / ".trnqwen").exists()


def test_cli_writes_the_manifest_and_prints_kubectl(cli, in_tmp):
    r = cli("train", "--launcher", "k8s", "--k8s-api", "pytorchjob", "--nodes", "3", "--image", IMAGE, "--json")
    assert r.code == 0, r.text
    info = json.loads(r.out)
    path = Path(info["manifest"])
    assert path.is_file() and info["apply"] == f"kubectl apply -f {path}"
    import yaml

    doc = yaml.safe_load(path.read_text())
    _validate(doc)
    assert doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    human = cli("train", "--launcher", "k8s", "--k8s-api", "pytorchjob", "--nodes", "3", "--image", IMAGE)
    assert "kubectl apply -f" in human.text


def test_cli_without_image_is_a_usage_error(cli, in_tmp):
    from tests.helpers import assert_clean_error

    assert_clean_error(cli("train", "--launcher", "k8s", "--nodes", "2"), code=2, contains="--image")


def test_a_preempted_pod_restarts_and_resumes_by_itself():
    """Exit 138 (Kubeflow's retryable code) restarts the pod (OnFailure); the same command then
    continues the run (--resume auto), and the kubelet waits out the ranks' grace period."""
    doc = k8s_pytorchjob.manifest(RunConfig(nnodes=2, image=IMAGE, device="cpu", grace_seconds=60), run_id="r1")
    _validate(doc)
    for replica in doc["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] in ("OnFailure", "ExitCode")
        spec = replica["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] == 90
        assert spec["containers"][0]["command"][-2:] == ["--resume", "auto"]
    assert _env(_container(doc))["TRNQWEN_CHECKPOINT_DIR"].startswith("/shared/")  # resume points on the volume
