"""Overhead of ``trnqwen train`` against the same torchrun command run by hand.

On the built-in tiny Qwen3 (CPU, 2 ranks), runs in turn (A first in even repeats, B first in
odd ones, so neither always has the warmer machine)

  A. ``trnqwen train ... --show-log`` (plan, preflight, run dir, supervised torchrun), and
  B. the run's own ``command.sh`` (the exact torchrun command and environment, by hand),

timing from process start to the first step line (time to first step) and the median time
between later step lines (seconds per step).  Prints each run, the medians and the ratios
A/B, and a final ``--json`` summary line.

  python benchmarks/train_overhead.py [--backend hf-v5] [--steps 6] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def timed_run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> dict:
    """Run ``argv``; time to the first step line and between step lines.

    Seconds per step come from the timestamps torchtitan prints on each step line (when it
    stamped the line, inside the rank), not from when the line reached us: a relaying process
    (trnqwen's tee, pipe buffering) must not look like slower training.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stamps: list[float] = []
    logged: list[float] = []
    losses: list[float] = []
    assert proc.stdout is not None
    tail: list[str] = []
    for raw in iter(proc.stdout.readline, b""):
        text = raw.decode("utf-8", "replace")
        tail = (tail + [text])[-15:]
        m = parse_step_line(text)
        if m is not None:
            stamps.append(time.monotonic() - t0)
            losses.append(m["loss"])
            at = logged_at(text)
            if at is not None:
                logged.append(at)
    rc = proc.wait()
    wall = time.monotonic() - t0
    series = logged if len(logged) == len(stamps) else stamps
    deltas = [b - a for a, b in zip(series, series[1:])]
    return {
        "rc": rc,
        "wall_s": wall,
        "time_to_first_step_s": stamps[0] if stamps else None,
        "seconds_per_step": statistics.median(deltas) if deltas else None,
        "steps": len(stamps),
        "tail_s": wall - stamps[-1] if stamps else None,  # last step -> process exit (save, teardown)
        "output_tail": "".join(tail),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="hf-v5", choices=["hf-v5", "native"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = ap.parse_args()

    from trnqwen.fetch.builtin import write_tiny_qwen3

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="trnqwen-bench-"))
    try:
        assets = write_tiny_qwen3(work / "assets" / "hf" / "tiny-qwen3")
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("HF_HUB_OFFLINE", "1")
        train = [
            sys.executable, "-m", "trnqwen", "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets),
            "--backend", args.backend, "--device", "cpu", "--nproc-per-node", str(args.nproc),
            "--steps", str(args.steps), "--seq-len", "256", "--finetune", "--show-log", "--checkpoint-dir", "ckpt",
        ]
        ckpt = work / "ckpt"
        runs = work / ".trnqwen" / "runs"
        rows: dict[str, list[dict]] = {"trnqwen": [], "torchrun": []}
        orders: list[list[str]] = []

        def run_trnqwen() -> dict:
            r = timed_run(train, cwd=work, env=env)
            run_dir = runs / (runs / "LAST").read_text().strip()
            # trnqwen's own share, measured inside the run: process start -> torchrun started.
            r["launcher_startup_s"] = json.loads((run_dir / "run.json").read_text())["extra"].get("launcher_startup_s")
            return r

        def run_by_hand() -> dict:
            # the exact torchrun command of trnqwen's latest run (command.sh)
            script = runs / (runs / "LAST").read_text().strip() / "command.sh"
            return timed_run(["bash", str(script)], cwd=work, env=env)

        for i in range(args.repeats):
            # Alternate which goes first (page cache, CPU frequency, a neighbour's load hit both
            # alike); the hand-run command needs a trnqwen run's command.sh, so run 0 starts with trnqwen.
            order = ["trnqwen", "torchrun"] if i % 2 == 0 else ["torchrun", "trnqwen"]
            orders.append(order)
            for name in order:
                shutil.rmtree(ckpt, ignore_errors=True)  # else torchtitan resumes from the previous run instead of loading
                r = run_trnqwen() if name == "trnqwen" else run_by_hand()
                if r["rc"] != 0 or r["steps"] != args.steps:
                    print(f"run {i} {name} failed: rc={r['rc']} steps={r['steps']}\n{r['output_tail']}", file=sys.stderr)
                    return 1
                rows[name].append(r)
                print(
                    f"run {i} {name:8s} first step {r['time_to_first_step_s']:6.2f}s  "
                    f"{r['seconds_per_step']:.3f}s/step  wall {r['wall_s']:6.2f}s  (after last step {r['tail_s']:.2f}s)"
                )
        med = {
            name: {
                key: statistics.median(r[key] for r in rs)
                for key in ("time_to_first_step_s", "seconds_per_step", "wall_s", "tail_s")
            }
            for name, rs in rows.items()
        }
        startup = [r["launcher_startup_s"] for r in rows["trnqwen"] if r.get("launcher_startup_s") is not None]
        if startup:
            med["trnqwen"]["launcher_startup_s"] = statistics.median(startup)
            print(f"median trnqwen start-up before torchrun (CLI + plan + preflight + run dir): {med['trnqwen']['launcher_startup_s']:.3f}s")
        ratio = {key: med["trnqwen"][key] / med["torchrun"][key] for key in ("time_to_first_step_s", "seconds_per_step", "wall_s")}
        for key in ("time_to_first_step_s", "seconds_per_step", "wall_s"):
            print(
                f"median {key:22s} trnqwen {med['trnqwen'][key]:7.3f}  by hand {med['torchrun'][key]:7.3f}  "
                f"ratio {ratio[key]:.3f}  (+{med['trnqwen'][key] - med['torchrun'][key]:.3f}s)"
            )
        if args.json:
            print(json.dumps({
                "benchmark": "train_overhead", "backend": args.backend, "steps": args.steps,
                "nproc": args.nproc, "repeats": args.repeats, "order": [" then ".join(o) for o in orders],
                "median": med, "ratio": ratio,
                **load_note(load_before, os.getloadavg()[0]),
                "launcher_startup_note": "launcher_startup_s is trnqwen's own share of the wall time",
            }))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
