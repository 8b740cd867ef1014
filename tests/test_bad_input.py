"""The bad-input matrix: whatever a user throws at any subcommand gets the right exit code, a
one-line message naming the problem and no traceback; a secret in the environment never shows.

Each command's own tests cover its main paths; this file crosses them: every subcommand with
missing paths, wrong types, out-of-range numbers, unknown choices, contradictory flags, broken
trnqwen.toml files, hostile logs (non-UTF-8, binary, one 2 GB line), symlink loops, files where
folders belong, another model family's config.json, a read-only output folder, and HF_TOKEN set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import mounted_tmpfs, REPO_ROOT, Result, TRNQWEN, run_subprocess

LOGS = REPO_ROOT / "tests" / "data" / "logs"
NATIVE_LOG = LOGS / "real_native_tiny_2ranks_finetune.log"
TINY_CPU = ["--model", "builtin:tiny-qwen3", "--device", "cpu"]


def clean_error(r: Result, code: int, *needles: str) -> None:
    """Exit ``code``, exactly one ``Error:`` line (plus an optional hint), naming the problem."""
    assert r.code == code, f"exit {r.code} != {code}\n{r.text}"
    assert "Traceback" not in r.text, r.text
    assert "internal error" not in r.text, r.text
    errors = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.err
    for needle in needles:
        assert needle.lower() in errors[0].lower(), errors[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("bad-input") / "tiny-qwen3")


@pytest.fixture
def odd_paths(tmp_path) -> dict[str, Path]:
    """A symlink loop, a dangling link, a plain file, an empty folder."""
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "empty").mkdir()
    return {"loop": tmp_path / "loop_a", "dangling": tmp_path / "dangling", "file": tmp_path / "a_file",
            "empty": tmp_path / "empty", "missing": tmp_path / "missing"}


# --- numbers, types, choices --------------------------------------------------------------------

NUMBERS = [
    (["train", "--steps", "-1", "--dry-run"], 2, "steps", ">= 1"),
    (["train", "--steps", "0", "--dry-run"], 2, "steps"),
    (["train", "--steps", "ten", "--dry-run"], 2, "--steps"),
    (["train", "--lr", "fast", "--dry-run"], 2, "--lr"),
    (["train", "--lr", "-0.1", "--dry-run"], 2, "lr"),
    (["train", "--nproc-per-node", "0", "--dry-run"], 2, "nproc_per_node"),
    (["train", "--tp", "0", "--dry-run"], 2, "tp"),
    (["train", "--dp-shard", "0", "--dry-run"], 2, "dp_shard"),
    (["train", "--seq-len", "4", "--dry-run"], 2, "seq_len"),
    (["train", "--local-batch-size", "-2", "--dry-run"], 2, "local_batch_size"),
    (["train", "--top-k", "8", "--num-experts", "4", "--dry-run"], 2, "top_k"),
    (["train", "--backend", "bogus", "--dry-run"], 2, "backend", "bogus"),
    (["train", "--device", "tpu", "--dry-run"], 2, "device", "tpu"),
    (["check-env", "--device", "tpu"], 2, "device"),
    (["config", "show", "--backend", "torchxla"], 2, "backend"),
    (["config", "show", "--steps", "-5"], 2, "steps"),
    (["fetch", "not a repo id!"], 2, "model"),
    (["fetch", "builtin:tiny-qwen3", "--max-workers", "0"], 2, "--max-workers"),
    (["fetch", "builtin:tiny-qwen3", "--keep-free", "lots"], 2, "not a size"),
    (["fetch", "builtin:tiny-qwen3", "--revision", "v2"], 2, "built-in"),
    (["verify-ckpt", ".", "--step", "-3"], 2, "--step"),
    (["verify-ckpt", ".", "--max-new-tokens", "0"], 2, "--max-new-tokens"),
    (["inspect-logs", str(NATIVE_LOG), "--vocab-size", "1"], 2, "--vocab-size"),
    (["inspect-logs", str(NATIVE_LOG), "--expect-layers", "0"], 2, "--expect-layers"),
    (["inspect-logs", str(NATIVE_LOG), "--plot", "loss.txt"], 2, "--plot"),
    (["inspect-logs", "-", "-"], 2, "stdin"),
]


@pytest.mark.parametrize("case", NUMBERS, ids=[" ".join(c[0][:3]) for c in NUMBERS])
def test_wrong_types_out_of_range_and_unknown_choices(cli, in_tmp, case):
    args, code, *needles = case
    clean_error(cli(*args), code, *needles)


def test_env_value_of_the_wrong_type_names_its_source(cli, in_tmp, monkeypatch):
    monkeypatch.setenv("TRNQWEN_STEPS", "many")
    clean_error(cli("config", "show"), 2, "steps", "env TRNQWEN_STEPS")


# --- contradictory flags ----------------------------------------------------------------------------


def test_nki_moe_without_torchtitan_neuron(cli, in_tmp, tiny):
    clean_error(cli("train", *TINY_CPU, "--assets", str(tiny), "--backend", "nki-moe"), 3, "torchtitan-neuron")


def test_finetune_without_assets(cli, in_tmp, odd_paths):
    clean_error(cli("train", *TINY_CPU, "--finetune", "--assets", str(odd_paths["missing"])), 2, "assets", "missing")
    clean_error(cli("train", *TINY_CPU, "--finetune", "--assets", str(odd_paths["empty"])), 2, "assets")


def test_finetune_with_assets_but_no_weights(cli, in_tmp, tiny, tmp_path):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (no_weights / name).write_bytes((tiny / name).read_bytes())
    clean_error(cli("train", *TINY_CPU, "--finetune", "--assets", str(no_weights)), 2, "safetensors")


def test_raw_flags_without_the_separator(cli, in_tmp):
    clean_error(cli("train", *TINY_CPU, "metrics.log_freq", "--dry-run"), 2, "unexpected argument")


def test_global_batch_not_a_multiple(cli, in_tmp, tiny):
    r = cli("train", *TINY_CPU, "--assets", str(tiny), "--nproc-per-node", "2", "--global-batch-size", "3")
    clean_error(r, 2, "global batch 3")


def test_hf_trainer_tensor_parallel_on_cpu_is_refused_before_anything_runs(cli, in_tmp, tiny):
    """accelerate refuses TP for CPU processes (MULTI_CPU); it used to fail inside the ranks."""
    r = cli("train", *TINY_CPU, "--assets", str(tiny), "--backend", "hf-trainer", "--nproc-per-node", "2", "--tp", "2")
    clean_error(r, 2, "--tp 2 cannot run on CPU")
    assert "use --tp 1" in r.err
    assert not (in_tmp / ".trnqwen" / "runs").exists() or not any((in_tmp / ".trnqwen" / "runs").iterdir())


# --- NKI RoPE sequence length on a (fake) Trainium host -------------------------------------------


@pytest.mark.parametrize("lnc, bad, good", [(2, 300, 512), (1, 200, 256)])
def test_nki_rope_seq_len_must_be_a_multiple_of_128_x_lnc(tmp_path, tiny, lnc, bad, good):
    from tests.doubles.neuron import neuron_host

    env = neuron_host(tmp_path, lnc=lnc)
    # The documented example module, where a user keeps it (preflight refuses a module that does
    # not exist, so a made-up name would fail for the wrong reason).
    shutil.copy(REPO_ROOT / "examples" / "nki_rope" / "my_neuron_kernels.py", tmp_path)
    args = ["train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--device", "neuron",
            "--override-imports", "my_neuron_kernels.nki_rope"]
    r = run_subprocess(*args, "--seq-len", str(bad), env=env, cwd=tmp_path)
    clean_error(r, 2, f"seq_len {bad}", f"multiple of {128 * lnc}")
    assert not (tmp_path / ".trnqwen" / "runs").exists() or not any((tmp_path / ".trnqwen" / "runs").glob("*/run.json"))
    ok = run_subprocess(*args, "--seq-len", str(good), "--dry-run", "--json", env=env, cwd=tmp_path)
    assert ok.code == 0, ok.text
    findings = json.loads(ok.out)["preflight"]["findings"]
    assert not [f for f in findings if f["check"] == "seq_len" and f["severity"] != "plan"]  # a plan row, no problem


# --- trnqwen.toml -----------------------------------------------------------------------------------

TOMLS = [
    ("steps = 3\nseq_len = [\n", "TOML syntax error"),
    ("steps = 3\nsteps = 4\n", "TOML syntax error"),
    ("stepz = 3\n", "did you mean 'steps'"),
    ("[run]\nbackend = 'native'\nlearning_rate = 1e-4\n", "unknown key 'learning_rate'"),
    ("steps = 'ten'\n", "steps"),
    ("backend = 'jax'\n", "backend"),
    ("assets_dir = 42\n", "assets_dir"),
]


@pytest.mark.parametrize("text, needle", TOMLS)
@pytest.mark.parametrize("command", [["config", "show"], ["train", "--dry-run"], ["check-env"], ["fetch", "--dry-run"]])
def test_broken_trnqwen_toml_in_the_project(cli, in_tmp, text, needle, command):
    (in_tmp / "trnqwen.toml").write_text(text)
    clean_error(cli(*command), 2, needle)


def test_trnqwen_toml_not_utf8_and_binary(cli, in_tmp):
    (in_tmp / "trnqwen.toml").write_bytes(b"steps = 3\n\xff\xfe\x00\x01")
    clean_error(cli("config", "show"), 2, "not UTF-8")
    (in_tmp / "trnqwen.toml").write_bytes(os.urandom(2048).replace(b"\n", b" ") + b"\x00")
    r = cli("config", "show")
    clean_error(r, 2, "trnqwen.toml")


def test_config_file_flag_pointing_at_odd_things(cli, in_tmp, odd_paths):
    for key in ("missing", "empty", "loop", "dangling"):
        clean_error(cli("config", "show", "--config-file", str(odd_paths[key])), 2, "config file")


# --- paths: missing, loops, files where folders belong -----------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "loop", "dangling"])
def test_missing_and_looping_paths_for_every_reader(cli, in_tmp, odd_paths, tiny, kind):
    p = str(odd_paths[kind])
    word = "no such" if kind == "missing" else "symlink"
    clean_error(cli("verify-ckpt", p), 2, word)
    clean_error(cli("verify-ckpt", str(tiny), "--compare-to", p), 2, word)
    clean_error(cli("inspect-logs", p), 2, word)
    clean_error(cli("inspect-logs", str(NATIVE_LOG), "--compare", p), 2)
    clean_error(cli("train", *TINY_CPU, "--assets", p), 2, "assets")
    clean_error(cli("train", *TINY_CPU, "--assets", str(tiny), "--dataset", p, "--dry-run"), 2, "dataset")


def test_fetch_into_a_loop_a_link_or_a_file(cli, in_tmp, odd_paths):
    clean_error(cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(odd_paths["loop"])), 2, "symlink")
    clean_error(cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(odd_paths["dangling"])), 2, "symbolic link")
    clean_error(cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(odd_paths["file"])), 2, "not a folder")


def test_checkpoint_folder_that_is_really_a_file(cli, in_tmp, odd_paths, tiny):
    clean_error(cli("verify-ckpt", str(odd_paths["file"])), 2, "not a checkpoint")
    # train refuses before starting anything (it used to train, then fail at save)
    r = cli("train", *TINY_CPU, "--assets", str(tiny), "--finetune", "--checkpoint-dir", str(odd_paths["file"]))
    clean_error(r, 2, "checkpoint folder", "not a folder")
    r = cli("train", *TINY_CPU, "--assets", str(tiny), "--finetune", "--checkpoint-dir", str(odd_paths["loop"]))
    clean_error(r, 2, "symlink loop")
    assert not list((in_tmp / ".trnqwen").rglob("run.json"))


def test_empty_folders(cli, in_tmp, odd_paths):
    clean_error(cli("verify-ckpt", str(odd_paths["empty"])), 2, "empty")
    clean_error(cli("inspect-logs", str(odd_paths["empty"])), 2, "no run.json or train.log")


def test_no_last_run_to_default_to(cli, in_tmp):
    clean_error(cli("inspect-logs"), 2, "no run found")
    r = cli("verify-ckpt")
    assert r.code == 2 and "Traceback" not in r.text


def test_config_json_of_another_model_family(cli, in_tmp, tiny, tmp_path):
    llama = tmp_path / "llama"
    llama.mkdir()
    for name in ("model-00001-of-00001.safetensors", "model.safetensors.index.json", "tokenizer.json",
                 "tokenizer_config.json"):
        (llama / name).write_bytes((tiny / name).read_bytes())
    cfg = json.loads((tiny / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (llama / "config.json").write_text(json.dumps(cfg))
    clean_error(cli("verify-ckpt", str(llama)), 2, "llama", "not a Qwen3")
    clean_error(cli("verify-ckpt", str(tiny), "--assets", str(llama)), 2, "llama")
    clean_error(cli("train", *TINY_CPU, "--backend", "native", "--assets", str(llama), "--dry-run"), 2, "llama")


# --- logs: non-UTF-8, binary, a 2 GB line --------------------------------------------------------------


def test_binary_and_non_utf8_logs(cli, tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    clean_error(cli("inspect-logs", str(binary)), 2, "does not look like a text log")  # not a log: a usage error (issue 28)
    latin1 = tmp_path / "latin1.log"
    latin1.write_bytes(b"caf\xe9 \xff\xfe\n" + NATIVE_LOG.read_bytes())
    r = cli("inspect-logs", str(latin1), "--json")
    assert r.code == 0, r.text
    payload = json.loads(r.out)
    # the bad bytes cost nothing: every step of the log is read, and the bytes are named once
    summary = payload["summary"]
    assert (summary["steps_logged"], summary["last_step"], summary["completed"]) == (3, 3, True), summary
    assert summary["last_loss"] == pytest.approx(7.40945)
    assert [f["code"] for f in payload["findings"] if "utf" in f["code"].lower()] == ["invalid-utf8"]


def test_a_2gb_log_line_is_read_in_bounded_memory(tmp_path):
    """A sparse file: half the real log, one 2 GiB line of NULs, the other half (no 2 GB in memory)."""
    lines = NATIVE_LOG.read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    log = tmp_path / "huge.log"
    with open(log, "wb") as fh:
        fh.writelines(lines[:half])
        fh.write(b"[rank0]: huge line starts ")
        fh.seek(2 * 1024**3, os.SEEK_CUR)  # a hole: reads as NUL bytes, costs no disk
        fh.write(b" huge line ends\n")
        fh.writelines(lines[half:])
    assert log.stat().st_size > 2 * 1024**3
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    # A fresh wrapper process, so RUSAGE_CHILDREN is this one command's peak RSS alone.
    wrapper = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.monotonic()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "json.dump({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr, 's': time.monotonic() - t,\n"
        "           'rss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, sys.stdout)\n"
    )
    res = json.loads(subprocess.run([sys.executable, "-c", wrapper, *TRNQWEN, "inspect-logs", str(log), "--json"],
                                    capture_output=True, text=True, env=env, timeout=300, check=True).stdout)
    proc = subprocess.CompletedProcess(TRNQWEN, res["rc"], res["out"], res["err"])
    took = res["s"]
    peak_mib = res["rss_kib"] / 1024
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    full = json.loads(run_subprocess("inspect-logs", str(NATIVE_LOG), "--json").out)
    huge = json.loads(proc.stdout)
    def strip(steps):
        return [{k: v for k, v in s.items() if k != "line"} for s in steps]

    assert strip(huge["steps"]) == strip(full["steps"])  # every step on both sides of the line is still found
    assert any("overlong" in f["code"] for f in huge["findings"]), huge["findings"]
    assert peak_mib < 1024, f"peak RSS {peak_mib:.0f} MiB for a 2 GiB line"
    print(f"2 GiB line: {took:.1f}s, peak RSS of children {peak_mib:.0f} MiB")


def test_binary_garbage_on_stdin(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([*TRNQWEN, "inspect-logs", "-"], input=os.urandom(1 << 20), capture_output=True, env=env,
                          timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2 and "Traceback" not in err and "Error:" in err


# --- read-only output folders ---------------------------------------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (chmod does not stop root, a read-only mount does)."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as mnt:
        yield mnt


def test_read_only_output_folders(read_only_dir, tiny, tmp_path):
    ro = read_only_dir
    r = run_subprocess("train", *TINY_CPU, "--assets", str(tiny), "--steps", "1", cwd=ro)
    clean_error(r, 2, "read-only")  # the runs dir, found by preflight, nothing started
    r = run_subprocess("train", *TINY_CPU, "--assets", str(tiny), "--finetune", "--checkpoint-dir", str(ro / "ck"),
                       cwd=tmp_path)
    clean_error(r, 2, "checkpoint folder", "read-only")
    assert not (tmp_path / ".trnqwen").exists() or not list((tmp_path / ".trnqwen").rglob("run.json"))
    clean_error(run_subprocess("fetch", "builtin:tiny-qwen3", "--local-dir", str(ro / "x")), 3, "read-only")
    clean_error(run_subprocess("inspect-logs", str(NATIVE_LOG), "--csv", str(ro / "s.csv")), 3, "read-only")
    clean_error(run_subprocess("inspect-logs", str(NATIVE_LOG), "--plot", str(ro / "s.png")), 3, "read-only")
    assert list(ro.iterdir()) == []


def test_verify_ckpt_reads_a_checkpoint_on_a_read_only_mount(tiny, tmp_path):
    """Readers only read: verify-ckpt (bit scan and round trip) of a model folder on a read-only
    mount, run from inside it, passes and writes nothing there."""
    with mounted_tmpfs(tmp_path / "ro", "size=16m") as mnt:
        shutil.copytree(tiny, mnt / "tiny-qwen3")
        before = sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*"))
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount the tmpfs read-only: {remount.stderr.decode().strip()}")
        assert subprocess.run(["touch", str(mnt / "probe")], capture_output=True).returncode != 0  # really read-only
        r = run_subprocess("verify-ckpt", str(mnt / "tiny-qwen3"), "--round-trip", "--json", cwd=mnt)
        assert r.code == 0, r.text
        doc = json.loads(r.out)
        assert doc["ok"] is True and doc["scanned"] is True and doc["nonfinite"] == {}, doc
        assert doc["round_trip"] and not doc["round_trip"].get("disagrees"), doc["round_trip"]
        assert sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*")) == before


# --- a token in the environment never shows --------------------------------------------------------------

TOKEN = "hf_FAKEbadInputToken9876543210zyxw"
PLAIN_TOKEN = "plain-secret-not-hf-shaped-4242"


@pytest.mark.parametrize("token", [TOKEN, PLAIN_TOKEN])
def test_hf_token_never_appears_in_any_output(cli, in_tmp, tiny, monkeypatch, token):
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", token)
    log = in_tmp / "leaky.log"
    log.write_text(NATIVE_LOG.read_text() + f"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\"\n"
                   f"[rank1]: ValueError: bad auth header Bearer {token} for HF_TOKEN={token}\n")
    runs = [
        cli("config", "show", "--json"),
        cli("config", "show"),
        cli("check-env", "--json"),
        cli("check-env"),
        cli("fetch", "builtin:tiny-qwen3", "--local-dir", str(in_tmp / "t"), "--json"),
        cli("train", *TINY_CPU, "--assets", str(tiny), "--finetune", "--dry-run", "--json"),
        cli("train", *TINY_CPU, "--assets", str(tiny), "--finetune", "--dry-run"),
        cli("train", *TINY_CPU, "--assets", str(tiny), "--export-config", str(in_tmp / "cfg_mod.py")),
        cli("verify-ckpt", str(tiny), "--json"),
        cli("verify-ckpt", str(tiny)),
        cli("inspect-logs", str(log), "--json"),
        cli("inspect-logs", str(log), "--csv", str(in_tmp / "s.csv")),
        cli("train", *TINY_CPU, "--assets", f"/nonexistent/{token}", "--finetune"),  # echoed in an error
    ]
    for r in runs:
        assert token not in r.text, r.text
        assert "Traceback" not in r.text
    # a crash is an error finding: inspect-logs exits 1 by default (issue 18 item 11)
    assert runs[10].code == 1 and "ValueError: bad auth header" in runs[10].out
    for p in in_tmp.rglob("*"):
        if p.is_file() and p != log:  # everything trnqwen wrote (the CSV, the config module, the fetch)
            assert token.encode() not in p.read_bytes(), p


@pytest.mark.parametrize("args", [
    ["verify-ckpt", "~nosuchuser_xyz/ckpt"], ["inspect-logs", "~nosuchuser_xyz/train.log"],
    ["fetch", "builtin:tiny-qwen3", "--local-dir", "~nosuchuser_xyz/t"],
    ["train", *TINY_CPU, "--assets", "~nosuchuser_xyz/a", "--dry-run"], ["check-env", "--assets-dir", "~nosuchuser_xyz/a"],
    ["config", "show", "--model", "~nosuchuser_xyz"],
])
def test_tilde_of_an_unknown_user(cli, in_tmp, args):
    """``~nosuchuser`` is a usage error where the path comes in (a flag, a config value), with the way out."""
    r = cli(*args)
    if args[0] == "config":  # --model is not a path: a name that is neither a repo id nor a folder
        clean_error(r, 2, "model = '~nosuchuser_xyz'", "local folder")
    else:
        clean_error(r, 2, "cannot expand a path starting with ~", "~nosuchuser_xyz")
        assert "use an absolute path, or ~/ for your own home" in r.err


# =================================================================================================
# --- issue 14: bad data for `trnqwen data` (and `train`, which prepares through the same code) ---
# One line naming the file and the record (1-based JSONL line), exit 2, nothing written.
# =================================================================================================

_GOOD_TURNS = [{"role": "user", "content": "2 plus 2?"}, {"role": "assistant", "content": "4."}]
BAD_RECORDS = [
    ("not_json", ['{"messages": ' + json.dumps(_GOOD_TURNS) + "}", "{not json"], ["line 2", "not valid json"]),
    ("unknown_role", [{"messages": [{"role": "bot", "content": "hi"}, _GOOD_TURNS[1]]}], ["line 1", "unknown role 'bot'"]),
    ("no_assistant", [{"messages": [_GOOD_TURNS[0]]}], ["line 1", "no assistant turn"]),
    ("empty_content", [{"messages": [_GOOD_TURNS[0], {"role": "assistant", "content": "  "}]}], ["line 1", "empty"]),
    ("content_type", [{"messages": _GOOD_TURNS}, {"messages": [_GOOD_TURNS[0], {"role": "assistant", "content": 4}]}],
     ["line 2", "must be a string, not a number"]),
    ("messages_type", [{"messages": "hello"}], ["line 1", "must be a non-empty list"]),
    ("sharegpt_role", [{"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "yo"}]}],
     ["line 1", "unknown role 'robot'"]),
    ("alpaca_type", [{"instruction": ["a"], "output": "b"}], ["line 1", "'instruction' must be a string, not a list"]),
    ("mixed_formats", [{"messages": _GOOD_TURNS}, {"text": "plain"}], ["line 2", "no 'messages' field"]),
    ("unknown_fields", [{"question": "q", "answer": "a"}], ["line 1", "found: question, answer"]),
]


def _write_records(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _data_args(tiny: Path, cache: Path, dataset: Path, *extra: str) -> list[str]:
    return ["data", str(dataset), "--model", "builtin:tiny-qwen3", "--assets", str(tiny),
            "--data-cache-dir", str(cache), *extra]


def _nothing_written(cache: Path) -> None:
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())


@pytest.mark.parametrize("name,rows,needles", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_bad_records_name_file_and_line(cli, in_tmp, tiny, name, rows, needles):
    data = _write_records(in_tmp / f"{name}.jsonl", rows)
    r = cli(*_data_args(tiny, in_tmp / "cache", data))
    clean_error(r, 2, f"{name}.jsonl", *needles)
    _nothing_written(in_tmp / "cache")


def test_template_that_does_not_render_names_the_record(cli, in_tmp, tiny):
    snapshot = in_tmp / "strict"
    snapshot.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).write_bytes((tiny / name).read_bytes())
    cfg = json.loads((snapshot / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    (snapshot / "tokenizer_config.json").write_text(json.dumps(cfg))
    data = _write_records(in_tmp / "sys.jsonl", [{"messages": _GOOD_TURNS}, {"messages": [{"role": "system", "content": "x"}, *_GOOD_TURNS]}])
    r = cli(*_data_args(snapshot, in_tmp / "cache", data))
    clean_error(r, 2, "sys.jsonl line 2", "does not render", "system role not supported")
    _nothing_written(in_tmp / "cache")


def test_no_trained_tokens_left_after_truncation(cli, in_tmp, tiny):
    long_prompt = {"messages": [{"role": "system", "content": "You are a calculator. " * 5}, *_GOOD_TURNS]}
    data = _write_records(in_tmp / "long.jsonl", [long_prompt] * 3)
    r = cli(*_data_args(tiny, in_tmp / "cache", data, "--seq-len", "16"))
    clean_error(r, 2, "long.jsonl", "no trained tokens", "--seq-len 16")
    _nothing_written(in_tmp / "cache")


def test_parquet_without_recognised_columns_names_the_columns(cli, in_tmp, tiny):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "q", "reply": "a"}]), in_tmp / "qa.parquet")
    r = cli(*_data_args(tiny, in_tmp / "cache", in_tmp / "qa.parquet"))
    clean_error(r, 2, "qa.parquet", "no recognised columns", "question, reply")
    _nothing_written(in_tmp / "cache")


@pytest.mark.parametrize("extra,needle", [
    (["--dataset-format", "yaml"], "dataset_format"),
    (["--long-conversations", "wrap"], "long_conversations"),
    (["--val-split", "1.5"], "val_split"),
    (["--val-split", "0.1", "--val-dataset", "x.jsonl"], "val_split and val_dataset"),
    (["--val-dataset", "~nosuchuser_xyz/v.jsonl"], "cannot expand a path starting with ~"),
])
def test_bad_data_flags(cli, in_tmp, tiny, extra, needle):
    data = _write_records(in_tmp / "ok.jsonl", [{"messages": _GOOD_TURNS}])
    r = cli(*_data_args(tiny, in_tmp / "cache", data, *extra))
    clean_error(r, 2, needle)
    _nothing_written(in_tmp / "cache")


BAD_DATASETS = [  # (name, how to make it, what the one error line says)
    ("missing.jsonl", None, ["missing.jsonl does not exist"]),
    ("empty.jsonl", "", ["empty.jsonl has no records"]),
    ("data.csv", "a,b\n1,2\n", ["unknown file type .csv"]),
    ("mixed", {"a.jsonl": '{"text": "a"}\n', "b.txt": "b\n"}, ["mixed", "mixes file types (jsonl, text)"]),
    ("fields.jsonl", '{"content": "x"}\n', ["fields.jsonl line 1", "no recognised fields (found: content)"]),
    ("no_data", {}, ["no_data has no .jsonl/.json/.parquet/.txt files"]),
    ("not a name", None, ["'not a name' is neither a local file/folder nor a hub dataset name"]),
]


@pytest.mark.parametrize("name,content,needles", BAD_DATASETS, ids=[c[0] for c in BAD_DATASETS])
@pytest.mark.parametrize("command", ["train", "data"])
def test_bad_dataset_stops_train_and_data_with_one_line(cli, in_tmp, tiny, name, content, needles, command):
    """Each --dataset that cannot be read is refused by the one file lister (dataset/sources.py),
    whichever command names it: one line, a hint, exit 2, nothing tokenized."""
    if isinstance(content, dict):
        (in_tmp / name).mkdir()
        for file, text in content.items():
            (in_tmp / name / file).write_text(text)
    elif content is not None:
        (in_tmp / name).write_text(content)
    cache = in_tmp / "cache"
    if command == "train":
        r = cli("train", *TINY_CPU, "--assets", str(tiny), "--dataset", name, "--data-cache-dir", str(cache), "--dry-run")
    else:
        r = cli(*_data_args(tiny, cache, Path(name)))
    clean_error(r, 2, *needles)
    assert "->" in r.err.split("Error:", 1)[1], r.err  # the hint line
    _nothing_written(cache)


# --- issue 18, fetch / check-env / model folders (items 7, 8, 14) --------------------------------


def test_fetch_builtin_honours_keep_free(cli, in_tmp):
    """Item 7: --keep-free is checked before the tiny model is written, as for a Hub download."""
    r = cli("fetch", "builtin:tiny-qwen3", "--keep-free", "999P", "--local-dir", str(in_tmp / "t"))
    clean_error(r, 3, "not enough disk space", "999.0 PiB to keep free")
    assert not (in_tmp / "t").exists()
    ok = cli("fetch", "builtin:tiny-qwen3", "--keep-free", "0", "--local-dir", str(in_tmp / "t"), "--json")
    assert ok.code == 0, ok.text
    # the bound the check uses holds for what is actually written
    from trnqwen.fetch.builtin import SNAPSHOT_BYTES_BOUND

    assert 0 < json.loads(ok.out)["bytes"] <= SNAPSHOT_BYTES_BOUND


def test_check_env_without_the_model_is_not_ready(cli, in_tmp):
    """Item 8: no model where train looks is a blocking problem, with the fetch command as the fix."""
    r = cli("check-env", "--json", "--assets-dir", "/nonexistent", "--model", "builtin:tiny-qwen3")
    report = json.loads(r.out)
    assert r.code == 1 and report["ok"] is False
    blocking = [p for p in report["problems"] if p["severity"] == "error"]
    assert [p["message"] for p in blocking] == ["model assets not found: /nonexistent is not a folder"]
    assert blocking[0]["fix"] == "fetch it: trnqwen fetch builtin:tiny-qwen3 --local-dir /nonexistent"
    table = cli("check-env", "--assets-dir", "/nonexistent")
    assert table.code == 1 and "Ready" not in table.out and "block training" in table.out


def test_check_env_with_the_default_model_folder_names_plain_fetch(cli, in_tmp):
    r = cli("check-env", "--json", "--model", "Qwen/Qwen3-0.6B")
    fixes = [p["fix"] for p in json.loads(r.out)["problems"] if p["message"].startswith("model assets not found")]
    assert r.code == 1 and fixes == ["fetch it: trnqwen fetch Qwen/Qwen3-0.6B"]


def test_safetensors_linking_to_itself_is_called_a_link(cli, in_tmp, tiny):
    """Item 14: a file that symlinks to itself is reported as that, not as "no *.safetensors"."""
    folder = in_tmp / "looped"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny / name).read_bytes())
    (folder / "model.safetensors").symlink_to("model.safetensors")
    clean_error(cli("verify-ckpt", str(folder)), 2, "model.safetensors is a symbolic link to itself")
    r = cli("train", *TINY_CPU, "--assets", str(folder), "--finetune", "--steps", "1")
    clean_error(r, 2, "model.safetensors is a symbolic link to itself")
    assert not (in_tmp / ".trnqwen").exists()


def test_fetch_blames_the_repo_argument(cli, in_tmp):
    """Item 14: the positional REPO is named as such, not as --model."""
    r = cli("fetch", "not a repo id!")
    clean_error(r, 2, "(from argument REPO)")
    assert "--model" not in r.err


# =====================================================================================================
# Issue 18, round two (helper G): what an adversarial new user still broke.  Each case failed before.
# =====================================================================================================

import re  # noqa: E402
import shlex  # noqa: E402

B_CPU = [*TINY_CPU, "--nproc-per-node", "1", "--steps", "2", "--seq-len", "128"]


def _one_line_with(text: str, *needles: str) -> str:
    """The single line of ``text`` holding every needle (a redirected stream is never hard-wrapped)."""
    lines = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert lines, f"no single line holds {needles}:\n{text}"
    return lines[0]


# --- 1. a dry run that would not start exits 1 ----------------------------------------------------------


def test_dry_run_exits_1_when_it_would_not_start(cli, in_tmp, tiny):
    r = cli("train", *B_CPU, "--dry-run")  # no assets fetched here
    clean_error(r, 1, "would not start", "model assets not found")
    assert "dry run: would NOT start" in r.out  # the verdict is still the result on stdout
    (in_tmp / "a_file").write_text("x\n")
    r = cli("train", *B_CPU, "--assets", str(tiny), "--finetune", "--checkpoint-dir", str(in_tmp / "a_file"), "--dry-run")
    clean_error(r, 1, "would not start", "exists and is not a folder")
    r = cli("train", *B_CPU, "--assets", str(tiny), "--finetune", "--dry-run")
    assert r.code == 0, r.text
    assert "dry run: would start" in r.out and "Error" not in r.err
    assert not (in_tmp / ".trnqwen").exists()  # a dry run writes nothing either way


def test_dry_run_with_a_read_only_checkpoint_dir_exits_1(read_only_dir, tiny, tmp_path):
    r = run_subprocess("train", *B_CPU, "--assets", str(tiny), "--finetune", "--checkpoint-dir",
                       str(read_only_dir / "ck"), "--dry-run", cwd=tmp_path)
    clean_error(r, 1, "would not start", "read-only")


# --- 2. preflight stops impossible runs ------------------------------------------------------------------


@pytest.mark.parametrize("extra,needles", [
    (["--nproc-per-node", "100000"], ["100000 cpu ranks", "cannot make progress"]),
    (["--seq-len", "1048576"], ["--seq-len 1048576 is longer than the model's context: 2048 tokens"]),
    (["--seq-len", "2048", "--local-batch-size", "4096"], ["host ram", "does not fit"]),
], ids=["ranks-beyond-cores", "seq-len-beyond-context", "memory-beyond-host-ram"])
def test_impossible_runs_are_preflight_errors(cli, in_tmp, tiny, extra, needles):
    r = cli("train", *B_CPU, "--assets", str(tiny), *extra, "--dry-run")
    clean_error(r, 1, "would not start", *needles)
    r = cli("train", *B_CPU, "--assets", str(tiny), *extra)  # and a real run does not start either
    assert r.code in (1, 2) and "Traceback" not in r.text, r.text
    assert not list(in_tmp.rglob("run.json"))


def test_rope_scaling_lifts_the_context_limit(cli, in_tmp, tiny, tmp_path):
    scaled = tmp_path / "scaled"
    import shutil

    shutil.copytree(tiny, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    (scaled / "config.json").write_text(json.dumps(cfg))
    r = cli("train", *B_CPU, "--assets", str(scaled), "--seq-len", "4096", "--dry-run", "--json")
    assert r.code == 0, r.text
    rows = [f for f in json.loads(r.out)["preflight"]["findings"] if f["check"] == "seq_len"]
    assert [f["severity"] for f in rows] == ["plan"] and "RoPE scaling in config.json extends it" in rows[0]["message"]


# --- 3. host memory next to the device estimate ------------------------------------------------------------


def test_host_memory_is_reported_next_to_the_device_estimate(cli, in_tmp, tiny):
    r = cli("train", *B_CPU, "--assets", str(tiny), "--finetune", "--dry-run", "--json")
    assert r.code == 0, r.text
    pre = json.loads(r.out)["preflight"]
    host, device = pre["host_memory"], pre["memory"]
    assert {f["check"] for f in pre["findings"]} >= {"host-memory"}
    # CPU: the training state lives in host RAM; fine-tuning reads the whole checkpoint per rank
    assert host["training"] == device["total"] and host["checkpoint"] > 0 and host["export"] > 0
    assert host["per_node"] == host["per_rank"] * 1 and host["capacity"] > 0


# --- 5. TRNQWEN_DEBUG ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,traceback", [("off", False), ("0", False), ("no", False), ("maybe", False),
                                             ("1", True), ("TRUE", True), ("yes", True)])
def test_debug_only_on_for_1_true_yes_and_never_changes_the_exit_code(cli, in_tmp, monkeypatch, value, traceback):
    monkeypatch.setenv("TRNQWEN_DEBUG", value)
    r = cli("train", "--steps", "-1", "--dry-run")
    assert r.code == 2, r.text  # the same exit code with or without debugging
    assert ("Traceback" in r.err) is traceback, r.err
    assert len([line for line in r.err.splitlines() if line.startswith("Error:")]) == 1


# --- 6. a corrupt LAST pointer -----------------------------------------------------------------------------


def test_corrupt_last_pointer_warns_and_falls_back_to_the_newest_run(cli, in_tmp, tmp_path):
    from tests.ckpt_fixtures import make_case

    ckpt, assets, _ = make_case(tmp_path / "case")
    runs = in_tmp / ".trnqwen" / "runs"
    run = runs / "20260101-000000-native"
    run.mkdir(parents=True)
    (run / "train.log").write_bytes(NATIVE_LOG.read_bytes())
    record = {"run_id": run.name, "run_dir": str(run), "status": "succeeded", "log_path": str(run / "train.log"),
              "checkpoint_dir": str(ckpt), "assets_dir": str(assets), "backend": "native", "steps": 2}
    (run / "run.json").write_text(json.dumps(record))
    (runs / "LAST").write_bytes(b"\xff\xfe\x00garbage\x80\n")
    for args in (["inspect-logs"], ["verify-ckpt", "--quick"]):
        r = cli(*args)
        assert r.code != 70 and "internal error" not in r.text and "UnicodeDecodeError" not in r.text, r.text
        assert "not UTF-8" in _one_line_with(r.err, "warning", "LAST"), r.err
        assert run.name in r.text or str(ckpt) in r.text, r.text  # it used the newest run
    r = cli("verify-ckpt", "--quick")
    assert r.code == 0, r.text


# --- 9. --max-rel-change -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-0.5"])
def test_max_rel_change_negative_or_nan_is_a_usage_error(cli, in_tmp, value):
    r = cli("verify-ckpt", ".", "--compare-to", ".", "--max-rel-change", value)
    clean_error(r, 2, "--max-rel-change")


# --- 10. printed follow-up commands are shell-quoted --------------------------------------------------------


def test_fetch_hint_is_shell_quoted(cli, in_tmp):
    odd = in_tmp / "my models" / "qwen ü"
    odd.mkdir(parents=True)
    r = cli("train", "--model", str(odd), "--device", "cpu", "--dry-run")
    assert r.code == 1, r.text
    hint = _one_line_with(r.err, "-> run `trnqwen fetch")
    command = hint.split("`")[1]
    assert shlex.split(command) == ["trnqwen", "fetch", str(odd)]


def test_follow_up_commands_after_a_run_are_quoted_and_results_go_to_stdout(tiny, tmp_path, capsys):
    from trnqwen.cli.train import _print_outcome
    from trnqwen.config import resolve_config
    from trnqwen.train.launch_result import LaunchResult
    from trnqwen.train.run import TrainOutcome, plan_train

    plan = plan_train(resolve_config({"model": "builtin:tiny-qwen3", "device": "cpu", "assets_dir": tiny}),
                      cwd=tmp_path)
    step = tmp_path / "ck pt" / "ü" / "step-2"
    outcome = TrainOutcome(plan=plan, result=LaunchResult(exit_code=0, ended_by="completed", wall_s=3.0), exported=step)
    _print_outcome(outcome)
    out, err = capsys.readouterr()
    assert f"HF checkpoint: {step}" in out and f"run dir: {plan.run_dir}" in out  # results: stdout
    assert "train: completed" in err  # status: stderr
    check = _one_line_with(err, "check it:").split("check it:", 1)[1]
    assert shlex.split(check) == ["trnqwen", "verify-ckpt", str(step.parent)]


def test_hand_run_command_quotes_every_value(cli, in_tmp, tiny):
    folder = in_tmp / "my configs"
    folder.mkdir()
    r = cli("train", *B_CPU, "--assets", str(tiny), "--export-config", str(folder / "qwen3_ft.py"))
    assert r.code == 0, r.text
    line = _one_line_with(r.out, "torchrun")
    words = shlex.split(line)
    assert f"PYTHONPATH={folder}" + "${PYTHONPATH:+:$PYTHONPATH}" in words
    assert words[words.index("--module") + 1] == "qwen3_ft"


# --- 12. output streams -------------------------------------------------------------------------------------


def test_redirected_status_lines_are_not_hard_wrapped(tiny, tmp_path):
    """stderr is a pipe here: the long preflight lines stay whole (no `4.1 \\nMiB`)."""
    r = run_subprocess("train", *B_CPU, "--assets", str(tiny), "--finetune", "--override-imports", "no_such_mod_xyz",
                       cwd=tmp_path)
    clean_error(r, 2, "no_such_mod_xyz")
    line = _one_line_with(r.err, "estimated host", "at load", "at export", "gathered model")
    assert len(line) > 120
    assert not any(re.fullmatch(r"\s*(MiB|GiB)\b.*", x) for x in r.err.splitlines()), r.err


# --- 14. small ones ------------------------------------------------------------------------------------------


def test_a_folder_named_trnqwen_toml_is_an_error(cli, in_tmp):
    (in_tmp / "trnqwen.toml").mkdir()
    clean_error(cli("config", "show"), 2, "trnqwen.toml is a folder")
    clean_error(cli("train", "--dry-run"), 2, "trnqwen.toml is a folder")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_learning_rate_says_finite(cli, in_tmp, monkeypatch, value):
    monkeypatch.setenv("TRNQWEN_LR", value)
    r = cli("config", "show")
    clean_error(r, 2, "lr", "finite number", "TRNQWEN_LR")
    assert "<= 1" not in r.err


def test_run_record_masks_secrets_not_every_token_word():
    from trnqwen.errors import redact_env

    env = {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "abc123", "GITHUB_TOKEN": "ghp_0123456789abcdefABCDEF",
           "WANDB_API_KEY": "0123456789abcdef0123456789abcdef", "DB_PASSWORD": "x", "AWS_SECRET_ACCESS_KEY": "k",
           "NEURON_RT_VISIBLE_CORES": "0-63", "MY_TOKEN_LIMIT": "4096", "NOTE": "hf_abcdefghijklmnop",
           "PYTHONPATH": "/a b/c"}
    masked = {k for k, v in redact_env(env).items() if v == "***"}
    assert masked == {"HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "NOTE"}


def test_unknown_override_import_fails_in_preflight_with_one_line(cli, in_tmp, tiny):
    r = cli("train", *B_CPU, "--assets", str(tiny), "--override-imports", "no.such.module")
    clean_error(r, 2, "--override-imports no.such.module", "no module named 'no'")
    assert not (in_tmp / ".trnqwen").exists()  # nothing started, nothing written
    # a module next to the run (the ranks' working folder) and a factory inside it are found, and
    # finding them imports nothing: the module would fail to import here
    (in_tmp / "my_kernels.py").write_text("raise ImportError('heavy deps are never imported by preflight')\n")
    r = cli("train", *B_CPU, "--assets", str(tiny), "--override-imports", "my_kernels.attn_factory", "--dry-run", "--json")
    assert r.code == 0, r.text
    assert not [f for f in json.loads(r.out)["preflight"]["findings"] if f["check"] == "override-imports"]


def test_exit_code_table_in_the_docs_lists_70():
    text = (REPO_ROOT / "docs" / "cli" / "index.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\|\s*`?(\d+)`?\s*\|", text, flags=re.M)}
    assert {"0", "1", "2", "3", "70", "130", "143"} <= rows, rows


def test_override_module_on_the_ranks_extra_pythonpath_is_found_by_preflight(in_tmp, tiny):
    """quickstart puts examples/torch_rope on the ranks' PYTHONPATH: preflight must look there too
    (it once looked only at the launcher's path and refused the quickstart's own override stage)."""
    from trnqwen.config import RunConfig
    from trnqwen.train.run import plan_train

    kernels = in_tmp / "kernels"
    kernels.mkdir()
    (kernels / "far_kernels.py").write_text("raise ImportError('never imported by preflight')\n")
    cfg = RunConfig(model="builtin:tiny-qwen3", device="cpu", nproc_per_node=1, steps=2, seq_len=128,
                    assets_dir=tiny, override_imports=["far_kernels.attn_factory"])
    work = in_tmp / "work"
    work.mkdir()
    refused = plan_train(cfg, cwd=work, dry_run=True)
    assert [f.check for f in refused.preflight.findings if f.severity == "error"] == ["override-imports"]
    plan = plan_train(cfg, cwd=work, dry_run=True, pythonpath=[kernels])
    assert not [f for f in plan.preflight.findings if f.severity == "error"], plan.preflight.findings
    assert plan.env["PYTHONPATH"].split(os.pathsep)[0] == str(kernels)


@pytest.mark.parametrize("flag, name", [("--csv", "out"), ("--plot", "plots.png")])
def test_csv_or_plot_into_a_folder_names_the_folder_not_a_temp_file(cli, in_tmp, flag, name):
    (in_tmp / name).mkdir()
    r = cli("inspect-logs", str(LOGS / "real_hf_v5_tiny_2ranks_scratch.log"), flag, name)
    clean_error(r, 2, f"{flag} {name} is a folder")
    assert f".{name}." not in r.text and ".tmp" not in r.text  # no temp file name leaks out
    assert sorted(p.name for p in (in_tmp / name).iterdir()) == []  # nothing written inside it
