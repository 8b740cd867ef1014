"""Run every benchmark script in benchmarks/, collect their --json summary lines, print one table
and write benchmarks/RESULTS.md with the machine (cores, memory, CPU model, load) and the date.

Each script measures trnqwen against a baseline timed in the same run and prints a ratio; this
file only runs them and gathers what they report (no numbers of its own).

  .venv/bin/python benchmarks/run_all.py                 # everything, full size (`make bench`)
  .venv/bin/python benchmarks/run_all.py --quick         # smoke run: small sizes, one repetition
  .venv/bin/python benchmarks/run_all.py --skip verify_ckpt --skip train_overhead
  .venv/bin/python benchmarks/run_all.py --only startup --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"


@dataclass
class Bench:
    name: str
    what: str  # one line: what is measured against what
    full: list[str] = field(default_factory=list)
    quick: list[str] = field(default_factory=list)


# Ordered cheapest first.  Scripts that are missing are reported as such, never invented.
BENCHES = [
    Bench("startup", "CLI start-up of every command (root/subcommand --help, check-env --json, config show) vs `hf --help`", [], ["-n", "3"]),
    Bench("data_prep", "tokenize+mask+pack a chat set vs a Python loop over apply_chat_template (tiny model)",
          [], ["--records", "2000", "--repeats", "1"]),
    Bench("inspect_logs", "inspect-logs MB/s (table, --json) on the 8-rank 203 MB real-shaped log, a 64-rank log and a "
          "chatty log (most lines not step lines) vs `grep -c step:`",
          ["-n", "1", "--shape", "all"], ["-n", "1", "--shape", "uniform", "--mb", "20"]),
    Bench("fetch_throughput", "fetch from a loopback Hub vs `hf download` (same server, same files)", [],
          ["--size-mb", "20", "--runs", "1"]),
    Bench("verify_ckpt", "verify-ckpt on a generated Qwen3-4B-shaped 8 GB checkpoint vs `cat` (time, peak RSS)",
          ["--skip-naive"], ["--repeat", "1", "--skip-naive", "--layers", "2"]),
    Bench("eval_throughput", "eval tokens/s vs a plain transformers model(**batch) loop (same rows, same model)", [],
          ["--rows", "4", "--seq-len", "256", "--repeats", "1"]),
    Bench("train_overhead", "`trnqwen train` vs the same torchrun command by hand (tiny model, 2 CPU ranks)", [],
          ["--steps", "2", "--repeats", "1"]),
    Bench("resume_overhead", "`trnqwen train --resume` time to first new step vs a fresh start (tiny model, 2 CPU ranks)", [],
          ["--steps", "4", "--repeats", "1"]),
    Bench("hf_trainer_backends", "hf-trainer backend vs the torchtitan backends (tiny model, CPU)", [],
          ["--steps", "2", "--repeats", "1", "--skip-backends"]),
    Bench("inspect_logs_before_after", "inspect-logs from the committed tree vs the working tree on the same logs, "
          "interleaved (quick: `git archive HEAD`, a small generated log)",
          ["--quick", "-n", "5", "--quick-steps", "50000"], ["--quick", "-n", "1"]),
    Bench("torchtitan_releases", "trnqwen.titan_compat against torchtitan releases' wheels (pip download) and the "
          "installed one (quick: one release, nothing written)", ["--no-write"], ["--versions", "0.2.2", "--no-write"]),
    Bench("lora", "LoRA r16 vs a full fine-tune: the kernel's peak RSS per rank, s/step, adapter size, merge "
          "(Qwen3-0.6B-shaped; quick: tiny model, 2 steps)", [], ["--shape", "tiny", "--steps", "2"]),
    Bench("dpo", "DPO vs SFT over the same trained tokens (checked): trainer start to last step, s/step "
          "(Qwen3-0.6B-shaped LoRA; quick: tiny model full fine-tune, 8 pairs)", ["--lora"],
          ["--shape", "tiny", "--pairs", "8"]),
    Bench("grpo", "GRPO steps vs TRL's GRPOTrainer generating with transformers (same model, prompts, G, lengths): "
          "rollout tokens/s, step seconds, rollout/update split, peak RSS (small Qwen3-shaped model; quick: tiny, "
          "1 repeat)", [], ["--quick"]),
    Bench("harness", "`trnqwen eval --tasks` vs lm-evaluation-harness's own CLI on the same model and task "
          "(trnqwen_calculator, tiny model, CPU): seconds per sample, scores must agree", [],
          ["--limit", "8", "--repeats", "1"]),
]


# --- pieces the smoke test checks ---------------------------------------------------------------


def parse_summary(stdout: str) -> Optional[dict[str, Any]]:
    """The last line of a script's stdout that is one JSON object (its --json summary)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def is_ratio(key: str) -> bool:
    k = key.lower()
    if "target" in k:  # a goal the script compares against, not a measurement
        return False
    return "ratio" in k or "_vs_" in k or k.startswith("vs_") or k.endswith("_x")


def flat(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened to ``a.b`` keys; lists of scalars joined; other lists skipped."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, list):
            if all(not isinstance(x, (dict, list)) for x in v) and len(v) <= 8:
                out[key] = ", ".join(_fmt(x) for x in v)
        else:
            out[key] = v
    return out


def build_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one headline table (status, ratios) and one table of every measurement.

    ``rows``: dicts with ``name``, ``status`` (ok / failed / skipped / missing), ``seconds`` and
    ``summary`` (the script's JSON object, or None).
    """
    head = ["| benchmark | status | ratios vs baseline (same run) | took |", "| --- | --- | --- | --- |"]
    detail = ["| benchmark | measurement | value |", "| --- | --- | --- |"]
    for row in rows:
        summary = flat(row.get("summary") or {})
        ratios = [f"{k} {_fmt(v)}" for k, v in summary.items() if is_ratio(k) and not isinstance(v, str)]
        took = f"{row['seconds']:.0f} s" if row.get("seconds") is not None else "-"
        status = row["status"] + (f" ({row['why']})" if row.get("why") else "")
        head.append(f"| {row['name']} | {status} | {'; '.join(ratios) or '-'} | {took} |")
        for k, v in summary.items():
            if k == "benchmark":
                continue
            detail.append(f"| {row['name']} | {k} | {_fmt(v)} |")
    return "\n".join(head) + "\n\n" + "\n".join(detail) + "\n"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


GPU_NOTE = (
    "`benchmarks/gpu_check.sh` (one CUDA GPU, under 8 minutes: a Qwen3-0.6B-shaped random-init native run through "
    "`trnqwen train` and through the equivalent raw torchrun line, tokens/s and MFU of both) is not part of this "
    "run: it needs a GPU. Where it has been run, its `gpu_check.json` line belongs here; numbers are never estimated."
)


def render_results(rows: list[dict[str, Any]], info: dict[str, Any], *, quick: bool, note: str = "") -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        "# Benchmark results",
        "",
        f"Written by `benchmarks/run_all.py{' --quick' if quick else ''}` (`make bench`) on {when}.",
        "Every ratio compares trnqwen with a baseline measured in the same run on the same machine;",
        "absolute numbers move with the machine and its load, ratios much less.",
        "",
        "## Machine",
        "",
        f"- CPU: {info['cpu_model']}, {info['nproc']} cores",
        f"- memory: {info['memory_gib']} GiB",
        f"- {info['os']}, Python {info['python']}",
        f"- load average at start: {info.get('load_avg_start')}, at end: {info.get('load_avg_end')}",
    ]
    if note:
        lines += ["", f"Note: {note}"]
    lines += ["", "## Summary", "", build_table(rows)]
    lines += ["## GPU check", "", GPU_NOTE, ""]
    lines += ["## Raw summary lines", "", "```"]
    lines += [json.dumps({"benchmark": r["name"], **(r.get("summary") or {"status": r["status"]})}) for r in rows]
    lines += ["```", ""]
    return "\n".join(lines)


# --- running ----------------------------------------------------------------------------------------


def run_one(bench: Bench, *, quick: bool, timeout: float, extra: list[str]) -> dict[str, Any]:
    script = HERE / f"{bench.name}.py"
    if not script.is_file():
        return {"name": bench.name, "status": "missing", "why": f"no {script.name}", "summary": None, "seconds": None}
    argv = [sys.executable, str(script), *(bench.quick if quick else bench.full), *extra, "--json"]
    print(f"== {bench.name}: {bench.what}\n   {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": bench.name, "status": "failed", "why": f"timed out after {timeout:.0f} s", "summary": None,
                "seconds": time.monotonic() - t0}
    took = time.monotonic() - t0
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            print(f"   {line}", file=sys.stderr)
    summary = parse_summary(proc.stdout)
    if proc.returncode != 0 or summary is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"   failed (exit {proc.returncode}): {tail}", file=sys.stderr)
        return {"name": bench.name, "status": "failed", "why": f"exit {proc.returncode}: {tail[:120]}",
                "summary": summary, "seconds": took}
    print(f"   done in {took:.0f} s", file=sys.stderr, flush=True)
    return {"name": bench.name, "status": "ok", "summary": summary, "seconds": took}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition (a smoke run)")
    ap.add_argument("--skip", action="append", default=[], metavar="NAME", help="skip a benchmark (repeatable)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these (repeatable)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark (default 3600)")
    ap.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where to write the Markdown results")
    ap.add_argument("--note", default="", help="a note for RESULTS.md (e.g. other work ran concurrently)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)
    names = {b.name for b in BENCHES}
    unknown = sorted(set(args.skip + args.only) - names)
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    if args.list:
        for b in BENCHES:
            print(f"{b.name:20s} {b.what}")
        return 0
    info = machine()
    info["load_avg_start"] = info.pop("load_avg")
    rows = []
    for bench in BENCHES:
        if (args.only and bench.name not in args.only) or bench.name in args.skip:
            rows.append({"name": bench.name, "status": "skipped", "summary": None, "seconds": None})
            continue
        rows.append(run_one(bench, quick=args.quick, timeout=args.timeout, extra=[]))
    info["load_avg_end"] = machine()["load_avg"]
    table = build_table(rows)
    print(table)
    if not args.no_write:
        args.results.write_text(render_results(rows, info, quick=args.quick, note=args.note))
        print(f"wrote {args.results}", file=sys.stderr)
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
