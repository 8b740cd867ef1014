"""Resume, preemption and the checkpoint folder layout: the rules, on real folders and run records.

The real torchrun runs (exactness, SIGTERM, a different world size) are in test_resume_e2e.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.ckpt_fixtures import tree_hash
from tests.helpers import assert_clean_error
from trnqwen.config import RunConfig
from trnqwen.errors import UsageError
from trnqwen.rundir import RunRecord, point_last
from trnqwen.contract import checkpoint_layout as checkpoints
from trnqwen.train import resume

TINY = "builtin:tiny-qwen3"


# --- the folder layout ------------------------------------------------------------------------------


def _dcp(folder: Path, complete: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (folder / ".metadata").write_bytes(b"m")
    return folder


def _hf(folder: Path, complete: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"x")
    if complete:
        (folder / checkpoints.INDEX_NAME).write_text("{}")
    return folder


def test_scan_tells_complete_from_half_written_steps(tmp_path):
    root = tmp_path / "ck"
    _dcp(root / "resume" / "step-4")
    _dcp(root / "resume" / "step-8", complete=False)  # killed mid-save: no .metadata
    trainer = root / "resume" / "checkpoint-6"
    trainer.mkdir()
    (trainer / "trainer_state.json").write_text("{}")
    _hf(root / "hf" / "step-4")
    found = checkpoints.scan(root)
    assert [(s.step, s.kind, s.complete) for s in found.resume] == [(4, "dcp", True), (6, "trainer", True), (8, "dcp", False)]
    assert found.latest_resume.step == 6 and found.latest_export.step == 4
    assert "8 incomplete" in found.describe() and found.foreign == []
    assert checkpoints.find_export(root) == root / "hf" / "step-4"


def test_a_new_run_into_a_used_folder_is_refused_with_the_three_choices(tmp_path):
    root = tmp_path / "ck"
    _dcp(root / "resume" / "step-2")
    checkpoints.write_owner(root, run_id="run-1", model=TINY, backend="native")
    before = tree_hash(root)
    with pytest.raises(UsageError) as exc:
        checkpoints.check_for_new_run(root, overwrite=False)
    text = exc.value.message + " " + exc.value.hint
    assert str(root) in text and "run-1" in text
    assert "trnqwen train --resume run-1" in text and "--checkpoint-dir" in text and "--overwrite" in text
    assert tree_hash(root) == before
    found = checkpoints.check_for_new_run(root, overwrite=True)  # allowed; clear() does the removal
    assert checkpoints.clear(found) and not root.joinpath("resume").exists() and not (root / checkpoints.OWNER_FILE).exists()


def test_old_layout_exports_count_as_checkpoints(tmp_path):
    """The crash of the issue: an older run's step-N export beside torchtitan's resume points."""
    root = tmp_path / "ck"
    _hf(root / "step-2")
    with pytest.raises(UsageError, match="already holds checkpoints"):
        checkpoints.check_for_new_run(root, overwrite=False)


def test_foreign_files_are_never_a_checkpoint_folder_and_never_deleted(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "thesis.tex").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(UsageError, match="not trnqwen, torchtitan or Trainer checkpoints"):
            checkpoints.check_for_new_run(root, overwrite=overwrite)
    assert (root / "thesis.tex").read_text() == "mine"


def test_remove_incomplete_keeps_what_existed_and_what_is_complete(tmp_path):
    root = tmp_path / "ck"
    old_partial = _dcp(root / "resume" / "step-1", complete=False)
    before = checkpoints.step_paths(root)
    done = _dcp(root / "resume" / "step-2")
    partial = _dcp(root / "resume" / "step-3", complete=False)
    half_export = _hf(root / "hf" / "step-3", complete=False)
    removed = checkpoints.remove_incomplete(root, before)
    assert sorted(removed) == sorted([str(partial), str(half_export)])
    assert old_partial.exists() and done.exists() and not partial.exists()


def test_preempted_step_is_read_from_the_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step: 1\n[rank0]:[titan] ... - [trnqwen] preempted: SIGTERM at step 4; saved a resumable checkpoint\n")
    assert resume.preempted_step(log) == (4, "SIGTERM")
    assert resume.preempted_step(log, offset=log.stat().st_size) is None


def test_bare_resume_means_last():
    from trnqwen.cli.main import resume_takes_optional_value as fix

    assert fix(["train", "--resume"]) == ["train", "--resume", "last"]
    assert fix(["train", "--resume", "--steps", "9"]) == ["train", "--resume", "last", "--steps", "9"]
    assert fix(["train", "--resume", "r1"]) == ["train", "--resume", "r1"]
    assert fix(["train", "--", "--resume"]) == ["train", "--", "--resume"]


def test_keep_last_follows_torchtitans_rule():
    from trnqwen.config import resolve_config
    from trnqwen.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        resolve_config({"keep_last": 1}, environ={})
    assert "keep_last = 1: must be 0 (keep all) or at least 2" in exc.value.problems[0]
    assert RunConfig(keep_last=0).keep_last == 0 and RunConfig().resolved_save_every == 500


# --- --resume: a recorded run ---------------------------------------------------------------------


@pytest.fixture
def recorded(in_tmp):
    """A preempted tiny native run as trnqwen records it: run.json, assets, resume/step-4."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    assets = write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    cfg = RunConfig(model=TINY, backend="native", device="cpu", nproc_per_node=2, steps=8, seq_len=128, finetune=True)
    root = in_tmp / cfg.resolved_checkpoint_dir
    runs = in_tmp / ".trnqwen" / "runs"
    record = RunRecord(
        run_id="r1", run_dir=str(runs / "r1"), status="interrupted", config=cfg.model_dump(mode="json"),
        checkpoint_dir=str(root), assets_dir=str(assets), backend="native", steps=8,
        extra={"cwd": str(in_tmp), "interrupted_at_step": 4},
    )
    (runs / "r1").mkdir(parents=True)
    record.save()
    point_last(runs, "r1")
    _dcp(root / "resume" / "step-4")
    checkpoints.write_owner(root, run_id="r1", model=TINY, backend="native")
    return in_tmp, record, root


def _resolved(**flags):
    from trnqwen.config import resolve_config

    return resolve_config(flags, environ={})


def test_resume_continues_with_the_recorded_config(recorded):
    work, record, root = recorded
    point = resume.prepare("last", _resolved(steps=12, nproc_per_node=1))
    assert point.run_id == "r1" and point.from_step == 4 and point.checkpoint == root / "resume" / "step-4"
    cfg = point.resolved.config
    assert (cfg.backend, cfg.seq_len, cfg.finetune, cfg.steps, cfg.nproc_per_node) == ("native", 128, True, 12, 1)
    assert point.changes == {"steps": 12, "nproc_per_node": 1}
    assert point.resolved.sources["seq_len"] == "run.json of r1" and point.resolved.sources["steps"] == "flag --steps"


@pytest.mark.parametrize("flag, value", [("seq_len", 256), ("backend", "hf-v5"), ("model", "Qwen/Qwen3-0.6B"), ("lr", 0.1)])
def test_resume_refuses_flags_that_change_the_run_naming_the_field(recorded, flag, value):
    with pytest.raises(UsageError) as exc:
        resume.prepare("r1", _resolved(**{flag: value}))
    assert exc.value.message.startswith(f"--resume: {flag} would change")


def test_resume_of_a_completed_run_says_how_to_extend_it(recorded):
    work, record, root = recorded
    record.status = "succeeded"
    record.save()
    _dcp(root / "resume" / "step-8")
    with pytest.raises(UsageError) as exc:
        resume.prepare("r1", _resolved())
    assert "already completed all 8 steps" in exc.value.message and "--steps 16" in exc.value.hint
    assert resume.prepare("r1", _resolved(steps=10)).from_step == 8  # extending is allowed


def test_resume_bad_inputs_are_one_clear_line_and_write_nothing(recorded, cli):
    work, record, root = recorded
    before = tree_hash(work)
    assert_clean_error(cli("train", "--resume", "nope"), code=2, contains="no run 'nope'")
    (work / "assets" / "hf" / "tiny-qwen3" / "config.json").rename(work / "config.json.bak")
    assert_clean_error(cli("train", "--resume"), code=2, contains="model assets of run r1 are gone")
    (work / "config.json.bak").rename(work / "assets" / "hf" / "tiny-qwen3" / "config.json")
    (root / "notes.txt").write_text("mine")
    assert_clean_error(cli("train", "--resume"), code=2, contains="not a torchtitan or Trainer checkpoint")
    (root / "notes.txt").unlink()
    assert_clean_error(cli("train", "--resume", "--seq-len", "256"), code=2, contains="seq_len would change")
    assert_clean_error(cli("train", "--resume", "--overwrite"), code=2, contains="pick one")
    assert tree_hash(work) == before


def test_resume_with_data_gone(recorded):
    work, record, root = recorded
    data = work / "data.jsonl"
    record.config["dataset"] = str(data)
    record.save()
    with pytest.raises(UsageError, match="training data of run r1 is gone"):
        resume.prepare("r1", _resolved())


def test_resume_after_the_data_changed_is_refused_before_any_rank_starts(recorded, cli):
    """issue 28 #10: the ranks started and failed 12 s later on the saved data position."""
    from trnqwen.config import resolve_config
    from trnqwen.dataset.prepare import prepare_dataset

    work, record, root = recorded
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i} " * 20}) + "\n" for i in range(12)))
    record.config["dataset"] = str(data)
    cfg = resolve_config(dict(record.config), environ={}).config
    record.extra["dataset_cache"] = str(prepare_dataset(cfg).cache_dir)
    record.save()
    dry = cli("train", "--resume", "--dry-run", "--json")
    assert dry.code in (0, 1) and "changed since it was saved" not in dry.text, dry.text  # the same data resumes
    data.write_text(data.read_text() + json.dumps({"text": "one more record " * 20}) + "\n")
    before = tree_hash(work / ".trnqwen")
    r = cli("train", "--resume")
    assert_clean_error(r, code=2, contains="the training data of run r1 changed since it was saved: step 4")
    assert "put the data back" in r.text
    assert tree_hash(work / ".trnqwen") == before  # nothing started, nothing written


def test_resume_on_another_kind_of_device_is_refused(recorded, cli):
    """issue 28 #15: MAY_CHANGE admitted device; a Trainium run continued on CPU is not exact."""
    work, record, root = recorded
    record.extra["device"] = {"type": "neuron"}
    record.save()
    r = cli("train", "--resume", "--dry-run")
    assert_clean_error(r, code=2, contains="run r1 trained on neuron, and this run would continue on cpu")
    record.extra["device"] = {"type": "cpu"}
    record.save()
    assert cli("train", "--resume", "--dry-run", "--device", "auto").code in (0, 1)  # the same kind, named again


def test_resume_without_any_earlier_run(in_tmp, cli):
    r = cli("train", "--resume")
    assert_clean_error(r, code=2, contains="no earlier run")
    assert "--runs-dir" not in r.text and "TRNQWEN_RUNS_DIR" in r.text  # issue 28 #10: there is no --runs-dir flag
    assert not (in_tmp / ".trnqwen").exists()


def test_resume_refuses_a_run_that_is_still_running(recorded):
    work, record, root = recorded
    import psutil

    record.status = "running"
    record.extra.update(launcher_pid=os.getppid(), launcher_started_at=psutil.Process(os.getppid()).create_time())
    record.save()
    with pytest.raises(UsageError, match="still running") as exc:
        resume.prepare("r1", _resolved())
    # issue 28 #12: Ctrl-C (SIGINT) stops without a checkpoint; SIGTERM saves one
    assert f"kill -TERM {os.getppid()} saves a checkpoint" in exc.value.hint and "Ctrl-C stops it without one" in exc.value.hint


def _checkpoint_settings(cli) -> dict:
    res = cli("config", "show", "--json")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    names = ("save_every", "keep_last", "grace_seconds")
    return {
        "config": {k: doc["config"][k] for k in names},
        "resolved_save_every": doc["derived"]["resolved_save_every"],
        "sources": {k: doc["sources"][k] for k in (*names, "resolved_save_every")},
    }


def test_config_show_lists_the_checkpoint_settings_with_their_values_and_sources(cli, in_tmp, monkeypatch):
    assert _checkpoint_settings(cli) == {
        "config": {"save_every": None, "keep_last": 3, "grace_seconds": 90.0},
        "resolved_save_every": 500,  # torchtitan's interval when nothing is set
        "sources": {"save_every": "default", "keep_last": "default", "grace_seconds": "default",
                    "resolved_save_every": "derived"},
    }
    monkeypatch.setenv("TRNQWEN_SAVE_EVERY", "50")
    monkeypatch.setenv("TRNQWEN_KEEP_LAST", "0")
    monkeypatch.setenv("TRNQWEN_GRACE_SECONDS", "30")
    assert _checkpoint_settings(cli) == {
        "config": {"save_every": 50, "keep_last": 0, "grace_seconds": 30.0},
        "resolved_save_every": 50,
        "sources": {"save_every": "env TRNQWEN_SAVE_EVERY", "keep_last": "env TRNQWEN_KEEP_LAST",
                    "grace_seconds": "env TRNQWEN_GRACE_SECONDS", "resolved_save_every": "derived"},
    }
    monkeypatch.setenv("TRNQWEN_SAVE_EVERY", "epoch")
    got = _checkpoint_settings(cli)
    assert got["config"]["save_every"] == "epoch" and got["resolved_save_every"] == "epoch"


# --- verify-ckpt after a failed run -------------------------------------------------------------


def test_verify_ckpt_without_argument_never_passes_a_failed_run_silently(in_tmp, cli):
    from tests.ckpt_fixtures import make_case

    ckpt, assets, _ = make_case(in_tmp / "old")
    runs = in_tmp / ".trnqwen" / "runs"
    good = RunRecord(run_id="a-good", run_dir=str(runs / "a-good"), status="succeeded", checkpoint_dir=str(ckpt),
                     assets_dir=str(assets), extra={"exported": str(ckpt / "step-3")})
    bad = RunRecord(run_id="b-bad", run_dir=str(runs / "b-bad"), status="failed", error="AssertionError: metadata is None",
                    checkpoint_dir=str(in_tmp / "new"), assets_dir=str(assets))
    for r in (good, bad):
        Path(r.run_dir).mkdir(parents=True)
        r.save()
    os.utime(runs / "a-good" / "run.json", (1, 1))
    point_last(runs, "b-bad")
    res = cli("verify-ckpt", "--quick", "--json")
    assert res.code == 0, res.text
    doc = json.loads(res.out)
    assert "the last run (b-bad) ended failed: AssertionError" in doc["note"] and "a-good" in doc["note"]
    assert "b-bad" in res.err  # said on stderr too, not only in the JSON
    good.status = "failed"
    good.save()
    assert_clean_error(cli("verify-ckpt", "--quick"), code=2, contains="no earlier run exported")


def test_verify_ckpt_while_the_last_run_is_still_running_says_so(in_tmp, cli):
    """issue 28 #12: "the last run (r) ended running" and "holds no checkpoints yet (no checkpoints)"."""
    runs = in_tmp / ".trnqwen" / "runs"
    root = in_tmp / "ck"
    running = RunRecord(run_id="r-live", run_dir=str(runs / "r-live"), status="running", checkpoint_dir=str(root))
    Path(running.run_dir).mkdir(parents=True)
    running.save()
    point_last(runs, "r-live")
    r = cli("verify-ckpt", "--quick")
    assert_clean_error(r, code=2, contains="the last run (r-live) is still running, and no earlier run exported")
    assert "ended running" not in r.text and "wait until that run has finished" in r.text
    checkpoints.write_owner(root, run_id="r-live", model=TINY, backend="native")  # a run that has not saved yet
    r = cli("verify-ckpt", str(root), "--quick")
    assert_clean_error(r, code=2, contains=f"{root} holds no checkpoints yet")
    assert "(no checkpoints)" not in r.text


def test_verify_ckpt_lists_complete_and_incomplete_steps(in_tmp, cli):
    from tests.ckpt_fixtures import make_case

    case, assets, _ = make_case(in_tmp / "case")
    root = in_tmp / "ck"
    (root / "hf").mkdir(parents=True)
    (case / "step-3").rename(root / "hf" / "step-3")
    _hf(root / "hf" / "step-5", complete=False)
    _dcp(root / "resume" / "step-3")
    _dcp(root / "resume" / "step-5", complete=False)
    res = cli("verify-ckpt", str(root), "--step", "3", "--assets", str(assets), "--quick", "--json")
    assert res.code == 0, res.text
    folder = json.loads(res.out)["checkpoint_folder"]
    assert [(s["step"], s["complete"]) for s in folder["resume"]] == [(3, True), (5, False)]
    assert [(s["step"], s["complete"]) for s in folder["exports"]] == [(3, True), (5, False)]
    text = cli("verify-ckpt", str(root), "--step", "3", "--assets", str(assets), "--quick").out
    assert "resume points: complete 3; incomplete 5" in text


def test_rank_rng_round_trip_restores_every_generator():
    """What the checkpoint holds per rank: torch, Python and NumPy generators, as tensors only."""
    import random

    import numpy as np
    import torch

    from trnqwen.runtime.resume_state import RankRNG

    rng = RankRNG(3)
    random.gauss(0, 1)  # a cached Gaussian is part of Python's state
    saved = {k: v.clone() for k, v in rng.state_dict()["rank_3"].items()}
    assert all(isinstance(v, torch.Tensor) for v in saved.values())
    draws = (torch.rand(4), random.random(), random.gauss(0, 1), np.random.rand(3))
    rng.load_state_dict({"rank_3": saved})
    again = (torch.rand(4), random.random(), random.gauss(0, 1), np.random.rand(3))
    assert torch.equal(draws[0], again[0]) and draws[1:3] == again[1:3] and np.array_equal(draws[3], again[3])
    rng.load_state_dict({"rank_0": saved})  # another rank's key: nothing to restore, nothing breaks


def test_inspect_logs_reads_a_resumed_log_as_one_run(tmp_path, cli):
    """Preempted at step 2, resumed: one run with resumes [{from_step, line}], no restart warning."""
    def step(n, loss):
        return f"[rank0]:[titan] 2026-11-30 10:00:0{n},000 - root - INFO - step: {n}  loss: {loss:.4f}  grad_norm: 1.0  memory: 0.9GiB(3.0%)  tps: 100  tflops: 0.01  mfu: 0.01%"

    lines = [
        "[rank0]:[titan] 2026-11-30 10:00:00,000 - root - INFO - Training starts at step 1",
        step(1, 7.6), step(2, 7.5),
        "[rank0]:[trnqwen] received SIGTERM: saving a resumable checkpoint at the next step boundary",
        "[rank0]:[titan] 2026-11-30 10:00:03,000 - root - INFO - [trnqwen] preempted: SIGTERM at step 2; saved a resumable checkpoint of step 2 to /c/resume/step-2",
        "[trnqwen] resumed run r1 from step 2 (/c/resume/step-2)",
        "[rank0]:[titan] 2026-11-30 10:01:00,000 - root - INFO - Training starts at step 3",
        step(3, 7.4), step(4, 7.3),
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    doc = json.loads(cli("inspect-logs", str(log), "--json").out)
    assert doc["resumes"] == [{"from_step": 2, "line": 6}]
    assert doc["preempted"] == [{"step": 2, "signal": "SIGTERM", "line": 5}]
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4]
    codes = {f["code"] for f in doc["findings"]}
    assert "resumed" in codes and "restarted" not in codes and "preempted" not in codes  # resumed since
    log.write_text("\n".join(lines[:5]) + "\n")  # preempted, not resumed yet: say how to continue
    doc = json.loads(cli("inspect-logs", str(log), "--json").out)
    assert any(f["code"] == "preempted" and "--resume" in f["message"] for f in doc["findings"])


def test_resume_auto_continues_only_this_jobs_own_run(in_tmp):
    """The sbatch script and the PyTorchJob run `--resume auto`: a first start starts, a node that
    ran this run before (requeue, pod restart) resumes it, and a job without a run id is refused."""
    from trnqwen.train import multinode

    runs = in_tmp / ".trnqwen" / "runs"
    single = _resolved(rdzv_id="job7")
    assert resume.auto_run_id(single) is None  # nothing ran yet
    (runs / "job7").mkdir(parents=True)
    RunRecord(run_id="job7", run_dir=str(runs / "job7"), status="submitted").save()
    assert resume.auto_run_id(single) is None  # submitted by sbatch, never started
    RunRecord(run_id="job7", run_dir=str(runs / "job7"), status="interrupted").save()
    assert resume.auto_run_id(single) == "job7"
    node1 = _resolved(rdzv_id="job8", nnodes=2, node_rank=1, rdzv_endpoint="h:1")
    assert resume.auto_run_id(node1) is None
    multinode.node_dir(runs / "job8", 1).mkdir(parents=True)
    assert resume.auto_run_id(node1) == "job8"
    with pytest.raises(UsageError, match="--rdzv-id"):
        resume.auto_run_id(_resolved())


def test_the_same_command_twice_is_refused_before_anything_starts(in_tmp, cli):
    """The issue's crash: the second identical `train --finetune` found the first run's export.
    Now it stops in preflight with the three choices (exit 2), and writes nothing."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    args = ["train", "--model", TINY, "--device", "cpu", "--steps", "2", "--seq-len", "128", "--finetune"]
    root = in_tmp / RunConfig(model=TINY, finetune=True).resolved_checkpoint_dir
    _hf(root / "hf" / "step-2")  # what the first run left
    _dcp(root / "resume" / "step-2")
    checkpoints.write_owner(root, run_id="first", model=TINY, backend="hf-v5")
    before = tree_hash(in_tmp)
    res = cli(*args)
    assert_clean_error(res, code=2, contains="already holds checkpoints of run first")
    assert "--resume first" in res.text and "--checkpoint-dir" in res.text and "--overwrite" in res.text
    assert tree_hash(in_tmp) == before and not (in_tmp / ".trnqwen").exists()
    dry = cli(*args, "--dry-run", "--json")
    assert dry.code == 1 and json.loads(dry.out)["preflight"]["ok"] is False  # a dry run that would not start


def test_a_one_node_scheduler_job_is_named_after_its_run_id(in_tmp, cli):
    """SLURM/k8s give every node TRNQWEN_RDZV_ID; a one-node job's run dir must carry it too, or
    its restart (`--resume auto`) would never find the run it should continue."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    res = cli("train", "--model", TINY, "--device", "cpu", "--steps", "2", "--seq-len", "128", "--finetune",
              "--rdzv-id", "job9", "--resume", "auto", "--dry-run", "--json")
    assert res.code == 0, res.text
    assert json.loads(res.out)["run_id"] == "job9"


# --- --overwrite deletes only what trnqwen wrote (issue 24) ------------------------------------------


def _used_folder(root: Path) -> Path:
    """What a finished run leaves: resume points, an export with its .sharded pieces, the owner file."""
    _dcp(root / "resume" / "step-2")
    _dcp(root / "resume" / "step-3")
    _hf(root / "hf" / "step-3")
    for name in ("config.json", "tokenizer.json", "README.md"):
        (root / "hf" / "step-3" / name).write_text("{}")
    (root / "hf" / "step-3.sharded").mkdir()
    (root / "hf" / "step-3.sharded" / "shard-00001-model-00001-of-00001.safetensors").write_bytes(b"x")
    trainer = root / "resume" / "checkpoint-4"
    (trainer / "dcp").mkdir(parents=True)
    for name in ("trainer_state.json", "rng_state_0.pth", "scheduler.pt", "dcp/.metadata", "dcp/__0_0.distcp"):
        (trainer / name).write_bytes(b"x")
    checkpoints.write_owner(root, run_id="first", model=TINY, backend="native")
    return root


@pytest.mark.parametrize("user_path", ["hf/step-3/NOTES.md", "hf/step-3/eval_outputs/scores.json", "resume/step-2/extra/a.txt",
                                       "resume/checkpoint-4/dcp/mine.txt", "hf/notes.txt"])
def test_overwrite_refuses_a_folder_with_files_trnqwen_did_not_write(tmp_path, user_path):
    root = _used_folder(tmp_path / "ck")
    (root / user_path).parent.mkdir(parents=True, exist_ok=True)
    (root / user_path).write_text("mine")
    before = tree_hash(root)
    with pytest.raises(UsageError) as exc:
        checkpoints.check_for_new_run(root, overwrite=True)
    shown = user_path if user_path.count("/") < 3 or "dcp" in user_path else user_path.rsplit("/", 1)[0] + "/"
    assert "holds files trnqwen did not write" in exc.value.message and shown in exc.value.message, exc.value.message
    with pytest.raises(UsageError):
        checkpoints.clear(checkpoints.scan(root))
    assert tree_hash(root) == before  # nothing deleted


def test_overwrite_deletes_every_file_trnqwen_writes_and_nothing_else(tmp_path):
    root = _used_folder(tmp_path / "ck")
    (root / "README.md").write_text("the user's notes on this folder")  # beside, not inside, the step folders
    found = checkpoints.check_for_new_run(root, overwrite=True)
    assert [str(p.relative_to(root)) for p in checkpoints.step_folders(found)] == [
        "resume/checkpoint-4", "resume/step-2", "resume/step-3", "hf/step-3", "hf/step-3.sharded"]
    checkpoints.clear(found)
    assert sorted(p.name for p in root.iterdir()) == ["README.md"]


def test_overwrite_dry_run_lists_what_it_would_delete_and_refuses_user_files(in_tmp, cli):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    write_tiny_qwen3(in_tmp / "assets" / "hf" / "tiny-qwen3")
    root = _used_folder(in_tmp / "ck")
    args = ["train", "--model", TINY, "--device", "cpu", "--steps", "2", "--seq-len", "128", "--finetune",
            "--checkpoint-dir", "ck", "--overwrite"]
    dry = cli(*args, "--dry-run", "--json")
    assert dry.code == 0, dry.text
    listed = [f["message"] for f in json.loads(dry.out)["preflight"]["findings"] if f["message"].startswith("--overwrite deletes")]
    assert listed == [f"--overwrite deletes from {root}: resume/checkpoint-4, resume/step-2, resume/step-3, hf/step-3, "
                      "hf/step-3.sharded and its owner file"], dry.out
    (root / "hf" / "step-3" / "NOTES.md").write_text("mine")
    before = tree_hash(in_tmp)
    res = cli(*args)
    assert_clean_error(res, code=2, contains="holds files trnqwen did not write (hf/step-3/NOTES.md)")
    assert tree_hash(in_tmp) == before and not (in_tmp / ".trnqwen").exists()


# --- a resume whose checkpoints are gone (issue 24) -----------------------------------------------------


def test_saved_steps_come_from_the_record():
    record = RunRecord(run_id="r", run_dir="/x", status="interrupted",
                       extra={"saved_checkpoints": [2, 4], "interrupted_at_step": 5, "resumes": [{"from_step": 0}, {"from_step": 3}]})
    assert resume.saved_steps(record) == [2, 3, 4, 5]
    assert resume.saved_steps(RunRecord(run_id="r", run_dir="/x", status="failed")) == []


def test_starting_the_dataloader_leaves_the_global_rng_alone():
    """torch's DataLoader draws its iterator seed from the global RNG when iteration starts: in a
    resumed run that happens after the RNG was restored, and shifted every dropout mask after it.
    The ranks start it through _RngNeutralIterable, which leaves the RNG where it was."""
    import torch
    from torch.utils.data import DataLoader

    from trnqwen.runtime.resume_state import _RngNeutralIterable

    loader = DataLoader(list(range(8)), batch_size=2)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    iter(loader)
    assert not torch.equal(torch.get_rng_state(), before)  # the draw this is about
    torch.manual_seed(0)
    batches = list(_RngNeutralIterable(loader))
    assert torch.equal(torch.get_rng_state(), before)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]


# --- a run recorded by an earlier trnqwen (issue 33 #6): its run.json, as written, still resumes ----

RECORDED_BEFORE = Path(__file__).parent / "data" / "run_records" / "0.1.0-native-preempted.run.json"


@pytest.fixture
def recorded_before(in_tmp):
    """The committed run.json of a preempted tiny native run, written by trnqwen 0.1.0 before the
    settings were declared once (paths put back under this test's folder), with its assets and
    the resume/step-4 checkpoint it saved."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    text = RECORDED_BEFORE.read_text().replace("@WORK@", str(in_tmp)).replace("@REPO@", str(Path(__file__).parents[1]))
    data = json.loads(text)
    run_dir = Path(data["run_dir"])
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(text)
    point_last(run_dir.parent, data["run_id"])
    write_tiny_qwen3(Path(data["assets_dir"]))
    root = Path(data["checkpoint_dir"])
    _dcp(root / "resume" / "step-4")
    checkpoints.write_owner(root, run_id=data["run_id"], model=TINY, backend="native")
    return in_tmp, data


def test_a_run_recorded_before_the_change_resumes(recorded_before):
    work, data = recorded_before
    point = resume.prepare("last", _resolved(steps=12))
    assert point.run_id == data["run_id"] and point.from_step == 4
    cfg = point.resolved.config
    dumped = cfg.model_dump(mode="json")
    assert {k: dumped.get(k) for k in data["config"]} == {**data["config"], "steps": 12}  # every recorded value kept
    # a setting added since the record (e.g. a new method's) is at its default
    defaults = type(cfg)().model_dump(mode="json")
    assert {k: dumped[k] for k in set(dumped) - set(data["config"])} == {k: defaults[k] for k in set(dumped) - set(data["config"])}
    assert point.changes == {"steps": 12} and point.resolved.sources["seq_len"] == f"run.json of {data['run_id']}"


def test_train_resume_of_a_run_recorded_before_the_change(recorded_before, cli):
    work, data = recorded_before
    r = cli("train", "--resume", "--steps", "12", "--dry-run", "--json")
    assert r.code == 0, r.text
    plan = json.loads(r.out)
    assert plan["run_id"] == data["run_id"] and plan["config"]["steps"] == 12 and plan["config"]["seq_len"] == 128
    assert "training.steps = 12" in plan["config_module_text"]
    assert_clean_error(cli("train", "--resume", "--seq-len", "256"), code=2, contains="seq_len would change")
