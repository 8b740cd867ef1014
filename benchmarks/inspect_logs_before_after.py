"""inspect-logs from two source trees on the same logs, interleaved: the same-run before/after of a change.

Each command (``python -m trnqwen inspect-logs LOG`` and ``--json``) runs from its own tree
(PYTHONPATH), alternating trees every run, in a fresh wrapper process that reads its output
through a pipe and measures wall time, CPU time (user + sys) and peak RSS, as
``benchmarks/inspect_logs.py`` does.  The logs are that benchmark's (run it first to write them).

Usage:
  git worktree add /tmp/before <commit>
  .venv/bin/python benchmarks/inspect_logs_before_after.py /tmp/before -n 5 --shape real chatty
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "benchmarks" / "_work"
LOGS = {"real": WORK / "inspect_logs_8ranks_100000steps_varied.log",
        "chatty": WORK / "inspect_logs_8ranks_20000steps_varied_chatty.log"}
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
    "w = time.perf_counter() - t\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "json.dump({'rc': p.returncode, 'wall': w, 'cpu': u.ru_utime + u.ru_stime, 'rss': u.ru_maxrss / 1024}, sys.stdout)\n"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the other source tree (e.g. a git worktree of the base commit)")
    ap.add_argument("-n", type=int, default=5, help="runs per command and tree (median reported)")
    ap.add_argument("--shape", nargs="+", choices=sorted(LOGS), default=["real"])
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": REPO}
    missing = [str(LOGS[s]) for s in args.shape if not LOGS[s].exists()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run benchmarks/inspect_logs.py --shape all -n 1 first")
    load = os.getloadavg()[0]
    runs: dict = {}
    for shape in args.shape:
        for _ in range(args.n):
            for mode in ("table", "json"):
                for name, tree in trees.items():
                    argv = [sys.executable, "-m", "trnqwen", "inspect-logs", str(LOGS[shape])] + (["--json"] if mode == "json" else [])
                    env = dict(os.environ, PYTHONPATH=str(tree), NO_COLOR="1")
                    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, env=env, cwd=tree)
                    runs.setdefault((shape, mode, name), []).append(json.loads(out.stdout))
    summary: dict = {"benchmark": "inspect_logs_before_after", "runs": args.n, "load_avg_1m": [load, os.getloadavg()[0]]}
    for (shape, mode, name), rs in sorted(runs.items()):
        mb = LOGS[shape].stat().st_size / 1e6
        wall, cpu = statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs)
        row = {"wall_s": round(wall, 3), "mb_s_wall": round(mb / wall, 1), "cpu_s": round(cpu, 3),
               "peak_rss_mb": round(max(r["rss"] for r in rs), 1), "exit_codes": sorted({r["rc"] for r in rs})}
        summary[f"{shape} {mode} {name}"] = row
        print(f"{shape:7} {mode:5} {name:6} wall {wall:.2f}s ({mb / wall:.0f} MB/s)  cpu {cpu:.2f}s  rss {row['peak_rss_mb']:.0f} MB")
    for shape in args.shape:
        for mode in ("table", "json"):
            b, a = summary[f"{shape} {mode} before"], summary[f"{shape} {mode} after"]
            summary[f"{shape} {mode} ratio"] = round(a["wall_s"] / b["wall_s"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
