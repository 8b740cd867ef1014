"""inspect-logs parsing speed on a 64-rank interleaved log, against ``grep -c "step:"``.

Generates (once, reused while its parameters match) a torchtitan-style log of 64 ranks with
ANSI colours and torchrun prefixes - start-up lines, one [Override] line per layer per rank,
every rank's step lines interleaved, a warning now and then, checkpoint lines - of at least
``--mb`` MB under benchmarks/_work/ (gitignored).  Then, interleaved, N times each:

* ``grep -c "step:" FILE``  (the baseline: a C tool that only counts),
* the parser (``trnqwen.logs.parse.parse_file``) in a fresh process, with its peak RSS,
* the whole command ``trnqwen inspect-logs FILE --json`` (parse + judge + report).

Medians are reported as MB/s with the ratio to grep.  Target (issue 6): parser >= 150 MB/s,
memory bounded (peak RSS independent of the file size: the parser reads 16 MiB chunks and keeps
per-step records, not lines).  The machine may be shared: numbers are noisy, compare ratios.

Usage:
  .venv/bin/python benchmarks/inspect_logs.py            # table
  .venv/bin/python benchmarks/inspect_logs.py -n 5 --mb 400 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "benchmarks" / "_work"
TARGET_MBPS = 150.0
RANKS = 64
LAYERS = 36
E = "\x1b"


def _step(step: int, loss: float, gn: float, gib: float, pct: float, tps: float, tflops: float, mfu: float) -> str:
    # torchtitan 0.3.0 components/metrics.py, verbatim layout
    return (
        f"{E}[31mstep: {step:2}  {E}[32mloss: {loss:8.5f}  {E}[38;2;180;60;0mgrad_norm: {gn:7.4f}  "
        f"{E}[38;2;54;234;195mmemory: {gib:5.2f}GiB({pct:.2f}%)  {E}[34mtps: {round(tps):,}  "
        f"{E}[36mtflops: {tflops:,.2f}  {E}[35mmfu: {mfu:.2f}%{E}[39m"
    )


def generate(path: Path, target_mb: float = 0.0, *, ranks: int = RANKS, steps: int = 0) -> dict:
    """Write the log (``ranks`` ranks, until ``target_mb`` MB or ``steps`` steps); returns its
    facts (steps, lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    target = int(target_mb * 1e6)
    written = 0
    lines = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        head = []
        for r in range(ranks):
            p = f"[rank{r}]:[titan] 2026-11-29 09:00:00,{r:03d} - root - INFO - "
            head.append(p + "torchtitan version: 0.3.0 (0.0.0 means __version__ is not defined correctly).\n")
            head.append(p + f"Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard={ranks}, cp=1, tp=1, ep=1\n")
            for layer in range(LAYERS):
                head.append(p + f"[Override] my_kernels.nki_rope: model_spec.model.layers.{layer}.attention.rope "
                                 "CosSinRoPE.Config -> NKIRoPE.Config\n")
            head.append(p + f"Applied {LAYERS} override(s)\n")
            head.append(p + "Building qwen3 4B\n")
            head.append(p + f"{E}[34mModel qwen3 4B {E}[31msize: 4,022,468,096 total parameters{E}[39m\n")
            head.append(p + "Loading from HF safetensors from --checkpoint.initial_load_path: /data/assets/hf/Qwen3-4B\n")
            head.append(p + f"Trainer is initialized with local batch size 1, global batch size {ranks}, gradient accumulation "
                            f"steps 1, sequence length 2048, total steps {steps or 100000} (warmup 2)\n")
            head.append(p + "Training starts at step 1\n")
        text = "".join(head)
        fh.write(text)
        written += len(text)
        lines += len(head)
        step = 0
        while (written < target) if steps <= 0 else (step < steps):
            step += 1
            loss = 6.54 / (1 + step / 2000) + 0.5
            block = []
            sec = step % 60
            for r in range(ranks):
                pre = f"[rank{r}]:[titan] 2026-11-29 10:{(step // 60) % 60:02d}:{sec:02d},{(r * 13) % 1000:03d} - root - INFO - "
                tps = 55.0 if step == 1 else 1234.0 + (r * 7 + step) % 50
                block.append(pre + _step(step, loss, 1.0 + (step % 17) / 10, 14.2 + r / 100, 59.2 + r / 50, tps,
                                         3.5 if step == 1 else 49.9, 7.48) + "\n")
                if step % 500 == 0 and r % 16 == 3:
                    block.append(f"[rank{r}]:[titan] 2026-11-29 10:00:00,000 - root - WARNING - "
                                 f"Dataloader slow: waited 1.{r:02d}s for batch at step {step}\n")
            text = "".join(block)
            fh.write(text)
            written += len(text)
            lines += len(block)
        tail = "[rank0]:[titan] 2026-11-29 11:00:00,000 - root - INFO - Training completed\n"
        fh.write(tail)
        lines += 1
    os.replace(tmp, path)
    return {"steps": step, "lines": lines}


def _child(path: str) -> None:
    """Parse in a fresh process; print seconds and peak RSS."""
    sys.path.insert(0, str(REPO))
    from trnqwen.logs.parse import parse_file

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    log = parse_file(path)
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": dt, "steps": len(log.steps), "ranks": len(log.ranks), "maxrss_mb": rss / 1024,
                      "baseline_rss_mb": rss0 / 1024, "lines": log.lines}))


def _time(argv: list[str], env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    dt = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dt, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--mb", type=float, default=320.0, help="generated log size in MB (>= 300 for the issue's target)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--no-cli", action="store_true", help="skip timing the whole `trnqwen inspect-logs` command")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return
    path = WORK / f"inspect_logs_{RANKS}ranks_{int(args.mb)}MB.log"
    meta = path.with_suffix(".json")
    if not path.exists() or not meta.exists():
        t0 = time.perf_counter()
        facts = generate(path, args.mb)
        facts["generate_s"] = time.perf_counter() - t0
        meta.write_text(json.dumps(facts))
    facts = json.loads(meta.read_text())
    size_mb = path.stat().st_size / 1e6
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    grep_t, parse_t, cli_t, rss = [], [], [], []
    grep_count = child = None
    for _ in range(args.n):
        dt, out = _time(["grep", "-c", "step:", str(path)])
        grep_t.append(dt)
        grep_count = int(out.strip())
        dt, out = _time([sys.executable, __file__, "--child", str(path)], env)
        child = json.loads(out)
        parse_t.append(child["seconds"])
        rss.append(child["maxrss_mb"])
        if not args.no_cli:
            dt, out = _time([sys.executable, "-m", "trnqwen", "inspect-logs", str(path), "--json"], env)
            cli_t.append(dt)
    g, p = statistics.median(grep_t), statistics.median(parse_t)
    summary = {
        "benchmark": "inspect_logs",
        "file_mb": round(size_mb, 1),
        "ranks": RANKS,
        "lines": facts["lines"],
        "steps": facts["steps"],
        "step_lines_grep": grep_count,
        "grep_s": round(g, 3),
        "grep_mb_s": round(size_mb / g, 1),
        "parse_s": round(p, 3),
        "parse_mb_s": round(size_mb / p, 1),
        "parse_vs_grep": round(g / p, 3),
        "cli_s": round(statistics.median(cli_t), 3) if cli_t else None,
        "cli_mb_s": round(size_mb / statistics.median(cli_t), 1) if cli_t else None,
        "peak_rss_mb": round(max(rss), 1),
        "parsed_steps": child["steps"],
        "parsed_ranks": child["ranks"],
        "target_mb_s": TARGET_MBPS,
        "meets_target": size_mb / p >= TARGET_MBPS,
        "runs": args.n,
        "load_avg": round(os.getloadavg()[0], 2),
    }
    if not args.json:
        print(f"log: {path} ({size_mb:.0f} MB, {facts['lines']:,} lines, {RANKS} ranks, {facts['steps']:,} steps)")
        print(f"grep -c 'step:'        {g:7.3f} s  {size_mb / g:8.1f} MB/s  ({grep_count:,} matches)")
        print(f"parser (parse_file)    {p:7.3f} s  {size_mb / p:8.1f} MB/s  = {g / p:.2f}x grep's speed; "
              f"peak RSS {max(rss):.0f} MB")
        if cli_t:
            c = statistics.median(cli_t)
            print(f"trnqwen inspect-logs   {c:7.3f} s  {size_mb / c:8.1f} MB/s  (whole command, --json)")
        print(f"target: parser >= {TARGET_MBPS:.0f} MB/s -> {'met' if summary['meets_target'] else 'NOT met'} "
              f"(median of {args.n}; load average {summary['load_avg']}: a shared machine makes these noisy)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
