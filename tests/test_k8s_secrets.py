"""``--k8s-secret NAME`` (issue 34, item 23): the pods of either Kubeflow API get HF_TOKEN and
WANDB_API_KEY from a named Secret by ``secretKeyRef``; the values never reach the manifest, and a
run that needs one without a Secret named is told how to give it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests import k8s_schema
from trnqwen.config import RunConfig
from trnqwen.train import k8s_pod, k8s_pytorchjob, k8s_trainjob

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trnqwen:0.1"
PYTORCHJOB_SCHEMA = json.loads((Path(__file__).parent / "data" / "pytorchjob.schema.json").read_text())
HF_SECRET_VALUE = "hf_" + "Zq8" * 12  # what a user's shell holds: it must never be written
WANDB_SECRET_VALUE = "wb" + "7f3" * 13


def _pod_envs(cfg: RunConfig) -> list[list[dict]]:
    """Every env list a pod of ``cfg.k8s_api`` starts with."""
    if cfg.k8s_api == "pytorchjob":
        doc = k8s_pytorchjob.manifest(cfg, run_id="r1")
        jsonschema.Draft202012Validator(PYTORCHJOB_SCHEMA).validate(doc)
        return [spec["template"]["spec"]["containers"][0]["env"] for spec in doc["spec"]["pytorchReplicaSpecs"].values()]
    runtime, job = k8s_trainjob.manifests(cfg, run_id="r1")
    problems = k8s_schema.errors(runtime, k8s_schema.TRAININGRUNTIME_CRD) + k8s_schema.errors(job, k8s_schema.TRAINJOB_CRD)
    assert problems == [], problems  # the published CRD's EnvVar schema: valueFrom.secretKeyRef {name, key, optional}
    return [job["spec"]["trainer"]["env"]]


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_a_named_secret_reaches_every_pod_by_reference(api):
    cfg = RunConfig(nnodes=2, image=IMAGE, finetune=True, k8s_api=api, k8s_secret="team-tokens", wandb=True)
    for env in _pod_envs(cfg):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
        assert refs == {key: {"name": "team-tokens", "key": key, "optional": True} for key in ("HF_TOKEN", "WANDB_API_KEY")}
        assert all("value" not in e for e in env if "valueFrom" in e)


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_without_a_secret_no_reference_is_written(api):
    for env in _pod_envs(RunConfig(nnodes=2, image=IMAGE, finetune=True, k8s_api=api)):
        assert not any("valueFrom" in e for e in env)
        assert not {"HF_TOKEN", "WANDB_API_KEY"} & {e["name"] for e in env}


def test_notes_say_what_the_pods_lack_and_how_to_give_it():
    hub = k8s_pod.secret_notes(RunConfig(image=IMAGE, model="Qwen/Qwen3-8B", wandb=True))
    assert len(hub) == 2 and "WANDB_API_KEY" in hub[0] and "HF_TOKEN" in hub[1]
    assert all("--k8s-secret" in note and "kubectl create secret generic" in note for note in hub)
    assert k8s_pod.secret_notes(RunConfig(image=IMAGE, model="builtin:tiny-qwen3")) == []  # nothing to log in to
    assert k8s_pod.secret_notes(RunConfig(image=IMAGE, model="Qwen/Qwen3-8B", wandb=True, k8s_secret="s")) == []


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_the_cli_writes_references_never_the_values_in_the_environment(cli, in_tmp, monkeypatch, api):
    monkeypatch.setenv("HF_TOKEN", HF_SECRET_VALUE)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_SECRET_VALUE)
    r = cli("train", "--launcher", "k8s", "--k8s-api", api, "--nodes", "2", "--image", IMAGE, "--finetune", "--wandb",
            "--k8s-secret", "team-tokens", "--json")
    assert r.code == 0, r.text
    info = json.loads(r.out)
    text = Path(info["manifest"]).read_text()
    assert "secretKeyRef" in text and "team-tokens" in text
    for secret in (HF_SECRET_VALUE, WANDB_SECRET_VALUE):
        assert secret not in text and secret not in r.text
    assert info["notes"] == []
    docs = list(yaml.safe_load_all(text))
    assert docs[-1]["kind"] == {"trainjob": "TrainJob", "pytorchjob": "PyTorchJob"}[api]


def test_the_cli_tells_a_wandb_run_without_a_secret(cli, in_tmp):
    r = cli("train", "--launcher", "k8s", "--nodes", "2", "--image", IMAGE, "--finetune", "--wandb")
    assert r.code == 0, r.text
    assert "note: --wandb: the pods get no WANDB_API_KEY" in " ".join(r.err.split())
    assert "--k8s-secret" in r.err


def test_the_secret_name_may_change_on_resume():
    from trnqwen.train.resume import MAY_CHANGE

    assert "k8s_secret" in MAY_CHANGE
