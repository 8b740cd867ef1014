"""Benchmark ``trnqwen verify-ckpt`` on a Qwen3-4B-shaped checkpoint (~8 GB of random bf16).

Generates the checkpoint once under benchmarks/_work/qwen3-4b-shaped (reused when present):
the real Qwen3-4B shapes (36 layers, hidden 2560, 32 heads, 8 KV heads, head_dim 128,
intermediate 9728, vocab 151936, tied embeddings), three shards plus an index like the Hub's,
written with numpy + safetensors (no torch).  Then measures, in one run, wall time and peak RSS
of each command as a child process (``resource.getrusage(RUSAGE_CHILDREN)`` after each):

  baseline   cat <shards> > /dev/null        (reading the same bytes once; page cache warm)
  default    trnqwen verify-ckpt --json      (headers + full NaN/Inf scan)
  quick      trnqwen verify-ckpt --quick --json
  naive      from_pretrained(dtype=bf16) + torch.isfinite(t).all() on every tensor

Targets (issue 5): quick < 2 s, default within 1.5x of the cat baseline, peak RSS < 1.5 GB.
Prints one line per measurement, the ratios, and a final ``--json``-style summary line.

    .venv/bin/python benchmarks/verify_ckpt.py [--repeat 3] [--skip-naive] [--json]
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

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work" / "qwen3-4b-shaped"
PY = sys.executable

QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "rope_theta": 5000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def generate(folder: Path, shards: int = 3) -> list[Path]:
    """Random bf16 tensors with the real shapes, split into ``shards`` files by size.

    Written tensor by tensor in the safetensors layout (8-byte header length, JSON header padded
    to 8 bytes, raw little-endian data): numpy has no bfloat16, so the bits are made from float32
    (top 16 bits) and streamed, never holding a whole shard in memory.  The naive baseline then
    loads these files with transformers, which proves they are standard safetensors.
    """
    import struct

    import numpy as np

    sys.path.insert(0, str(ROOT.parent))
    from trnqwen.ckpt.spec import expected_tensors

    spec = expected_tensors(QWEN3_4B)
    names = [k for k in spec.tensors if k not in spec.expected_missing]
    sizes = {k: int(np.prod(spec.tensors[k].shape)) * 2 for k in names}
    total = sum(sizes.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    for k in names:
        groups[min(shards - 1, acc * shards // total)].append(k)
        acc += sizes[k]
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weight_map = {}
    files = []
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header, pos = {}, 0
        for k in group:
            header[k] = {"dtype": "BF16", "shape": list(spec.tensors[k].shape), "data_offsets": [pos, pos + sizes[k]]}
            pos += sizes[k]
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        tmp = folder / (fname + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            for k in group:
                n = sizes[k] // 2
                for start in range(0, n, 1 << 24):
                    vals = rng.standard_normal(min(1 << 24, n - start), dtype=np.float32) * np.float32(0.02)
                    fh.write((vals.view(np.uint32) >> 16).astype(np.uint16).tobytes())
        os.replace(tmp, folder / fname)
        weight_map.update({k: fname for k in group})
        files.append(folder / fname)
        print(f"  wrote {fname}: {(folder / fname).stat().st_size / 1e9:.2f} GB", file=sys.stderr)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (folder / "config.json").write_text(json.dumps(QWEN3_4B, indent=2))
    return files


def ensure_checkpoint(work: Path = WORK) -> list[Path]:
    files = sorted(work.glob("model-*.safetensors"))
    if len(files) == 3 and (work / "model.safetensors.index.json").is_file() and (work / "config.json").is_file():
        return files
    print(f"generating a Qwen3-4B-shaped checkpoint under {work} (once) ...", file=sys.stderr)
    return generate(work)


NAIVE = r"""
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
bad = [n for n, t in m.state_dict().items() if not bool(torch.isfinite(t).all())]
print(len(bad))
"""


def measure(cmd: list[str], repeat: int) -> dict:
    """Median wall seconds and the peak RSS (MB) of the child over ``repeat`` runs."""
    walls, cpus, rss = [], [], 0.0
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"})
        walls.append(time.perf_counter() - start)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds (user + sys) are far less sensitive than wall time to other load on the host
        cpus.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
        rss = max(rss, r1.ru_maxrss / 1024)  # KiB -> MiB; children's max so far (monotone)
        if proc.returncode not in (0,):
            raise SystemExit(f"{cmd} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return {
        "wall_s": round(statistics.median(walls), 3),
        "runs": [round(w, 3) for w in walls],
        "cpu_s": round(statistics.median(cpus), 3),
        "peak_rss_mb": round(rss),
    }


def child_rss(cmd: list[str]) -> float:
    """Peak RSS (MB) of one child measured in isolation (a fresh python parent per command)."""
    code = (
        "import resource, subprocess, sys, json;"
        "subprocess.run(json.loads(sys.argv[1]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
    )
    out = subprocess.run([PY, "-c", code, json.dumps(cmd)], capture_output=True, text=True, check=True).stdout
    return round(float(out.strip()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-naive", action="store_true", help="skip from_pretrained + isfinite (needs ~10 GB RAM)")
    ap.add_argument("--layers", type=int, default=QWEN3_4B["num_hidden_layers"],
                    help="transformer layers (36 = Qwen3-4B, ~8 GB; the quick path's 2 make ~1.2 GB)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    args = ap.parse_args()

    global WORK
    if args.layers != QWEN3_4B["num_hidden_layers"]:
        QWEN3_4B["num_hidden_layers"] = args.layers
        WORK = WORK.with_name(f"{WORK.name}-{args.layers}l")
    files = ensure_checkpoint(WORK)
    size_gb = sum(f.stat().st_size for f in files) / 1e9
    trnqwen = [PY, "-m", "trnqwen", "verify-ckpt", str(WORK), "--json"]
    cmds = {
        "cat": ["cat", *map(str, files)],
        "default": trnqwen,
        "quick": [*trnqwen, "--quick"],
    }
    if not args.skip_naive:
        cmds["naive"] = [PY, "-c", NAIVE, str(WORK)]
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache

    results = {}
    for name, cmd in cmds.items():
        r = measure(cmd if name != "cat" else ["sh", "-c", " ".join(cmd) + " > /dev/null"], 1 if name == "naive" else args.repeat)
        r["peak_rss_mb"] = child_rss(cmd if name != "cat" else ["sh", "-c", " ".join(cmd) + " > /dev/null"])
        results[name] = r
        if not args.json:
            print(f"{name:8s} wall {r['wall_s']:7.3f} s (runs {r['runs']})  cpu {r['cpu_s']:6.2f} s  peak RSS {r['peak_rss_mb']:6.0f} MB")

    base = results["cat"]["wall_s"]
    summary = {
        "benchmark": "verify_ckpt",
        "checkpoint_gb": round(size_gb, 2),
        "load_avg": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        **{f"{k}_wall_s": v["wall_s"] for k, v in results.items()},
        **{f"{k}_cpu_s": v["cpu_s"] for k, v in results.items()},
        **{f"{k}_peak_rss_mb": v["peak_rss_mb"] for k, v in results.items()},
        "default_vs_cat": round(results["default"]["wall_s"] / base, 2),
        "default_vs_cat_best": round(min(results["default"]["runs"]) / min(results["cat"]["runs"]), 2),
        "default_vs_cat_cpu": round(results["default"]["cpu_s"] / max(results["cat"]["cpu_s"], 1e-3), 2),
        "quick_wall_s_target_2": results["quick"]["wall_s"] < 2.0,
        "default_within_1_5x_cat": results["default"]["wall_s"] <= 1.5 * base,
        "peak_rss_under_1_5gb": max(results["default"]["peak_rss_mb"], results["quick"]["peak_rss_mb"]) < 1500,
    }
    if "naive" in results:
        summary["naive_vs_default"] = round(results["naive"]["wall_s"] / results["default"]["wall_s"], 2)
    if not args.json:
        print(f"ratios: default/cat {summary['default_vs_cat']}x wall (best runs {summary['default_vs_cat_best']}x, "
              f"cpu {summary['default_vs_cat_cpu']}x), quick {results['quick']['wall_s']} s"
              + (f", naive/default {summary['naive_vs_default']}x" if "naive" in summary else ""))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
