"""The data a run names reaches its Kubernetes pods: every local dataset of a [[datasets]] mixture
(and --dataset, --val-dataset, a --chat-template file) is placed on the shared volume the way
--dataset is, and the settings travel in TRNQWEN_* variables that the pods resolve back to the
same config (tables as JSON, mappings as their flags write them)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_clean_error
from trnqwen.config import RunConfig, resolve_config
from trnqwen.errors import UsageError
from trnqwen.train import k8s, k8s_pod, k8s_pytorchjob, k8s_trainjob

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trnqwen:0.1"
SHAREGPT = {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
            "roles": {"user": ["human"], "assistant": ["gpt", "bot"]}}


def _envs(doc) -> list[dict[str, str]]:
    """Every container env of a manifest document, by name (values only)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("env"), list):
                found.append({e["name"]: e["value"] for e in node["env"] if "value" in e})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


def _run_env(docs) -> dict[str, str]:
    envs = [env for doc in docs for env in _envs(doc) if "TRNQWEN_NNODES" in env or "TRNQWEN_RDZV_ID" in env]
    assert envs, "no container carries the run settings"
    return {k: v for k, v in envs[0].items() if k.startswith("TRNQWEN_")}


def _mixture(tmp_path) -> RunConfig:
    return RunConfig(
        image=IMAGE, finetune=True, nnodes=2,
        datasets=[
            {"path": "data/task.jsonl", "weight": 3, **SHAREGPT},
            {"path": str(tmp_path / "general"), "weight": 1, "val_split": 0.05},
            {"path": "org/safety-chat", "weight": 1, "split": "train", "type": "chat_template"},
        ],
        val_dataset="data/val.jsonl", chat_template="templates/mine.jinja",
    )


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_every_dataset_of_a_mixture_is_placed_on_the_volume_and_resolves_in_the_pods(tmp_path, api):
    cfg = _mixture(tmp_path).model_copy(update={"k8s_api": api})
    docs = (k8s_trainjob.manifests(cfg, run_id="r1") if api == "trainjob"
            else [k8s_pytorchjob.manifest(cfg, run_id="r1")])
    env = _run_env(docs)
    tables = json.loads(env["TRNQWEN_DATASETS"])
    assert [t["path"] for t in tables] == ["/shared/data/task.jsonl", str(tmp_path / "general"), "org/safety-chat"]
    assert env["TRNQWEN_VAL_DATASET"] == "/shared/data/val.jsonl"
    assert env["TRNQWEN_CHAT_TEMPLATE"] == "/shared/templates/mine.jinja"
    # a pod resolves the variables alone (no trnqwen.toml there) to the same mixture, mappings and all
    pod = resolve_config(environ=env).config
    assert [e.path for e in pod.datasets] == [t["path"] for t in tables]
    for theirs, ours in zip(pod.datasets, cfg.datasets):
        assert theirs.model_dump(exclude={"path"}) == ours.model_dump(exclude={"path"})


def test_one_datasets_flat_mapping_resolves_in_the_pods():
    cfg = RunConfig(image=IMAGE, finetune=True, dataset="chats.jsonl", remove_columns=["id", "url"], **SHAREGPT)
    env = _run_env(k8s_trainjob.manifests(cfg, run_id="r1"))
    assert env["TRNQWEN_DATASET"] == "/shared/chats.jsonl"
    assert env["TRNQWEN_ROLES"] == "user=human,assistant=gpt,assistant=bot"
    pod = resolve_config(environ=env).config
    assert (pod.roles, pod.message_property_mappings, pod.remove_columns) == (SHAREGPT["roles"],
                                                                            SHAREGPT["message_property_mappings"], ["id", "url"])


def test_hub_names_and_builtin_templates_are_not_paths():
    cfg = RunConfig(image=IMAGE, finetune=True, dataset="org/name", chat_template="chatml")
    placed = k8s_pod.pod_paths(cfg)
    assert "dataset" not in placed and "chat_template" not in placed and k8s_pod.data_notes(cfg) == []


def test_a_file_in_this_machines_home_cannot_reach_the_pods():
    cfg = RunConfig(image=IMAGE, finetune=True, datasets=[{"path": "~/chats.jsonl", "weight": 1}])
    with pytest.raises(UsageError, match="home folder, which the pods do not see") as caught:
        k8s_trainjob.manifests(cfg, run_id="r1")
    assert "copy it onto the shared volume" in caught.value.hint


def test_the_launch_notes_say_where_the_pods_read_the_data(tmp_path):
    info = k8s.launch(_mixture(tmp_path).model_copy(update={"runs_dir": tmp_path / "runs"}), dry_run=True,
                      cwd=tmp_path, run_id="r1")
    note = next(n for n in info["notes"] if "the pods read the run's data" in n)
    assert "/shared/data/task.jsonl" in note and str(tmp_path / "general") in note and "org/safety-chat" not in note


def test_cli_dry_run_carries_the_tables_of_trnqwen_toml(cli, in_tmp):
    import yaml

    (in_tmp / "trnqwen.toml").write_text(
        '[[datasets]]\npath = "data/a.jsonl"\nweight = 3\nfield_messages = "conversations"\n\n'
        '[[datasets]]\npath = "data/b.jsonl"\nweight = 1\n')
    r = cli("train", "--launcher", "k8s", "--image", IMAGE, "--finetune", "--dry-run")
    assert r.code == 0, r.text
    env = _run_env(list(yaml.safe_load_all(r.out)))
    assert [(t["path"], t["weight"]) for t in json.loads(env["TRNQWEN_DATASETS"])] == [
        ("/shared/data/a.jsonl", 3.0), ("/shared/data/b.jsonl", 1.0)]
    (in_tmp / "trnqwen.toml").write_text('[[datasets]]\npath = "~/a.jsonl"\nweight = 1\n')
    assert_clean_error(cli("train", "--launcher", "k8s", "--image", IMAGE, "--finetune", "--dry-run"), code=2,
                       contains="home folder")
