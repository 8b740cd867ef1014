"""benchmarks/run_all.py's collecting and table building on canned --json lines (no timing),
gpu_check.sh failing clearly where there is no GPU, and (slow suite) every benchmark's quick path
run for real through run_all: exit 0 and its own --json summary line."""

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


def _load_run_all():
    if "run_all" in sys.modules:
        return sys.modules["run_all"]
    spec = importlib.util.spec_from_file_location("run_all", REPO_ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run_all():
    return _load_run_all()


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


def _load_bench(name: str):
    bench_dir = str(REPO_ROOT / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)  # the scripts import their siblings (_common, lora)
    return importlib.import_module(name)


def test_measured_run_reports_the_kernels_peak_not_a_sample(tmp_path):
    """A child that touches 300 MiB for a moment, far shorter than the 0.2 s sampling interval,
    then frees it: the wrapper's ru_maxrss still holds the peak (a psutil sample would miss it)."""
    lora = _load_bench("lora")
    code = "b = bytearray(300 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\ndel b\n"
    env = dict(os.environ)
    run = lora.measured_run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    assert run["rc"] == 0
    assert run["peak_rss_max_mib"] >= 300, run
    small = lora.measured_run([sys.executable, "-c", "pass"], cwd=tmp_path, env=env)
    assert small["peak_rss_max_mib"] < 200, small
    failing = lora.measured_run([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path, env=env)
    assert failing["rc"] == 3


def test_vm_hwm_is_the_high_water_mark_of_a_live_process():
    lora = _load_bench("lora")
    proc = subprocess.Popen([sys.executable, "-c", "import sys\nb = bytearray(200 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
                             "del b\nsys.stdout.write('freed\\n'); sys.stdout.flush(); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "freed\n"
        hwm = lora.vm_hwm_bytes(proc.pid)
        import psutil

        rss = psutil.Process(proc.pid).memory_info().rss
        assert hwm >= 200 * 2**20 > rss, (hwm, rss)  # the peak is kept after the memory is freed
    finally:
        proc.communicate("")
    assert lora.vm_hwm_bytes(proc.pid) is None  # gone


def test_dpo_benchmark_sft_records_train_the_same_tokens_as_the_pairs(tmp_path):
    """benchmarks/dpo.py's SFT side: the pairs' conversations as chat records must train exactly the
    tokens DPO trains (multi-turn prompts' earlier answers are context), counted by the benchmark's
    own check in each cache."""
    dpo = _load_bench("dpo")
    from trnqwen.dataset.prepare import DataSettings, prepare
    from trnqwen.fetch.builtin import write_tiny_qwen3

    assets = write_tiny_qwen3(tmp_path / "tiny")
    prefs, chats = dpo.write_data(tmp_path, 40)
    counts = {}
    for label, settings in (("sft", DataSettings(dataset=str(chats), seq_len=256)),
                            ("dpo", DataSettings(dataset=str(prefs), seq_len=256, method="dpo", data_kind="preference"))):
        prepare(settings, assets, tmp_path / label)
        counts[label] = dpo.trained_tokens(tmp_path / label)
    assert counts["sft"] == counts["dpo"] > 0, counts
    prepare(DataSettings(dataset=str(chats), seq_len=128), assets, tmp_path / "dpo")
    assert dpo.trained_tokens(tmp_path / "dpo") is None  # two caches: which one a run read is unknown


# --- every benchmark's quick path, for real (slow suite) ----------------------------------------------

# What each summary must hold besides "benchmark": the measurement the benchmark exists for.
MEASURED = {
    "startup": "ratio",
    "data_prep": "ratio",
    "inspect_logs": "json_mb_s",  # the --json throughput on the first shape
    "fetch_throughput": "ratio_trnqwen_vs_hf",
    "verify_ckpt": "default_vs_cat",
    "eval_throughput": "shapes",
    "train_overhead": "ratio",
    "resume_overhead": "resumed_vs_fresh_first_step_ratio",
    "hf_trainer_backends": "distributed_config_vs_ddp",
    "inspect_logs_before_after": "quick json ratio",  # after / before wall time on the same log
    "torchtitan_releases": "installed",  # the installed release's API shape, read from its sources
    "lora": "ratios",  # LoRA / full: the kernel's peak RSS, s/step, adapter size
    "dpo": "ratios",  # DPO / SFT over the same trained tokens (present only when the check passed)
    "harness": "ratio_trnqwen_vs_lm_eval",  # eval --tasks / lm_eval by hand, seconds per sample
    "grpo": "ratios",  # trnqwen / TRL: rollout tokens/s, step seconds, peak RSS
}
# Extra arguments on top of the quick path: train_overhead runs two repeats here so the test sees
# that the order alternates.
EXTRA = {"train_overhead": ["--repeats", "2", "--backend", "native"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", [b.name for b in _load_run_all().BENCHES])
def test_each_benchmark_quick_path_runs_for_real(run_all, name):
    """run_all's own runner on the quick arguments: the script exits 0 and ends with its summary."""
    bench = next(b for b in run_all.BENCHES if b.name == name)
    row = run_all.run_one(bench, quick=True, timeout=1800, extra=EXTRA.get(name, []))
    assert row["status"] == "ok", row
    summary = row["summary"]
    assert summary["benchmark"] == name and MEASURED[name] in summary, summary
    ratios = {k: v for k, v in run_all.flat(summary).items() if run_all.is_ratio(k) and not isinstance(v, str)}
    assert all(v > 0 for v in ratios.values()), ratios  # a measurement, never a zero placeholder
    if name == "eval_throughput":
        shapes = summary["shapes"]
        assert set(shapes) == {"lm-head", "qwen3-4b"}
        assert all(s["losses_agree"] for s in shapes.values()), shapes
        assert shapes["lm-head"]["lm_head_share"] > 0.5  # the LM head dominates
        assert 0.05 < shapes["qwen3-4b"]["lm_head_share"] < 0.15  # about Qwen3-4B's tenth
    if name == "dpo":
        assert summary["same_tokens"] and summary["trained_tokens"]["sft"] == summary["trained_tokens"]["dpo"] > 0
    if name == "harness":
        assert summary["scores_agree"], summary  # the same score, through trnqwen and by hand
    if name == "lora":
        assert all(run["peak_rss_max_mib"] > 0 for run in summary["runs"].values()), summary
    if name == "torchtitan_releases":
        assert summary["installed"]["supported"] and "0.2.2" in summary["releases"] | summary["download_failed"]
    if name == "grpo":
        assert summary["same_prompts"] and not summary["failed"], summary
        # the generator's fast paths ran, not a fallback
        assert summary["trnqwen"]["rollout_paths"] == {"cache": "preallocated", "prefill_head": "last", "threads": 1}
        for side in ("trnqwen", "trl"):
            assert summary[side]["completion_tokens_per_step"] > 0 and summary[side]["peak_rss_mib"] > 0, summary
    if name == "train_overhead":
        assert summary["order"] == ["trnqwen then torchrun", "torchrun then trnqwen"], summary
