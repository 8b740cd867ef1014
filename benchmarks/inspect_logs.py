"""inspect-logs speed on generated log shapes, against ``grep -c "step:"`` on the same file in the same run.

Generated torchtitan-style logs (ANSI colours, torchrun prefixes, start-up lines, one [Override]
line per layer per rank, every rank's step lines interleaved, a warning now and then), written once
under benchmarks/_work/ (gitignored) and reused:

* ``real`` (the default): 8 ranks, every rank prints its step lines, 100k steps, about 203 MB and
  800k step lines (the shape of a by-hand torchrun; trnqwen's own launcher keeps rank 0's lines
  and its runs are read from their metrics stream).  One step line in 8 is rank 0's; a warning
  every ~1 MB breaks every all-step-lines stretch.  Every column varies as in real runs: tps per
  rank and step, with a dip below 1,000 (no thousands comma) at every 1,000th step; tflops and mfu
  follow tps; memory differs per rank, wobbles per step and drifts up over the run from about 78%
  to about 94% of the device (the last quarter above 90%); the lr column warms up, then follows a
  curve, printed with 10 significant digits.
* ``uniform``: 64 ranks, ``--mb`` MB (one line in 64 is rank 0's).
* ``chatty``: 8 ranks, 20,000 steps, and 3 other lines per rank and step (DEBUG chatter), about
  100 MB: three lines in four are read one by one.  No target; the figure is reported.

For each shape, N times, interleaved: ``grep -c "step:"`` (the baseline: a C tool that only
counts), the parser alone in a fresh process, and the whole command ``trnqwen inspect-logs FILE``
for the table and for ``--json`` (parse + judge + report, the output read through a pipe).  Each
command's wall time, CPU time (user + sys) and peak RSS are measured in a fresh wrapper process.
On a shared machine wall time includes waiting for a core: the load average is measured before
and after, and every figure is also given as a fraction of ``grep -c``'s speed in the same run.
trnqwen's bytecode is compiled first, as an install has it (see _compile_ahead).  Floor (issue
33): >= 100 MB/s wall for the table and for --json on the real shape.

Usage:
  .venv/bin/python benchmarks/inspect_logs.py                 # the real shape
  .venv/bin/python benchmarks/inspect_logs.py --shape all     # and uniform and chatty
  .venv/bin/python benchmarks/inspect_logs.py -n 1 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_note  # noqa: E402

WORK = REPO / "benchmarks" / "_work"
TARGET_MBPS = 100.0
RANKS = 64
LAYERS = 36
E = "\x1b"


def _step(step: int, loss: float, gn: float, gib: float, pct: float, tps: float, tflops: float, mfu: float,
          lr: float) -> str:
    # torchtitan 0.3.0 components/metrics.py, verbatim layout, and the lr column trnqwen's ranks append
    from trnqwen.contract.stepline import lr_text

    return (
        f"{E}[31mstep: {step:2}  {E}[32mloss: {loss:8.5f}  {E}[38;2;180;60;0mgrad_norm: {gn:7.4f}  "
        f"{E}[38;2;54;234;195mmemory: {gib:5.2f}GiB({pct:.2f}%)  {E}[34mtps: {round(tps):,}  "
        f"{E}[36mtflops: {tflops:,.2f}  {E}[35mmfu: {mfu:.2f}%{E}[39m" + lr_text(lr)
    )


TFLOPS_PER_TPS = 6 * 4.02e9 / 1e12  # 6 x parameters of Qwen3-4B, per token
PEAK_TFLOPS = 667.0
DEVICE_GIB = 24.0


def _tps(step: int, rank: int) -> float:
    """Tokens per second as real runs show them: slow at step 1 (compilation), then varying per
    rank and step, with a dip below 1,000 (no thousands comma) every 1,000 steps (a checkpoint save)."""
    if step == 1:
        return 55.0
    if step % 1000 == 0:
        return 612.0 + 37 * rank
    return 1150.0 + (rank * 7919 + step * 104_729) % 311 + (step % 7) / 3


def _gib(step: int, rank: int, steps: int) -> float:
    """Device memory as real runs log it: it differs per rank, wobbles per step and drifts up over
    the run, from about 78% of the device to about 94% (the last third of the run near capacity)."""
    return DEVICE_GIB * (0.78 + 0.16 * step / steps) + rank / 100 + (step % 97) / 400


def generate(path: Path, target_mb: float = 0.0, *, ranks: int = RANKS, steps: int = 0, chatter: int = 0) -> dict:
    """Write the log (``ranks`` ranks, until ``target_mb`` MB or ``steps`` steps; ``chatter``
    other lines per rank and step); returns its facts (steps, lines)."""
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
            lr = 1e-5 * min(1.0, step / 100) * (0.55 + 0.45 * math.cos(step / 5000))  # warm-up, then a curve
            block = []
            sec = step % 60
            for r in range(ranks):
                pre = f"[rank{r}]:[titan] 2026-11-29 10:{(step // 60) % 60:02d}:{sec:02d},{(r * 13) % 1000:03d} - root - INFO - "
                tps = _tps(step, r)
                tflops = tps * TFLOPS_PER_TPS  # torchtitan: tflops and mfu follow tps
                gib = _gib(step, r, steps or 100_000)
                block.append(pre + _step(step, loss, 1.0 + (step % 17) / 10, gib, 100 * gib / DEVICE_GIB, tps,
                                         tflops, 100 * tflops / PEAK_TFLOPS, lr) + "\n")
                for k in range(chatter):  # what a chatty run prints between steps, of varied length
                    block.append(pre.replace(" INFO ", " DEBUG ") + _CHATTER[(step + r + k) % len(_CHATTER)].format(
                        step=step, k=k, ms=(step * 7 + r * 3 + k) % 997) + "\n")
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


_CHATTER = (
    "dataloader worker {k}: prefetched batch for step {step} in {ms} ms",
    "NCCL INFO comm 0x{ms:x} rank {k} nranks 8 cudaDev {k} - Init COMPLETE",
    "profiler: step {step} forward {ms}.{k} ms, backward {ms}.{k} ms, optimizer 1.{k} ms",
    "checkpoint: staging shard {k} of step {step} ({ms} MB) to the background writer",
    "tokenizer: {ms} sequences packed, {k} cut at the context",
)


def _child(path: str) -> None:
    """Parse in a fresh process; print seconds and peak RSS."""
    sys.path.insert(0, str(REPO))
    from trnqwen.logs.engine import parse

    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        log = parse(fh, path)
    dt = time.perf_counter() - t0
    print(json.dumps({"seconds": dt, "steps": len(log.steps), "ranks": len(log.ranks), "lines": log.lines}))


def _measure(argv: list[str], env: dict | None = None, ok: tuple[int, ...] = (0, 1)) -> dict:
    """Run ``argv`` from a fresh wrapper process (so RUSAGE_CHILDREN is this command alone):
    wall seconds, CPU seconds, peak RSS in MB, and stdout's tail."""
    wrapper = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
        "w = time.perf_counter() - t\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "json.dump({'rc': p.returncode, 'wall_s': w, 'cpu_s': u.ru_utime + u.ru_stime, 'rss_mb': u.ru_maxrss / 1024,\n"
        "           'out': p.stdout[-4000:].decode('utf-8', 'replace'), 'err': p.stderr[-2000:].decode('utf-8', 'replace'),\n"
        "           'out_bytes': len(p.stdout)}, sys.stdout)\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, env=env, cwd=REPO)
    res = json.loads(proc.stdout)
    if res["rc"] not in ok:
        raise SystemExit(f"{' '.join(argv[:3])} failed ({res['rc']}): {res['err']}")
    return res


SHAPES = {"real": {"ranks": 8, "steps": 100_000}, "uniform": {"ranks": RANKS},
          "chatty": {"ranks": 8, "steps": 20_000, "chatter": 3}}


def _log_for(shape: str, mb: float) -> tuple[Path, dict]:
    spec = SHAPES[shape]
    name = (f"inspect_logs_{spec['ranks']}ranks_{spec['steps']}steps_varied{'_chatty' if spec.get('chatter') else ''}.log"
            if "steps" in spec else f"inspect_logs_{spec['ranks']}ranks_{int(mb)}MB.log")
    path = WORK / name
    meta = path.with_suffix(".json")
    if not path.exists() or not meta.exists():
        t0 = time.perf_counter()
        facts = generate(path, 0.0 if "steps" in spec else mb, ranks=spec["ranks"], steps=spec.get("steps", 0),
                         chatter=spec.get("chatter", 0))
        facts["generate_s"] = time.perf_counter() - t0
        meta.write_text(json.dumps(facts))
    return path, json.loads(meta.read_text())


def bench_shape(shape: str, mb: float, runs: int, env: dict) -> dict:
    path, facts = _log_for(shape, mb)
    size_mb = path.stat().st_size / 1e6
    cmds = {
        "grep -c": (["grep", "-c", "step:", str(path)], (0,), env),
        "parser": ([sys.executable, __file__, "--child", str(path)], (0,), env),
        "table": ([sys.executable, "-m", "trnqwen", "inspect-logs", str(path)], (0, 1), env),
        "json": ([sys.executable, "-m", "trnqwen", "inspect-logs", str(path), "--json"], (0, 1), env),
    }
    samples: dict[str, list[dict]] = {k: [] for k in cmds}
    for _ in range(runs):
        for name, (argv, ok, cmd_env) in cmds.items():
            samples[name].append(_measure(argv, cmd_env, ok))
    out: dict = {"file_mb": round(size_mb, 1), "ranks": SHAPES[shape]["ranks"], "lines": facts["lines"], "steps": facts["steps"],
                 "best_case": shape == "uniform"}
    grep_wall = statistics.median(r["wall_s"] for r in samples["grep -c"])
    grep_cpu = statistics.median(r["cpu_s"] for r in samples["grep -c"])
    out["step_lines_grep"] = int(samples["grep -c"][0]["out"].strip())
    for name, rs in samples.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        cpu = statistics.median(r["cpu_s"] for r in rs)
        out[name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "mb_s_wall": round(size_mb / wall, 1),
                     "mb_s_cpu": round(size_mb / cpu, 1), "peak_rss_mb": round(max(r["rss_mb"] for r in rs), 1),
                     "vs_grep_wall": round(grep_wall / wall, 3), "vs_grep_cpu": round(grep_cpu / cpu, 3)}
    parsed = json.loads(samples["parser"][-1]["out"])
    out["parsed_steps"], out["parsed_ranks"] = parsed["steps"], parsed["ranks"]
    out["json_bytes"] = samples["json"][-1]["out_bytes"]
    out["commands"] = list(cmds)
    return out


def _compile_ahead() -> bool:
    """Write trnqwen's bytecode (``__pycache__``, gitignored) as ``pip install`` does: with
    PYTHONDONTWRITEBYTECODE set (as on the shared machine) every fresh process would otherwise
    compile each trnqwen module from source again, about 40 ms of CPU per command that an
    installed trnqwen never pays.  Python reads existing bytecode even with that variable set."""
    import compileall

    return bool(compileall.compile_dir(str(REPO / "trnqwen"), quiet=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--mb", type=float, default=200.0, help="size of the uniform log in MB")
    ap.add_argument("--shape", choices=["real", "uniform", "chatty", "both", "all"], default="real",
                    help="both: real and uniform; all: and chatty")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    bytecode = _compile_ahead()
    load_before = os.getloadavg()[0]
    shapes = {"both": ["real", "uniform"], "all": ["real", "uniform", "chatty"]}.get(args.shape, [args.shape])
    results = {shape: bench_shape(shape, args.mb, args.n, env) for shape in shapes}
    load_after = os.getloadavg()[0]
    summary: dict = {"benchmark": "inspect_logs", "runs": args.n, "bytecode_compiled_ahead": bytecode, "target_mb_s": TARGET_MBPS,
                     **results, **load_note(load_before, load_after)}
    if "real" in results:
        r = results["real"]
        summary["meets_target_wall"] = r["table"]["mb_s_wall"] >= TARGET_MBPS and r["json"]["mb_s_wall"] >= TARGET_MBPS
        summary["meets_target_cpu"] = r["table"]["mb_s_cpu"] >= TARGET_MBPS and r["json"]["mb_s_cpu"] >= TARGET_MBPS

    first_shape = next(iter(results))
    first = results[first_shape]  # flat keys for run_all's summary table
    summary.update(shape=first_shape, parse_mb_s=first["parser"]["mb_s_wall"],
                   table_mb_s=first["table"]["mb_s_wall"], json_mb_s=first["json"]["mb_s_wall"],
                   json_mb_s_cpu=first["json"]["mb_s_cpu"], peak_rss_mb=first["json"]["peak_rss_mb"])
    if not args.json:
        for shape, r in results.items():
            label = {"real": "8 ranks, every rank's step lines", "uniform": "64 ranks",
                     "chatty": "3 other lines per rank and step, read one by one"}[shape]
            print(f"\n{shape} ({label}): {r['file_mb']:.0f} MB, {r['ranks']} ranks, {r['steps']:,} steps, "
                  f"{r['lines']:,} lines, {r['step_lines_grep']:,} step lines")
            print(f"  {'command':<24}{'wall':>9}{'MB/s':>9}{'x grep':>9}{'cpu':>9}{'MB/s':>9}{'x grep':>9}{'RSS MB':>9}")
            for name in r["commands"]:
                m = r[name]
                print(f"  {name:<24}{m['wall_s']:>8.2f}s{m['mb_s_wall']:>9.0f}{m['vs_grep_wall']:>9.3f}{m['cpu_s']:>8.2f}s"
                      f"{m['mb_s_cpu']:>9.0f}{m['vs_grep_cpu']:>9.3f}{m['peak_rss_mb']:>9.0f}")
        if "real" in results:
            print(f"\nfloor (real shape, table and --json >= {TARGET_MBPS:.0f} MB/s): "
                  f"wall {'met' if summary['meets_target_wall'] else 'NOT met'}, CPU time {'met' if summary['meets_target_cpu'] else 'NOT met'}")
        print(summary["note"])
        if bytecode:
            print("trnqwen's bytecode compiled ahead, as pip install does (PYTHONDONTWRITEBYTECODE would otherwise "
                  "recompile every module in every run)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
