"""``trnqwen fetch`` against a real Hub-compatible HTTP server on loopback.

The server (tests/hubserver.py) serves repos from local files with the Hub's API, headers,
error codes and HTTP Range; ``trnqwen fetch`` runs as a real subprocess with HF_ENDPOINT
pointing at it, so huggingface_hub reads its constants the way it does for users.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import TRNQWEN, REPO_ROOT, assert_clean_error, run_subprocess
from tests.hubserver import HubServer

REPO = "Qwen/Qwen3-Mini"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
EXPECTED_DEFAULT = sorted(
    [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        SHARD1,
        SHARD2,
    ]
)


def _safetensors(tensors: dict) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "pt"})


def _qwen_files(model_type: str = "qwen3", seed: int = 0, ctx: int = 2048) -> dict[str, bytes]:
    """A small Qwen3-shaped repo: two shards (~600 KB), index, config, tokenizer, and the files
    the default allow-list must skip (.bin, original/, README)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    s1 = {
        "model.embed_tokens.weight": rng.standard_normal((256, 256)).astype(np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(256, np.float32),
    }
    s2 = {
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((256, 320)).astype(np.float32),
        "model.norm.weight": np.ones(256, np.float32),
    }
    index = {"metadata": {}, "weight_map": {**{k: SHARD1 for k in s1}, **{k: SHARD2 for k in s2}}}
    config = {"model_type": model_type, "architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": ctx}
    return {
        "config.json": json.dumps(config).encode(),
        "generation_config.json": b'{"do_sample": true}',
        "tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}}}).encode(),
        "tokenizer_config.json": b'{"eos_token": "<|im_end|>"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        SHARD1: _safetensors(s1),
        SHARD2: _safetensors(s2),
        "pytorch_model.bin": b"\x80\x02pickle" * 100,
        "original/consolidated.safetensors": _safetensors({"x": np.zeros(4, np.float32)}),
        "README.md": b"# mini\n",
    }


@pytest.fixture(scope="module")
def repo_files() -> dict[str, dict[str, bytes]]:
    main = _qwen_files()
    v1 = _qwen_files(seed=1, ctx=1024)
    bad_index = _qwen_files()
    idx = json.loads(bad_index["model.safetensors.index.json"])
    idx["weight_map"]["model.layers.9.self_attn.q_proj.weight"] = SHARD2
    bad_index["model.safetensors.index.json"] = json.dumps(idx).encode()
    return {
        "main": main,
        "v1.0": v1,
        "llama": _qwen_files(model_type="llama"),
        "bad_index": bad_index,
    }


BIG = "Qwen/Qwen3-Big"
BIG_SHARD = "model-00001-of-00001.safetensors"
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes downloads in 10 MiB chunks: what a resume starts from


@pytest.fixture(scope="module")
def big_files() -> dict[str, bytes]:
    """One 24 MiB shard: big enough that huggingface_hub has written whole chunks before a drop."""
    import numpy as np

    weight = np.random.default_rng(7).standard_normal((6 * 1024, 1024)).astype(np.float32)
    return {
        "config.json": b'{"model_type": "qwen3"}',
        "tokenizer.json": b"{}",
        BIG_SHARD: _safetensors({"model.embed_tokens.weight": weight}),
    }


@pytest.fixture
def hub(repo_files, big_files):
    server = HubServer()
    server.add_repo(BIG, big_files)
    server.add_repo(REPO, repo_files["main"])
    server.add_repo(REPO, repo_files["v1.0"], revision="v1.0")
    server.add_repo("Acme/NotQwen", repo_files["llama"])
    server.add_repo("Qwen/BadIndex", repo_files["bad_index"])
    server.add_repo("Qwen/Gated", repo_files["main"], gated=True)
    server.add_repo("Evil/Traversal", {**repo_files["main"], "../escape.json": b"{}"})
    server.valid_tokens.add("hf_GoodTokenForTheTestServer1")
    with server:
        yield server


def _env(hub: HubServer, **extra: str) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "5"}
    env.update(extra)
    return env


def fetch(hub: HubServer, *args: str, env: dict | None = None, cwd: Path | None = None):
    return run_subprocess("fetch", *args, env={**_env(hub), **(env or {})}, cwd=cwd, timeout=180)


def fetch_json(hub: HubServer, *args: str, **kw) -> tuple[int, dict, str]:
    r = fetch(hub, *args, "--json", **kw)
    try:
        payload = json.loads(r.out) if r.out.strip() else {}
    except json.JSONDecodeError:
        raise AssertionError(f"stdout is not one JSON object:\n{r.out}\n{r.err}")
    return r.code, payload, r.err


def _resolve_gets(hub: HubServer, since: int = 0) -> list[dict]:
    return [r for r in hub.requests[since:] if r["method"] == "GET" and r.get("api") == "resolve"]


# --- downloads ---------------------------------------------------------------------------------


def test_full_download_default_allow_list_and_json(hub, repo_files, tmp_path):
    dest = tmp_path / "snap"
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 0, err
    assert {"local_dir", "revision", "files", "bytes", "verified", "problems"} <= set(out)
    assert out["verified"] is True and out["problems"] == []
    assert sorted(out["files"]) == EXPECTED_DEFAULT  # no .bin, no original/, no README
    assert out["commit"] == hub.repos[REPO].refs["main"]
    assert out["bytes"] == sum(len(repo_files["main"][f]) for f in EXPECTED_DEFAULT)
    for name in EXPECTED_DEFAULT:
        assert (dest / name).read_bytes() == repo_files["main"][name]
    assert not (dest / "pytorch_model.bin").exists() and not (dest / "original").exists()
    assert sorted(r["file"] for r in _resolve_gets(hub)) == EXPECTED_DEFAULT


def test_complete_snapshot_is_verified_not_downloaded_again(hub, tmp_path):
    dest = tmp_path / "snap"
    assert fetch_json(hub, REPO, "--local-dir", str(dest))[0] == 0
    mark = len(hub.requests)
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 0, err
    assert out["verified"] and out["to_download"] == [] and out["downloaded_bytes"] == 0
    assert _resolve_gets(hub, mark) == []

    from trnqwen.assets import read_manifest

    manifest = read_manifest(dest)  # the record base_identity and a rerun read
    assert manifest["verified"] and manifest["repo_id"] == REPO and manifest["commit"] == out["commit"]
    (dest / SHARD2).unlink()
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 0 and out["verified"] and out["to_download"] == [SHARD2], err


def test_default_local_dir_is_where_train_looks(hub, tmp_path):
    r = fetch(hub, REPO, "--no-progress", cwd=tmp_path)
    assert r.code == 0, r.text
    assert (tmp_path / "assets" / "hf" / "Qwen3-Mini" / "config.json").is_file()
    assert "verified" in r.out  # the verdict is the result: stdout (issue 18)


def test_include_and_exclude(hub, tmp_path):
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(tmp_path / "a"), "--include", "*.json")
    assert code == 0
    assert sorted(out["files"]) == sorted(f for f in EXPECTED_DEFAULT if f.endswith(".json"))
    # the index names shards that were not asked for: a warning, not a problem
    assert any(SHARD1 in w and "left out" in w for w in out["warnings"])
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(tmp_path / "b"), "--exclude", "tokenizer*")
    assert code == 0, out
    assert sorted(out["files"]) == sorted(f for f in EXPECTED_DEFAULT if not f.startswith("tokenizer"))
    assert any("tokenizer" in w for w in out["warnings"])
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(tmp_path / "c"), "--include", "*.bin", "--include", "config.json")
    assert sorted(out["files"]) == ["config.json", "pytorch_model.bin"]  # --include replaces the defaults
    r = fetch(hub, REPO, "--local-dir", str(tmp_path / "d"), "--include", "*.nothing")
    assert_clean_error(r, code=2, contains="no files")


def test_revision(hub, repo_files, tmp_path):
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(tmp_path / "v1"), "--revision", "v1.0")
    assert code == 0
    assert out["commit"] == hub.repos[REPO].refs["v1.0"] != hub.repos[REPO].refs["main"]
    assert json.loads((tmp_path / "v1" / "config.json").read_text())["max_position_embeddings"] == 1024
    assert (tmp_path / "v1" / SHARD1).read_bytes() == repo_files["v1.0"][SHARD1]
    r = fetch(hub, REPO, "--local-dir", str(tmp_path / "x"), "--revision", "no-such-branch")
    assert_clean_error(r, code=2, contains="revision 'no-such-branch' not found")


def test_switching_revision_replaces_the_previous_files(hub, repo_files, tmp_path):
    dest = tmp_path / "s"
    assert fetch_json(hub, REPO, "--local-dir", str(dest))[0] == 0
    (dest / "my-notes.safetensors").write_bytes(b"not ours")
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(dest), "--revision", "v1.0", "--exclude", SHARD2)
    assert code == 0 and out["verified"]
    assert not (dest / SHARD2).exists()  # the previous revision's shard is gone
    assert (dest / "my-notes.safetensors").read_bytes() == b"not ours"  # not ours to delete
    assert any("previously fetched revision" in w for w in out["warnings"])
    assert any("my-notes.safetensors" in w for w in out["warnings"])
    assert (dest / SHARD1).read_bytes() == repo_files["v1.0"][SHARD1]


def test_narrower_include_on_the_same_revision_keeps_the_other_files(hub, tmp_path):
    dest = tmp_path / "s"
    assert fetch_json(hub, REPO, "--local-dir", str(dest))[0] == 0
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(dest), "--include", "config.json")
    assert code == 0 and out["files"] == ["config.json"]
    assert (dest / SHARD1).is_file() and (dest / SHARD2).is_file()


def test_dry_run_writes_nothing(hub, tmp_path):
    dest = tmp_path / "never"
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(dest), "--dry-run")
    assert code == 0
    assert out["dry_run"] is True and out["verified"] is False
    assert sorted(out["to_download"]) == EXPECTED_DEFAULT
    assert out["bytes"] == sum(out["sizes"].values())
    assert not dest.exists()
    assert _resolve_gets(hub) == []
    r = fetch(hub, REPO, "--local-dir", str(dest), "--dry-run")
    assert r.code == 0 and SHARD1 in r.out and "nothing written" in r.out  # the dry-run verdict: stdout (issue 18)


# --- interruptions and corruption ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fin", "rst"])
def test_connection_dropped_mid_file_is_resumed_with_range(hub, big_files, tmp_path, mode):
    """fin (short body): huggingface_hub resumes by itself with HTTP Range from the last whole
    10 MiB chunk; rst (connection reset, which huggingface_hub does not retry): trnqwen's next
    pass fetches that file again, in the same run."""
    hub.drop[BIG_SHARD] = (CHUNK + CHUNK // 2, 1, mode)
    code, out, err = fetch_json(hub, BIG, "--local-dir", str(tmp_path / "s"))
    assert code == 0, err
    assert out["verified"]
    gets = hub.downloads_of(BIG_SHARD)
    if mode == "fin":
        assert [g["range"] for g in gets] == [None, f"bytes={CHUNK}-"]
    else:
        assert [g["range"] for g in gets] == [None, None]
        assert "connection lost" in err
    assert (tmp_path / "s" / BIG_SHARD).read_bytes() == big_files[BIG_SHARD]


def test_failed_download_never_reports_success_and_rerun_completes(hub, big_files, tmp_path):
    dest = tmp_path / "s"
    hub.drop[BIG_SHARD] = (CHUNK + 4096, 100, "rst")  # the server keeps resetting: retries give up
    r = fetch(hub, BIG, "--local-dir", str(dest))
    assert_clean_error(r, code=3, contains="the same command again resumes")
    assert not (dest / BIG_SHARD).exists()
    manifest = dest / ".cache" / "trnqwen" / "fetch.json"
    assert not manifest.exists() or json.loads(manifest.read_text())["verified"] is False
    hub.reset_faults()
    mark = len(hub.requests)
    code, out, err = fetch_json(hub, BIG, "--local-dir", str(dest))
    assert code == 0 and out["verified"], err
    assert out["to_download"] == [BIG_SHARD]  # the files that arrived are not fetched again
    assert [g["file"] for g in _resolve_gets(hub, mark)] == [BIG_SHARD]
    assert (dest / BIG_SHARD).read_bytes() == big_files[BIG_SHARD]


def test_killed_fetch_then_rerun_completes(hub, big_files, tmp_path):
    """A fetch killed mid-file (SIGKILL: no clean-up ran): the rerun drops the stale partial
    file, keeps the files that were complete, fetches the rest and verifies."""
    dest = tmp_path / "s"
    hub.stall[BIG_SHARD] = CHUNK + CHUNK // 2
    env = {**os.environ, **_env(hub), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([*TRNQWEN, "fetch", BIG, "--local-dir", str(dest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        partial = []
        while time.time() < deadline and proc.poll() is None:
            if (dest / ".cache").is_dir() and (dest / "config.json").is_file():
                partial = [p for p in (dest / ".cache").rglob("*.incomplete") if p.stat().st_size >= CHUNK]
            if partial:
                break
            time.sleep(0.1)
        assert partial, "the download never reached the stall point"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        hub.reset_faults()
        hub.release()
    assert proc.returncode != 0
    assert not (dest / BIG_SHARD).exists()
    mark = len(hub.requests)
    code, out, err = fetch_json(hub, BIG, "--local-dir", str(dest))
    assert code == 0 and out["verified"], err
    assert out["to_download"] == [BIG_SHARD]
    assert [g["file"] for g in _resolve_gets(hub, mark)] == [BIG_SHARD]
    assert (dest / BIG_SHARD).read_bytes() == big_files[BIG_SHARD]
    assert not list((dest / ".cache").rglob("*.incomplete"))


def test_corrupted_local_file_detected_and_repaired(hub, repo_files, tmp_path):
    dest = tmp_path / "s"
    assert fetch_json(hub, REPO, "--local-dir", str(dest))[0] == 0
    data = bytearray((dest / SHARD2).read_bytes())
    data[-1] ^= 0x01  # same size, different bytes
    (dest / SHARD2).write_bytes(bytes(data))
    mark = len(hub.requests)
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 0, err
    assert out["repaired"] == [SHARD2] and out["to_download"] == [SHARD2] and out["verified"]
    assert [g["file"] for g in _resolve_gets(hub, mark)] == [SHARD2]
    assert (dest / SHARD2).read_bytes() == repo_files["main"][SHARD2]


def test_corrupted_download_is_reported_not_verified(hub, tmp_path):
    dest = tmp_path / "s"
    hub.corrupt.add(SHARD1)
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 1
    assert out["verified"] is False
    assert any(SHARD1 in p and "corrupted" in p for p in out["problems"]), out["problems"]
    assert "Traceback" not in err
    hub.corrupt.clear()
    code, out, _ = fetch_json(hub, REPO, "--local-dir", str(dest))
    assert code == 0 and out["verified"] and out["repaired"] == [SHARD1]


def test_index_naming_a_missing_tensor_is_a_problem(hub, tmp_path):
    code, out, _ = fetch_json(hub, "Qwen/BadIndex", "--local-dir", str(tmp_path / "s"))
    assert code == 1 and out["verified"] is False
    assert any("model.layers.9.self_attn.q_proj.weight" in p for p in out["problems"])


def test_not_a_qwen3_model_warns(hub, tmp_path):
    code, out, _ = fetch_json(hub, "Acme/NotQwen", "--local-dir", str(tmp_path / "s"))
    assert code == 0 and out["verified"]
    assert any("'llama'" in w and "Qwen3" in w for w in out["warnings"])


# --- errors: one clear line each ------------------------------------------------------------------------


def test_missing_repo(hub, tmp_path):
    r = fetch(hub, "Qwen/DoesNotExist", "--local-dir", str(tmp_path / "s"))
    assert_clean_error(r, code=2, contains="repo Qwen/DoesNotExist not found")
    assert "hf auth login" in r.err
    assert not (tmp_path / "s").exists()


def test_gated_repo(hub, tmp_path):
    r = fetch(hub, "Qwen/Gated", "--local-dir", str(tmp_path / "s"))
    assert_clean_error(r, code=3, contains="gated")
    assert "accept its terms" in r.err


def test_good_token_opens_gated_repo(hub, tmp_path):
    token = "hf_GoodTokenForTheTestServer1"
    code, out, err = fetch_json(hub, "Qwen/Gated", "--local-dir", str(tmp_path / "s"), env={"HF_TOKEN": token})
    assert code == 0 and out["verified"], err
    assert token not in err and token not in json.dumps(out)


def test_bad_token_is_reported_and_never_printed(hub, tmp_path):
    token = "hf_ThisTokenIsWrong1234567890"
    r = fetch(hub, REPO, "--local-dir", str(tmp_path / "s"), env={"HF_TOKEN": token})
    assert_clean_error(r, code=3, contains="rejected the access token")
    assert token not in r.text
    assert "ThisTokenIsWrong" not in r.text


def test_network_unreachable(hub, tmp_path):
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "HF_HUB_ETAG_TIMEOUT": "2"}
    r = run_subprocess("fetch", REPO, "--local-dir", str(tmp_path / "s"), env=dead)
    assert_clean_error(r, code=3, contains="cannot reach http://127.0.0.1:9")
    assert "HTTPS_PROXY" in r.err
    assert not (tmp_path / "s").exists()
    # a snapshot fetched earlier is still usable without the Hub (checked, not downloaded)
    assert fetch_json(hub, REPO, "--local-dir", str(tmp_path / "s"))[0] == 0
    r = run_subprocess("fetch", REPO, "--local-dir", str(tmp_path / "s"), "--json", env=dead)
    assert r.code == 0, r.text
    out = json.loads(r.out)
    assert out["verified"] and any("cannot reach" in w for w in out["warnings"])


def test_offline_mode(hub, tmp_path):
    dest = tmp_path / "s"
    r = fetch(hub, REPO, "--local-dir", str(dest), env={"HF_HUB_OFFLINE": "1"})
    assert_clean_error(r, code=3, contains="HF_HUB_OFFLINE")
    assert hub.requests == []
    assert fetch_json(hub, REPO, "--local-dir", str(dest))[0] == 0
    mark = len(hub.requests)
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest), env={"HF_HUB_OFFLINE": "1"})
    assert code == 0 and out["verified"], err
    assert any("nothing downloaded" in w for w in out["warnings"])
    assert hub.requests[mark:] == []
    (dest / SHARD1).unlink()
    r = fetch(hub, REPO, "--local-dir", str(dest), env={"HF_HUB_OFFLINE": "1"})
    assert_clean_error(r, code=3, contains="not a complete snapshot")


def test_path_traversal_in_hub_names_refused_before_writing(hub, tmp_path):
    dest = tmp_path / "inner" / "s"
    r = fetch(hub, "Evil/Traversal", "--local-dir", str(dest), "--include", "*")
    assert_clean_error(r, code=1, contains="escape the download folder")
    assert not dest.exists() and not (tmp_path / "inner" / "escape.json").exists()
    assert _resolve_gets(hub) == []


def test_disk_space_refused_with_keep_free(hub, tmp_path):
    dest = tmp_path / "s"
    r = fetch(hub, REPO, "--local-dir", str(dest), "--keep-free", "1P")
    assert_clean_error(r, code=3, contains="not enough disk space")
    assert not dest.exists()
    assert _resolve_gets(hub) == []


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs (needs root and mount rights; skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_space_refused_on_a_small_filesystem(hub, small_fs):
    dest = small_fs / "s"
    r = fetch(hub, REPO, "--local-dir", str(dest), "--keep-free", "0")
    assert_clean_error(r, code=3, contains="not enough disk space")
    assert list(small_fs.iterdir()) == []
    # what fits is fetched (the JSON files alone)
    code, out, err = fetch_json(hub, REPO, "--local-dir", str(dest), "--keep-free", "0", "--include", "*.json")
    assert code == 0 and out["verified"], err


# --- pure pieces ---------------------------------------------------------------------------------------------


def test_parse_size():
    from trnqwen.errors import UsageError
    from trnqwen.units import parse_size

    assert parse_size("0") == 0
    assert parse_size("512") == 512
    assert parse_size("1K") == 1024
    assert parse_size("1.5GiB") == int(1.5 * 1024**3)
    assert parse_size("2g") == 2 * 1024**3
    with pytest.raises(UsageError):
        parse_size("lots")


@pytest.mark.parametrize(
    "name", ["../x", "a/../../x", "/etc/passwd", "a\\..\\b", "C:/x", "a//b", "./a", "a/./b", "", "a\0b", "a\nb"]
)
def test_check_repo_path_refuses(name):
    from trnqwen.errors import CheckFailed
    from trnqwen.fetch.plan import check_repo_path

    with pytest.raises(CheckFailed):
        check_repo_path(name)


@pytest.mark.parametrize("name", ["config.json", "sub/dir/model.safetensors", "a..b.json", ".gitattributes"])
def test_check_repo_path_accepts(name):
    from trnqwen.fetch.plan import check_repo_path

    assert check_repo_path(name) == name


def test_default_selection():
    from trnqwen.fetch.plan import RemoteFile, select_files

    names = [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
        "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "pytorch_model.bin",
        "original/model.safetensors", "original/params.json", "README.md", "LICENSE", ".gitattributes",
    ]  # fmt: skip
    chosen = [f.path for f in select_files([RemoteFile(n, 1) for n in names], None, None)]
    assert chosen == sorted(
        ["config.json", "generation_config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]
    )  # fmt: skip


def test_safetensors_header_checks(tmp_path):
    import numpy as np

    from trnqwen.safetensors_format import SafetensorsFormatError, read_header

    good = tmp_path / "good.safetensors"
    good.write_bytes(_safetensors({"w": np.zeros((4, 4), np.float32)}))
    assert set(read_header(good, known_dtypes=False).tensors) >= {"w"}
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(good.read_bytes()[:-8])
    with pytest.raises(SafetensorsFormatError, match="truncated"):
        read_header(truncated, known_dtypes=False)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(SafetensorsFormatError):
        read_header(junk, known_dtypes=False)


def test_tail_hasher_hashes_while_writing_and_only_trusts_the_renamed_inode(tmp_path):
    """The in-flight hash follows an appended .incomplete file the way huggingface_hub writes it."""
    import hashlib

    from trnqwen.fetch.download import TailHasher
    from trnqwen.fetch.plan import RemoteFile

    data = os.urandom(3 * 1024 * 1024 + 17)
    other = os.urandom(1024 * 1024)
    sha, sha_other = hashlib.sha256(data).hexdigest(), hashlib.sha256(other).hexdigest()
    files = [RemoteFile("a.safetensors", len(data), sha256=sha), RemoteFile("b.safetensors", len(other), sha256=sha_other)]
    folder = tmp_path / ".cache" / "huggingface" / "download"
    folder.mkdir(parents=True)
    with TailHasher(tmp_path, files) as hashed:
        part = folder / f"abc123.{sha}.deadbeef.incomplete"
        with open(part, "wb") as fh:
            for i in range(0, len(data), 512 * 1024):
                fh.write(data[i:i + 512 * 1024])
                fh.flush()
                time.sleep(0.02)
        os.replace(part, tmp_path / "a.safetensors")
        # b: rewritten from the start mid-way (a resume the server refused): not trusted
        part_b = folder / f"abc124.{sha_other}.feedface.incomplete"
        part_b.write_bytes(other[:600_000])
        time.sleep(0.3)
        part_b.write_bytes(other)
        os.replace(part_b, tmp_path / "b.safetensors")
    entries = hashed.entries()
    assert entries["a.safetensors"]["sha256"] == sha
    assert entries["a.safetensors"]["size"] == len(data)
    assert "b.safetensors" not in entries or entries["b.safetensors"]["sha256"] == sha_other
    # a file replaced after hashing (another inode) is not vouched for
    (tmp_path / "a.safetensors").unlink()
    (tmp_path / "a.safetensors").write_bytes(data)
    assert "a.safetensors" not in hashed.entries()
