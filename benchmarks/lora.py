"""LoRA against a full fine-tune, in one run, on the shape users have.

A Qwen3-0.6B-shaped model (28 layers, hidden 1024, 16/8 heads, FFN 3072, vocab 151,936, tied,
random bf16 weights made here with transformers), 2 CPU ranks, the bundled chat set, seq 256:

  A. ``trnqwen train --finetune`` (full fine-tune, HF export)
  B. the same with ``--lora`` (rank 16, all-linear; PEFT adapter export)
  C. ``trnqwen merge`` of B's adapter into the base

For A and B: the kernel's peak RSS: each rank's high-water mark (``VmHWM``, read while it lives)
and ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper around the command (the largest process),
seconds per step (median of the ranks' own step-line stamps), time from the last step to the
process exit (the export). Then the adapter's size against the base's, and C's time.
Prints the ratios B/A (goals: peak RSS <= 0.5x, seconds per step <= 1.0x, adapter <= 2% of the
base) and a ``--json`` summary line. Either run failing is reported as a failure, never hidden.

``--shape tiny`` runs the built-in tiny Qwen3 instead (a quick path, seconds not minutes).

  python benchmarks/lora.py [--steps 4] [--shape tiny|0.6b] [--backend native|hf-v5] [--json]
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
import threading
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _common import finish, logged_at  # noqa: E402

QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                 rope_theta=1000000.0, rms_norm_eps=1e-6)


def make_model(dest: Path) -> Path:
    """A Qwen3-0.6B-shaped snapshot: random bf16 weights, the tiny model's tokenizer files."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trnqwen.fetch.builtin import write_tiny_qwen3

    tiny = write_tiny_qwen3(dest.parent / "tiny")
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_06B, dtype="bfloat16")
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (tiny / name).exists() and not (dest / name).exists():
            shutil.copy(tiny / name, dest / name)
    del model
    return dest


def _rank_pids(root: int) -> list:
    import psutil

    try:
        procs = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    # the ranks, not torchrun's agent (whose command line names the entry module too)
    return [p for p in procs if "trnqwen.runtime.entry" in (line := " ".join(_cmdline(p)))
            and "torch.distributed.run" not in line]


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []


# Runs the measured command as its child and, once it has exited, reports the kernel's peak RSS
# over every descendant it reaped (torchrun waits for its ranks, the CLI for torchrun): the biggest
# single process, in practice the biggest rank.  Linux gives ru_maxrss in KiB.
WRAPPER = (
    "import json, resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "open(sys.argv[1], 'w').write(json.dumps({'rc': rc, 'maxrss_kib': u.ru_maxrss}))\n"
    "sys.exit(rc)\n"
)


def vm_hwm_bytes(pid: int) -> Optional[int]:
    """The kernel's high-water mark of a live process's RSS (``VmHWM`` in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def measured_run(argv: list[str], *, cwd: Path, env: dict) -> dict:
    """Run a train command; the kernel's peak RSS (per rank and over all descendants), seconds per
    step, time after the last step.

    Each rank's ``VmHWM`` is read every 0.2 s while it lives: the kernel keeps the high-water mark,
    so the last read holds the rank's peak unless it rose in the rank's last 0.2 s.
    ``peak_rss_max_mib`` is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in a wrapper process around
    the command: exact, the largest of every process the command ran (ranks, torchrun, the CLI).
    """
    t0 = time.monotonic()
    usage_file = cwd / ".rusage.json"
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, str(usage_file), *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for p in _rank_pids(proc.pid):
                hwm = vm_hwm_bytes(p.pid)
                if hwm is not None:
                    peaks[p.pid] = max(peaks.get(p.pid, 0), hwm)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    from trnqwen.contract.stepline import parse_step_line

    stamps, tail, last_step_at, ready = [], [], None, None
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        text = raw.decode("utf-8", "replace")
        tail = (tail + [text])[-20:]
        if ready is None and "Trainer is initialized" in text:  # model built and sharded; the load comes next
            ready = logged_at(text)
        if parse_step_line(text) is not None:
            last_step_at = time.monotonic()
            at = logged_at(text)
            if at is not None:
                stamps.append(at)
    rc = proc.wait()
    done.set()
    sampler.join()
    wall = time.monotonic() - t0
    try:
        maxrss_kib = json.loads(usage_file.read_text())["maxrss_kib"]
    except (OSError, ValueError, KeyError):
        maxrss_kib = None
    deltas = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "rc": rc,
        "wall_s": round(wall, 2),
        "steps": len(stamps),
        "seconds_per_step": round(statistics.median(deltas), 3) if deltas else None,
        # from the trainer's start (checkpoint load, any pass before step 1, step 1's warm-up) to the last step
        "ready_to_last_step_s": round(stamps[-1] - ready, 2) if stamps and ready is not None else None,
        "after_last_step_s": round(time.monotonic() - last_step_at, 2) if last_step_at else None,
        # the kernel's per-rank high-water marks (VmHWM), and the exact max over every process (ru_maxrss)
        "peak_rss_per_rank_mib": sorted(round(v / 2**20) for v in peaks.values()),
        "peak_rss_max_mib": round(maxrss_kib / 1024) if maxrss_kib else None,
        "output_tail": "".join(tail) if rc else "",
    }


def peak_mib(run: dict) -> Optional[int]:
    """The run's peak RSS for ratios: the biggest rank's VmHWM, else the exact ru_maxrss."""
    return max(run["peak_rss_per_rank_mib"]) if run["peak_rss_per_rank_mib"] else run["peak_rss_max_mib"]


def make_assets(shape: str, work: Path) -> Path:
    """The model snapshot for ``--shape``: ``tiny`` (the built-in tiny Qwen3) or ``0.6b``."""
    if shape == "tiny":
        from trnqwen.fetch.builtin import write_tiny_qwen3

        return write_tiny_qwen3(work / "assets" / "tiny-qwen3")
    return make_model(work / "assets" / "qwen3-0.6b-shaped")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--backend", default="native", choices=["native", "hf-v5"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--shape", default="0.6b", choices=["tiny", "0.6b"],
                    help="tiny = the built-in tiny Qwen3 (a quick path); 0.6b = Qwen3-0.6B-shaped (the default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="trnqwen-bench-lora-"))
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["XDG_CACHE_HOME"] = str(work / "cache")
        t = time.monotonic()
        assets = make_assets(args.shape, work)
        made = time.monotonic() - t
        from trnqwen.fetch.builtin import chat_path

        base_argv = [sys.executable, "-m", "trnqwen", "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets),
                     "--backend", args.backend, "--device", "cpu", "--nproc-per-node", "2", "--steps", str(args.steps),
                     "--seq-len", str(args.seq_len), "--finetune", "--dataset", str(chat_path()), "--lr", "1e-4",
                     "--show-log"]  # rank 0's step lines, stamped inside the rank
        runs = {}
        for label, extra in (("full", []), ("lora", ["--lora", "--lora-rank", "16"])):
            cwd = work / label
            cwd.mkdir()
            runs[label] = measured_run([*base_argv, "--checkpoint-dir", str(cwd / "ckpt"), *extra], cwd=cwd, env=env)
            print(f"{label:5s} rc={runs[label]['rc']} {runs[label]['seconds_per_step']} s/step, peak RSS/rank "
                  f"{runs[label]['peak_rss_per_rank_mib']} MiB (max over all processes {runs[label]['peak_rss_max_mib']} MiB), export {runs[label]['after_last_step_s']} s", flush=True)
            if runs[label]["rc"] != 0:
                print(runs[label]["output_tail"], file=sys.stderr)
        failed = [k for k, v in runs.items() if v["rc"] != 0]
        adapter = work / "lora" / "ckpt" / "hf" / f"step-{args.steps}"
        merge = None
        if not failed:
            t = time.monotonic()
            m = subprocess.run([sys.executable, "-m", "trnqwen", "merge", str(adapter), "--base", str(assets), "--json"],
                               env=env, capture_output=True, text=True)
            merge = {"rc": m.returncode, "seconds": round(time.monotonic() - t, 2)}
            if m.returncode:
                failed.append("merge")
                print(m.stderr[-2000:], file=sys.stderr)
        base_bytes = sum(p.stat().st_size for p in assets.glob("*.safetensors"))
        adapter_bytes = (adapter / "adapter_model.safetensors").stat().st_size if adapter.exists() else None
        summary = {
            "benchmark": "lora", "backend": args.backend, "steps": args.steps, "seq_len": args.seq_len,
            "shape": args.shape,
            "model": "Qwen3-0.6B-shaped, random bf16" if args.shape == "0.6b" else "tiny-qwen3 (built-in)", "model_build_s": round(made, 1), "runs": runs, "merge": merge,
            "base_bytes": base_bytes, "adapter_bytes": adapter_bytes, "failed": failed,
        }
        if not failed:
            full, lo = runs["full"], runs["lora"]
            summary["ratios"] = {
                "peak_rss": round(peak_mib(lo) / peak_mib(full), 3),  # the kernel's figures (VmHWM of the biggest rank)
                "seconds_per_step": round(lo["seconds_per_step"] / full["seconds_per_step"], 3),
                "adapter_vs_base": round(adapter_bytes / base_bytes, 4),
            }
            print("ratios LoRA / full: " + ", ".join(f"{k} {v}" for k, v in summary["ratios"].items()))
        return finish(summary, load_before=load_before, json_out=args.json, failed=failed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
