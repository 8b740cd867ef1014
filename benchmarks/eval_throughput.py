"""Benchmark ``trnqwen eval``'s scoring loop against a plain transformers ``model(**batch)`` loop.

Both score the same packed chat rows (a dataset cache written with trnqwen's own writer: documents
packed into ``--seq-len`` rows, about a third of the tokens trained, labels already shifted) with
the same model, in the same run, each in its own child process so peak memory is its own:

  baseline   for each batch: ``model(input_ids=..., position_ids=...).logits`` then cross-entropy
             over the trained labels (what a user writes by hand with transformers)
  trnqwen    ``trnqwen.evaluate.model.score`` (the loop ``trnqwen eval`` runs)

Two model shapes (``--shape``, default both), random init:

  lm-head    Qwen3's real 151,936-token vocabulary on a small body (``--hidden``, ``--layers``):
             the LM head dominates, as it does in the smallest Qwen3s (where trnqwen's loop gains most)
  qwen3-4b   Qwen3-4B's proportions at a quarter of its width and depth: hidden 640 (2560 / 4),
             9 layers (36 / 4), 8 query and 2 key/value heads of 128 (32 and 8 / 4), FFN 2,432
             (9,728 / 4), and a vocabulary of 9,496 (151,936 / 16, so vocab x hidden against
             layers x hidden^2, the LM head's share of the FLOPs, is Qwen3-4B's: about a tenth)

Both losses must agree (same numbers, different speed).  Goal (issue 15): tokens/s ratio >= 1.0 and
peak memory no more than one model plus one batch, on each shape.

    .venv/bin/python benchmarks/eval_throughput.py [--shape both] [--rows 16] [--repeats 2] [--device cpu] [--json]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "_work" / "eval-throughput"
VOCAB = 151936
# Qwen3-4B (hidden 2560, 36 layers, 32/8 heads of 128, FFN 9728, vocab 151936, tied) at a quarter
# of its width and depth; the vocabulary shrinks by 4 x 4 so the LM head keeps its share of the FLOPs.
QWEN3_4B_QUARTER = {"vocab": VOCAB // 16, "hidden": 640, "layers": 9, "heads": 8, "kv_heads": 2, "head_dim": 128,
                    "ffn": 9728 // 4}
SHAPES = ("lm-head", "qwen3-4b")


def shape_dims(shape: str, hidden: int, layers: int) -> dict:
    """The model dimensions of ``shape`` (``--hidden``/``--layers`` size the lm-head shape's body)."""
    if shape == "qwen3-4b":
        return dict(QWEN3_4B_QUARTER)
    return {"vocab": VOCAB, "hidden": hidden, "layers": layers, "heads": max(1, hidden // 64),
            "kv_heads": max(1, hidden // 128), "head_dim": 64, "ffn": hidden * 3}


def lm_head_share(d: dict) -> float:
    """The LM head's share of a token's forward multiply-adds (attention scores left out)."""
    attn = d["hidden"] * d["head_dim"] * (2 * d["heads"] + 2 * d["kv_heads"])
    body = d["layers"] * (attn + 3 * d["hidden"] * d["ffn"])
    return d["vocab"] * d["hidden"] / (body + d["vocab"] * d["hidden"])


def build(work: Path, *, rows: int, seq_len: int, dims: dict, seed: int = 0) -> tuple[Path, Path]:
    """The model folder and the dataset cache (rebuilt when the shape arguments change)."""
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trnqwen.dataset.cache import SplitArrays, write_cache

    vocab, hidden, layers = dims["vocab"], dims["hidden"], dims["layers"]
    tag = f"v{vocab}-h{hidden}-l{layers}-f{dims['ffn']}-a{dims['heads']}x{dims['head_dim']}-r{rows}-s{seq_len}"
    model_dir, cache_root = work / f"model-{tag}", work / f"cache-{tag}"
    if not (model_dir / "config.json").is_file():
        torch.manual_seed(seed)
        config = Qwen3Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=dims["ffn"], num_hidden_layers=layers,
            num_attention_heads=dims["heads"], num_key_value_heads=dims["kv_heads"], head_dim=dims["head_dim"],
            tie_word_embeddings=True, max_position_embeddings=max(seq_len, 512),
        )
        Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(str(model_dir))
    if not (cache_root / "bench").is_dir():
        rng = np.random.default_rng(seed)
        ids = np.zeros((rows, seq_len), dtype=np.int32)
        labels = np.full((rows, seq_len), -100, dtype=np.int32)
        positions = np.zeros((rows, seq_len), dtype=np.int32)
        documents = padding = 0
        for r in range(rows):
            t = 0
            while t < seq_len:
                length = min(int(rng.integers(40, 300)), seq_len - t)
                answer = int(length * 0.35)
                ids[r, t:t + length] = rng.integers(10, min(30000, vocab), length)
                positions[r, t:t + length] = np.arange(length)
                # labels[i] = ids[i + 1] over the answer, shifted; the last input of a document is untrained
                start = t + length - answer - 1
                labels[r, start:t + length - 1] = ids[r, start + 1:t + length]
                t += length
                documents += 1
        split = SplitArrays(ids, labels, positions, documents, padding)
        write_cache(cache_root, "bench", {"train": split}, seq_len=seq_len, packing=True, pad_id=0, eos_id=None)
    return model_dir, cache_root / "bench"


def child(method: str, model_dir: Path, cache: Path, batch_size: int, device: str) -> dict:
    """One measurement in this process: load, one warm-up batch, then the whole pass timed."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from trnqwen.evaluate import model as m
    from trnqwen.evaluate.data import from_cache

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    data = from_cache(cache, "train", name="bench")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32 if device == "cpu" else torch.bfloat16,
        use_safetensors=True, trust_remote_code=False,
    )
    model.to(device).eval()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def baseline(limit: int | None = None) -> tuple[int, float]:
        tokens, loss_sum = 0, 0.0
        stop = len(data) if limit is None else limit
        with torch.no_grad():
            for start in range(0, stop, batch_size):
                ids, labels, positions = (t.to(device) for t in m._batch(data, start, batch_size))
                # use_cache=False: with a cache transformers ignores the documents in position_ids
                batch = {"input_ids": ids, "position_ids": positions, "use_cache": False}
                logits = model(**batch).logits
                loss_sum += float(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"))
                tokens += int((labels != -100).sum())
        return tokens, loss_sum

    def ours(limit: int | None = None) -> tuple[int, float]:
        subset = data if limit is None else _head(data, limit)
        result = m.score(model, subset, batch_size=batch_size)
        return result.tokens, result.loss_sum

    run = baseline if method == "baseline" else ours
    run(batch_size)  # warm-up: one batch
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    tokens, loss_sum = run()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = (
        torch.cuda.max_memory_allocated() if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    )
    return {
        "method": method,
        "seconds": seconds,
        "tokens_per_s": len(data) * data.seq_len / seconds,
        "trained_tokens": tokens,
        "loss": loss_sum / tokens,
        "peak_bytes": peak,  # CPU: peak RSS growth from model load on; CUDA: peak allocated
        "model_bytes": model_bytes,
        "logits_batch_bytes": batch_size * data.seq_len * model.config.vocab_size * 4,
    }


def _head(data, n: int):
    from dataclasses import replace

    return replace(data, input_ids=data.input_ids[:n], labels=data.labels[:n], positions=data.positions[:n])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256, help="the lm-head shape's hidden size")
    ap.add_argument("--layers", type=int, default=4, help="the lm-head shape's layers")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", action="store_true", help="end with one JSON summary line")
    ap.add_argument("--child", nargs=4, metavar=("METHOD", "MODEL", "CACHE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        method, model_dir, cache, out = args.child
        Path(out).write_text(json.dumps(child(method, Path(model_dir), Path(cache), args.batch_size, args.device)))
        return

    shapes = SHAPES if args.shape == "both" else (args.shape,)
    results = {shape: measure_shape(shape, args) for shape in shapes}
    summary = {
        "benchmark": "eval_throughput",
        "device": args.device,
        "rows": args.rows,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "shapes": results,
        "target_ratio": 1.0,
        "losses_agree": all(r["losses_agree"] for r in results.values()),
        "meets_target": all(r["meets_target"] for r in results.values()),
    }
    if args.json:
        print(json.dumps(summary))


def measure_shape(shape: str, args) -> dict:
    """Both methods on one model shape, alternating, each run in its own process."""
    dims = shape_dims(shape, args.hidden, args.layers)
    model_dir, cache = build(WORK, rows=args.rows, seq_len=args.seq_len, dims=dims)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs: dict[str, list[dict]] = {"baseline": [], "trnqwen": []}
    share = lm_head_share(dims)
    print(f"shape {shape}: vocab {dims['vocab']:,}, hidden {dims['hidden']}, {dims['layers']} layers, "
          f"FFN {dims['ffn']:,}; LM head {100 * share:.0f}% of the forward")
    for _ in range(args.repeats):
        for method in ("baseline", "trnqwen"):  # alternate, so machine noise hits both alike
            out = WORK / f"{method}.json"
            subprocess.run(
                [sys.executable, __file__, "--batch-size", str(args.batch_size), "--device", args.device,
                 "--child", method, str(model_dir), str(cache), str(out)],
                check=True, env=env,
            )
            runs[method].append(json.loads(out.read_text()))
            r = runs[method][-1]
            print(f"  {method:9s} {r['tokens_per_s']:10,.0f} tok/s  loss {r['loss']:.5f}  peak +{r['peak_bytes'] / 2**20:,.0f} MiB")
    base_tps = statistics.median(r["tokens_per_s"] for r in runs["baseline"])
    ours_tps = statistics.median(r["tokens_per_s"] for r in runs["trnqwen"])
    ours, base = runs["trnqwen"][-1], runs["baseline"][-1]
    budget = ours["model_bytes"] + ours["logits_batch_bytes"]
    result = {
        **dims,
        "lm_head_share": round(share, 3),
        "baseline_tokens_per_s": round(base_tps, 1),
        "trnqwen_tokens_per_s": round(ours_tps, 1),
        "ratio": round(ours_tps / base_tps, 3),
        "losses_agree": abs(ours["loss"] - base["loss"]) < 1e-3 * max(1.0, abs(base["loss"])),
        "baseline_peak_mb": round(base["peak_bytes"] / 2**20, 1),
        "trnqwen_peak_mb": round(ours["peak_bytes"] / 2**20, 1),
        "model_plus_batch_mb": round(budget / 2**20, 1),
        "meets_target": ours_tps >= base_tps and ours["peak_bytes"] <= budget,
    }
    print(f"  ratio {result['ratio']} (trnqwen / plain model(**batch)), peak {result['trnqwen_peak_mb']} MiB "
          f"vs model + one batch {result['model_plus_batch_mb']} MiB")
    return result


if __name__ == "__main__":
    main()
