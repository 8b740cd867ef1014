"""What the hf-trainer backend costs on CPU, against the torchtitan backends and between its strategies.

On the built-in tiny Qwen3 (CPU, 2 ranks, fine-tune, seq 128), times

  1. ``trnqwen train --backend B`` for B in native (the baseline), hf-v5, hf-trainer:
     wall time, time to the first step line, median seconds between later step lines;
  2. the hf-trainer entry point under torchrun directly with ``--strategy distributed-config``
     (FSDP2 sharding at from_pretrained, the default) against ``--strategy ddp`` (the baseline).

Seconds per step come from the timestamps stamped on the step lines inside the ranks (torchtitan's
logger, and trnqwen's hf-trainer in the same layout), never from when a line reached this script.
A run that fails is counted and reported with its output tail; medians use the successful runs,
and the script exits 1 when any run failed (a benchmark that drops failures would overstate).
Prints every run, the medians, the ratios against each baseline, the measured load average
before and after, and with ``--json`` one summary line.

  python benchmarks/hf_trainer_backends.py [--steps 6] [--repeats 1] [--skip-backends] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trnqwen.contract.stepline import parse_step_line  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_note, logged_at  # noqa: E402


def timed(argv: list[str], *, cwd: Path, env: dict[str, str]) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    arrived: list[float] = []
    logged: list[float] = []
    tail: list[str] = []
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        text = raw.decode("utf-8", "replace")
        tail = (tail + [text])[-15:]
        if parse_step_line(text) is not None:
            arrived.append(time.monotonic() - t0)
            at = logged_at(text)
            if at is not None:
                logged.append(at)
    rc = proc.wait()
    from_log = bool(arrived) and len(logged) == len(arrived)
    series = logged if from_log else arrived
    deltas = [b - a for a, b in zip(series, series[1:])]
    return {
        "rc": rc,
        "wall_s": time.monotonic() - t0,
        "first_step_s": arrived[0] if arrived else None,
        "s_per_step": statistics.median(deltas) if deltas else None,
        "step_times_from": "log timestamps" if from_log else "arrival times (the lines carry no timestamp)",
        "steps": len(arrived),
        "output_tail": "".join(tail),
    }


def _median(runs: list[dict], key: str):
    """Median over the successful runs (the failed ones are counted in ``failures``)."""
    values = [r[key] for r in runs if r.get(key) is not None and r["rc"] == 0]
    return statistics.median(values) if values else None


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-backends", action="store_true", help="only compare the hf-trainer strategies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from trnqwen.fetch.builtin import write_tiny_qwen3

    work = Path(tempfile.mkdtemp(prefix="trnqwen-hft-bench-"))
    assets = write_tiny_qwen3(work / "assets" / "hf" / "tiny-qwen3")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", NO_COLOR="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    summary: dict = {"benchmark": "hf_trainer_backends", "steps": args.steps, "repeats": args.repeats, "ranks": 2, "seq_len": 128}
    load_before = os.getloadavg()[0]
    failures: list[dict] = []

    def record(label: str, r: dict) -> None:
        if r["rc"] != 0 or r["steps"] < args.steps:
            failures.append({"run": label, "rc": r["rc"], "steps": r["steps"], "tail": r["output_tail"][-2000:]})
            print(f"FAILED: {label} rc={r['rc']} after {r['steps']} step line(s):\n{r['output_tail']}")

    if not args.skip_backends:
        results: dict[str, list[dict]] = {}
        for _ in range(args.repeats):
            for backend in ("native", "hf-v5", "hf-trainer"):
                run_dir = work / f"cli-{backend}-{len(results.get(backend, []))}"
                run_dir.mkdir()
                argv = [sys.executable, "-m", "trnqwen", "train", "--backend", backend, "--finetune",
                        "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--device", "cpu",
                        "--nproc-per-node", "2", "--steps", str(args.steps), "--seq-len", "128", "--show-log"]
                r = timed(argv, cwd=run_dir, env=env)
                record(f"train --backend {backend}", r)
                results.setdefault(backend, []).append(r)
                print(f"train --backend {backend:10s} rc={r['rc']} wall {r['wall_s']:.1f}s "
                      f"first step {r['first_step_s'] or float('nan'):.1f}s  {r['s_per_step'] or float('nan'):.2f}s/step")
        base = {k: _median(results["native"], k) for k in ("wall_s", "first_step_s", "s_per_step")}
        for backend, runs in results.items():
            med = {k: _median(runs, k) for k in ("wall_s", "first_step_s", "s_per_step")}
            ratios = {f"{k}_vs_native": _ratio(med[k], base[k]) for k in med}
            summary[backend] = {**med, **ratios}
            print(f"median {backend:10s} " + "  ".join(f"{k}={v:.2f}" for k, v in med.items() if v is not None)
                  + "  ratio vs native: " + ", ".join(f"{k.split('_vs')[0]} {v}" for k, v in ratios.items()))

    strat: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for strategy in ("ddp", "distributed-config"):
            out = work / f"direct-{strategy}-{len(strat.get(strategy, []))}"
            out.mkdir()
            argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", "localhost:0", "--local-ranks-filter", "0", "-m", "trnqwen.runtime.hf_trainer",
                    "--assets-dir", str(assets), "--model", "builtin:tiny-qwen3", "--steps", str(args.steps),
                    "--seq-len", "128", "--finetune", "--export-hf", "--checkpoint-dir", str(out / "ckpt"),
                    "--output-dir", str(out), "--strategy", strategy]
            r = timed(argv, cwd=out, env=env)
            record(f"hf-trainer --strategy {strategy}", r)
            strat.setdefault(strategy, []).append(r)
            print(f"hf-trainer --strategy {strategy:18s} rc={r['rc']} wall {r['wall_s']:.1f}s "
                  f"first step {r['first_step_s'] or float('nan'):.1f}s  {r['s_per_step'] or float('nan'):.2f}s/step")
    for strategy, runs in strat.items():
        med = {k: _median(runs, k) for k in ("wall_s", "first_step_s", "s_per_step")}
        summary[f"strategy_{strategy}"] = med
    dc, ddp = summary["strategy_distributed-config"], summary["strategy_ddp"]
    summary["distributed_config_vs_ddp"] = {k: _ratio(dc[k], ddp[k]) for k in dc}
    print("distributed-config / ddp: " + ", ".join(f"{k} {v}" for k, v in summary["distributed_config_vs_ddp"].items()))
    summary["failures"] = len(failures)
    summary["failed_runs"] = [{k: v for k, v in f.items() if k != "tail"} for f in failures]
    summary["step_times_from"] = sorted({r["step_times_from"] for rs in [*strat.values()] for r in rs})
    summary.update(load_note(load_before, os.getloadavg()[0]))
    print(summary["note"])
    if failures:
        print(f"{len(failures)} run(s) FAILED: the medians above leave them out; exit 1")
    if args.json:
        print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
