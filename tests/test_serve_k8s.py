"""``trnqwen serve --k8s``: the vLLM Neuron server as a Deployment + Service, validated offline against
the Kubernetes v1.34 API schemas (tests/data/k8s-v1.34, strict: unknown fields are errors) and the
API server's own rules beyond them (names, selectors, extended resources, named ports)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers import assert_clean_error

SCHEMA = json.loads((Path(__file__).parent / "data" / "k8s-v1.34" / "deployment-service.schema.json").read_text())
QWEN3 = ["Qwen3ForCausalLM"]
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/vllm-neuron:0.29"
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_IANA_SVC_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?")


def problems(doc: dict) -> list[str]:
    """What the API server would refuse in ``doc``: the schema of its kind, then the rules it
    checks in code (apps/validation, core/validation) that trnqwen's manifest touches."""
    kind = doc.get("kind")
    if kind not in ("Deployment", "Service"):
        return [f"unexpected kind {kind}"]
    validator = jsonschema.Draft202012Validator({"$ref": f"#/$defs/{kind}", "$defs": SCHEMA["$defs"]})
    found = ["/" + "/".join(map(str, e.absolute_path)) + f": {e.message}" for e in validator.iter_errors(doc)]
    name = doc["metadata"]["name"]
    if not (_DNS1035.fullmatch(name) and len(name) <= 63):
        found.append(f"metadata.name {name!r} is not a DNS-1035 label")
    if kind == "Deployment":
        spec = doc["spec"]
        pod = spec["template"]
        if any(pod["metadata"]["labels"].get(k) != v for k, v in spec["selector"]["matchLabels"].items()):
            found.append("spec.selector does not match the template's labels")
        if spec.get("strategy", {}).get("type") == "Recreate" and "rollingUpdate" in spec["strategy"]:
            found.append("spec.strategy.rollingUpdate with type Recreate")
        for c in pod["spec"]["containers"]:
            if not _DNS1123_LABEL.fullmatch(c["name"]):
                found.append(f"container name {c['name']!r} is not a DNS-1123 label")
            ports = {p["name"] for p in c.get("ports", []) if "name" in p}
            found += [f"port name {p!r} is not an IANA service name" for p in ports
                      if not (len(p) <= 15 and _IANA_SVC_NAME.fullmatch(p))]
            res = c.get("resources", {})
            for key, amount in res.get("requests", {}).items():
                if "/" in key and not key.startswith("kubernetes.io/"):  # an extended resource
                    if not re.fullmatch(r"[1-9][0-9]*", str(amount)) or res.get("limits", {}).get(key) != amount:
                        found.append(f"extended resource {key}: whole numbers, requests equal to limits")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    found.append(f"{probe} names port {port!r}, which the container does not declare")
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"] for v in pod["spec"].get("volumes", [])}
            found += [f"volumeMount {m!r} names no volume" for m in mounts - volumes]
    return found


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder: a 64-head export (wide/ckpt/step-3: TP 64 on a trn2.48xlarge), a 4-head one
    (small/ckpt/step-3), a base (assets/base) and adapters (lora/hf/step-2 of rank 8, lora4's of rank 4)."""
    from tests.ckpt_fixtures import make_case
    from tests.lora_fixtures import make_adapter, make_base
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    root = tmp_path_factory.mktemp("project")
    wide, wide_assets, _ = make_case(root / "wide", architectures=QWEN3, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=4)
    complete_export(wide / "step-3", wide_assets, CardInfo(base_model="Qwen/Qwen3-32B", backend="native", steps=3))
    small, small_assets, _ = make_case(root / "small", architectures=QWEN3)
    complete_export(small / "step-3", small_assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    base = make_base(root / "assets" / "base", tokenizer=True, architectures=QWEN3)
    make_adapter(root / "lora" / "hf" / "step-2", base, rank=8)
    make_adapter(root / "lora4" / "hf" / "step-2", base, rank=4)
    return root


def _manifest(cli, monkeypatch, project: Path, *args: str) -> tuple[list[dict], dict]:
    monkeypatch.chdir(project)
    r = cli("serve", *args, "--image", IMAGE, "--json")
    assert r.code == 0, r.text
    info = json.loads(r.out)
    docs = list(yaml.safe_load_all(Path(info["manifest"]).read_text()))
    return docs, info


def test_whole_model_manifest_is_valid_and_runs_the_planned_vllm_command(cli, monkeypatch, project):
    docs, info = _manifest(cli, monkeypatch, project, "wide/ckpt/step-3", "--k8s", "out/serve.yaml", "--port", "8080")
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] and info["kinds"] == ["Deployment", "Service"]
    for doc in docs:
        assert problems(doc) == [], problems(doc)
    deployment, service = docs
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = container["command"]
    flag = dict(zip(argv, argv[1:]))
    assert argv[:3] == ["vllm", "serve", "/shared/wide/ckpt/step-3"]  # the export, on the shared volume
    assert flag["--host"] == "0.0.0.0" and flag["--port"] == "8080"
    assert flag["--tensor-parallel-size"] == "64" and flag["--max-model-len"] == "128"  # what serve --engine vllm plans
    assert container["image"] == IMAGE
    assert container["resources"]["limits"] == {"aws.amazon.com/neuron": "16"}  # 64 logical cores = a whole trn2.48xlarge
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/shared", "/dev/shm"}
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "trnqwen-shared"}} in pod["volumes"]
    assert {"name": "VLLM_CACHE_ROOT", "value": "/shared/.trnqwen/neff-cache/vllm"} in container["env"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800
    assert pod["tolerations"][0]["key"] == "aws.amazon.com/neuron"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert info["apply"] == f"kubectl apply -f {info['manifest']}" and info["model"] == "/shared/wide/ckpt/step-3"
    assert info["port_forward"].startswith(f"kubectl port-forward service/{service['metadata']['name']} 8080:8080")
    assert Path(info["manifest"]) == project / "out" / "serve.yaml"


def test_adapter_manifest_serves_it_on_its_base_from_the_volume(cli, monkeypatch, project):
    docs, info = _manifest(cli, monkeypatch, project, "lora/hf/step-2", "--base", "assets/base", "--k8s", "manifests")
    assert Path(info["manifest"]) == project / "manifests" / "serve.yaml"  # a folder: serve.yaml in it
    for doc in docs:
        assert problems(doc) == [], problems(doc)
    argv = docs[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    flag = dict(zip(argv, argv[1:]))
    assert argv[2] == "/shared/assets/base" and flag["--max-lora-rank"] == "8"
    assert flag["--lora-modules"] == f"{info['model']}=/shared/lora/hf/step-2"
    assert flag["--tensor-parallel-size"] == "4"  # 4 heads
    assert docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {"aws.amazon.com/neuron": "1"}


def test_the_checks_catch_what_the_api_server_would_refuse(cli, monkeypatch, project):
    import copy

    docs, _ = _manifest(cli, monkeypatch, project, "small/ckpt/step-3", "--k8s", "bad.yaml")
    deployment, service = docs
    cases = [
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}), "readinesProbe"),
        (lambda d: d["spec"].update(replicas="one"), "replicas"),
        (lambda d: d["spec"]["selector"]["matchLabels"].update(extra="x"), "does not match"),
        (lambda d: d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            {"aws.amazon.com/neuron": "2"}), "requests equal to limits"),
        (lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"].update(port="web"),
         "does not declare"),
        (lambda d: d["metadata"].update(name="Serve_Model"), "DNS-1035"),
    ]
    for mutate, says in cases:
        doc = copy.deepcopy(deployment)
        mutate(doc)
        assert any(says in p for p in problems(doc)), (says, problems(doc))
    bad = copy.deepcopy(service)
    bad["spec"]["ports"][0]["port"] = "eighty"
    assert any("/spec/ports/0/port" in p for p in problems(bad))


def test_k8s_mistakes_are_one_line(cli, monkeypatch, project):
    monkeypatch.chdir(project)
    r = cli("serve", "small/ckpt/step-3", "--k8s", "x.yaml")
    assert_clean_error(r, code=2, contains="--k8s needs the container image")
    r = cli("serve", "small/ckpt/step-3", "--k8s", "x.yaml", "--image", IMAGE, "--engine", "transformers")
    assert_clean_error(r, code=2, contains="--k8s writes the vLLM Neuron server's manifest")
    r = cli("serve", "lora4/hf/step-2", "--base", "assets/base", "--k8s", "x.yaml", "--image", IMAGE)
    assert_clean_error(r, code=1, contains="LoRA rank 4 is not one vLLM accepts")
    assert not (project / "x.yaml").exists()
