"""CLI start-up of every command, against ``hf --help``, measured in the same run.

Each command runs as a fresh process N times (interleaved, after one warm-up each): the root
``--help`` (a hand-written fast path), every subcommand's ``--help`` (these import typer and the
command's module) and two real commands (``check-env --json`` and ``config show``).  The median
wall time is reported per command, with the CPU time (user + sys of the child), because on a
shared machine wall time includes waiting for a core.  The verdict covers every trnqwen command:
each must start in under 150 ms (issue 17: a verdict on the root help alone overstated), and
the root help must be at most 0.4x ``hf --help``.  Both CLIs run with HF_HUB_OFFLINE=1; the
interpreter floor (``python -c pass``) is shown for context.  The load average is measured before
and after, so a "machine shared" note is a number, not a guess.

``--breakdown`` also says where a real command's CPU time goes: each stage is a fresh process that
imports one more layer (interpreter, typer, pydantic, the RunConfig schema, the command's modules,
rich) and the median CPU difference between consecutive stages is that layer's cost.

Usage:
  .venv/bin/python benchmarks/startup.py            # table
  .venv/bin/python benchmarks/startup.py -n 30 --json
  .venv/bin/python benchmarks/startup.py --breakdown
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
TARGET_S = 0.150
TARGET_RATIO = 0.4


def _bin(name: str) -> str:
    for candidate in (REPO / ".venv" / "bin" / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    raise SystemExit(f"{name} not found in .venv/bin: run `make venv` first")


SUBCOMMANDS = ("fetch", "check-env", "train", "verify-ckpt", "inspect-logs", "quickstart", "config")


def _time_once(argv: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok_codes:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cases() -> dict[str, tuple[list[str], tuple[int, ...]]]:
    tq = _bin("trnqwen")
    out: dict[str, tuple[list[str], tuple[int, ...]]] = {"trnqwen --help": ([tq, "--help"], (0,))}
    for name in SUBCOMMANDS:
        out[f"trnqwen {name} --help"] = ([tq, name, "--help"], (0,))
    # real commands: check-env exits 1 when something blocks training (no Neuron device here)
    out["trnqwen check-env --json"] = ([tq, "check-env", "--json"], (0, 1, 3))
    out["trnqwen config show"] = ([tq, "config", "show"], (0,))
    out["hf --help"] = ([_bin("hf"), "--help"], (0,))
    out["python -c pass"] = ([_bin("python"), "-c", "pass"], (0,))
    return out


def measure(runs: int) -> dict[str, dict[str, float]]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
    todo = cases()
    wall: dict[str, list[float]] = {k: [] for k in todo}
    cpu: dict[str, list[float]] = {k: [] for k in todo}
    for argv, ok in todo.values():  # warm the page cache
        _time_once(argv, env, ok)
    for _ in range(runs):
        for name, (argv, ok) in todo.items():
            w, c = _time_once(argv, env, ok)
            wall[name].append(w)
            cpu[name].append(c)
    return {
        name: {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs),
               "cpu_median_s": statistics.median(cpu[name]), "runs": len(xs)}
        for name, xs in wall.items()
    }


# (layer, statement added to the previous stage); each stage runs everything above it
BREAKDOWN: dict[str, list[tuple[str, str]]] = {
    "config show": [
        ("interpreter + site", "pass"),
        ("typer", "import typer"),
        ("pydantic", "from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator"),
        ("trnqwen.config (RunConfig schema)", "import trnqwen.config"),
        ("command modules + typer app", "from trnqwen.cli.main import build_app; build_app('config')"),
        ("rich (the table)", "import rich.console, rich.table, rich.markup"),
        ("resolve + render", "from trnqwen.cli.main import main; main(['config', 'show'])"),
    ],
    "check-env --json": [
        ("interpreter + site", "pass"),
        ("typer", "import typer"),
        ("pydantic", "from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator"),
        ("trnqwen.config (RunConfig schema)", "import trnqwen.config"),
        ("command modules + typer app", "from trnqwen.cli.main import build_app; build_app('check-env')"),
        ("trnqwen.env.probe", "import trnqwen.env.probe"),
        ("probe + JSON", "from trnqwen.cli.main import main; main(['check-env', '--json'])"),
    ],
}


def breakdown(runs: int) -> dict[str, dict[str, float]]:
    """Per command: layer -> median CPU seconds it adds (fresh processes, cumulative imports)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
    python = _bin("python")
    out: dict[str, dict[str, float]] = {}
    for command, stages in BREAKDOWN.items():
        scripts = ["\n".join(code for _, code in stages[: i + 1]) for i in range(len(stages))]
        cpu: list[list[float]] = [[] for _ in scripts]
        for _ in range(runs):
            for i, script in enumerate(scripts):
                cpu[i].append(_time_once([python, "-c", script], env, (0, 1, 3))[1])
        medians = [statistics.median(xs) for xs in cpu]
        out[command] = {
            label: medians[i] - (medians[i - 1] if i else 0.0) for i, (label, _) in enumerate(stages)
        }
        out[command]["total"] = medians[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=15, help="runs per command (median reported)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--breakdown", action="store_true", help="also: where config show's and check-env's CPU goes")
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    results = measure(args.runs)
    load_after = os.getloadavg()[0]
    ours = results["trnqwen --help"]["median_s"]
    baseline = results["hf --help"]["median_s"]
    ratio = ours / baseline
    commands = {k: v for k, v in results.items() if k.startswith("trnqwen")}
    slow = sorted(k for k, v in commands.items() if v["median_s"] >= TARGET_S)
    slow_cpu = sorted(k for k, v in commands.items() if v["cpu_median_s"] >= TARGET_S)
    summary = {
        "benchmark": "startup",
        "trnqwen_help_s": round(ours, 4),
        "hf_help_s": round(baseline, 4),
        "ratio": round(ratio, 3),
        "commands": {k: {"median_s": round(v["median_s"], 4), "cpu_median_s": round(v["cpu_median_s"], 4)}
                     for k, v in commands.items()},
        "check_env_help_s": round(results["trnqwen check-env --help"]["median_s"], 4),
        "slowest_command": max(commands, key=lambda k: commands[k]["median_s"]),
        "over_target": slow,
        "over_target_cpu": slow_cpu,
        "python_floor_s": round(results["python -c pass"]["median_s"], 4),
        "runs": args.runs,
        "target_s": TARGET_S,
        "target_ratio": TARGET_RATIO,
        "meets_target": not slow and ratio <= TARGET_RATIO,
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(load_after, 2),
        "cpus": os.cpu_count(),
    }
    if args.breakdown:
        parts = breakdown(args.runs)
        summary["breakdown_cpu_ms"] = {c: {k: round(v * 1000, 1) for k, v in d.items()} for c, d in parts.items()}
        summary["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    if not args.json:
        print(f"{'command':<34}{'median':>10}{'min':>10}{'max':>10}{'cpu':>10}")
        for name, r in results.items():
            mark = "  over 150 ms" if name in slow else ""
            print(f"{name:<34}{r['median_s'] * 1000:>8.1f}ms{r['min_s'] * 1000:>8.1f}ms{r['max_s'] * 1000:>8.1f}ms"
                  f"{r['cpu_median_s'] * 1000:>8.1f}ms{mark}")
        print(
            f"\ntrnqwen --help / hf --help = {ratio:.2f}x; every trnqwen command < {TARGET_S * 1000:.0f} ms: "
            f"{'yes' if not slow else 'NO (' + ', '.join(slow) + ')'} -> target {'met' if summary['meets_target'] else 'NOT met'}"
            f"\nload average {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} CPUs"
            f"{' (shared: wall times include waiting for a core; see the cpu column)' if max(load_before, load_after) > (os.cpu_count() or 1) else ''}"
        )
        for command, layers in summary.get("breakdown_cpu_ms", {}).items():
            print(f"\nwhere `trnqwen {command}`'s CPU goes (median ms added by each layer):")
            for label, ms in layers.items():
                print(f"  {label:<36}{ms:>8.1f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
