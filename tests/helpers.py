"""Helpers shared by tests: run the CLI in-process or as a real subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TRNQWEN = [sys.executable, "-m", "trnqwen"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(*args: str) -> Result:
    """The real ``main()`` in this process, capturing stdout/stderr and the exit code."""
    from trnqwen.cli.main import main

    import signal

    out, err = io.StringIO(), io.StringIO()
    code = 0
    sigint = signal.getsignal(signal.SIGINT)  # an interrupted command ignores SIGINT while it exits
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            signal.signal(signal.SIGINT, sigint)
    return Result(code, out.getvalue(), err.getvalue())


def run_subprocess(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> Result:
    """``python -m trnqwen ...`` as a real process (for anything touching signals or torchrun)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [*TRNQWEN, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def dry_plan(cli, *args: str) -> dict:
    """``trnqwen train ARGS --dry-run --json``'s plan (the command must succeed)."""
    import json

    r = cli("train", *args, "--dry-run", "--json")
    assert r.code == 0, r.text
    return json.loads(r.out)


def assert_clean_error(result: Result, *, code: int, contains: str) -> None:
    """A user mistake: the given exit code, a message naming the problem, no traceback."""
    assert result.code == code, f"exit {result.code} != {code}\n{result.text}"
    assert contains.lower() in result.text.lower(), result.text
    assert "Traceback" not in result.text, result.text


def assert_verified_export(doc: dict, step_dir: Path, *, step: int) -> None:
    """What verify-ckpt reports for a whole tiny-Qwen3 export: the run's step, every value scanned."""
    assert doc["ok"] and doc["problems"] == [], doc["problems"]
    assert doc["checkpoint"] == str(step_dir) and doc["step"] == step
    # exports are whole model folders: the model is built from the config.json written beside them
    assert doc["config_source"] == "beside the checkpoint" and doc["config_path"] == str(step_dir / "config.json")
    assert doc["scanned"]
    assert doc["missing_keys"] == [] and doc["unexpected_keys"] == [] and doc["nonfinite"] == {}
    assert doc["expected_missing"] == ["lm_head.weight"]  # tied to the embedding: not saved twice
    assert doc["num_tensors"] > 0 and doc["num_parameters"] > 0


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str):
    """A real tmpfs (e.g. ``ro,size=1m`` or ``size=3m``): chmod does not stop root, a mount does.

    Skips the test, saying why, where mounting is not allowed.
    """
    import pytest

    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def replace_weights(model, dest: Path) -> Path:
    """Save ``model`` into the model folder ``dest`` in place of the weights (and index) it had."""
    for old in Path(dest).glob("model*.safetensors*"):
        old.unlink()
    model.save_pretrained(dest)
    return Path(dest)
