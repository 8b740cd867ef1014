"""inspect-logs from two source trees on the same logs, interleaved: the same-run before/after of a change.

Each command (``python -m trnqwen inspect-logs LOG`` and ``--json``) runs from its own tree
(PYTHONPATH), alternating trees every run, in a fresh wrapper process that reads its output
through a pipe and measures wall time, CPU time (user + sys) and peak RSS, as
``benchmarks/inspect_logs.py`` does.  The logs are that benchmark's (run it first to write them).

``--quick`` makes what it needs (a smoke run, ``benchmarks/run_all.py --quick``): "before" is
``git archive HEAD`` of this repository unpacked in a temporary folder (the committed tree against
the working tree; the same tree when git cannot give one, said so in the summary), and the log is
a small 8-rank log of ``--quick-steps`` steps written by inspect_logs.generate.

Usage:
  git worktree add /tmp/before <commit>
  .venv/bin/python benchmarks/inspect_logs_before_after.py /tmp/before -n 5 --shape real chatty
  .venv/bin/python benchmarks/inspect_logs_before_after.py --quick -n 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def committed_tree(dest: Path) -> bool:
    """Unpack ``git archive HEAD`` (trnqwen/ only: what the commands import) into ``dest``."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "trnqwen"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if archive.returncode:
        return False
    dest.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True).returncode:
        return False
    # bytecode compiled ahead, as an install (and the working tree, once imported) has it
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest / "trnqwen")], capture_output=True)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, nargs="?", help="the other source tree (e.g. a git worktree of the base commit)")
    ap.add_argument("-n", type=int, default=5, help="runs per command and tree (median reported)")
    ap.add_argument("--shape", nargs="+", choices=sorted(LOGS), default=["real"])
    ap.add_argument("--quick", action="store_true", help="before = the committed tree (git archive HEAD), a small generated log")
    ap.add_argument("--quick-steps", type=int, default=2000, help="steps of the --quick log (8 ranks)")
    ap.add_argument("--json", action="store_true", help="accepted for run_all: the summary line is always printed last")
    args = ap.parse_args()
    if args.before is None and not args.quick:
        ap.error("give the before tree (a git worktree of the base commit), or --quick")
    with tempfile.TemporaryDirectory(prefix="trnqwen-bench-ba-") as tmp:
        before_note = str(args.before)
        logs = LOGS
        shapes = args.shape
        if args.quick:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from inspect_logs import generate

            before = Path(tmp) / "before"
            if args.before is None:
                if committed_tree(before):
                    before_note = "git archive HEAD"
                else:
                    before, before_note = REPO, "the same tree (git archive HEAD failed)"
            else:
                before = args.before
            logs = {"quick": Path(tmp) / "quick.log"}
            generate(logs["quick"], ranks=8, steps=args.quick_steps)
            shapes = ["quick"]
        else:
            before = args.before
            missing = [str(LOGS[s]) for s in shapes if not LOGS[s].exists()]
            if missing:
                raise SystemExit(f"missing {', '.join(missing)}: run benchmarks/inspect_logs.py --shape all -n 1 first")
        return measure({"before": before.resolve(), "after": REPO}, logs, shapes, args.n, before_note)


def measure(trees: dict, logs: dict, shapes: list, n: int, before_note: str) -> int:
    load = os.getloadavg()[0]
    runs: dict = {}
    for shape in shapes:
        for _ in range(n):
            for mode in ("table", "json"):
                for name, tree in trees.items():
                    argv = [sys.executable, "-m", "trnqwen", "inspect-logs", str(logs[shape])] + (["--json"] if mode == "json" else [])
                    env = dict(os.environ, PYTHONPATH=str(tree), NO_COLOR="1")
                    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, env=env, cwd=tree)
                    runs.setdefault((shape, mode, name), []).append(json.loads(out.stdout))
    summary: dict = {"benchmark": "inspect_logs_before_after", "before": before_note, "runs": n,
                     "load_avg_1m": [load, os.getloadavg()[0]]}
    failed = []
    for (shape, mode, name), rs in sorted(runs.items()):
        mb = logs[shape].stat().st_size / 1e6
        wall, cpu = statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs)
        row = {"wall_s": round(wall, 3), "mb_s_wall": round(mb / wall, 1), "cpu_s": round(cpu, 3),
               "peak_rss_mb": round(max(r["rss"] for r in rs), 1), "exit_codes": sorted({r["rc"] for r in rs})}
        if any(rc not in (0, 1) for rc in row["exit_codes"]):  # 1 = the log judged unhealthy, still a report
            failed.append(f"{shape} {mode} {name}")
        summary[f"{shape} {mode} {name}"] = row
        print(f"{shape:7} {mode:5} {name:6} wall {wall:.2f}s ({mb / wall:.0f} MB/s)  cpu {cpu:.2f}s  rss {row['peak_rss_mb']:.0f} MB")
    for shape in shapes:
        for mode in ("table", "json"):
            b, a = summary[f"{shape} {mode} before"], summary[f"{shape} {mode} after"]
            summary[f"{shape} {mode} ratio"] = round(a["wall_s"] / b["wall_s"], 3)
    summary["failed"] = failed
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
