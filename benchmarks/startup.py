"""CLI start-up: ``trnqwen --help`` against ``hf --help``, measured in the same run.

Each command runs as a fresh process N times (interleaved, after one warm-up each); the median
wall time is reported with the ratio to ``hf --help``.  Target (issue 2): ``trnqwen --help``
under 150 ms and at most 0.4x ``hf --help``.  Both run with HF_HUB_OFFLINE=1 so neither does a
network check; the interpreter floor (``python -c pass``) is shown for context.

Usage:
  .venv/bin/python benchmarks/startup.py            # table
  .venv/bin/python benchmarks/startup.py -n 30 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.150
TARGET_RATIO = 0.4


def _bin(name: str) -> str:
    for candidate in (REPO / ".venv" / "bin" / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    raise SystemExit(f"{name} not found in .venv/bin: run `make venv` first")


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed


def measure(runs: int) -> dict[str, dict[str, float]]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
    cases = {
        "trnqwen --help": [_bin("trnqwen"), "--help"],
        "hf --help": [_bin("hf"), "--help"],
        "trnqwen check-env --help": [_bin("trnqwen"), "check-env", "--help"],
        "python -c pass": [_bin("python"), "-c", "pass"],
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for argv in cases.values():  # warm the page cache
        _time_once(argv, env)
    for _ in range(runs):
        for name, argv in cases.items():
            samples[name].append(_time_once(argv, env))
    return {
        name: {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "runs": len(xs)}
        for name, xs in samples.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=15, help="runs per command (median reported)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    args = ap.parse_args()

    results = measure(args.runs)
    ours = results["trnqwen --help"]["median_s"]
    baseline = results["hf --help"]["median_s"]
    ratio = ours / baseline
    summary = {
        "benchmark": "startup",
        "trnqwen_help_s": round(ours, 4),
        "hf_help_s": round(baseline, 4),
        "ratio": round(ratio, 3),
        "check_env_help_s": round(results["trnqwen check-env --help"]["median_s"], 4),
        "python_floor_s": round(results["python -c pass"]["median_s"], 4),
        "runs": args.runs,
        "target_s": TARGET_S,
        "target_ratio": TARGET_RATIO,
        "meets_target": ours < TARGET_S and ratio <= TARGET_RATIO,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if not args.json:
        print(f"{'command':<28}{'median':>10}{'min':>10}{'max':>10}")
        for name, r in results.items():
            print(f"{name:<28}{r['median_s'] * 1000:>8.1f}ms{r['min_s'] * 1000:>8.1f}ms{r['max_s'] * 1000:>8.1f}ms")
        print(
            f"\ntrnqwen --help / hf --help = {ratio:.2f}x  (target <= {TARGET_RATIO}x and < {TARGET_S * 1000:.0f} ms: "
            f"{'met' if summary['meets_target'] else 'NOT met'}; load avg {summary['load_avg_1m']})"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
