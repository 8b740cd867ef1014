"""DPO against SFT on the same tokens, in one run.

The first N pairs of the bundled preference set; 2 CPU ranks, seq 256, one epoch of the pairs:

  A. ``trnqwen train --finetune`` on the same tokens as SFT: every pair's two conversations
     (prompt + chosen, prompt + rejected) as chat records (a multi-turn prompt's earlier answers
     marked ``"weight": 0``: DPO trains only the final answer), one epoch of its packed rows;
  B. ``trnqwen train --finetune --method dpo`` on the pairs: the reference pass, then one epoch.

Checked, not assumed: the tokens each run trains (labels not IGNORE_INDEX in the token cache that
run read, each run with its own cache root) must be the same count, else the benchmark fails
("same tokens" in ``failed``).

Reported: "reference + training" = the time from the trainer's start (its "Trainer is
initialized" line) to the last step line, stamped inside rank 0, for B against A (the goal: at most
2.2x; both include the checkpoint load and the first step's warm-up, which the reference pass
pays for DPO instead of step 1); seconds per step (median of the step-line stamps); the reference
pass's own seconds (its meta.json); whole-command wall times; the kernel's peak RSS per rank
(lora.measured_run).
Either run failing is reported as a failure, never hidden.

  python benchmarks/dpo.py [--pairs 40] [--shape tiny|0.6b] [--backend native|hf-v5] [--lora] [--json]

Without ``--lora`` both runs are full fine-tunes (``--shape tiny`` is the quick one; the 0.6B
shape's full fine-tune needs ~10 GiB per rank); ``--lora`` runs both with a rank-16 adapter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _common import finish  # noqa: E402
from lora import make_assets, measured_run, peak_mib  # noqa: E402


def trained_tokens(cache_root: Path) -> Optional[int]:
    """The tokens a run trains on (labels not IGNORE_INDEX) in the one token cache under ``cache_root``
    (the run's own); None unless there is exactly one."""
    import numpy as np

    from trnqwen.dataset.cache import IGNORE_INDEX, open_split

    caches = [m.parent for m in cache_root.glob("*/meta.json")]
    if len(caches) != 1:
        return None
    split = open_split(caches[0], "train")
    return int(np.count_nonzero(np.asarray(split.labels) != IGNORE_INDEX))


def write_data(work: Path, pairs: int) -> tuple[Path, Path]:
    """(the first ``pairs`` preference records, the same conversations as SFT chat records)."""
    from trnqwen.dataset.preference import bundled_pairs_path
    from trnqwen.dataset.preference_formats import detect_preference_format, normalise_pairs
    from trnqwen.dataset.sources import resolve_source

    records = resolve_source(str(bundled_pairs_path())).records()[:pairs]
    prefs = work / "pairs.jsonl"
    prefs.write_text("".join(json.dumps(r.data) + "\n" for r in records))
    chats = work / "chats.jsonl"
    with chats.open("w") as fh:
        for pair in normalise_pairs(records, detect_preference_format(records[0])):
            for side in ("chosen", "rejected"):
                messages = [dict(m) for m in pair.conversation(side)]
                # DPO trains only the final answer: a multi-turn prompt's earlier answers are context
                # ("weight": 0), or SFT would train more tokens than DPO
                for m in messages[:-1]:
                    if m.get("role") == "assistant":
                        m["weight"] = 0
                fh.write(json.dumps({"messages": messages}) + "\n")
    return prefs, chats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--shape", default="0.6b", choices=["tiny", "0.6b"])
    ap.add_argument("--backend", default="native", choices=["native", "hf-v5"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lora", action="store_true", help="both runs train a rank-16 LoRA adapter")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="trnqwen-bench-dpo-"))
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["XDG_CACHE_HOME"] = str(work / "cache")
        assets = make_assets(args.shape, work)
        prefs, chats = write_data(work, args.pairs)
        from trnqwen.dataset.prepare import DataSettings, prepare

        scratch = work / "cache" / "trnqwen" / "datasets"
        rows = {"sft": len(prepare(DataSettings(dataset=str(chats), seq_len=args.seq_len), assets, scratch).split("train")),
                "dpo": len(prepare(DataSettings(dataset=str(prefs), seq_len=args.seq_len, method="dpo", data_kind="preference"),
                                   assets, scratch).split("train"))}
        # one epoch of each run's own rows on 2 ranks (SFT packs its conversations densely, DPO keeps
        # each pair's two sides in one row): the same tokens, not the same number of steps
        steps = {label: max(2, math.ceil(n / 2)) for label, n in rows.items()}
        base = [sys.executable, "-m", "trnqwen", "train", "--model", "builtin:tiny-qwen3", "--assets", str(assets),
                "--backend", args.backend, "--device", "cpu", "--nproc-per-node", "2",
                "--seq-len", str(args.seq_len), "--finetune", "--lr", "1e-5", "--no-export-hf", "--show-log",
                *(["--lora", "--lora-rank", "16"] if args.lora else [])]
        runs, trained = {}, {}
        for label, extra in (("sft", ["--dataset", str(chats)]), ("dpo", ["--dataset", str(prefs), "--method", "dpo"])):
            cwd = work / label
            cwd.mkdir()
            # each run its own cache root: the tokens counted below are the ones that run read
            run_env = dict(env, XDG_CACHE_HOME=str(cwd / "cache"))
            runs[label] = measured_run([*base, "--steps", str(steps[label]), "--checkpoint-dir", str(cwd / "ckpt"), *extra],
                                       cwd=cwd, env=run_env)
            trained[label] = trained_tokens(cwd / "cache" / "trnqwen" / "datasets")
            print(f"{label:3s} rc={runs[label]['rc']} {runs[label]['steps']} steps, {runs[label]['seconds_per_step']} s/step, "
                  f"trainer start to last step {runs[label]['ready_to_last_step_s']} s, "
                  f"wall {runs[label]['wall_s']} s, peak RSS/rank {runs[label]['peak_rss_per_rank_mib']} MiB, "
                  f"trained tokens {trained[label]}", flush=True)
            if runs[label]["rc"] != 0:
                print(runs[label]["output_tail"], file=sys.stderr)
        failed = [k for k, v in runs.items() if v["rc"] != 0 or v["steps"] != steps[k]]
        if trained["sft"] is None or trained["sft"] != trained["dpo"]:
            failed.append(f"same tokens (trained tokens: SFT {trained['sft']}, DPO {trained['dpo']})")
            print(f"SFT and DPO do not train the same tokens: SFT {trained['sft']}, DPO {trained['dpo']}", file=sys.stderr)
        metas = list((work / "dpo" / "cache").glob("trnqwen/datasets/*/reference/*/meta.json"))
        reference_s = json.loads(metas[0].read_text())["seconds"] if metas else None
        if reference_s is None and "dpo" not in failed:
            failed.append("dpo (no reference pass recorded)")
        summary = {"benchmark": "dpo", "backend": args.backend, "shape": args.shape, "lora": args.lora,
                   "fine_tune": "lora r16" if args.lora else "full", "pairs": args.pairs, "rows": rows, "steps": steps,
                   "trained_tokens": trained, "same_tokens": trained["sft"] is not None and trained["sft"] == trained["dpo"],
                   "seq_len": args.seq_len, "runs": runs, "reference_pass_s": reference_s, "failed": failed}
        if not failed:
            sft, dpo = runs["sft"], runs["dpo"]
            summary["ratios"] = {
                # an epoch each over the same trained tokens: load, DPO's reference pass, every step
                "reference_plus_training_vs_sft": round(dpo["ready_to_last_step_s"] / sft["ready_to_last_step_s"], 3),
                # a step is 2 rows in both, but DPO's rows hold fewer tokens (one or two pairs, padded)
                "seconds_per_step": round(dpo["seconds_per_step"] / sft["seconds_per_step"], 3),
                # the steps of one epoch at the median step time: the training alone over the same tokens
                "epoch_training_vs_sft": round(dpo["seconds_per_step"] * steps["dpo"] / (sft["seconds_per_step"] * steps["sft"]), 3),
                "wall": round(dpo["wall_s"] / sft["wall_s"], 3),
                "peak_rss": round(peak_mib(dpo) / peak_mib(sft), 3),
            }
            print("ratios DPO / SFT: " + ", ".join(f"{k} {v}" for k, v in summary["ratios"].items())
                  + " (goal: reference_plus_training_vs_sft <= 2.2)")
        return finish(summary, load_before=load_before, json_out=args.json, failed=failed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
