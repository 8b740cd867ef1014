"""``trnqwen quickstart``: the whole lifecycle for real (smaller), and its parts on their own."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import assert_clean_error, run_subprocess

PRETRAIN_STEPS = 6
FINETUNE_STEPS = 1


# --- the real lifecycle -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory):
    """``python -m trnqwen quickstart --json`` for real: tiny model, 1 rank per run, every backend."""
    base = tmp_path_factory.mktemp("quickstart")
    workdir = base / "qs"
    result = run_subprocess(
        "quickstart", "--workdir", str(workdir), "--pretrain-steps", str(PRETRAIN_STEPS),
        "--steps", str(FINETUNE_STEPS), "--nproc-per-node", "1", "--json",
        cwd=base, env={"HF_HUB_OFFLINE": "1"}, timeout=900,
    )
    return result, workdir


@pytest.mark.slow
def test_quickstart_runs_every_stage(quickstart_run):
    result, workdir = quickstart_run
    assert result.code == 0, result.text[-4000:]
    summary = json.loads(result.out)
    assert summary["ok"] is True and summary["failed_stage"] is None
    names = [s["name"] for s in summary["stages"]]
    assert names == [
        "check-env", "fetch", "pre-train", "snapshot",
        "train --finetune (native)", "train --finetune (hf-v5)", "train --finetune (hf-trainer)", "override",
        "verify-ckpt (native)", "verify-ckpt (hf-v5)", "verify-ckpt (hf-trainer)", "inspect-logs", "chat fine-tune",
        "LoRA fine-tune", "DPO", "GRPO",
    ]
    assert all(s["ok"] for s in summary["stages"]), summary["stages"]
    # progress went to stderr, stage by stage, numbered as they start (lanes run two at a time:
    # the numbers only climb); stdout is the one JSON object
    import re

    headers = re.findall(r"^\[(\d+)/(\d+)\] (.+?)  ", result.err, flags=re.M)
    assert [int(i) for i, _, _ in headers] == list(range(1, len(names) + 1)), headers
    assert {int(n) for _, n, _ in headers} == {len(names)} and sorted(h for _, _, h in headers) == sorted(names)
    # what it wrote is where the summary says, and summary.json is the same document
    assert json.loads((workdir / "summary.json").read_text()) == summary
    assert summary["next_commands"] and any("trnqwen train --backend" in c for c in summary["next_commands"])


@pytest.mark.slow
def test_quickstart_finetunes_start_far_below_random_init(quickstart_run):
    result, _ = quickstart_run
    summary = json.loads(result.out)
    runs = summary["runs"]
    assert set(runs) == {"pretrain", "native", "hf-v5", "hf-trainer", "override", "chat", "lora", "dpo", "grpo"}
    pre = runs["pretrain"]
    assert pre["finetune"] is False and len(pre["losses"]) == PRETRAIN_STEPS
    vocab = json.loads((Path(summary["files"]["assets"]) / "config.json").read_text())["vocab_size"]
    # random init starts near ln(vocab); pre-training lowers it
    assert abs(pre["step1_loss"] - math.log(vocab)) < 0.5
    assert pre["last_loss"] < pre["step1_loss"] - 0.5
    cmp = summary["comparison"]
    assert cmp["ok"] is True and cmp["random_init_step1_loss"] == pre["step1_loss"]
    learned = pre["step1_loss"] - pre["last_loss"]
    for backend in ("native", "hf-v5", "hf-trainer"):
        run = runs[backend]
        assert run["finetune"] is True and run["backend"] == backend
        assert len(run["losses"]) == FINETUNE_STEPS
        # the fine-tune starts where pre-training ended, far below the random-init start
        assert run["step1_loss"] < pre["step1_loss"] - 0.5 * learned
        assert cmp["finetunes"][backend]["step1_loss"] == run["step1_loss"]
        assert not [f for f in run["findings"] if f["severity"] == "error"]


@pytest.mark.slow
def test_quickstart_lora_stage_trains_only_adapters_and_merges(quickstart_run):
    result, _ = quickstart_run
    lora = json.loads(result.out)["lora"]
    assert 0 < lora["trainable"] < 0.2 * lora["total"]  # rank 8 on a 1M-parameter model
    assert lora["adapter_bytes"] < 0.5 * lora["base_bytes"]
    assert lora["validation_after"] < lora["validation_before"]
    assert lora["merged_verify"]["ok"] and Path(lora["merged"]).name.endswith(".merged")


@pytest.mark.slow
def test_quickstart_chat_stage_lowers_held_out_loss_and_answers(quickstart_run):
    """The chat fine-tune on the bundled set: `trnqwen eval`'s held-out loss falls, one answer each."""
    result, _ = quickstart_run
    summary = json.loads(result.out)
    ev = summary["evaluation"]
    assert ev["after"] < ev["before"] and ev["tokens"] > 0
    (gen,) = ev["generations"]
    assert gen["prompt"] and gen["reference"] and set(gen["answers"]) >= {"base"} and len(gen["answers"]) == 2
    run_dir = Path(summary["runs"]["chat"]["run_dir"])
    saved = json.loads((run_dir / "eval.json").read_text())
    assert [r["loss"] for r in saved["results"]] == [ev["before"], ev["after"]]
    from trnqwen.evaluate.lifecycle import answers_tell_apart

    base, tuned = gen["answers"].values()
    # answers are shown only when a person can tell them apart
    assert ("base '" in ev["line"]) == answers_tell_apart(base, tuned), ev["line"]
    assert ("answers not shown" in ev["line"]) != answers_tell_apart(base, tuned), ev["line"]
    # the bundled harness task, base and tuned, through `trnqwen eval RUN --tasks` (recorded in the run)
    bench = ev["benchmarks"]
    assert (bench["task"], bench["limit"], bench["metric"]) == ("trnqwen_calculator", 8, "acc"), bench
    assert all(0 <= bench[k] <= 1 for k in ("before", "after"))
    harness = json.loads((run_dir / "eval-harness.json").read_text())
    assert [r["is_base"] for r in harness["results"]] == [True, False] and harness["limit"] == 8
    assert [r["scores"]["trnqwen_calculator"]["value"] for r in harness["results"]] == [bench["before"], bench["after"]]
    stage = next(s for s in summary["stages"] if s["name"] == "chat fine-tune")
    assert stage["detail"].endswith(bench["line"]) and "trnqwen_calculator acc" in stage["detail"]


@pytest.mark.parametrize("base, tuned, shown", [
    ("................................", "................................", False),
    ("................................", ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,", False),
    ("the the the", " the  the the", False),
    ("................................", "About 4100 people live in Quendale.", True),
    ("Quendale Quendale", "About 4100 people", True),
])
def test_chat_line_shows_answers_only_when_they_can_be_told_apart(base, tuned, shown):
    from trnqwen.evaluate.lifecycle import held_out_line

    got = {"before": 6.1688, "after": 5.0517, "generations": [
        {"prompt": "How many people live in Quendale?", "answers": {"base": base, "run/step-12": tuned}}]}
    line = held_out_line(got, Path("runs/r1"))
    assert line.startswith("held-out loss 6.169 -> 5.052; ")
    if shown:
        assert f"base {base[:60]!r}, tuned {tuned[:60]!r}" in line
    else:
        assert "base '" not in line and line.endswith(
            "answers not shown: base and tuned write no words yet that tell them apart "
            "(`trnqwen eval runs/r1 --generate 3` prints them)")


@pytest.mark.slow
def test_quickstart_dpo_stage_starts_at_ln2_and_raises_held_out_preference_accuracy(quickstart_run):
    """The DPO stage: step 1 is the reference (loss ln 2), and `trnqwen eval` on the run says the
    tuned model prefers the chosen answer on more held-out pairs than its starting point."""
    result, _ = quickstart_run
    summary = json.loads(result.out)
    dpo, run = summary["dpo"], summary["runs"]["dpo"]
    assert abs(dpo["step1_loss"] - math.log(2)) < 1e-4 and run["step1_loss"] == dpo["step1_loss"]
    assert dpo["pairs"] == 30 and dpo["accuracy_after"] > dpo["accuracy_before"]
    run_dir = Path(run["run_dir"])
    assert json.loads((run_dir / "run.json").read_text())["config"]["method"] == "dpo"
    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["method"] == "dpo"
    assert [r["preference_accuracy"] for r in saved["results"]] == [dpo["accuracy_before"], dpo["accuracy_after"]]
    stage = next(s for s in summary["stages"] if s["name"] == "DPO")
    assert stage["ok"] and "held-out preference accuracy" in stage["detail"]


@pytest.mark.slow
def test_quickstart_grpo_stage_raises_the_held_out_reward(quickstart_run):
    """The GRPO stage: `trnqwen eval` on the run (the bundled held-out prompts, greedy answers) says
    the tuned model earns a clearly higher mean reward than its starting point; the line says both."""
    from trnqwen.methods.grpo.quickstart import MARGIN

    result, _ = quickstart_run
    summary = json.loads(result.out)
    grpo, run = summary["grpo"], summary["runs"]["grpo"]
    assert grpo["prompts"] == 16 and grpo["reward_after"] >= grpo["reward_before"] + MARGIN, grpo
    run_dir = Path(run["run_dir"])
    assert json.loads((run_dir / "run.json").read_text())["config"]["method"] == "grpo"
    saved = json.loads((run_dir / "eval.json").read_text())
    assert [r["mean_reward"] for r in saved["results"]] == [grpo["reward_before"], grpo["reward_after"]]
    stage = next(s for s in summary["stages"] if s["name"] == "GRPO")
    assert stage["ok"] and f"base {grpo['reward_before']:.3f} -> tuned {grpo['reward_after']:.3f}" in stage["detail"]


@pytest.mark.slow
def test_quickstart_checkpoints_and_files(quickstart_run):
    from safetensors import safe_open

    result, workdir = quickstart_run
    summary = json.loads(result.out)
    files = summary["files"]
    for key, path in files.items():
        assert Path(path).exists(), (key, path)
        assert Path(path).is_relative_to(workdir), (key, path)
    assert Path(files["loss_plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    snapshot = Path(files["pretrained_snapshot"])
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        assert (snapshot / name).is_file(), name
    (shard,) = snapshot.glob("*.safetensors")
    with safe_open(str(shard), framework="np") as fh:
        embed = fh.get_tensor("model.embed_tokens.weight")
    assert str(embed.dtype) == "float32"  # converted to config.json's torch_dtype
    for label, run in summary["runs"].items():
        if label == "override":  # a native fine-tune again, to show the custom path runs: no export
            continue
        run_dir = Path(run["run_dir"])
        assert (run_dir / "run.json").is_file() and (run_dir / "train.log").is_file()
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "succeeded" and record["backend"] == run["backend"]
        exported = Path(run["exported"])
        assert exported.name == f"step-{run['steps']}" and any(exported.glob("*.safetensors"))
        if run["finetune"]:
            assert record["config"]["finetune"] is True
            assert Path(record["assets_dir"]) == snapshot
            if label in ("dpo", "grpo"):  # judged by their held-out numbers (the method stages' tests)
                continue
            v = run["verify"]
            assert v["ok"] is True and v["scanned"] is True and v["nonfinite_tensors"] == 0
            assert v["round_trip"]["missing_keys"] == ["lm_head.weight"]  # tied, as in Qwen3-4B
            assert v["round_trip"]["unexpected_keys"] == []
        else:
            assert record["config"]["finetune"] is False and record["config"]["export_hf"] is True


@pytest.mark.slow
def test_quickstart_override_stage_shows_the_custom_path_ran(quickstart_run):
    """The custom-kernel workflow: the CPU twin of the NKI example ran its own rotation on every
    layer (its [OverrideCalls] line: calls > 0, no fallback) and trained to the native losses."""
    from trnqwen.contract.override_calls import parse_calls_line
    from trnqwen.fetch.builtin import tiny_qwen3_config

    result, _ = quickstart_run
    summary = json.loads(result.out)
    stage = next(s for s in summary["stages"] if s["name"] == "override")
    n_layers = tiny_qwen3_config()["num_hidden_layers"]
    assert stage["ok"] and f"on {n_layers}/{n_layers} layers" in stage["detail"] and "fallbacks=0" in stage["detail"]
    assert "step losses equal native's" in stage["detail"], stage["detail"]
    run, native = summary["runs"]["override"], summary["runs"]["native"]
    assert max(abs(a - b) for a, b in zip(run["losses"], native["losses"])) <= 1e-5
    log = Path(run["log"]).read_text()
    recs = [r for r in map(parse_calls_line, log.splitlines()) if r and r["name"] == "torch_rope_override.torch_rope"]
    assert recs and all(r["calls"] > 0 and r["fallbacks"] == 0 and r["modules"] == n_layers for r in recs), recs
    assert "[Override] torch_rope_override.torch_rope" in log
    assert not [f for f in run["findings"] if f["severity"] == "error"]


# --- failures name their stage ------------------------------------------------------------------


def test_failed_stage_is_named_and_exits_nonzero(tmp_path):
    """No Neuron device here: the check-env stage fails first, before anything trains."""
    result = run_subprocess("quickstart", "--workdir", str(tmp_path / "qs"), "--device", "neuron", "--json", cwd=tmp_path)
    assert result.code == 3, result.text
    assert "quickstart stage 'check-env' failed" in result.err
    assert "Traceback" not in result.text
    partial = json.loads(result.out)
    assert partial["ok"] is False and partial["failed_stage"] == "check-env"
    assert [s["name"] for s in partial["stages"]] == ["check-env"]
    assert json.loads((tmp_path / "qs" / "summary.json").read_text())["failed_stage"] == "check-env"


def test_a_bug_in_a_stage_exits_70_naming_the_stage(cli, tmp_path, monkeypatch):
    """issue 28 #14: every stray exception became StageFailed, exit 1; the one error table says 70."""
    from trnqwen.quickstart import stages

    def broken(device, assets):
        raise ZeroDivisionError("a bug in check-env")

    monkeypatch.setattr(stages, "stage_check_env", broken)  # the fault injected; the error mapping is under test
    result = cli("quickstart", "--workdir", str(tmp_path / "qs"), "--json")
    assert_clean_error(result, code=70, contains="internal error: ZeroDivisionError: a bug in check-env")
    partial = json.loads(result.out)  # what was done is still reported
    assert partial["failed_stage"] == "check-env" and partial["error"] == "ZeroDivisionError: a bug in check-env"


@pytest.mark.slow
def test_a_full_disk_exits_3_naming_the_stage(tmp_path):
    """issue 28 #14: a full disk was StageFailed, exit 1; the one error table says 3 (environment).

    The assets folder is a real tmpfs holding the fetched tiny model and 64 KiB more: the snapshot
    stage (after the pre-training run) fills it."""
    import subprocess

    from tests.helpers import mounted_tmpfs
    from trnqwen.constants import TINY_MODEL
    from trnqwen.fetch.download import fetch
    from trnqwen.quickstart import prepare_workdir

    work = prepare_workdir(tmp_path / "qs")
    with mounted_tmpfs(work / "assets", "size=16m") as assets:
        assert fetch(TINY_MODEL, assets / "tiny-qwen3", progress=False, keep_free=0).verified
        used_kib = int(subprocess.run(["df", "-k", "--output=used", str(assets)], capture_output=True, text=True,
                                      check=True).stdout.split()[-1])
        subprocess.run(["mount", "-o", f"remount,size={used_kib + 64}k", str(assets)], check=True)
        result = run_subprocess("quickstart", "--workdir", str(work), "--pretrain-steps", "2", "--json",
                                cwd=tmp_path, timeout=600)
    assert result.code == 3, result.text
    assert "disk full: No space left on device" in result.err and "Traceback" not in result.text
    partial = json.loads(result.out)
    assert partial["failed_stage"] == "snapshot" and "No space left" in partial["error"]


def test_refuses_a_folder_it_did_not_make(cli, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me\n")
    assert_clean_error(cli("quickstart", "--workdir", str(foreign)), code=2, contains="was not made by trnqwen quickstart")
    assert (foreign / "notes.txt").read_text() == "keep me\n"


def test_unknown_backend_is_a_usage_error(cli, tmp_path):
    assert_clean_error(cli("quickstart", "--workdir", str(tmp_path / "q"), "--backend", "nki-moe"), code=2,
                       contains="quickstart backends are")


# --- the parts ------------------------------------------------------------------------------------


def _info(label, backend, finetune, losses):
    from trnqwen.quickstart import RunInfo

    info = RunInfo(label=label, backend=backend, finetune=finetune, steps=len(losses), nproc_per_node=1)
    info.losses = list(losses)
    info.step1_loss, info.last_loss = losses[0], losses[-1]
    return info


def test_compare_losses_accepts_loaded_weights_and_rejects_a_fresh_start():
    from trnqwen.quickstart import StageFailed, compare_losses

    runs = {"pretrain": _info("pretrain", "native", False, [7.6, 6.8, 6.0]), "native": _info("native", "native", True, [6.1])}
    out = compare_losses(runs)
    assert out["ok"] and out["threshold"] == pytest.approx(6.8)
    runs["hf-v5"] = _info("hf-v5", "hf-v5", True, [7.55])  # weights not loaded: back at random init
    with pytest.raises(StageFailed, match="'inspect-logs' failed: the pre-trained weights were not loaded: hf-v5"):
        compare_losses(runs)


def test_compare_losses_needs_a_pretraining_that_learned():
    from trnqwen.quickstart import StageFailed, compare_losses

    runs = {"pretrain": _info("pretrain", "native", False, [7.6, 7.5]), "native": _info("native", "native", True, [7.4])}
    with pytest.raises(StageFailed, match="pre-training did not learn"):
        compare_losses(runs)
    runs["pretrain"] = _info("pretrain", "native", False, [7.6, float("nan")])
    with pytest.raises(StageFailed, match="no usable loss"):
        compare_losses(runs)


def test_make_snapshot_combines_weights_with_config_and_tokenizer(tmp_path):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from trnqwen.quickstart import make_snapshot

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"torch_dtype": "float32", "model_type": "qwen3"}))
    (base / "tokenizer.json").write_text("{}")
    (base / "tokenizer_config.json").write_text("{}")
    export = tmp_path / "ckpt" / "step-3"
    export.mkdir(parents=True)
    weights = {"a": np.arange(6, dtype=np.float16).reshape(2, 3), "b": np.full((4,), 0.5, dtype=np.float16)}
    save_file(weights, str(export / "model-00001-of-00001.safetensors"))
    (export / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}}))
    dest = make_snapshot(base, export, tmp_path / "snap")
    got = load_file(str(dest / "model-00001-of-00001.safetensors"))
    assert {k: v.dtype for k, v in got.items()} == {"a": np.float32, "b": np.float32}
    assert np.array_equal(got["a"], weights["a"].astype(np.float32))
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 40 and set(index["weight_map"]) == {"a", "b"}
    assert (dest / "tokenizer.json").is_file() and (dest / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".snap")]  # no temp folder left


def test_prepare_workdir_marks_and_reuses_its_own_folder(tmp_path):
    from trnqwen.quickstart import MARKER, prepare_workdir

    wd = prepare_workdir(tmp_path / "qs")
    assert (wd / MARKER).is_file()
    (wd / "runs").mkdir()
    assert prepare_workdir(tmp_path / "qs") == wd  # its own, non-empty: fine


# --- a wheel install has no examples/: the override stage says it is skipped (issue 18) -----------------


def _wheel_like_copy(dest: Path) -> Path:
    """The ``trnqwen`` package alone, as a wheel installs it (no examples/ next to it)."""
    import shutil

    from tests.helpers import REPO_ROOT

    shutil.copytree(REPO_ROOT / "trnqwen", dest / "trnqwen", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_override_stage_skip_is_one_line_with_the_reason(tmp_path, capsys):
    import subprocess
    import sys

    from trnqwen.quickstart import OVERRIDE_SKIPPED, Progress, Stage

    site = _wheel_like_copy(tmp_path / "site")
    found = subprocess.run([sys.executable, "-c", "from trnqwen.quickstart import override_example_dir as f; print(f())"],
                           cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": ""}, capture_output=True, text=True)
    assert found.stdout.strip() == "None", found.stderr  # the wheel layout has no example to run
    prog = Progress(True, 12)
    prog.start("override", "native fine-tune with --override-imports torch_rope_override.torch_rope")
    prog.done(Stage(name="override", ok=True, skipped=OVERRIDE_SKIPPED))
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "skipped" in x]
    assert "examples/torch_rope is not installed" in line and "source checkout" in line


@pytest.mark.slow
def test_quickstart_from_a_wheel_layout_shows_the_override_stage_skipped(tmp_path):
    """The real quickstart (one backend, few steps) run from the package alone, as after pip install."""
    site = _wheel_like_copy(tmp_path / "site")
    result = run_subprocess(
        "quickstart", "--workdir", str(tmp_path / "qs"), "--pretrain-steps", str(PRETRAIN_STEPS), "--steps", "1",
        "--nproc-per-node", "1", "--backend", "native", "--json",
        cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(site)}, timeout=900,
    )
    assert result.code == 0, result.text[-4000:]
    summary = json.loads(result.out)
    (override,) = [s for s in summary["stages"] if s["name"] == "override"]
    assert override["skipped"] and "examples/torch_rope" in override["skipped"] and override["ok"]
    assert "override" not in summary["runs"]
    (line,) = [x for x in result.err.splitlines() if "skipped" in x]
    assert "source checkout" in line


# --- two stages at a time (trnqwen.quickstart.lanes) -------------------------------------------------------


def test_lanes_run_two_jobs_at_once_in_order_and_wait_for_dependencies():
    import threading
    import time

    from trnqwen.quickstart.lanes import Job, run_jobs

    lock = threading.Lock()
    running, peak, events = [0], [0], []

    def job(name, seconds=0.2):
        def run():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                events.append(("start", name))
            time.sleep(seconds)
            with lock:
                running[0] -= 1
                events.append(("end", name))
        return run

    jobs = [Job("chat", job("chat", 0.6)), Job("native", job("native")), Job("override", job("override"), after=("native",)),
            Job("hf-v5", job("hf-v5")), Job("lora", job("lora")), Job("gone", job("gone"), after=("not a job",))]
    t0 = time.monotonic()
    run_jobs(jobs, workers=2)
    took = time.monotonic() - t0
    assert peak[0] == 2 and sorted(n for e, n in events if e == "end") == sorted(j.name for j in jobs)
    assert events.index(("start", "override")) > events.index(("end", "native"))
    assert [n for e, n in events if e == "start"][:2] == ["chat", "native"]  # list order
    assert took < 0.6 + 0.2 * 5  # side by side: well under the 1.6 s one at a time takes


def test_lanes_start_nothing_after_a_failure_and_raise_the_first_one():
    import time

    from trnqwen.quickstart.lanes import Job, run_jobs
    from trnqwen.quickstart.types import StageFailed

    ran = []

    def fail(name, delay):
        def run():
            time.sleep(delay)
            ran.append(name)
            raise StageFailed(name, "boom")
        return run

    jobs = [Job("a", fail("a", 0.3)), Job("b", fail("b", 0.05)), Job("c", lambda: ran.append("c")), Job("d", lambda: ran.append("d"))]
    with pytest.raises(StageFailed, match="'a' failed"):  # the first in list order, though b failed first
        run_jobs(jobs, workers=2)
    assert sorted(ran) == ["a", "b"]


def test_run_ids_reserved_in_one_second_differ(tmp_path):
    from trnqwen.quickstart.lanes import reserve_run_id

    ids = [reserve_run_id(tmp_path, "native", method="dpo", lora=True) for _ in range(3)]
    assert len(set(ids)) == 3 and all(i.split("-")[2:5] == ["native", "dpo", "lora"] for i in ids)


_CTRL_C_LANES = """
import os, signal, threading, time
from trnqwen.quickstart.lanes import Job, run_jobs
from trnqwen.train import stop_requests

stopped_with, started = [], threading.Barrier(3)

def supervised_run():
    received = []
    stop_requests.register(received)
    try:
        started.wait()
        deadline = time.monotonic() + 20
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped_with.append(received[:1])
    finally:
        stop_requests.unregister(received)

def press_ctrl_c():
    started.wait()
    time.sleep(0.2)  # the main thread is in run_jobs' join by now
    os.kill(os.getpid(), signal.SIGINT)  # a real signal: only the main thread sees it

threading.Thread(target=press_ctrl_c, daemon=True).start()
jobs = [Job("a", supervised_run), Job("b", supervised_run), Job("never", lambda: stopped_with.append("ran"))]
try:
    run_jobs(jobs, workers=2)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    print("stopped", sorted(map(str, stopped_with)), "left", stop_requests.request_stop())
"""


def test_ctrl_c_while_lanes_run_stops_each_run_through_its_own_stop_request():
    """Only the main thread gets Ctrl-C: run_jobs hands it to every supervised run
    (trnqwen.train.stop_requests), waits for the lanes to record how their runs ended, re-raises.
    In a fresh interpreter: a real SIGINT to this test process would meet whatever earlier tests
    left behind (it lost one run's stop after the slow quickstart tests, never alone)."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    out = subprocess.run([sys.executable, "-c", _CTRL_C_LANES], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT)})
    # both runs stopped with SIGINT, nothing new started, each run unregistered itself
    assert out.stdout.strip() == "stopped ['[<Signals.SIGINT: 2>]', '[<Signals.SIGINT: 2>]'] left 0", out.stdout + out.stderr


def test_a_running_stage_is_reported_while_it_runs(tmp_path, capsys):
    """Piped, the lane stages have no status line: a heartbeat names each running stage and its last
    logged step (read from the run's real log), and stops when the stages end."""
    import time

    from trnqwen.contract.stepline import format_step_line
    from trnqwen.quickstart import Progress, Stage

    log = tmp_path / "train.log"
    log.write_text("starting\n" + format_step_line(3, 5.1, 1.0, 0.1, 1.0, 1000, 0.1, None, lr=1e-4) + "\nnoise\n")
    prog = Progress(True, 15, heartbeat_s=0.2)
    prog.start("chat fine-tune", "bundled chat set")
    prog.watch("chat fine-tune", log, steps=40, live=False)
    prog.start("LoRA fine-tune", "adapter")
    prog.start("pre-train", "with its own status line")
    prog.watch("pre-train", log, steps=10, live=True)
    time.sleep(0.7)
    beats = [x for x in capsys.readouterr().err.splitlines() if "still running" in x]
    assert beats, "no heartbeat while stages ran"
    assert "chat fine-tune (step 3/40, " in beats[-1] and "LoRA fine-tune (" in beats[-1]
    assert "pre-train" not in beats[-1]  # it shows its own status line
    for name in ("chat fine-tune", "LoRA fine-tune", "pre-train"):
        prog.done(Stage(name=name, ok=True, detail="done"), name=name)
    capsys.readouterr()
    time.sleep(0.6)
    prog.close()
    assert "still running" not in capsys.readouterr().err  # nothing runs: no heartbeat
