"""The fine-tune's last line: validation loss before (the base model) and after (the export);
for a run of a method that trains on preference pairs, held-out preference accuracy and margin
before and after, and the loss on the chosen answers (:func:`trnqwen.evaluate.report.preference_line`);
for a GRPO run, the held-out prompts' mean reward and pass@1 before and after.

``trnqwen train --finetune`` calls :func:`validation_before_after` when the run has a validation
split.  It runs ``trnqwen eval <run dir> --json`` in a child process, because the launcher never
imports torch or claims a Neuron device itself (and a quickstart runs several trainings from one
process).  The child writes ``eval.json`` into the run dir like any eval does.  A failed eval is
reported, never turned into a failed training.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from trnqwen.methods import registry as methods

EVAL_TIMEOUT_S = 3600


def has_validation(run_dir: Path) -> bool:
    """Whether the run trained on a token cache with a ``val`` split."""
    from trnqwen.dataset.cache import has_split
    from trnqwen.errors import TrnqwenError
    from trnqwen.evaluate.data import run_cache
    from trnqwen.evaluate.targets import load_run

    try:
        cache = run_cache(load_run(run_dir))
    except (TrnqwenError, OSError, ValueError):
        return False
    return cache is not None and has_split(cache, "val")


def validation_before_after(
    run_dir: Path, *, device: str = "auto", generate: int = 0, timeout: float = EVAL_TIMEOUT_S,
    threads: Optional[int] = None,
) -> Optional[dict[str, Any]]:
    """``{"before", "after", "tokens", "line", "generations"}`` (or ``{"error", "line"}``); None
    without a validation split.  ``generate``: held-out answers to ask both models for;
    ``threads``: the eval's CPU threads (OMP_NUM_THREADS), torch's default when None.  On
    preference pairs ``before``/``after`` are the chosen-answer losses, and ``preference`` holds
    ``{"pairs", "accuracy_before", "accuracy_after", "margin_before", "margin_after"}`` plus the
    method's own summary fields (its ``eval_report.SUMMARY_FIELDS``: reward accuracy, margin, loss).
    On held-out prompts (GRPO) ``before``/``after`` are None and ``reward`` holds the method's
    ``eval_report.before_after``: ``{"prompts", "reward_before", "reward_after", "pass_before", "pass_after"}``."""
    if not has_validation(run_dir):
        return None
    argv = [sys.executable, "-m", "trnqwen", "eval", str(run_dir), "--json", "--device", device]
    if generate:
        argv += ["--generate", str(generate), "--max-new-tokens", "32"]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "line": f"validation loss before/after: eval timed out after {timeout:.0f}s"}
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[0].removeprefix("Error: ")
        return {"error": why, "line": f"validation loss before/after: not measured ({why}); try `trnqwen eval {run_dir}`"}
    doc = json.loads(proc.stdout)
    results = doc["results"]
    base = next((r for r in results if r["checkpoint"] == "base"), None)
    tuned = [r for r in results if r is not base]
    if base is None or not tuned:
        return None
    after = tuned[-1]
    got = {
        "before": base["loss"],
        "after": after["loss"],
        "tokens": after["tokens"],
        "generations": doc.get("generations", []),
    }
    method = methods.find(doc["method"]) if doc.get("method") else None
    scorer = methods.load(method.eval_report) if method is not None and method.eval_report else None
    if scorer is not None and hasattr(scorer, "before_after"):  # the method's own numbers (held-out prompts' reward)
        got["reward"] = scorer.before_after(base, after)
        got["line"] = got["reward"].pop("line")
        return got
    got["line"] = (f"validation loss before {base['loss']:.4f} -> after {after['loss']:.4f} "
                   f"({after['loss'] - base['loss']:+.4f}) on {after['tokens']:,} held-out tokens")
    if scorer is not None and method.data == "preference":
        from trnqwen.evaluate.report import preference_line

        summary = scorer.SUMMARY_FIELDS
        got["line"] = preference_line(base, after)
        got["preference"] = {
            "pairs": after.get("pairs"),
            "accuracy_before": base.get("preference_accuracy"), "accuracy_after": after.get("preference_accuracy"),
            "margin_before": base.get("margin"), "margin_after": after.get("margin"),
            **{k: after.get(k) for k in summary},
        }
    return got


def held_out_check(run_dir: Path, *, device: str = "auto") -> dict[str, Any]:
    """The quickstart's chat stage: held-out loss must fall; one answer before and after."""
    from trnqwen.errors import CheckFailed

    # The tiny model scores and answers fastest on one thread: two on 2 shared cores tripled its CPU time.
    got = validation_before_after(run_dir, device=device, generate=1, threads=1)
    if got is None or "error" in got:
        raise CheckFailed(got["line"] if got else f"run {run_dir} has no validation split to evaluate")
    if not got["after"] < got["before"]:
        raise CheckFailed(
            f"the chat fine-tune did not lower the held-out loss ({got['before']:.4f} -> {got['after']:.4f})",
            hint=f"trnqwen eval {run_dir} --generate 3",
        )
    return {**got, "line": held_out_line(got, run_dir)}


_WORD = re.compile(r"[^\W\d_]{2,}")  # two letters in a row: something a person reads as a word


def answers_tell_apart(base: str, tuned: str) -> bool:
    """Whether a person could tell the two answers apart: they differ, and one has a word in it
    (``'....'`` against ``'....'``, or against ``',,,,'``, shows nothing)."""
    base, tuned = " ".join(base.split()), " ".join(tuned.split())
    return base != tuned and bool(_WORD.search(base) or _WORD.search(tuned))


def held_out_line(got: dict[str, Any], run_dir: Path) -> str:
    """The chat stage's line: the held-out loss before and after, and one answer of each model
    when they can be told apart (else a word on why none is shown)."""
    line = f"held-out loss {got['before']:.3f} -> {got['after']:.3f}"
    if got.get("generations"):
        g = got["generations"][0]
        answers = list(g["answers"].values())
        base, tuned = answers[0], answers[-1]
        if answers_tell_apart(base, tuned):
            line += f"; {g['prompt']!r}: base {base[:60]!r}, tuned {tuned[:60]!r}"
        else:
            line += (f"; answers not shown: base and tuned write no words yet that tell them apart "
                     f"(`trnqwen eval {run_dir} --generate 3` prints them)")
    return line


def quickstart_chat_settings(workdir: Path) -> dict[str, Any]:
    """RunConfig values of the quickstart's chat stage: the bundled chat set, 10% held out and
    validated at the last step, its token cache inside the quickstart's folder."""
    from trnqwen.fetch.builtin import chat_path

    steps = 12
    return {"steps": steps, "lr": 2e-3, "dataset": str(chat_path()), "val_split": 0.1, "val_every": steps,
            "data_cache_dir": Path(workdir) / "data-cache"}


QUICKSTART_TASK = "trnqwen_calculator"  # offline, in the package: the harness on the quickstart's chat model
QUICKSTART_TASK_LIMIT = 8


def harness_before_after(run_dir: Path, *, device: str = "auto", task: str = QUICKSTART_TASK,
                         limit: int = QUICKSTART_TASK_LIMIT, threads: Optional[int] = 1,
                         timeout: float = EVAL_TIMEOUT_S) -> dict[str, Any]:
    """The quickstart's harness check: ``trnqwen eval RUN --tasks TASK --limit N --json`` in a child
    (as :func:`validation_before_after`), base and tuned.  ``{"task", "limit", "metric", "before",
    "after", "line"}``; ``{"skipped", "line"}`` without lm-evaluation-harness; ``{"error", "line"}``
    when the command failed."""
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        return {"skipped": "lm-evaluation-harness is not installed",
                "line": f"{task}: not run (pip install 'trnqwen[eval]' for lm-evaluation-harness)"}
    argv = [sys.executable, "-m", "trnqwen", "eval", str(run_dir), "--tasks", task, "--limit", str(limit),
            "--json", "--device", device]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "line": f"{task}: eval --tasks timed out after {timeout:.0f}s"}
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("Error: ")
        return {"error": why, "line": f"{task}: eval --tasks failed ({why}); try `trnqwen eval {run_dir} --tasks {task}`"}
    doc = json.loads(proc.stdout)
    scores = {r["label"]: r["scores"][task] for r in doc["results"] if task in r["scores"]}
    base = next((r["scores"][task] for r in doc["results"] if r["is_base"] and task in r["scores"]), None)
    tuned = next((r["scores"][task] for r in doc["results"] if not r["is_base"] and task in r["scores"]), None)
    if base is None or tuned is None:
        return {"error": "no base and tuned scores", "line": f"{task}: eval --tasks gave {sorted(scores)}"}
    return {"task": task, "limit": limit, "metric": tuned["metric"], "before": base["value"], "after": tuned["value"],
            "line": f"{task} {tuned['metric']} {base['value']:.3f} -> {tuned['value']:.3f} on {limit} questions "
                    "(lm-evaluation-harness)"}
