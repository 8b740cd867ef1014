"""Benchmark ``trnqwen eval --tasks`` against lm-evaluation-harness run by hand on the same model and task.

Both are whole processes, timed from start to exit, in the same run, in alternating order:

  baseline   ``python -m lm_eval --model hf --model_args pretrained=DIR,dtype=float32 --tasks T
             --include_path <the task's YAML> --apply_chat_template --batch_size B --limit N``
             (what a user types with the harness alone)
  trnqwen    ``trnqwen eval DIR --no-base --tasks T --limit N --batch-size B --json``

The task is trnqwen's own ``trnqwen_calculator`` (written out as a YAML file for the baseline, the
same config trnqwen builds), offline, on the built-in tiny Qwen3.  Reported: seconds per sample of
each, the ratio trnqwen / harness (goal, issue 36: at most 1.05), the same ratio of CPU seconds (user +
sys of each process tree: steadier than the wall clock on a shared machine), and whether the two
scores agree.

    .venv/bin/python benchmarks/harness.py [--limit 40] [--repeats 2] [--batch-size 4] [--json]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "_work" / "harness"
TASK = "trnqwen_calculator"


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def prepare(work: Path) -> tuple[Path, Path]:
    """(the tiny model's folder, the folder holding the task's YAML for the baseline)."""
    import yaml

    from trnqwen.evaluate.harness import builtin_task_config
    from trnqwen.fetch.builtin import write_tiny_qwen3

    model = work / "tiny-qwen3"
    if not (model / "config.json").is_file():
        write_tiny_qwen3(model)
    tasks = work / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    (tasks / f"{TASK}.yaml").write_text(yaml.safe_dump(builtin_task_config(TASK), sort_keys=False))
    return model, tasks


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished process, wall seconds, CPU seconds: user + sys of it and its children, the
    kernel's count, which a loaded machine disturbs far less than the wall clock)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=str(WORK))
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, seconds, cpu


def run_harness_by_hand(model: Path, tasks: Path, out: Path, *, limit: int, batch_size: int) -> tuple[float, float, float]:
    """(seconds, CPU seconds, acc) of lm_eval's own CLI."""
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
           "--tasks", TASK, "--include_path", str(tasks), "--apply_chat_template", "--device", "cpu",
           "--batch_size", str(batch_size), "--limit", str(limit), "--output_path", str(out)]
    proc, seconds, cpu = _run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"lm_eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = max(out.rglob("results*.json"), key=lambda p: p.stat().st_mtime)
    return seconds, cpu, json.loads(result.read_text())["results"][TASK]["acc,none"]


def run_trnqwen(model: Path, *, limit: int, batch_size: int) -> tuple[float, float, float]:
    """(seconds, CPU seconds, acc) of ``trnqwen eval --tasks``."""
    cmd = [sys.executable, "-m", "trnqwen", "eval", str(model), "--no-base", "--tasks", TASK, "--limit", str(limit),
           "--batch-size", str(batch_size), "--device", "cpu", "--json"]
    proc, seconds, cpu = _run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"trnqwen eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    return seconds, cpu, report["results"][0]["scores"][TASK]["value"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=40, help="samples of the task (40: all of it)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="end with one JSON summary line")
    args = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    model, tasks = prepare(WORK)
    times: dict[str, list[float]] = {"lm_eval": [], "trnqwen": []}
    cpus: dict[str, list[float]] = {"lm_eval": [], "trnqwen": []}
    scores: dict[str, float] = {}
    for i in range(args.repeats):  # alternate which goes first, so neither always gets the warm cache
        order = ("lm_eval", "trnqwen") if i % 2 == 0 else ("trnqwen", "lm_eval")
        for name in order:
            if name == "lm_eval":
                seconds, cpu, acc = run_harness_by_hand(model, tasks, WORK / "lm_eval_out", limit=args.limit,
                                                        batch_size=args.batch_size)
            else:
                seconds, cpu, acc = run_trnqwen(model, limit=args.limit, batch_size=args.batch_size)
            times[name].append(seconds)
            cpus[name].append(cpu)
            scores[name] = acc
            print(f"{name:8s} {seconds:7.2f} s  ({cpu:6.2f} s CPU)  acc {acc:.4f}", file=sys.stderr)
    per_sample = {k: statistics.median(v) / args.limit for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    summary = {
        "benchmark": "harness",
        "task": TASK,
        "limit": args.limit,
        "repeats": args.repeats,
        "seconds_per_sample": {k: round(v, 4) for k, v in per_sample.items()},
        "ratio_trnqwen_vs_lm_eval": round(per_sample["trnqwen"] / per_sample["lm_eval"], 3),
        "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_ratio_trnqwen_vs_lm_eval": round(cpu["trnqwen"] / cpu["lm_eval"], 3),
        "scores": scores,
        "scores_agree": abs(scores["trnqwen"] - scores["lm_eval"]) < 1e-9,
    }
    print(f"trnqwen {per_sample['trnqwen']:.3f} s/sample vs lm_eval {per_sample['lm_eval']:.3f} s/sample: "
          f"{summary['ratio_trnqwen_vs_lm_eval']:.3f}x (goal <= 1.05), CPU {summary['cpu_ratio_trnqwen_vs_lm_eval']:.3f}x; "
          f"scores agree: {summary['scores_agree']}",
          file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["scores_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
