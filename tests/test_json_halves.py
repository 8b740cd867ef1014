"""``inspect-logs --json`` on a long log writes the steps in two halves made at once, the second
by a forked child that writes it to the same descriptor (trnqwen.logs.halves): the same bytes as
one process, and every way it can fail ends as a write here would have (or redone here)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from trnqwen.logs import halves, jsonsteps, parallel
from trnqwen.logs.parse import parse_bytes
from trnqwen.contract.stepline import format_step_line, lr_text


def _log_bytes(steps: int) -> bytes:
    lines = ["[rank0]:[titan] 2026-11-29 09:00:00,000 - root - INFO - "
             + format_step_line(s, 2.0 + (s % 97) / 1e3, 0.5 + (s % 7) / 8, 20.0 + s % 3, 83.3, 1200 + s % 11, 30.5, 4.5)
             + lr_text(1e-5 * (1 + s % 13) / 13) for s in range(1, steps + 1)]
    lines.insert(steps // 3, f"[rank0]:[titan] 2026-11-29 09:00:00,000 - root - INFO - step: {steps // 3}  loss: nan  grad_norm: 1.0")
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(parallel, "cores_to_spare", lambda: 1)
    monkeypatch.setattr(jsonsteps, "SPLIT_ROWS", 10)


def _written(tmp_path, log) -> str:
    path = tmp_path / "steps.json"
    with open(path, "w") as out:
        jsonsteps.StepRowsJSON(log).write(out)
    return path.read_text()


def test_two_halves_equal_json_dumps_and_the_child_wrote_its_half(tmp_path, two_cores, monkeypatch):
    monkeypatch.setattr(jsonsteps.StepRowsJSON, "BATCH", 37)  # halves that cut batches
    log = parse_bytes(_log_bytes(1001), "x")
    before = dict(halves.STATS)
    assert _written(tmp_path, log) == json.dumps(jsonsteps.step_rows(log))
    assert halves.STATS["split"] == before["split"] + 1
    assert halves.STATS["child_wrote"] == before["child_wrote"] + 1


def test_one_process_when_told_or_short_or_without_a_descriptor(tmp_path, monkeypatch):
    import io

    log = parse_bytes(_log_bytes(60), "x")
    monkeypatch.setattr(jsonsteps, "SPLIT_ROWS", 10)
    monkeypatch.setenv("TRNQWEN_LOG_WORKERS", "0")
    before = halves.STATS["split"]
    assert _written(tmp_path, log) == json.dumps(jsonsteps.step_rows(log))
    monkeypatch.delenv("TRNQWEN_LOG_WORKERS")
    monkeypatch.setattr(parallel, "cores_to_spare", lambda: 1)
    buf = io.StringIO()  # no descriptor for a child to write to
    jsonsteps.StepRowsJSON(log).write(buf)
    assert buf.getvalue() == json.dumps(jsonsteps.step_rows(log))
    monkeypatch.setattr(jsonsteps, "SPLIT_ROWS", 61)
    assert _written(tmp_path, log) == json.dumps(jsonsteps.step_rows(log))
    assert halves.STATS["split"] == before


def test_a_child_that_fails_before_writing_is_redone_here(tmp_path):
    parent = os.getpid()

    def second():
        if os.getpid() != parent:
            raise RuntimeError("a bug in the child")
        yield "c"
        yield "d"

    before = halves.STATS["redone_here"]
    path = tmp_path / "out.txt"
    with open(path, "w") as out:
        halves.write(out, lambda: iter(["a", "b"]), second)
    assert path.read_text() == "abcd"
    assert halves.STATS["redone_here"] == before + 1


@pytest.mark.parametrize("target,error", [("pipe", BrokenPipeError), ("/dev/full", OSError)])
def test_a_write_that_fails_in_the_child_is_raised_here(target, error):
    if target == "pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)  # nobody reads: the child's write gets EPIPE
        out = os.fdopen(write_end, "w")
    else:
        if not os.path.exists(target):
            pytest.skip("no /dev/full here")
        out = open(target, "w")  # every write: ENOSPC, as on a full disk
    with out, pytest.raises(error) as caught:
        halves.write(out, lambda: iter([]), lambda: iter(["x" * 100]))
    assert caught.value.errno == (errno.EPIPE if target == "pipe" else errno.ENOSPC)
    try:
        out.close()
    except OSError:
        pass


def test_the_command_writes_a_long_log_whole_through_a_pipe(tmp_path):
    """The real command, stdout a pipe: a 60,000-step log (over SPLIT_ROWS) gives every row."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    data = _log_bytes(60_000)
    path = tmp_path / "train.log"
    path.write_bytes(data)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TRNQWEN_LOG_WORKERS="1")
    proc = subprocess.run([sys.executable, "-m", "trnqwen", "inspect-logs", str(path), "--json", "--no-strict"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == json.loads(json.dumps(jsonsteps.step_rows(parse_bytes(data, "x"))))
