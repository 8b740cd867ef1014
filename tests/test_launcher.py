"""The launcher: torchrun argv as data, rank env, root-cause extraction, and supervision of a
real torchrun running fake rank scripts (signals, no orphans, exit codes, run record)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from trnqwen.config import RunConfig
from trnqwen.env.device import DeviceInfo
from trnqwen.errors import UsageError
from trnqwen.train import launcher, rootcause
from trnqwen.train.job import TrainJob
from trnqwen.train.status import StatusLine
from trnqwen.contract.topology import topology
from trnqwen.train.topology import ranks_per_node

REPO_ROOT = Path(__file__).resolve().parent.parent

# The recipe's launch line (reference/recipe.md), with its placeholders filled in.
RECIPE_LAUNCH = (
    "torchrun --nproc_per_node=64 --rdzv_backend c10d --rdzv_endpoint localhost:0 "
    "--local-ranks-filter 0 --role rank --tee 3 "
    "-m torchtitan.train --module my_config --config qwen3_ft"
)


def _normalize(tokens: list[str]) -> list[str]:
    """``--flag=value`` -> ``--flag value`` so both spellings compare equal."""
    out: list[str] = []
    for tok in tokens:
        if tok.startswith("--") and "=" in tok:
            out += tok.split("=", 1)
        else:
            out.append(tok)
    return out


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("assets") / "tiny-qwen3")


def _argv(cfg: RunConfig, job: TrainJob, nproc_per_node: int, **kwargs) -> list[str]:
    return launcher.build_torchrun_argv(cfg, job, topology(nnodes=cfg.nnodes, nproc_per_node=nproc_per_node), **kwargs)


def _recipe_job() -> TrainJob:
    return TrainJob(
        backend="hf-v5",
        entry_module="torchtitan.train",
        entry_args=["--module", "my_config", "--config", "qwen3_ft"],
        config_module="my_config",
        config_fn="qwen3_ft",
    )


# --- argv ------------------------------------------------------------------------------------


def test_argv_matches_recipe_launch_line_field_by_field():
    argv = _argv(RunConfig(), _recipe_job(), 64, python="/opt/py/bin/python")
    assert argv[:3] == ["/opt/py/bin/python", "-m", launcher.TORCHRUN_MODULE]
    recipe = _normalize(shlex.split(RECIPE_LAUNCH))[1:]
    ours = argv[3:]
    assert ours == recipe
    # Pairwise: each recipe flag carries the same value in our argv.
    for flag in ("--nproc_per_node", "--rdzv_backend", "--rdzv_endpoint", "--local-ranks-filter", "--role", "--tee"):
        assert ours[ours.index(flag) + 1] == recipe[recipe.index(flag) + 1]


def test_argv_default_python_is_this_interpreter_and_log_dir_before_module(tmp_path):
    argv = _argv(RunConfig(), _recipe_job(), 2, log_dir=tmp_path / "ranks")
    assert argv[0] == sys.executable
    i_log, i_mod = argv.index("--log-dir"), argv.index("-m", 3)
    assert argv[i_log + 1] == str(tmp_path / "ranks") and i_log < i_mod
    assert argv[argv.index("--nproc_per_node") + 1] == "2"


def test_argv_override_imports_parse_with_installed_torchtitan_and_raw_flags_come_last(tiny_assets):
    """The recipe puts the override imports into the job; the launcher passes them on exactly once."""
    from torchtitan.config.override import parse_cli_imports

    from trnqwen.train.recipes import build_job

    cfg = RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend="native",
                    override_imports=["pkg_a.kernels.nki_rope", "pkg_b.attn.dense_attention"])
    extra = ["--training.max_norm", "0.5", "--metrics.log_freq", "5"]
    cpu = DeviceInfo(type="cpu", count=1)
    argv = _argv(cfg, build_job(cfg, cpu, None, check_runtime=False), 2, extra_args=extra)
    assert argv[-4:] == extra
    assert argv.count("--override.imports") == 1
    i = argv.index("--override.imports")
    assert i > argv.index("--config")
    tokens = argv[i + 1 : len(argv) - len(extra)]
    # torchtitan's own CLI parser reads the targets back from our tokens.
    parsed = parse_cli_imports(tokens)
    assert [p if isinstance(p, str) else p[0] for p in parsed] == cfg.override_imports
    plain = cfg.model_copy(update={"override_imports": []})
    assert _argv(plain, build_job(plain, cpu, None, check_runtime=False), 2).count("--override.imports") == 0


def test_argv_multi_node_fields():
    cfg = RunConfig(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.5:29500", rdzv_id="job42", max_restarts=3)
    argv = _argv(cfg, _recipe_job(), 64)
    pairs = {argv[i]: argv[i + 1] for i in range(3, argv.index("-m", 3)) if argv[i].startswith("--") and i + 1 < len(argv)}
    assert pairs["--nnodes"] == "2" and pairs["--node-rank"] == "1"
    assert pairs["--rdzv_endpoint"] == "10.0.0.5:29500" and pairs["--rdzv_id"] == "job42"
    assert pairs["--max-restarts"] == "3" and pairs["--nproc_per_node"] == "64"
    with pytest.raises(UsageError, match="rendezvous"):
        _argv(RunConfig(nnodes=2), _recipe_job(), 64)


def test_argv_is_accepted_by_torchrun_parser():
    from torch.distributed.run import get_args_parser

    cfg = RunConfig(nnodes=2, node_rank=1, rdzv_endpoint="h:29500", rdzv_id="x", max_restarts=1)
    argv = _argv(cfg, _recipe_job(), 8, log_dir=Path("/tmp/x"), extra_args=["--a.b", "1"])
    args = get_args_parser().parse_args(argv[3:])
    assert args.nproc_per_node == "8" and args.nnodes == "2" and args.node_rank == 1
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "h:29500" and args.rdzv_id == "x"
    assert args.local_ranks_filter == "0" and args.role == "rank" and args.tee == "3" and args.max_restarts == 1
    assert args.module and args.training_script == "torchtitan.train"
    assert args.training_script_args == ["--module", "my_config", "--config", "qwen3_ft", "--a.b", "1"]


@pytest.mark.parametrize(
    "device, expected",
    [
        (DeviceInfo(type="neuron", count=64, lnc=2), 64),
        (DeviceInfo(type="neuron", count=128, lnc=1), 128),
        (DeviceInfo(type="cuda", count=8), 8),
        (DeviceInfo(type="cpu", count=1), 1),
    ],
)
def test_default_ranks_per_device(device, expected):
    assert ranks_per_node(None, device) == expected
    assert ranks_per_node(3, device) == 3


# --- environment -----------------------------------------------------------------------------


def test_rank_env_neuron_cache_default_user_value_and_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    neuron = DeviceInfo(type="neuron", count=64, lnc=2)
    job = TrainJob(backend="native", entry_module="x", config_module="cfgmod", env={"A": "1"})
    env = launcher.rank_env(RunConfig(), job, neuron, tmp_path / "run", environ={})
    assert env[launcher.NEFF_CACHE_VAR] == str((tmp_path / ".trnqwen" / "neff-cache").resolve())
    assert env["A"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str((tmp_path / "run").resolve())
    # The user's own cache wins: trnqwen does not set it.
    env = launcher.rank_env(RunConfig(), job, neuron, None, environ={launcher.NEFF_CACHE_VAR: "/mine"})
    assert launcher.NEFF_CACHE_VAR not in env
    env = launcher.rank_env(RunConfig(compile_cache_dir=tmp_path / "cc"), job, neuron, None, environ={})
    assert env[launcher.NEFF_CACHE_VAR] == str((tmp_path / "cc").resolve())
    # Not on CPU.
    assert launcher.NEFF_CACHE_VAR not in launcher.rank_env(RunConfig(), job, DeviceInfo("cpu", 1), None, environ={})


def test_command_script_redacts_tokens_and_replays(tmp_path):
    script = launcher.command_script(
        [sys.executable, "-c", "import os,sys; print(os.environ['X']); sys.exit(3)"],
        {"X": "hello world", "HF_TOKEN_LIKE": "hf_abcdefghijklmnop"},
        tmp_path,
    )
    assert "hf_abcdefghijklmnop" not in script
    path = tmp_path / "command.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True)
    assert proc.returncode == 3 and proc.stdout.strip() == "hello world"


# --- root cause ------------------------------------------------------------------------------


def _real_traceback(code: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    return proc.stderr.splitlines()


def test_root_cause_is_last_line_of_first_traceback_with_prefixes_and_chaining():
    lines = _real_traceback(
        "def f():\n    raise KeyError('inner')\n"
        "try:\n    f()\nexcept KeyError as e:\n    raise RuntimeError('outer failure: bad shard') from e\n"
    )
    prefixed = ["[rank0]:[titan] INFO - starting", *(f"[rank0]:{line}" for line in lines)]
    assert rootcause.root_cause(prefixed) == "KeyError: 'inner'"
    only_outer = _real_traceback("x = [1]\nassert x[0] == 2, 'loss is nan at step 3'")
    assert rootcause.root_cause(only_outer) == "AssertionError: loss is nan at step 3"


def test_root_cause_known_runtime_line_without_traceback():
    lines = ["[rank0]:some info", "[rank0]:2026-11-29 TDRV:dmem_alloc_internal Failed to alloc DEVICE memory: 1024", "bye"]
    assert "Failed to alloc DEVICE memory" in rootcause.root_cause(lines)
    assert rootcause.root_cause(["all good", "done"]) is None


def test_root_cause_of_a_command_line_typo_is_tyros_unrecognized_options_line():
    """issue 28 #9: torchtitan parses its flags with tyro, which prints a box and exits 2 (no traceback)."""
    lines = _real_traceback(
        "import dataclasses, tyro\n"
        "@dataclasses.dataclass\nclass Metrics:\n    log_freq: int = 1\n"
        "@dataclasses.dataclass\nclass Job:\n    metrics: Metrics = dataclasses.field(default_factory=Metrics)\n"
        "tyro.cli(Job, args=['--metrics.log_freqq', '5'])\n"
    )
    prefixed = ["[rank0]:[titan] INFO - starting", *(f"[rank0]:{line}" for line in lines)]
    assert rootcause.root_cause(prefixed) == "Unrecognized options: --metrics.log_freqq, 5 (perhaps you meant --metrics.log-freq)"
    assert rootcause.root_cause(prefixed[:4]).startswith("Unrecognized options: --metrics.log_freqq")  # cut off in the box


# --- supervision under real torchrun ---------------------------------------------------------

FAKE_RANK = textwrap.dedent(
    '''
    """A stand-in for a training rank: logs torchtitan-shaped step lines, can crash or hang."""
    import os, signal, subprocess, sys, time

    mode, pids = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    if mode == "stubborn":
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    # A grandchild, like a dataloader worker, in the rank's session.
    child = subprocess.Popen([sys.executable, "-c",
        "import signal,time\\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)\\n" if mode == "stubborn" else "")
        + "time.sleep(600)"])
    with open(os.path.join(pids, f"rank{rank}"), "w") as fh:
        fh.write(f"{os.getpid()} {child.pid}\\n")
    print(f"rank {rank} up", flush=True)
    if mode == "crash" and rank == 1:
        time.sleep(1.0)
        raise ValueError("boom from rank 1: bad shard")
    if mode in ("silent", "killed") and rank == 1:
        time.sleep(1.0)
        print("[titan] INFO - Saving a model only checkpoint at last step, step 16.", flush=True)
        if mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
        os._exit(1)  # no traceback, no message: what a native crash at exit looks like
    if mode == "crash":
        # When torchrun stops rank 0 after rank 1 died, rank 0 fails too, with a different error
        # that shows on the console first: noise, not the root cause.
        def _lost_peer(*_):
            raise ConnectionError("peer rank went away")
        signal.signal(signal.SIGTERM, _lost_peer)
    step = 0
    while True:
        step += 1
        print(f"[titan] INFO - \\x1b[31mstep: {step:2d}  \\x1b[32mloss: {8.0 / step:8.5f}  grad_norm: 1.5  "
              f"memory:  0.00GiB(0.00%)  tps: 1,234  tflops: 0.03  mfu: 0.01%\\x1b[39m", flush=True)
        time.sleep(0.3)
        if mode == "rmrundir" and step == 3:
            if rank == 0:  # someone cleans .trnqwen/runs while the run trains
                import shutil
                gone = os.path.join(os.path.dirname(pids), "runs", "run-rmrundir")
                while os.path.exists(gone):  # a file written meanwhile fails one pass: again
                    shutil.rmtree(gone, ignore_errors=True)
            child.kill()
            sys.exit(0)
    '''
)

DRIVER = textwrap.dedent(
    '''
    import json, sys
    from pathlib import Path
    from trnqwen.config import RunConfig
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.job import TrainJob
    from trnqwen.train.preflight import PreflightReport
    from trnqwen.train.plan import TrainPlan
    from trnqwen.train.run import execute
    from trnqwen.train import launcher
    from trnqwen.train.topology import plan_topology

    work, mode, grace = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    cfg = RunConfig(model="builtin:tiny-qwen3", device="cpu", nproc_per_node=2, steps=1000,
                    runs_dir=work / "runs", finetune=False)
    job = TrainJob(backend="native", entry_module="fake_rank", entry_args=[mode, str(work / "pids")])
    device = DeviceInfo(type="cpu", count=1)
    run_dir = work / "runs" / f"run-{mode}"
    topo = plan_topology(cfg, device)
    argv = launcher.build_torchrun_argv(cfg, job, topo, log_dir=run_dir / "ranks")
    plan = TrainPlan(config=cfg, device=device, job=job, topology=topo, run_id=run_dir.name,
                     run_dir=run_dir, argv=argv, env={"PYTHONPATH": str(work), "HF_TOKEN": "hf_abcdefghSECRET12345"},
                     preflight=PreflightReport(), cwd=work)
    outcome = execute(plan, grace_s=grace)
    (work / "outcome.json").write_text(json.dumps(outcome.as_dict(), default=str))
    sys.exit(outcome.exit_code)
    '''
)


def _start_driver(tmp_path: Path, mode: str, grace: float = 10.0) -> subprocess.Popen:
    (tmp_path / "fake_rank.py").write_text(FAKE_RANK)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "pids").mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path), mode, str(grace)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_ranks(tmp_path: Path, proc: subprocess.Popen, timeout: float = 90) -> list[int]:
    """Both ranks and their children are up and rank 0 has logged a step."""
    log = tmp_path / "runs"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        files = list((tmp_path / "pids").glob("rank*"))
        logs = list(log.glob("*/train.log"))
        if len(files) == 2 and logs and "step:  2" in logs[0].read_text(errors="replace"):
            return [int(p) for f in files for p in f.read_text().split()]
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("ranks did not come up")


def _descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, mode, code",
    [(signal.SIGINT, "loop", 130), (signal.SIGTERM, "stubborn", 143)],
    ids=["sigint", "sigterm-stubborn-ranks"],
)
def test_signal_stops_every_rank_no_orphans(tmp_path, sig, mode, code):
    proc = _start_driver(tmp_path, mode, grace=4.0)
    rank_pids = _wait_for_ranks(tmp_path, proc)
    tree = sorted(set(_descendants(proc.pid)) | set(rank_pids))
    assert len(tree) >= 5  # torchrun + 2 ranks + 2 grandchildren
    t0 = time.monotonic()
    proc.send_signal(sig)  # only the launcher gets it, like kill <pid> or a Ctrl-C it forwards
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 5
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == [], f"orphans left: {_alive(tree)}"
    record = json.loads((tmp_path / "runs" / f"run-{mode}" / "run.json").read_text())
    assert record["status"] == "interrupted"
    assert record["ended_by"] == signal.Signals(sig).name and record["exit_code"] == code
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["steps_logged"] >= 2 and outcome["last_step"]["tps"] == 1234


@pytest.mark.slow
def test_a_run_whose_run_dir_was_deleted_says_its_logs_are_lost_and_recreates_run_json(tmp_path):
    """The training succeeded (exit 0), but its log and metrics are gone: a warning says so and
    run.json is written again with what the launcher knows, marked ``extra.run_dir_lost``."""
    proc = _start_driver(tmp_path, "rmrundir")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run_dir = tmp_path / "runs" / "run-rmrundir"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["ended_by"] == "completed"
    # found missing by the save at the end (run.json) or by one while it trained (train.log)
    assert set(record["extra"]["run_dir_lost"]["lost"]) in ({"run.json"}, {"train.log"}, {"run.json", "train.log"})
    assert record["extra"]["run_dir_lost"]["recovered"] == ["train.log"]
    said = " ".join(err.split())
    assert f"the run directory {run_dir} was deleted during the run" in said
    assert "the training itself completed" in said and "train.log was written back" in said
    # the whole log, from its first line to the last step, written back from the launcher's open file
    log = (run_dir / "train.log").read_text()
    assert "rank 0 up" in log and "step:  3" in log


@pytest.mark.slow
def test_crashing_rank_reports_root_cause(tmp_path):
    proc = _start_driver(tmp_path, "crash")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    record = json.loads((tmp_path / "runs" / "run-crash" / "run.json").read_text())
    assert record["status"] == "failed" and record["ended_by"] == "rank failure"
    # rank 1 failed first; rank 0's later ConnectionError and torchrun's ChildFailedError are noise.
    assert record["error"] == "ValueError: boom from rank 1: bad shard"
    log = (tmp_path / "runs" / "run-crash" / "train.log").read_text()
    assert "ChildFailedError" in log and "ConnectionError: peer rank went away" in log  # the full log is kept
    assert list((tmp_path / "runs" / "run-crash" / "ranks").glob("**/attempt_0/1/stderr.log"))
    assert (tmp_path / "runs" / "LAST").read_text().strip() == "run-crash"
    # Secrets never reach the run dir.
    assert record["env"]["HF_TOKEN"] == "***"
    for name in ("run.json", "command.sh"):
        assert "SECRET12345" not in (tmp_path / "runs" / "run-crash" / name).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mode, how", [("silent", "exited with code 1 without a Python error"),
                                       ("killed", "was killed by SIGKILL (the out-of-memory killer, or a kill -9)")])
def test_a_rank_that_dies_without_a_word_is_named_with_where_it_stopped(tmp_path, mode, how):
    """No traceback anywhere: the error names the rank torchrun saw fail first, how it ended and the
    last line it logged, instead of 'no error message from the ranks'."""
    proc = _start_driver(tmp_path, mode)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    record = json.loads((tmp_path / "runs" / f"run-{mode}" / "run.json").read_text())
    assert record["status"] == "failed" and record["ended_by"] == "rank failure"
    assert record["error"] == (f"rank 1 {how}; the last line it logged: "
                               "[titan] INFO - Saving a model only checkpoint at last step, step 16."), record["error"]


@pytest.mark.slow
def test_launcher_killed_outright_takes_ranks_with_it(tmp_path):
    """SIGKILL leaves no handler to run: torchrun's parent-death signal still stops every rank."""
    proc = _start_driver(tmp_path, "loop", grace=4.0)
    rank_pids = _wait_for_ranks(tmp_path, proc)
    tree = sorted(set(_descendants(proc.pid)) | set(rank_pids))
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(tree) == [], f"orphans left: {_alive(tree)}"


class _FakeTTY:
    def __init__(self, tty: bool):
        self.parts: list[str] = []
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        pass


def test_status_line_redraws_on_a_terminal_and_prints_lines_elsewhere():
    metrics = {"step": 2, "loss": 7.25, "tps": 1234, "mfu": 1.5}
    pipe = _FakeTTY(False)
    line = StatusLine(stream=pipe, total_steps=10)
    line.update(metrics)
    line.tick()  # no redraw off a terminal
    assert len(pipe.parts) == 1 and pipe.parts[0].endswith("\n")
    assert "step 2/10" in pipe.parts[0] and "loss 7.2500" in pipe.parts[0] and "tok/s 1,234" in pipe.parts[0]
    assert "mfu 1.50%" in pipe.parts[0] and "  [0:00<?, ? s/step]" in pipe.parts[0]  # one step: no rate yet
    term = _FakeTTY(True)
    line = StatusLine(stream=term, total_steps=None)
    line.update(metrics)
    line.print_above("a log line")
    line.clear()
    text = "".join(term.parts)
    assert text.startswith("\r\x1b[2K") and "a log line\n" in text and text.endswith("\r\x1b[2K")
    assert "step 2  loss" in text


def test_progress_bracket_reads_like_tqdm():
    """Issue 34 item 15: ``[elapsed<remaining, s/step]``, from the steps' own log times."""
    from trnqwen.train.status import clock, format_rate, progress_bracket, seconds_per_step

    assert [clock(s) for s in (0, 42.4, 725, 3723)] == ["0:00", "0:42", "12:05", "1:02:03"]
    # step 1 was logged 95 s after the launch (start-up, compilation): not a step's time
    seen = [(1, 95.0), (2, 105.0), (3, 107.0), (4, 109.0)]
    assert seconds_per_step(seen[:1]) is None and seconds_per_step(seen) == pytest.approx(14 / 3)
    assert progress_bracket(112.0, 4, 10, seconds_per_step(seen)) == "[1:52<0:28, 4.67 s/step]"
    assert progress_bracket(112.0, 4, None, seconds_per_step(seen)) == "[1:52, 4.67 s/step]"  # no step count
    assert progress_bracket(3.0, 1, 10, None) == "[0:03<?, ? s/step]"
    assert progress_bracket(600.0, 10, 10, 12.3) == "[10:00<0:00, 12.3 s/step]"
    assert [format_rate(v) for v in (0.0421, 2.1, 12.34, 345.6, 0.004)] == ["0.04 s/step", "2.10 s/step", "12.3 s/step",
                                                                             "346 s/step", "4.0e-03 s/step"]
    # a resumed run (step 401 first) or a long one: steps, not records, count
    assert seconds_per_step([(401, 50.0), (450, 148.0)]) == pytest.approx(2.0)


def test_status_line_eta_follows_the_recent_steps_and_names_the_closing_phase():
    pipe = _FakeTTY(False)
    line = StatusLine(stream=pipe, total_steps=30, closing="exporting HF safetensors")
    t0 = line.start
    for step in range(1, 31):  # 1 s a step, then 3 s a step from step 11: the rate follows (last 20 steps)
        at = t0 + 60 + min(step, 10) + 3 * max(0, step - 10)
        line.update({"step": step, "loss": 7.0, "tps": 100.0, "mfu": None}, at=at)
    lines = [p.rstrip("\n") for p in pipe.parts]
    assert "[" in lines[0] and "<?, ? s/step]" in lines[0]
    assert "<0:20, 1.00 s/step]" in lines[9]  # step 10/30: 20 steps left at 1 s
    assert "<0:21, 2.05 s/step]" in lines[19]  # step 20: steps 2-20 (9 x 1 s + 10 x 3 s) / 19, 10 left
    # step 30: the last 20 steps all took 3 s (the 1 s ones fell out); then what the ranks do until they exit
    assert lines[29].endswith("<0:00, 3.00 s/step]  exporting HF safetensors ...")
    assert not any("exporting" in ln for ln in lines[:29])


def test_closing_phase_says_what_the_ranks_write():
    from trnqwen.train.run import closing_phase

    assert closing_phase(RunConfig(finetune=True)) == "exporting HF safetensors"
    assert closing_phase(RunConfig(finetune=True, lora=True)) == "exporting the LoRA adapter (PEFT)"
    assert closing_phase(RunConfig(finetune=True, export_hf=False)).startswith("saving the last checkpoint")


# --- a Ctrl-C in the start-up window (issue 18: exit -2 under load) ----------------------------------

WINDOW_DRIVER = textwrap.dedent(
    '''
    """supervise() with a Ctrl-C that lands while torchrun's start is being recorded (on_start: the
    run.json write, slow on a loaded disk), before the first poll of the supervision loop."""
    import json, os, signal, sys, time
    from pathlib import Path
    from trnqwen.train import launcher

    work = Path(sys.argv[1])
    child = [sys.executable, "-c", "import time; time.sleep(120)"]

    def slow_record(pid):
        (work / "child.pid").write_text(str(pid))
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, delivered right now
        time.sleep(0.5)

    result = launcher.supervise(child, env={}, log_path=work / "train.log", grace_s=2.0, on_start=slow_record)
    (work / "result.json").write_text(json.dumps(result.summary()))
    sys.exit(result.exit_code)
    '''
)


def test_ctrl_c_while_the_start_is_recorded_stops_the_run_cleanly(tmp_path):
    """Before the fix the handlers went in after on_start: the Ctrl-C became a KeyboardInterrupt that
    skipped the forwarding, the sweep and the record (the CLI then said "Interrupted." and died by the
    signal).  Now it is a stop request like any other: exit 130, how it ended recorded, nothing left."""
    (tmp_path / "driver.py").write_text(WINDOW_DRIVER)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "result.json").read_text())
    assert (summary["ended_by"], summary["exit_code"]) == ("SIGINT", 130)
    child = int((tmp_path / "child.pid").read_text())
    assert _alive([child]) == []
