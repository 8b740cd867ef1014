"""Dataset preprocessing: trnqwen's tokenize-and-mask pipeline vs a plain Python loop, same run.

The baseline is what a user writes first: ``for r in records: tok.apply_chat_template(r,
tokenize=True)`` (tokens only, no loss mask).  trnqwen does more (one prefix rendering per
assistant turn, the prefix check, character offsets -> masks, packing into rows) with batched
template rendering and one batched call of the fast tokenizer.  Reported: records/s of both and
``speedup`` = baseline seconds / trnqwen seconds (above 1 = trnqwen is faster), plus the whole
``prepare`` (read JSONL, detect, tokenize, pack, write the cache) for context.

Second comparison, in the same run: the whole ``prepare`` against what a Hugging Face user writes,
``datasets.load_dataset("json").map(apply_chat_template, num_proc=N)`` (tokens only, no mask, no
packing), each in a fresh child process so that its time and peak memory (the resident memory
of the process and its workers together) are its own.

The records come from the bundled chat set's recipe, with new seeds up to ``--records``; the tokenizer is the
built-in tiny model's (built here, offline) unless ``--assets`` points at a real snapshot.

Third (``--sizes-mb 10,40``): memory against the file's size.  For each size a JSONL of new
conversations is written, then prepared in memory (``bounded_memory=False``), in bounded memory
(``bounded_memory=True``: records streamed, documents on disk, rows written block by block;
trnqwen.dataset.bounded) and by ``datasets.map``, each in a fresh process: time, peak resident
memory and its growth over the process's resident memory once its libraries are imported.

Usage:
  .venv/bin/python benchmarks/data_prep.py                      # 20,000 conversations
  .venv/bin/python benchmarks/data_prep.py --sizes-mb 10,40     # memory vs file size (3 ways)
  .venv/bin/python benchmarks/data_prep.py --records 2000 --repeats 1 --json
  .venv/bin/python benchmarks/data_prep.py --assets assets/hf/Qwen3-4B-Instruct-2507
  .venv/bin/python benchmarks/data_prep.py --records 100000 --repeats 1 --num-proc 2   # vs datasets.map
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _records(n: int) -> list[list[dict[str, str]]]:
    """``n`` conversations from the bundled chat recipe, new seeds until there are enough (no
    record repeated: repeats would flatter the piece cache)."""
    from trnqwen.data import chat_recipe

    out: list[list[dict[str, str]]] = []
    seed = chat_recipe.SEED
    while len(out) < n:
        out.extend(chat_recipe.build(seed))
        seed += 1
    return out[:n]


def _baseline(tokenizer, conversations) -> float:
    start = time.perf_counter()
    for messages in conversations:
        tokenizer.apply_chat_template(messages, tokenize=True)
    return time.perf_counter() - start


def _pipeline(tokenizer, examples, seq_len: int) -> float:
    import numpy as np

    from trnqwen.dataset import chat, packing

    start = time.perf_counter()
    texts, spans = chat.render(tokenizer, examples, train_on_inputs=False)
    docs = chat.tokenize(tokenizer, texts, spans)
    fitted = packing.fit_documents(docs, seq_len, "truncate")
    packing.build_rows(docs, fitted, fitted.keep, seq_len=seq_len, packing=True, pad_id=0)
    _ = np  # numpy is part of the measured path
    return time.perf_counter() - start


def _prepare(assets: Path, conversations, seq_len: int, work: Path) -> float:
    from trnqwen.dataset.prepare import DataSettings, prepare

    data = work / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    start = time.perf_counter()
    prepare(DataSettings(dataset=str(data), seq_len=seq_len), assets, work / f"cache-{time.time_ns()}")
    return time.perf_counter() - start


def _rollup(pid: int) -> dict[str, int]:
    """A process's Rss, Pss and Pss_Anon in bytes (/proc/PID/smaps_rollup; Pss counts a page shared
    by n processes, such as a forked worker's copy of its parent, as 1/n in each)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss", "Pss_Anon"):
                out[name] = int(rest.split()[0]) * 1024
    return out


class _PeakMemory:
    """The largest memory of this process and its workers together, sampled every 20 ms (``ru_maxrss``
    would not do: Linux keeps it across the exec that started this process): resident (``rss``: a
    page shared by a forked worker and its parent counted in each), proportional (``pss``: counted
    once) and its anonymous part (``anon``: not file pages, which the kernel can drop or write back:
    a memory-mapped scratch file's pages are in ``pss``, not in ``anon``)."""

    KEYS = {"rss": "Rss", "pss": "Pss", "anon": "Pss_Anon"}

    def __init__(self) -> None:
        import threading

        import psutil

        self.peak = dict.fromkeys(self.KEYS, 0)
        self._stop = threading.Event()
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        total = dict.fromkeys(self.KEYS, 0)
        for proc in [self._me, *self._me.children(recursive=True)]:
            try:
                rollup = _rollup(proc.pid)
            except OSError:
                continue
            for key, name in self.KEYS.items():
                total[key] += rollup.get(name, 0)
        for key in self.KEYS:
            self.peak[key] = max(self.peak[key], total[key])

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self) -> "_PeakMemory":
        self._sample()
        self.start = dict(self.peak)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _child(mode: str, assets: Path, data: Path, seq_len: int, num_proc: int, work: Path, workers) -> None:
    """One measured job in this (fresh) process, its libraries imported first; prints {"seconds",
    "peak": {rss, pss, anon}, "start": {...}} in MB as JSON (start: before the job, its libraries loaded)."""
    import datasets
    from transformers import AutoTokenizer

    import trnqwen.dataset.chat  # noqa: F401  (what prepare imports: loaded before the start is read)
    from trnqwen.dataset.prepare import DataSettings, prepare

    datasets.disable_caching()
    with _PeakMemory() as memory:
        start = time.perf_counter()
        if mode.startswith("prepare"):
            bounded = {"prepare": None, "prepare-in-memory": False, "prepare-bounded": True}[mode]
            prepare(DataSettings(dataset=str(data), seq_len=seq_len), assets, work / f"cache-{time.time_ns()}",
                    bounded_memory=bounded, workers=workers)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(assets), trust_remote_code=False)
            table = datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(work / "hf-cache"))
            table.map(lambda r: dict(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)),
                      remove_columns=table.column_names, num_proc=num_proc if num_proc > 1 else None)
        seconds = time.perf_counter() - start
    mb = {key: round(value / 2**20, 1) for key, value in memory.peak.items()}
    print(json.dumps({"seconds": seconds, "peak": mb, "start": {k: round(v / 2**20, 1) for k, v in memory.start.items()},
                      "peak_mb": mb["rss"], "start_mb": round(memory.start["rss"] / 2**20, 1)}))


def _measure(mode: str, assets: Path, data: Path, seq_len: int, num_proc: int, work: Path, workers=None) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--assets", str(assets), "--data", str(data), "--seq-len",
         str(seq_len), "--num-proc", str(num_proc), "--work", str(work)]
        + (["--workers", str(workers)] if workers is not None else []),
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


SCALING_MODES = ("prepare-in-memory", "prepare-bounded", "datasets-map")


def _write_jsonl(path: Path, megabytes: float) -> int:
    """New conversations (the chat recipe, seed after seed) until the file holds ``megabytes``; the count."""
    from trnqwen.data import chat_recipe

    n, seed, limit = 0, chat_recipe.SEED, megabytes * 2**20
    with path.open("w") as fh:
        while fh.tell() < limit:
            for messages in chat_recipe.build(seed):
                fh.write(json.dumps({"messages": messages}) + "\n")
                n += 1
            seed += 1
    return n


def _scaling(sizes: list[float], modes: list[str], args) -> None:
    with tempfile.TemporaryDirectory(prefix="trnqwen-bench-data-") as tmp:
        work = Path(tmp)
        assets = args.assets
        if assets is None:
            from trnqwen.fetch.builtin import write_tiny_qwen3

            assets = write_tiny_qwen3(work / "tiny-qwen3")
        rows = []
        for size in sizes:
            data = work / f"chats-{size:g}mb.jsonl"
            records = _write_jsonl(data, size)
            started = time.time()
            got = {mode: _measure(mode, assets, data, args.seq_len, args.num_proc, work, args.workers) for mode in modes}
            load = os.getloadavg()
            rows.append({"mb": round(data.stat().st_size / 2**20, 1), "records": records, **got,
                         "minutes": round((time.time() - started) / 60, 1), "load_after": [round(x, 1) for x in load]})
            data.unlink()
            for cache in work.glob("cache-*"):
                import shutil

                shutil.rmtree(cache)
    print("time, then peak memory of the process and its workers: PSS (anonymous part) [resident, pages shared "
          "by a forked worker counted in each]; growth over the start in brackets")
    for row in rows:
        print(f"{row['mb']:7.1f} MB {row['records']:9,} records (load after: {row['load_after']})")
        for m in modes:
            r = row[m]
            grow = {k: r["peak"][k] - r["start"][k] for k in r["peak"]}
            print(f"  {m:>18}: {r['seconds']:8.1f} s  PSS {r['peak']['pss']:6.0f} MB (+{grow['pss']:.0f})"
                  f"  anon {r['peak']['anon']:6.0f} MB (+{grow['anon']:.0f})  [RSS {r['peak']['rss']:6.0f} MB]")
        if "datasets-map" in row and "prepare-bounded" in row:
            print(f"  bounded is x{row['datasets-map']['seconds'] / row['prepare-bounded']['seconds']:.2f} faster than datasets.map")
    if args.json:
        print(json.dumps({"benchmark": "data_prep_scaling", "seq_len": args.seq_len, "num_proc": args.num_proc,
                          "workers": args.workers, "rows": rows}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000, help="conversations to process")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median reported)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--assets", type=Path, help="a model snapshot (default: the built-in tiny model)")
    ap.add_argument("--json", action="store_true", help="also print one JSON summary line")
    ap.add_argument("--num-proc", type=int, default=2, help="datasets.map's worker processes (the comparison)")
    ap.add_argument("--sizes-mb", help="memory vs file size: JSONL sizes in MB, comma-separated (e.g. 10,40)")
    ap.add_argument("--modes", default=",".join(SCALING_MODES), help="with --sizes-mb: which of them to run")
    ap.add_argument("--workers", type=int, help="prepare's worker processes (default: the CPUs)")
    ap.add_argument("--child", choices=("prepare", "prepare-in-memory", "prepare-bounded", "datasets-map"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.assets, args.data, args.seq_len, args.num_proc, args.work, args.workers)
        return
    if args.sizes_mb:
        _scaling([float(x) for x in args.sizes_mb.split(",")], args.modes.split(","), args)
        return

    from trnqwen.dataset import chat
    from trnqwen.dataset.formats import Example

    with tempfile.TemporaryDirectory(prefix="trnqwen-bench-data-") as tmp:
        work = Path(tmp)
        assets = args.assets
        if assets is None:
            from trnqwen.fetch.builtin import write_tiny_qwen3

            assets = write_tiny_qwen3(work / "tiny-qwen3")
        tokenizer = chat.load_tokenizer(assets)
        conversations = _records(args.records)
        examples = [Example(f"record {i}", messages=m) for i, m in enumerate(conversations, start=1)]
        _pipeline(tokenizer, examples[:200], args.seq_len)  # warm-up (template compile, thread pool)
        _baseline(tokenizer, conversations[:200])
        base, ours, whole = [], [], []
        for _ in range(args.repeats):
            base.append(_baseline(tokenizer, conversations))
            ours.append(_pipeline(tokenizer, examples, args.seq_len))
            whole.append(_prepare(assets, conversations, args.seq_len, work))
        data = work / "chats.jsonl"  # what _prepare wrote
        children = {mode: [] for mode in ("prepare", "datasets-map")}
        for _ in range(args.repeats):
            for mode in children:  # interleaved, each in a fresh process
                children[mode].append(_measure(mode, assets, data, args.seq_len, args.num_proc, work))
        data_mb = data.stat().st_size / 2**20
    b, o, w = statistics.median(base), statistics.median(ours), statistics.median(whole)
    child = {mode: {key: statistics.median(run[key] for run in runs) for key in ("seconds", "peak_mb")}
             for mode, runs in children.items()}
    n = args.records
    print(f"records                          {n:,}  (tokenizer: {'tiny model' if args.assets is None else assets})")
    print(f"baseline loop (tokens only)      {b:8.3f} s  {n / b:10,.0f} records/s")
    print(f"trnqwen render+mask+pack         {o:8.3f} s  {n / o:10,.0f} records/s   speedup x{b / o:.2f}")
    print(f"trnqwen prepare (read..write)    {w:8.3f} s  {n / w:10,.0f} records/s")
    p, d = child["prepare"], child["datasets-map"]
    print(f"a {data_mb:,.1f} MB JSONL, each in a fresh process:")
    print(f"  trnqwen prepare                {p['seconds']:8.3f} s  peak {p['peak_mb']:8.1f} MB")
    print(f"  datasets.map(apply_chat_template, num_proc={args.num_proc})"
          f" {d['seconds']:8.3f} s  peak {d['peak_mb']:8.1f} MB   trnqwen x{d['seconds'] / p['seconds']:.2f} faster")
    if args.json:
        print(json.dumps({
            "benchmark": "data_prep",
            "records": n,
            "baseline_s": round(b, 4),
            "trnqwen_s": round(o, 4),
            "prepare_s": round(w, 4),
            "baseline_records_per_s": round(n / b, 1),
            "trnqwen_records_per_s": round(n / o, 1),
            "speedup": round(b / o, 3),
            "ratio": round(o / b, 3),
            "data_mb": round(data_mb, 2),
            "prepare_child_s": round(p["seconds"], 4),
            "prepare_peak_mb": round(p["peak_mb"], 1),
            "datasets_map_s": round(d["seconds"], 4),
            "datasets_map_peak_mb": round(d["peak_mb"], 1),
            "datasets_map_num_proc": args.num_proc,
            "speedup_vs_datasets_map": round(d["seconds"] / p["seconds"], 3),
        }))


if __name__ == "__main__":
    main()
