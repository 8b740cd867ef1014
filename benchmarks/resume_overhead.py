"""Resume overhead: time from ``trnqwen train --resume`` to its first new step, vs a fresh start.

On the built-in tiny Qwen3 (CPU, 2 ranks), for each repeat:

  A. a fresh fine-tune (``trnqwen train --finetune ...``): process start -> first step line
     (loads the published weights in HF format);
  B. the same run preempted after step K (``TRNQWEN_FAULT_PREEMPT_AT_STEP``, untimed), then
     ``trnqwen train --resume RUN``: process start -> first new step line (loads the full DCP
     checkpoint: model, optimizer, LR schedule, data position, RNG).

Prints each run, the medians, the ratio B/A and the checkpoint load time torchtitan logs, and a
final ``--json`` summary line.

  python benchmarks/resume_overhead.py [--backend native|hf-v5|hf-trainer] [--steps 6] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _common import load_note  # noqa: E402
from train_overhead import timed_run  # noqa: E402  (one timing loop for the train benchmarks)

_LOADED = re.compile(r"Finished loading the checkpoint in ([\d.]+) seconds")


def _load_seconds(log: Path, after_line: int = 0) -> float | None:
    lines = log.read_text(errors="replace").splitlines()[after_line:]
    found = [float(m.group(1)) for m in map(_LOADED.search, lines) if m]
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="native", choices=["hf-v5", "native", "hf-trainer"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = ap.parse_args()
    stop_at = max(1, args.steps // 2)

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="trnqwen-bench-resume-"))
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("HF_HUB_OFFLINE", "1")
        trnqwen = [sys.executable, "-m", "trnqwen"]
        fetched = timed_run([*trnqwen, "fetch", "builtin:tiny-qwen3"], cwd=work, env=env)
        if fetched["rc"] != 0:
            print(f"fetch failed:\n{fetched['output_tail']}", file=sys.stderr)
            return 1
        base = [
            *trnqwen, "train", "--model", "builtin:tiny-qwen3", "--backend", args.backend, "--device", "cpu",
            "--nproc-per-node", str(args.nproc), "--steps", str(args.steps), "--seq-len", "128", "--finetune",
            "--show-log",
        ]
        runs = work / ".trnqwen" / "runs"
        rows: dict[str, list[dict]] = {"fresh": [], "resumed": []}
        for i in range(args.repeats):
            a = timed_run([*base, "--checkpoint-dir", f"fresh-{i}"], cwd=work, env=env)
            a["load_s"] = _load_seconds(runs / (runs / "LAST").read_text().strip() / "train.log")
            stopped = timed_run([*base, "--checkpoint-dir", f"resumed-{i}"], cwd=work,
                                env={**env, "TRNQWEN_FAULT_PREEMPT_AT_STEP": str(stop_at)})
            run_id = (runs / "LAST").read_text().strip()
            log = runs / run_id / "train.log"
            before = len(log.read_text(errors="replace").splitlines())
            b = timed_run([*trnqwen, "train", "--resume", run_id, "--show-log"], cwd=work, env=env)
            b["load_s"] = _load_seconds(log, before)
            if a["rc"] != 0 or stopped["rc"] != 138 or b["rc"] != 0 or b["steps"] != args.steps - stop_at:
                print(f"run {i} failed: fresh rc={a['rc']} stop rc={stopped['rc']} resume rc={b['rc']} "
                      f"steps={b['steps']}\n{b['output_tail'] or stopped['output_tail']}", file=sys.stderr)
                return 1
            for name, r in (("fresh", a), ("resumed", b)):
                rows[name].append(r)
                print(f"run {i} {name:8s} first step {r['time_to_first_step_s']:6.2f}s  "
                      f"checkpoint load {r['load_s'] if r['load_s'] is not None else float('nan'):.2f}s  wall {r['wall_s']:6.2f}s")
        def median(values: list) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        med = {
            name: {key: median([r[key] for r in rs]) for key in ("time_to_first_step_s", "load_s", "wall_s")}
            for name, rs in rows.items()
        }
        ratio = med["resumed"]["time_to_first_step_s"] / med["fresh"]["time_to_first_step_s"]
        print(f"median time to first new step: resumed {med['resumed']['time_to_first_step_s']:.2f}s, "
              f"fresh {med['fresh']['time_to_first_step_s']:.2f}s, ratio {ratio:.3f}")
        if args.json:
            print(json.dumps({
                "benchmark": "resume_overhead", "backend": args.backend, "steps": args.steps, "stopped_after": stop_at,
                "nproc": args.nproc, "repeats": args.repeats, "median": med, "resumed_vs_fresh_first_step_ratio": ratio,
                **load_note(load_before, os.getloadavg()[0]),
            }))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
