"""``trnqwen push`` (and ``train --push-to-hub``) against the loopback Hub (tests/hubserver.py).

Real exports (a whole tiny Qwen3 completed by the launcher's own ``complete_export``, a PEFT
adapter written by ``contract.peft_adapter``) are pushed by ``python -m trnqwen push`` as a real
subprocess with HF_ENDPOINT and HF_TOKEN set, as a user would; huggingface_hub's LFS protocol
is the one used (HF_HUB_DISABLE_XET=1: the loopback serves no Xet store).  What was pushed is
fetched back with ``trnqwen fetch`` and compared byte for byte.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error, run_subprocess
from tests.hubserver import HubServer

TOKEN = "hf_PushTokenNeverPrinted0123456789"


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """A whole model export, a trained and an untrained LoRA adapter (each with its card and
    tokenizer, as a finished run leaves them), and a model export holding a NaN."""
    import torch

    from tests.ckpt_fixtures import make_case, write_export
    from tests.lora_fixtures import make_adapter, make_base
    from trnqwen.ckpt.model_folder import CardInfo, complete_export

    root = tmp_path_factory.mktemp("push")
    ckpt, assets, state = make_case(root / "model", tokenizer=True)
    model = ckpt / "step-3"
    complete_export(model, assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    (model / ".tmp-card.partial").write_text("a write in progress")  # hidden: never pushed
    (model / "sharded").mkdir()
    (model / "sharded" / "rank0.distcp").write_bytes(b"per-rank piece")  # torchtitan's: never pushed
    base = make_base(root / "base", tokenizer=True)
    out = {"model": model, "base": base}
    for name, trained in (("adapter", True), ("untrained", False)):
        adapter = make_adapter(root / name / "hf" / "step-2", base, rank=4, trained=trained)
        complete_export(adapter, base, CardInfo(base_model=str(base), backend="hf-v5", steps=2))
        out[name] = adapter
    bad = dict(state)
    key = next(k for k in bad if k.endswith("q_proj.weight"))
    bad[key] = bad[key].clone()
    bad[key][0, 0] = math.nan  # a run that diverged
    nan_export = write_export(root / "nan" / "step-3", bad)
    complete_export(nan_export, assets, CardInfo(base_model="Qwen/Qwen3-0.6B", backend="native", steps=3))
    out["nan"] = nan_export
    assert torch.isnan(bad[key]).any()
    return out


@pytest.fixture
def hub():
    server = HubServer()
    server.valid_tokens.add(TOKEN)
    with server:
        yield server


def _env(hub: HubServer, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "5", **extra}


def push(hub: HubServer, *args: str, env: dict | None = None, cwd: Path | None = None):
    return run_subprocess("push", *args, env={**_env(hub), **(env or {})}, cwd=cwd, timeout=300)


def _writes(hub: HubServer) -> list[dict]:
    return [r for r in hub.requests if r["method"] in ("POST", "PUT")]


def _pushed_files(folder: Path) -> dict[str, bytes]:
    """What a push of ``folder`` must upload: every file but hidden ones and ``sharded/``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and not rel.as_posix().startswith((".", "sharded/")):
            out[rel.as_posix()] = p.read_bytes()
    return out


def _files_with(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


def test_a_model_and_an_adapter_are_pushed_fetched_back_byte_equal_and_the_token_is_never_shown(
        exports, hub, tmp_path, isolated_env):
    outputs = []
    r = push(hub, str(exports["model"]), "--repo", "me/tiny-qwen3-ft", "--json", cwd=tmp_path)
    outputs.append(r.text)
    assert r.code == 0, r.text
    assert r.err.strip() == "", r.err  # --json: the object on stdout, nothing else
    doc = json.loads(r.out)
    want = _pushed_files(exports["model"])
    assert len(want) == sum(1 for p in exports["model"].rglob("*") if p.is_file()) - 2
    assert "README.md" in want and "config.json" in want and "tokenizer.json" in want  # the card travels with it
    assert doc["ok"] and doc["repo"] == "me/tiny-qwen3-ft" and doc["revision"] == "main" and doc["kind"] == "model"
    assert sorted(doc["files"]) == sorted(want) and doc["bytes"] == sum(map(len, want.values()))
    assert doc["commit_url"].endswith(doc["commit"]) and hub.repos["me/tiny-qwen3-ft"].refs["main"] == doc["commit"]
    assert hub.files_of("me/tiny-qwen3-ft") == want

    # the adapter: a private repo, on a branch that does not exist yet, the human output
    r = push(hub, str(exports["adapter"]), "--repo", "me/tiny-qwen3-lora", "--private", "--revision", "v1", cwd=tmp_path)
    outputs.append(r.text)
    assert r.code == 0, r.text
    adapter = _pushed_files(exports["adapter"])
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(adapter)
    assert "pushed" in r.out and "me/tiny-qwen3-lora" in r.out and "@ v1" in r.out
    assert hub.repos["me/tiny-qwen3-lora"].private
    assert hub.files_of("me/tiny-qwen3-lora", "v1") == adapter and hub.files_of("me/tiny-qwen3-lora", "main") == {}
    assert all(entry["auth"] for entry in _writes(hub) if "/lfs-upload/" not in entry["path"] or "verify" in entry["path"])

    # fetched back (the private repo with the token), every file byte-equal and verified by fetch
    for repo, revision, folder in (("me/tiny-qwen3-ft", "main", exports["model"]), ("me/tiny-qwen3-lora", "v1", exports["adapter"])):
        dest = tmp_path / "fetched" / repo.split("/")[1]
        r = run_subprocess("fetch", repo, "--revision", revision, "--local-dir", str(dest), "--include", "*", "--json",
                           env=_env(hub), cwd=tmp_path, timeout=300)
        outputs.append(r.text)
        assert r.code == 0, r.text
        assert json.loads(r.out)["verified"]
        assert {name: (dest / name).read_bytes() for name in _pushed_files(folder)} == _pushed_files(folder)

    # the token: in no output, no file written here, under HOME or in the exports
    assert all(TOKEN not in text for text in outputs)
    for root in (tmp_path, isolated_env, exports["model"].parent.parent.parent):
        assert _files_with(root, TOKEN.encode()) == []


def test_a_rejected_token_is_one_line_and_never_printed(exports, hub, tmp_path):
    wrong = "hf_WrongTokenAlsoNeverPrinted98765"
    r = push(hub, str(exports["model"]), "--repo", "me/x", env={"HF_TOKEN": wrong}, cwd=tmp_path)
    assert_clean_error(r, code=3, contains="rejected the access token")
    assert wrong not in r.text and "me/x" not in hub.repos
    r = push(hub, str(exports["model"]), "--repo", "me/x", "--json", env={"HF_TOKEN": wrong}, cwd=tmp_path)
    assert r.code == 3 and wrong not in r.text and json.loads(r.out)["ok"] is False


def test_no_token_or_offline_is_refused_before_anything_is_sent(exports, hub, tmp_path):
    r = push(hub, str(exports["model"]), "--repo", "me/x", env={"HF_TOKEN": ""}, cwd=tmp_path)
    assert_clean_error(r, code=3, contains="HF_TOKEN")
    r = push(hub, str(exports["model"]), "--repo", "me/x", env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert_clean_error(r, code=3, contains="HF_HUB_OFFLINE")
    assert _writes(hub) == []


@pytest.mark.parametrize("name, says", [("nan", "failed verification"), ("untrained", "untrained")])
def test_an_export_that_fails_verification_or_an_untrained_adapter_is_not_pushed(exports, hub, tmp_path, name, says):
    r = push(hub, str(exports[name]), "--repo", "me/refused", cwd=tmp_path)
    assert_clean_error(r, code=1, contains=says)
    errors = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(exports[name]) in errors[0], r.err
    assert "verify-ckpt" in r.err  # the next step
    assert _writes(hub) == [] and "me/refused" not in hub.repos


@pytest.mark.parametrize("repo", ["no-owner", "a/b/c", "-bad/name", "me/has space", "me/"])
def test_a_bad_repo_is_exit_2_in_one_line(cli, repo):
    r = cli("push", "--repo", repo)
    assert_clean_error(r, code=2, contains="OWNER/NAME")
    assert [line for line in r.err.splitlines() if line.startswith("Error:")] == [r.err.splitlines()[0]]


def test_train_push_to_hub_checks_the_repo_before_the_run_and_refuses_a_scheduler(cli, tmp_path, in_tmp):
    r = cli("train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--finetune", "--push-to-hub", "nope", "--dry-run")
    assert_clean_error(r, code=2, contains="--push-to-hub 'nope'")
    r = cli("train", "--model", "builtin:tiny-qwen3", "--finetune", "--launcher", "slurm", "--push-to-hub", "me/x", "--dry-run")
    assert_clean_error(r, code=2, contains="trnqwen push RUN_ID --repo me/x")


@pytest.mark.slow
def test_train_push_to_hub_pushes_the_export_of_a_real_lora_run_and_push_finds_the_run_by_id(hub, tmp_path):
    """torchrun + torchtitan on CPU (1 rank, 2 steps) with --lora --push-to-hub: the adapter the run
    exported is in the repo when train exits; `trnqwen push RUN_ID` and `trnqwen push` (the last run)
    find the same export."""
    env = {**_env(hub), "HF_HUB_OFFLINE": "1"}  # builtin:tiny-qwen3 is written offline
    assert run_subprocess("fetch", "builtin:tiny-qwen3", cwd=tmp_path, env=env, timeout=300).code == 0
    run = run_subprocess(
        "train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "1", "--steps", "2",
        "--seq-len", "128", "--finetune", "--lora", "--lr", "1e-2", "--push-to-hub", "me/e2e-lora", "--json",
        cwd=tmp_path, env=_env(hub), timeout=900,
    )
    assert run.code == 0, run.text[-4000:]
    doc = json.loads(run.out)
    exported = Path(doc["exported"])
    assert doc["pushed"]["repo"] == "me/e2e-lora" and doc["pushed"]["kind"] == "adapter"
    assert Path(doc["pushed"]["folder"]) == exported
    assert hub.files_of("me/e2e-lora") == _pushed_files(exported)
    assert TOKEN not in run.text and _files_with(tmp_path, TOKEN.encode()) == []

    for args in ((doc["run_id"],), ()):
        r = push(hub, *args, "--repo", "me/e2e-again", "--json", cwd=tmp_path)
        assert r.code == 0, r.text
        assert Path(json.loads(r.out)["folder"]) == exported
