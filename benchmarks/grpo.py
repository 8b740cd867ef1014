"""GRPO steps: trnqwen's rollout and update against TRL's ``GRPOTrainer`` generating with
transformers, in one run on the same model, prompts, G and lengths.

Each side runs in a child process of its own (so each one's peak RSS is its own: the kernel's
``ru_maxrss`` of that process), on the same snapshot (``--shape small``: a Qwen3-shaped float32
model, hidden 512, 4 layers, the tiny tokenizer; ``tiny``: ``builtin:tiny-qwen3``), the same
``--prompts`` prompts of the bundled sums task every step, ``--generations`` (G) completions each
of at most ``--completion-length`` tokens, temperature 1, the bundled task's reward, dapo loss,
AdamW; one warm-up step, then ``--steps`` measured steps:

  trnqwen: what the hf-trainer backend's GRPO step runs, without the Trainer around it: the
     prompt cache (``trnqwen.methods.grpo.prompt_cache``), :class:`GroupRollout` (the in-process
     generator, rewards, advantages: the rollout both backends share), then the forward,
     :func:`staged_loss`, backward and the optimizer step;
  TRL: ``trl.GRPOTrainer`` (``use_vllm=False``: ``model.generate``), ``train()`` for the same steps.

Per step, on both sides: generation seconds and completion tokens (trnqwen: ``generate_padded``;
TRL: ``_generate_single_turn``, each timed around the call), the rollout (generation + rewards +
advantages: trnqwen's ``GroupRollout.rollout``, TRL's ``_generate_and_score_completions``), the
whole step, and update = step - rollout.  The two sides run alternately ``--repeats`` times (the
order flips each repeat); reported: medians over every measured step, trnqwen / TRL ratios
(rollout tokens/s: goal at least 1.0; step seconds and peak RSS: lower is better), whether the
prompts each side generated from were the same tokens (checked, else the run fails), and the load.

  python benchmarks/grpo.py [--shape small|tiny] [--prompts 2] [--generations 8]
                            [--completion-length 64] [--steps 3] [--repeats 2] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _common import finish  # noqa: E402

SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64)
REWARD = "trnqwen.methods.grpo.task:number"
LR = 1e-6


def make_assets(shape: str, work: Path) -> Path:
    """The snapshot both sides load: the tiny Qwen3, or ``small`` (its tokenizer, a bigger body)."""
    from trnqwen.fetch.builtin import tiny_qwen3_config, write_tiny_qwen3

    tiny = write_tiny_qwen3(work / "tiny-qwen3")
    if shape == "tiny":
        return tiny
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dest = work / "small-qwen3"
    config = {k: v for k, v in tiny_qwen3_config().items() if k not in ("architectures", "torch_dtype", "model_type")}
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{**config, **SMALL, "max_window_layers": SMALL["num_hidden_layers"]}))
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny / name, dest / name)
    return dest


def prompt_records(n: int) -> list[dict]:
    from trnqwen.methods.grpo.prompt_cache import bundled_prompts_path

    lines = bundled_prompts_path().read_text().splitlines()
    return [json.loads(line) for line in lines[:n]]


def _digest(prompts: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(sorted(prompts)).encode()).hexdigest()[:16]


def _peak_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


# --- the two sides, each in its own child process ----------------------------------------------------


def side_trnqwen(args, assets: Path, work: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trnqwen.config import RunConfig
    from trnqwen.dataset.cache import open_split
    from trnqwen.methods.grpo import prompt_cache
    from trnqwen.methods.grpo.plan import hook_settings
    from trnqwen.methods.grpo.rollout import GroupRollout, staged_loss
    from trnqwen.runtime.token_stream import read_row

    prompts_file = work / "prompts.jsonl"
    cfg = RunConfig(method="grpo", backend="hf-trainer", model="builtin:tiny-qwen3", dataset=str(prompts_file),
                    seq_len=args.room + args.completion_length, max_completion_length=args.completion_length,
                    num_generations=args.generations, temperature=1.0, loss_type="dapo", seed=0)
    data = prompt_cache.prepare(cfg, assets, cache_root=work / "trnqwen-cache")
    settings = hook_settings(cfg, assets, data, [REWARD])
    model = AutoModelForCausalLM.from_pretrained(assets, dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    group = GroupRollout(settings, model=model, kind="hf")
    split = open_split(data.cache_dir, "train")
    rows = list(range(len(split)))
    ids = torch.stack([torch.from_numpy(read_row(split, r)[0]) for r in rows])
    mask = torch.from_numpy(split.extra["prompt_mask"][rows].astype("int64"))
    prompts = [ids[i, : int(n)].tolist() for i, n in enumerate(mask.sum(-1))]

    gen, paths = [], set()
    original = group.generator.generate_padded

    def timed(*a, **kw):
        out = original(*a, **kw)
        gen.append((out.seconds, int(out.completion_mask.sum())))
        paths.add(tuple(getattr(out, k, None) for k in ("cache_path", "prefill_head", "threads")))
        return out

    group.generator.generate_padded = timed
    steps = []
    for step in range(1, args.steps + 2):
        began = time.perf_counter()
        [staged] = group.rollout(step, [(ids, mask, torch.tensor(rows))])
        rolled = time.perf_counter()
        group.training_on([staged], rolled - began)
        model.train()
        out = model(input_ids=staged.seq, position_ids=staged.positions(), use_cache=False)
        loss, _sums = staged_loss(out.logits, targets=staged.targets, advantages=staged.advantages,
                                  global_tokens=staged.tokens, micro_batches=1, loss_type="dapo", epsilon=0.2,
                                  epsilon_high=0.2, temperature=1.0, max_completion_length=args.completion_length)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ended = time.perf_counter()
        seconds, tokens = gen.pop()
        steps.append({"gen_s": seconds, "gen_tokens": tokens, "rollout_s": rolled - began, "step_s": ended - began})
    # which generator paths ran (generate.Rollout): a fast path that fell back shows here
    [(cache_path, prefill_head, threads)] = paths
    return {"steps": steps[1:], "prompt_digest": _digest(prompts), "peak_rss_mib": _peak_mib(),
            "torch_threads": torch.get_num_threads(),
            "rollout_paths": {"cache": cache_path, "prefill_head": prefill_head, "threads": threads}}


def side_trl(args, assets: Path, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trnqwen.methods.grpo.task import number

    records = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(assets, trust_remote_code=False)
    g = args.generations
    config = GRPOConfig(output_dir=str(work / "trl-out"), report_to="none", use_cpu=True, bf16=False,
                        per_device_train_batch_size=len(records) * g, num_generations=g,
                        max_completion_length=args.completion_length, temperature=1.0, top_p=1.0, loss_type="dapo",
                        beta=0.0, learning_rate=LR, max_steps=args.steps + 1, logging_steps=1, save_strategy="no",
                        seed=0, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(assets, dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[number], args=config, processing_class=tok,
                          train_dataset=Dataset.from_list(records))
    gen, rollout, prompts = [], [], []
    single, scored = trainer._generate_single_turn, trainer._generate_and_score_completions

    def timed_single(prompt_ids, *a, **kw):
        began = time.perf_counter()
        completion_ids, logprobs = single(prompt_ids, *a, **kw)
        gen.append((time.perf_counter() - began, sum(len(c) for c in completion_ids)))
        prompts.append([list(p) for p in prompt_ids])
        return completion_ids, logprobs

    def timed_scored(*a, **kw):
        began = time.perf_counter()
        out = scored(*a, **kw)
        rollout.append(time.perf_counter() - began)
        return out

    trainer._generate_single_turn, trainer._generate_and_score_completions = timed_single, timed_scored
    steps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.began = time.perf_counter()

        def on_step_end(self, *a, **kw):
            seconds, tokens = gen.pop()
            steps.append({"gen_s": seconds, "gen_tokens": tokens, "rollout_s": rollout.pop(),
                          "step_s": time.perf_counter() - self.began})

    trainer.add_callback(Clock())
    trainer.train()
    # each step generated from the same prompts (one G-group per prompt): one copy of each
    unique = [p for i, p in enumerate(prompts[-1]) if i % g == 0]
    return {"steps": steps[1:], "prompt_digest": _digest(unique), "peak_rss_mib": _peak_mib(),
            "torch_threads": torch.get_num_threads()}


def run_side(side: str, args, assets: Path, work: Path) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--assets", str(assets), "--work", str(work),
            "--room", str(args.room), "--generations", str(args.generations),
            "--completion-length", str(args.completion_length), "--steps", str(args.steps),
            "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"rc": proc.returncode or 1, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1],
                "tail": proc.stderr[-3000:]}
    return {"rc": 0, "wall_s": round(time.monotonic() - t0, 2), **json.loads(lines[-1])}


# --- the parent: both sides, alternately, then medians and ratios ---------------------------------------


def summarise(runs: list[dict]) -> dict:
    steps = [s for run in runs for s in run["steps"]]
    med = {k: statistics.median(s[k] for s in steps) for k in ("gen_s", "rollout_s", "step_s")}
    tok_s = [s["gen_tokens"] / s["gen_s"] for s in steps]
    update = [s["step_s"] - s["rollout_s"] for s in steps]
    return {
        "rollout_tokens_per_s": round(statistics.median(tok_s), 1),
        "completion_tokens_per_step": round(statistics.median(s["gen_tokens"] for s in steps), 1),
        "generate_s": round(med["gen_s"], 4),
        "rollout_s": round(med["rollout_s"], 4),  # generation + rewards + advantages
        "update_s": round(statistics.median(update), 4),
        "step_s": round(med["step_s"], 4),
        "rollout_share_of_step": round(med["rollout_s"] / med["step_s"], 3),
        "measured_steps": len(steps),
        "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        "torch_threads": runs[0]["torch_threads"],
        **({"rollout_paths": runs[0]["rollout_paths"]} if "rollout_paths" in runs[0] else {}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="small", choices=["small", "tiny"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=8, help="G: completions per prompt")
    ap.add_argument("--completion-length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run (after one warm-up step)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating which goes first")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads on both sides (default 1: on a shared CPU more threads wait on busy cores)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny model, 1 repeat, 2 steps, 16 tokens")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--side", choices=["trnqwen", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--assets", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--room", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.threads)
        run = side_trnqwen if args.side == "trnqwen" else side_trl
        print(json.dumps(run(args, args.assets, args.work)))
        return 0
    if args.quick:
        args.shape, args.repeats, args.steps, args.completion_length = "tiny", 1, 2, 16
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="trnqwen-bench-grpo-"))
    try:
        assets = make_assets(args.shape, work)
        records = prompt_records(args.prompts)
        (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(assets, trust_remote_code=False)
        rendered = [tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True) for r in records]
        longest = max(len(x["input_ids"] if hasattr(x, "keys") else x) for x in rendered)
        args.room = longest  # trnqwen pads prompts to the room; TRL to the longest prompt: the same here
        runs: dict[str, list] = {"trnqwen": [], "trl": []}
        failed: list[str] = []
        order = []
        for r in range(args.repeats):
            sides = ("trnqwen", "trl") if r % 2 == 0 else ("trl", "trnqwen")
            order.append(" then ".join(sides))
            for side in sides:
                run = run_side(side, args, assets, work)
                if run["rc"] != 0:
                    failed.append(f"{side}: {run['error']}")
                    print(f"{side} failed:\n{run['tail']}", file=sys.stderr)
                    continue
                runs[side].append(run)
                med = summarise([run])
                print(f"repeat {r + 1} {side:7s} rollout {med['rollout_tokens_per_s']} tok/s, step {med['step_s']} s "
                      f"(rollout {med['rollout_s']} s, update {med['update_s']} s), peak RSS {run['peak_rss_mib']} MiB",
                      flush=True)
        digests = {run["prompt_digest"] for side in runs.values() for run in side}
        if len(digests) > 1:
            failed.append(f"same prompts (digests {sorted(digests)})")
        summary: dict = {"benchmark": "grpo", "shape": args.shape, "prompts": args.prompts, "generations": args.generations,
                         "completion_length": args.completion_length, "prompt_tokens": longest, "threads": args.threads, "steps": args.steps,
                         "repeats": args.repeats, "order": order, "same_prompts": len(digests) == 1, "failed": failed}
        if not failed:
            ours, trl = summarise(runs["trnqwen"]), summarise(runs["trl"])
            summary.update(trnqwen=ours, trl=trl, ratios={
                "rollout_tokens_per_s_vs_trl": round(ours["rollout_tokens_per_s"] / trl["rollout_tokens_per_s"], 3),
                "step_s_vs_trl": round(ours["step_s"] / trl["step_s"], 3),
                "update_s_vs_trl": round(ours["update_s"] / trl["update_s"], 3),
                "peak_rss_vs_trl": round(ours["peak_rss_mib"] / trl["peak_rss_mib"], 3),
            }, target_rollout_ratio=1.0)
            print("trnqwen / TRL: " + ", ".join(f"{k} {v}" for k, v in summary["ratios"].items())
                  + " (goal: rollout_tokens_per_s_vs_trl >= 1.0)")
        return finish(summary, load_before=load_before, json_out=args.json, failed=failed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
