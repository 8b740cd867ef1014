"""benchmarks/run_all.py's collecting and table building on canned --json lines (no timing), and
gpu_check.sh failing clearly where there is no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

CANNED = {
    "startup": 'trnqwen --help   0.045 s\n{"benchmark": "startup", "trnqwen_help_s": 0.0447, "hf_help_s": 0.5461, "ratio": 0.082, "target_ratio": 0.4, "meets_target": true}',
    "inspect_logs": 'noise line\n{"not": "the last"}\n{"benchmark": "inspect_logs", "parse_mb_s": 232.3, "parse_vs_grep": 0.123, "peak_rss_mb": 41.8, "sizes": [1, 2]}\n',
    "broken": "Traceback (most recent call last):\nValueError: x\n",
}


@pytest.fixture(scope="module")
def run_all():
    spec = importlib.util.spec_from_file_location("run_all", REPO_ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def test_every_listed_benchmark_script_exists_and_takes_its_flags(run_all):
    for bench in run_all.BENCHES:
        script = REPO_ROOT / "benchmarks" / f"{bench.name}.py"
        assert script.is_file(), bench.name
        text = script.read_text()
        assert '"--json"' in text, bench.name
        for flag in [a for a in bench.quick + bench.full if a.startswith("--")]:
            assert f'"{flag}"' in text, (bench.name, flag)


def test_parse_summary_takes_the_last_json_object(run_all):
    assert run_all.parse_summary(CANNED["startup"])["ratio"] == 0.082
    assert run_all.parse_summary(CANNED["inspect_logs"])["benchmark"] == "inspect_logs"
    assert run_all.parse_summary(CANNED["broken"]) is None


def test_table_has_every_benchmark_status_and_ratio(run_all):
    rows = [
        {"name": "startup", "status": "ok", "seconds": 12.0, "summary": run_all.parse_summary(CANNED["startup"])},
        {"name": "inspect_logs", "status": "ok", "seconds": 3.2, "summary": run_all.parse_summary(CANNED["inspect_logs"])},
        {"name": "verify_ckpt", "status": "skipped", "seconds": None, "summary": None},
        {"name": "train_overhead", "status": "failed", "why": "exit 1: boom", "seconds": 5.0, "summary": None},
    ]
    table = run_all.build_table(rows)
    head = table.split("\n\n")[0].splitlines()
    assert len(head) == 2 + len(rows)
    assert "| startup | ok | ratio 0.082 | 12 s |" in head
    assert "target_ratio" not in head[2]  # a goal, not a measurement
    assert "parse_vs_grep 0.123" in head[3]
    assert "| verify_ckpt | skipped | - | - |" in head
    assert "failed (exit 1: boom)" in head[5]
    assert "| inspect_logs | sizes | 1, 2 |" in table and "| startup | hf_help_s | 0.5461 |" in table
    info = {"cpu_model": "Test CPU", "nproc": 2, "memory_gib": 24.0, "python": "3.11", "os": "Linux",
            "load_avg_start": [1.0, 1.0, 1.0], "load_avg_end": [2.0, 2.0, 2.0]}
    md = run_all.render_results(rows, info, quick=True, note="noisy")
    assert "Test CPU, 2 cores" in md and "24.0 GiB" in md and "Note: noisy" in md and table in md
    raw = md.split("```")[1].strip().splitlines()
    assert [json.loads(line)["benchmark"] for line in raw] == [r["name"] for r in rows]


def test_cli_list_and_unknown_names(run_all):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    script = str(REPO_ROOT / "benchmarks" / "run_all.py")
    out = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and all(b.name in out.stdout for b in run_all.BENCHES)
    bad = subprocess.run([sys.executable, script, "--only", "nonsense", "--no-write"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown benchmark" in bad.stderr


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    env = dict(os.environ, WORK=str(tmp_path))
    r = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 3
    assert r.stderr.strip() == "gpu_check: no CUDA GPU here: nvidia-smi is not on PATH (this check needs one NVIDIA GPU)"
    assert list(tmp_path.iterdir()) == []
