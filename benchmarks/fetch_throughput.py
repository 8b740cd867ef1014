"""Download throughput: ``trnqwen fetch`` against ``hf download`` of the same snapshot, same run.

A Qwen3-shaped snapshot (config, tokenizer, N safetensors shards of generated data, ~300 MB by
default) is served from a loopback Hub-compatible server (tests/hubserver.py, its own process,
files sent with sendfile).  Each client runs as a fresh process into an empty folder with its own
empty HF cache, progress bars off; the runs alternate (hf, trnqwen, hf, trnqwen, ...) after the
server's files are in the page cache.  Wall time includes process start and, for trnqwen, its
preflight and verification (sha256 of every file, safetensors headers, index): that is the price
of "arrives whole", so it is counted.  Reported: MB/s (10^6 bytes) per client, median over runs,
and the ratio trnqwen / hf.

Usage:
  .venv/bin/python benchmarks/fetch_throughput.py                 # ~300 MB, 3 runs each
  .venv/bin/python benchmarks/fetch_throughput.py --size-mb 500 --runs 5 --json
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
REPO_ID = "bench/Qwen3-Bench"


def _bin(name: str) -> str:
    for candidate in (REPO / ".venv" / "bin" / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    raise SystemExit(f"{name} not found in .venv/bin: run `make venv` first")


def make_snapshot(root: Path, size_mb: int, shards: int) -> int:
    """Write ROOT/bench/Qwen3-Bench/ with ``shards`` safetensors files; returns total bytes."""
    import numpy as np
    from safetensors.numpy import save_file

    repo = root / REPO_ID
    repo.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_shard = size_mb * 1_000_000 // shards
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i}.mlp.up_proj.weight"
        rows = per_shard // (4 * 1024)
        save_file({tensor: rng.standard_normal((rows, 1024), dtype=np.float32)}, str(repo / name), metadata={"format": "pt"})
        weight_map[tensor] = name
    (repo / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (repo / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    (repo / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    total = 0
    for f in repo.iterdir():
        total += f.stat().st_size
        with open(f, "rb") as fh:  # into the page cache, so the server is not disk-bound
            while fh.read(16 * 1024 * 1024):
                pass
    return total


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "hubserver.py"), str(root)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("HF_ENDPOINT="):
        proc.kill()
        raise SystemExit(f"the hub server did not start: {line!r}")
    return proc, line.split("=", 1)[1]


def run_client(name: str, endpoint: str, work: Path, workers: int) -> float:
    dest = work / f"{name}-out"
    home = work / f"{name}-home"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    env = dict(
        os.environ,
        HF_ENDPOINT=endpoint,
        HF_HUB_OFFLINE="0",
        HF_HOME=str(home),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_COLOR="1",
    )
    env.pop("HF_TOKEN", None)
    if name == "trnqwen":
        argv = [_bin("trnqwen"), "fetch", REPO_ID, "--local-dir", str(dest), "--max-workers", str(workers),
                "--keep-free", "0", "--no-progress", "--json"]  # fmt: skip
    else:
        argv = [_bin("hf"), "download", REPO_ID, "--local-dir", str(dest), "--max-workers", str(workers)]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if name == "trnqwen" and not json.loads(proc.stdout)["verified"]:
        raise SystemExit("trnqwen fetch did not verify the snapshot")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=300, help="snapshot size in MB (default 300)")
    ap.add_argument("--shards", type=int, default=4, help="safetensors shards (default 4)")
    ap.add_argument("--runs", type=int, default=3, help="runs per client (default 3)")
    ap.add_argument("--max-workers", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print one JSON summary line")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="trnqwen-fetch-bench-"))
    server = None
    try:
        total = make_snapshot(work / "hub", args.size_mb, args.shards)
        server, endpoint = start_server(work / "hub")
        run_client("hf", endpoint, work, args.max_workers)  # warm-up (imports, page cache)
        times: dict[str, list[float]] = {"hf": [], "trnqwen": []}
        for _ in range(args.runs):
            for name in ("hf", "trnqwen"):
                times[name].append(run_client(name, endpoint, work, args.max_workers))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)

    mbps = {k: total / 1e6 / statistics.median(v) for k, v in times.items()}
    ratio = mbps["trnqwen"] / mbps["hf"]
    summary = {
        "benchmark": "fetch_throughput",
        "bytes": total,
        "runs": args.runs,
        "max_workers": args.max_workers,
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "mb_per_s": {k: round(v, 1) for k, v in mbps.items()},
        "ratio_trnqwen_vs_hf": round(ratio, 3),
        "cpus": os.cpu_count(),
    }
    print(f"snapshot: {total / 1e6:.0f} MB in {args.shards} shards + config/tokenizer/index, loopback server")
    print(f"{'client':<10} {'median s':>9} {'MB/s':>8}   runs (s)")
    for name in ("hf", "trnqwen"):
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:<10} {statistics.median(times[name]):>9.2f} {mbps[name]:>8.1f}   {runs}")
    print(f"ratio trnqwen/hf throughput: {ratio:.2f} (trnqwen includes sha256 verification of every byte)")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
