"""RunRecord.save's "run dir deleted mid-run" check: it fires only for files that were there.

Every run saves run.json before the launcher opens train.log; those saves found the log "missing"
and every normal run warned that its run directory had been deleted (found at 2026-12-05)."""

from __future__ import annotations

import json

from trnqwen.rundir import RunRecord


def _record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return RunRecord(run_id="r", run_dir=str(run_dir), log_path=str(run_dir / "train.log")), run_dir


def test_saves_before_the_log_exists_lose_nothing(tmp_path):
    record, run_dir = _record(tmp_path)
    record.save()
    record.save()  # still no train.log: the launcher has not opened it yet
    (run_dir / "train.log").write_text("step: 1\n")
    record.save()
    assert "run_dir_lost" not in json.loads((run_dir / "run.json").read_text())["extra"]


def test_a_log_that_was_there_and_went_is_lost(tmp_path):
    record, run_dir = _record(tmp_path)
    record.save()
    (run_dir / "train.log").write_text("step: 1\n")
    record.save()
    (run_dir / "train.log").unlink()
    record.save()
    assert json.loads((run_dir / "run.json").read_text())["extra"]["run_dir_lost"]["lost"] == ["train.log"]


def test_a_loaded_record_knows_its_log_was_there(tmp_path):
    record, run_dir = _record(tmp_path)
    (run_dir / "train.log").write_text("step: 1\n")
    record.save()
    again = RunRecord.load(run_dir)
    (run_dir / "run.json").unlink()
    (run_dir / "train.log").unlink()
    again.save()
    assert set(json.loads((run_dir / "run.json").read_text())["extra"]["run_dir_lost"]["lost"]) == {"run.json", "train.log"}
