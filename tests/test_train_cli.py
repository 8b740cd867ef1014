"""``trnqwen train``: dry runs for each backend, --export-config, a fake Trainium host, and real
end-to-end CPU runs (native and hf-v5, 2 ranks, 3 steps) plus a run killed mid-way."""

from __future__ import annotations

import importlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO_ROOT, TRNQWEN, assert_clean_error, run_subprocess

TINY = ["--model", "builtin:tiny-qwen3", "--device", "cpu", "--nproc-per-node", "2", "--steps", "3", "--seq-len", "256"]


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """One tiny Qwen3 HF snapshot for the whole session (built offline, deterministic)."""
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "assets" / "hf" / "tiny-qwen3")


def _dry(cli, *args) -> dict:
    r = cli("train", *args, "--dry-run", "--json")
    assert r.code == 0, r.text
    return json.loads(r.out)


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# --- dry run ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["hf-v5", "native", "nki-moe"])
def test_dry_run_shows_command_config_and_preflight(cli, in_tmp, tiny_assets, backend):
    plan = _dry(cli, *TINY, "--assets", str(tiny_assets), "--backend", backend, "--finetune")
    argv = plan["command"]
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert _flag(argv, "--nproc_per_node") == "2" and _flag(argv, "--rdzv_backend") == "c10d"
    assert _flag(argv, "--rdzv_endpoint") == "localhost:0" and _flag(argv, "--local-ranks-filter") == "0"
    assert _flag(argv, "--role") == "rank" and _flag(argv, "--tee") == "3"
    assert _flag(argv, "--module") == plan["config_module"] and _flag(argv, "--config") == plan["config_fn"]
    text = plan["config_module_text"]
    assert f"def {plan['config_fn']}(" in text
    assert "training.steps = 3" in text and "training.seq_len = 256" in text
    assert str(tiny_assets) in text  # hf_assets_path: the local snapshot, absolute
    assert "initial_load_in_hf = True" in text and "last_save_in_hf = True" in text
    assert plan["preflight"]["ok"] is True
    assert plan["checkpoint_dir"] == str(in_tmp / "checkpoint_tiny_qwen3_f7b2a8_ft")
    # Nothing was started or created.
    assert not (in_tmp / ".trnqwen").exists() and not (in_tmp / "checkpoint_tiny_qwen3_f7b2a8_ft").exists()


def test_run_ids_say_what_is_trained(cli, in_tmp, tiny_assets, tmp_path):
    """``<time>-<backend>-<method>[-lora]``: a LoRA run's id says so; a second id planned in the same
    second gets ``-1``, ``-2`` (issue 34 item 18)."""
    import re

    from trnqwen.rundir import next_run_id

    plan = _dry(cli, *TINY, "--assets", str(tiny_assets), "--backend", "native", "--finetune", "--lora")
    assert re.fullmatch(r"\d{8}-\d{6}-native-sft-lora", plan["run_id"]), plan["run_id"]
    plan = _dry(cli, *TINY, "--assets", str(tiny_assets), "--backend", "hf-v5", "--finetune")
    assert re.fullmatch(r"\d{8}-\d{6}-hf-v5-sft", plan["run_id"]), plan["run_id"]
    runs = tmp_path / "runs"
    taken = []
    for _ in range(3):  # within one second (the timestamp is to the second): retried until it is
        taken = [next_run_id(runs, "native", method="dpo", lora=True)]
        (runs / taken[0]).mkdir(parents=True)
        taken += [next_run_id(runs, "native", method="dpo", lora=True)]
        (runs / taken[1]).mkdir()
        taken += [next_run_id(runs, "native", method="dpo", lora=True)]
        if taken[0][:15] == taken[2][:15]:
            break
    assert re.fullmatch(r"\d{8}-\d{6}-native-dpo-lora", taken[0])
    assert taken[1:] == [taken[0] + "-1", taken[0] + "-2"]


def test_dry_run_human_output_and_raw_flags(cli, in_tmp, tiny_assets):
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--finetune", "--dry-run", "--", "--metrics.log_freq", "2")
    assert r.code == 0, r.text
    assert "torch.distributed.run" in r.out and "--metrics.log_freq 2" in r.out
    assert "transformers_modeling_backend_full" in r.out  # the generated config (hf-v5 default)
    assert "preflight" in r.out and "would start" in r.out
    bad = cli("train", *TINY, "--assets", str(tiny_assets), "--dry-run", "stray")
    assert_clean_error(bad, code=2, contains="after `--`")


def test_dry_run_preflight_errors_are_shown_and_a_real_run_refuses(cli, in_tmp, tiny_assets):
    empty = in_tmp / "empty"
    empty.mkdir()
    r = cli("train", *TINY, "--assets", str(empty), "--backend", "hf-v5", "--dry-run", "--json")
    assert r.code == 1, r.text  # the plan is printed, and the dry run says it would not start (issue 18)
    plan = json.loads(r.out)
    assert plan["preflight"]["ok"] is False
    assert any(f["check"] == "assets" for f in plan["preflight"]["findings"])
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--global-batch-size", "3")
    assert_clean_error(r, code=2, contains="global batch 3")
    assert not (in_tmp / ".trnqwen" / "runs").exists() or not any((in_tmp / ".trnqwen" / "runs").iterdir())


def test_dry_run_on_fake_trainium_host(tmp_path, tiny_assets):
    """64 ranks from neuron-ls, a persistent NEFF cache, and no Neuron/torch import in the launcher."""
    from tests.doubles.neuron import neuron_host

    env = neuron_host(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO_ROOT)])
    probe = tmp_path / "modules.json"
    code = (
        "import json, sys\n"
        "from trnqwen.cli.main import main\n"
        "try:\n"
        f"    main(['train', '--model', 'builtin:tiny-qwen3', '--assets', {str(tiny_assets)!r}, '--device', 'neuron',"
        " '--backend', 'hf-v5', '--finetune', '--seq-len', '2048', '--dry-run', '--json'])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        f"json.dump({{'code': code, 'mods': [m for m in ('torch', 'torch_neuronx') if m in sys.modules]}}, open({str(probe)!r}, 'w'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=tmp_path, capture_output=True, text=True)
    seen = json.loads(probe.read_text())
    assert seen["code"] == 0, proc.stderr
    assert seen["mods"] == []  # the launcher never imports torch / torch_neuronx
    plan = json.loads(proc.stdout)
    assert plan["nproc_per_node"] == 64 and plan["device"]["type"] == "neuron"
    assert _flag(plan["command"], "--nproc_per_node") == "64"
    assert plan["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"] == str((tmp_path / ".trnqwen" / "neff-cache").resolve())
    assert plan["preflight"]["memory"]["capacity"] == 24 * 1024**3
    checks = {f["check"] for f in plan["preflight"]["findings"]}  # issue 28 #30: the same rows as on CPU
    assert {"memory", "host-memory", "seq_len", "batch"} <= checks, checks
    # The user's own cache location wins.
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = "/somewhere/else"
    r = run_subprocess("train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "neuron",
                       "--dry-run", "--json", env=env, cwd=tmp_path)
    assert r.code == 0, r.text
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" not in json.loads(r.out)["env"]


@pytest.mark.slow
def test_export_config_imports_and_builds_with_torchtitan(cli, in_tmp, tiny_assets, monkeypatch):
    for backend, name in (("native", "native_ft"), ("hf-v5", "hf_ft")):
        dest = in_tmp / f"{name}.py"
        r = cli("train", *TINY, "--assets", str(tiny_assets), "--backend", backend, "--finetune",
                "--export-config", str(dest), "--json")
        assert r.code == 0, r.text
        out = json.loads(r.out)
        assert out["exported_config"] == str(dest) and dest.is_file()
        hand = shlex.split(out["hand_run_command"].split(" torchrun ", 1)[1])
        assert hand[hand.index("--module") + 1] == name
        monkeypatch.syspath_prepend(str(in_tmp))
        module = importlib.import_module(name)
        config = getattr(module, out["config_fn"])()
        assert config.training.steps == 3 and config.training.seq_len == 256
        assert config.checkpoint.initial_load_in_hf and config.checkpoint.last_save_in_hf
        assert str(config.hf_assets_path) == str(tiny_assets)
    assert not (in_tmp / ".trnqwen").exists()


def test_export_config_wants_a_module_name(cli, in_tmp, tiny_assets):
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--export-config", str(in_tmp / "my-config.py"))
    assert_clean_error(r, code=2, contains="module name")


def test_cpu_dry_run_shows_memory_per_rank_context_and_batch_arithmetic(cli, in_tmp, tiny_assets):
    """issue 28 #30: on CPU the preflight showed one row (host memory); getting-started promises memory
    per rank, seq_len against the context and the batch arithmetic, on every device."""
    plan = _dry(cli, *TINY, "--assets", str(tiny_assets), "--finetune")
    rows = {f["check"]: f for f in plan["preflight"]["findings"]}
    assert {"memory", "host-memory", "seq_len", "batch"} <= set(rows), rows
    assert rows["seq_len"]["message"] == "--seq-len 256 of the model's 2,048-token context (max_position_embeddings)"
    assert rows["batch"]["message"].startswith("global batch 2 = local batch 1 x 2 data-parallel rank(s); 2 x 256 tokens")
    assert rows["batch"]["message"].endswith("= 512 tokens per step")
    assert rows["memory"]["message"].startswith("estimated ~") and "per rank" in rows["memory"]["message"]
    table = cli("train", *TINY, "--assets", str(tiny_assets), "--finetune", "--dry-run")
    assert "2,048-token context" in table.out and "512 tokens per step" in table.out


def test_dry_run_with_export_config_writes_nothing(cli, in_tmp, tiny_assets):
    """issue 28 #12: `train --dry-run --export-config F` wrote F."""
    target = in_tmp / "qwen3_ft.py"
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--dry-run", "--export-config", str(target))
    assert r.code == 0, r.text
    assert not target.exists() and f"would write the config module to {target} (nothing written)" in r.out
    assert "--module qwen3_ft" in r.out  # the hand-run command is still shown
    doc = _dry(cli, *TINY, "--assets", str(tiny_assets), "--export-config", str(target))
    assert doc["would_export_config"] == str(target) and "exported_config" not in doc and not target.exists()
    bad = cli("train", *TINY, "--assets", str(tiny_assets), "--dry-run", "--export-config", str(in_tmp / "my-config.py"))
    assert_clean_error(bad, code=2, contains="module name")
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--export-config", str(target))  # without --dry-run: written
    assert r.code == 0 and target.is_file()


def test_a_secret_given_as_a_raw_flag_value_is_never_recorded_or_printed(cli, in_tmp, tiny_assets):
    """issue 28 #12: `-- --some.api_key VALUE` reached run.json's command and extra_args unredacted."""
    from trnqwen.config import resolve_config
    from trnqwen.train.run import create_run_dir, plan_train

    key, token = "k3yVALUEnotHFshaped42", "t0kenVALUEnotHF99"
    raw = ["--metrics.wandb_api_key", key, f"--job.auth_token={token}", "--metrics.log_freq", "5"]
    r = cli("train", *TINY, "--assets", str(tiny_assets), "--dry-run", "--json", "--", *raw)
    assert r.code == 0, r.text
    assert key not in r.text and token not in r.text and "--metrics.log_freq 5" in json.loads(r.out)["shell_command"]
    resolved = resolve_config({"model": "builtin:tiny-qwen3", "device": "cpu", "nproc_per_node": 1, "steps": 2,
                               "seq_len": 256, "assets_dir": str(tiny_assets)}, environ={})
    plan = plan_train(resolved, extra_args=raw, cwd=in_tmp)
    assert key in plan.argv  # the ranks still get the value
    record = create_run_dir(plan)
    for path in Path(record.run_dir).iterdir():
        text = path.read_text(errors="replace")
        assert key not in text and token not in text, path.name
    saved = json.loads((Path(record.run_dir) / "run.json").read_text())
    assert saved["extra"]["extra_args"] == ["--metrics.wandb_api_key", "***", "--job.auth_token=***", "--metrics.log_freq", "5"]


# --- real runs -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def e2e_runs(tmp_path_factory, tiny_assets):
    """The two real CPU fine-tunes (native, hf-v5): 2 ranks, 3 steps, seq 256."""
    runs = {}
    for backend in ("native", "hf-v5"):
        cwd = tmp_path_factory.mktemp(f"e2e-{backend}")
        t0 = time.monotonic()
        r = run_subprocess("train", *TINY, "--assets", str(tiny_assets), "--backend", backend, "--finetune",
                           "--json", cwd=cwd, timeout=600)
        runs[backend] = (r, cwd, time.monotonic() - t0)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "hf-v5"])
def test_real_finetune_run(e2e_runs, backend):
    from trnqwen.contract.stepline import parse_step_line
    from trnqwen.rundir import RunRecord, last_run_dir

    r, cwd, wall = e2e_runs[backend]
    assert r.code == 0, r.text
    summary = json.loads(r.out)
    assert summary["ended_by"] == "completed" and summary["steps_logged"] == 3
    run_dir = last_run_dir(cwd / ".trnqwen" / "runs")
    assert run_dir is not None and str(run_dir) == summary["run_dir"]
    record = RunRecord.load(run_dir)
    assert record.status == "succeeded" and record.exit_code == 0 and record.backend == backend
    assert "run_dir_lost" not in record.extra and "was deleted during the run" not in r.err  # nothing was deleted
    assert record.versions["torchtitan"] and record.versions["torch"]
    assert record.extra["summary"]["time_to_first_step_s"] > 0
    for name in ("train.log", "command.sh", "trnqwen_run_config.py"):
        assert (run_dir / name).is_file(), name
    steps = [m for m in map(parse_step_line, (run_dir / "train.log").read_text().splitlines()) if m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(math.isfinite(m["loss"]) for m in steps)
    assert list((run_dir / "ranks").glob("**/attempt_0/1/stderr.log"))  # every rank's log kept
    export = Path(summary["exported"])
    assert export == cwd / "checkpoint_tiny_qwen3_f7b2a8_ft" / "hf" / "step-3" and record.extra["exported"] == str(export)
    assert list(export.glob("*.safetensors"))


@pytest.mark.slow
def test_real_export_loads_into_transformers(e2e_runs, tiny_assets):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    for backend in ("native", "hf-v5"):
        r, cwd, _ = e2e_runs[backend]
        export = Path(json.loads(r.out)["exported"])
        state = {}
        for f in export.glob("*.safetensors"):
            state.update(load_file(f))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_assets))
        result = model.load_state_dict(state, strict=False, assign=True)
        assert list(result.missing_keys) == ["lm_head.weight"], backend
        assert list(result.unexpected_keys) == [], backend


@pytest.mark.slow
def test_killed_run_leaves_no_processes(tmp_path, tiny_assets):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    args = [*TINY, "--assets", str(tiny_assets), "--backend", "native", "--steps", "500"]
    proc = subprocess.Popen([*TRNQWEN, "train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree: set[int] = set()
    deadline = time.monotonic() + 300
    log = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            tree |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.Error:
            pass
        logs = list((tmp_path / ".trnqwen" / "runs").glob("*/train.log"))
        log = logs[0] if logs else None
        if log and "step:  2" in log.read_text(errors="replace"):
            break
        time.sleep(0.3)
    else:
        proc.kill()
        raise AssertionError("no training step within the time limit")
    tree |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    assert len(tree) >= 3  # torchrun + 2 ranks
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 138, err  # SIGTERM = preemption: the ranks saved at the next step boundary
    assert "Traceback" not in err and "SIGTERM" in err and "trnqwen train --resume" in err
    deadline = time.monotonic() + 5
    alive = tree
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.1)
    assert not alive, f"left behind: {[psutil.Process(p).cmdline() for p in alive]}"
    record = json.loads((log.parent / "run.json").read_text())
    assert (record["status"], record["ended_by"], record["exit_code"]) == ("interrupted", "SIGTERM", 138)


@pytest.mark.slow
def test_typo_in_a_raw_torchtitan_flag_is_the_root_cause(tmp_path, tiny_assets):
    """issue 28 #9: the rank printed tyro's "Unrecognized options" box and exited 2 without a traceback;
    the run said "no error message from the ranks"."""
    args = [*TINY, "--nproc-per-node", "1", "--assets", str(tiny_assets), "--backend", "native", "--steps", "1"]
    r = run_subprocess("train", *args, "--", "--metrics.log_freqq", "5", cwd=tmp_path, timeout=300)
    assert r.code == 1, r.text
    run_json = next((tmp_path / ".trnqwen" / "runs").glob("*/run.json"))
    error = json.loads(run_json.read_text())["error"]
    assert error == "Unrecognized options: --metrics.log_freqq, 5 (perhaps you meant --metrics.log-freq)", error
    assert "no error message" not in r.err and "Unrecognized options: --metrics.log_freqq" in r.err
    judged = run_subprocess("inspect-logs", "--json", cwd=tmp_path, timeout=120)
    crash = [f for f in json.loads(judged.out)["findings"] if f["code"] == "crash"]
    assert crash and "Unrecognized options: --metrics.log_freqq" in crash[0]["message"], judged.text
