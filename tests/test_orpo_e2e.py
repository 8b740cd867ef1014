"""ORPO for real: torchrun, 2 CPU ranks, the bundled preference set, every backend.

One ``trnqwen train --method orpo`` per backend (native, hf-v5, hf-trainer) from the built-in tiny
Qwen3's weights (``--finetune`` from its assets, which this test loads too), shared by the tests:

* step 1's loss is ORPO's formula computed here on the Transformers model's forward over the rows
  step 1 reads (rows 0-3 of the training split: 2 ranks x 2 rows, epoch 0 in cache order), within
  1e-5 on every backend (all train in float32 on a CPU), and every backend's loss is its own logged parts recombined
  (loss = nll - lambda x log_odds_ratio, 1e-5);
* the orpo/* values are in every step record of metrics.jsonl, the status line, ``inspect-logs
  --json`` and ``--csv``, and TensorBoard;
* ``trnqwen eval`` on the run: the held-out preference accuracy (mean log-probs) rises;
* a run preempted at step 3 and resumed logs the uninterrupted run's losses and values (1e-5);
* LoRA ORPO on hf-v5 and hf-trainer starts at the formula (B = 0: the base's forward) and exports
  an adapter.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from tests.helpers import run_subprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # three backends' runs in one fixture

SEQ = 256
STEPS = 16
LAM = 1.0
BACKENDS = ("native", "hf-v5", "hf-trainer")
COMMON = ("--device", "cpu", "--nproc-per-node", "2", "--seq-len", str(SEQ), "--finetune", "--method", "orpo",
          "--orpo-lambda", str(LAM), "--local-batch-size", "2", "--val-split", "0.1", "--json")
TRAIN = (*COMMON, "--steps", str(STEPS), "--lr", "5e-4", "--val-every", str(STEPS))
METRICS = ("nll", "log_odds_ratio", "log_odds", "rewards_chosen", "rewards_rejected", "margin", "accuracy")
# step 1 against the formula on the Transformers model's forward (document-masked packed rows):
# every backend trains in float32 on a CPU, so each is the formula to float32 rounding (measured
# 1e-6 on each; torchtitan's FSDP used to run the forward in bfloat16: 5.6e-5 native, 4.7e-4 hf-v5)
STEP1_TOLERANCE = {"hf-trainer": 1e-5, "native": 1e-5, "hf-v5": 1e-5}


@pytest.fixture(scope="session")
def orpo_runs(tmp_path_factory):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    root = tmp_path_factory.mktemp("orpo")
    assets = write_tiny_qwen3(root / "assets" / "tiny-qwen3")
    env = {"XDG_CACHE_HOME": str(root / "cache")}
    runs = {}
    for backend in BACKENDS:
        cwd = root / backend
        cwd.mkdir()
        tensorboard = ["--tensorboard"] if backend in ("native", "hf-trainer") else []
        r = run_subprocess("train", "--model", "builtin:tiny-qwen3", "--assets", str(assets), "--backend", backend,
                           *TRAIN, *tensorboard, cwd=cwd, env=env, timeout=900)
        runs[backend] = (r, cwd)
    return {"runs": runs, "assets": assets, "root": root, "env": env}


def _run_dir(cwd: Path) -> Path:
    from trnqwen.rundir import last_run_dir

    return last_run_dir(cwd / ".trnqwen" / "runs")


def _steps(cwd: Path) -> dict[int, dict[str, float]]:
    from trnqwen.contract.metrics_stream import latest, read_stream

    return {step: rec.values for step, rec in latest(read_stream(_run_dir(cwd) / "metrics.jsonl"), "step").items()}


def _cache(root: Path) -> Path:
    """The runs' token cache (ORPO's, with its held-out split)."""
    caches = [p for p in (root / "cache" / "trnqwen" / "datasets").iterdir() if (p / "meta.json").is_file()]
    found = [p for p in caches if json.loads((p / "meta.json").read_text()).get("method") == "orpo"
             and "val" in json.loads((p / "meta.json").read_text()).get("pairs_per_row", {})]
    assert len(found) == 1, caches
    return found[0]


def _step_one_formula(assets: Path, cache: Path) -> float:
    """ORPO's step-1 loss computed here: the Transformers model's own forward over rows 0-3 of the
    training split, each answer's mean token log-prob by log_softmax + gather, TRL's formula, the
    mean over the pairs (float64)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trnqwen.dataset.cache import open_split
    from trnqwen.runtime.token_stream import read_row

    split = open_split(cache, "train")
    model = AutoModelForCausalLM.from_pretrained(assets, dtype=torch.float32).eval()
    losses = []
    for row in range(4):  # 2 ranks x local batch 2: step 1 reads stream items 0-3 = rows 0-3 (epoch 0)
        ids, labels, positions = read_row(split, row)
        segments = list(split.extra["segments"][row])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(ids)[None], position_ids=torch.tensor(positions)[None],
                           use_cache=False).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1)
        for slot in range(max(segments) // 2 + 1):
            means = []
            for side in (0, 1):
                at = [i for i, s in enumerate(segments) if s == 2 * slot + side]
                means.append(sum(float(logp[i, int(labels[i])]) for i in at) / len(at) if at else None)
            if None in means:
                continue
            c, r = means
            log_odds = (c - r) - (math.log1p(-math.exp(c)) - math.log1p(-math.exp(r)))
            losses.append(-c + LAM * math.log1p(math.exp(-log_odds)))  # -c - lambda x log sigmoid(log_odds)
    assert losses
    return sum(losses) / len(losses)


@pytest.fixture(scope="session")
def formula(orpo_runs):
    return _step_one_formula(orpo_runs["assets"], _cache(orpo_runs["root"]))


def test_step_one_is_the_formula_on_the_models_own_forward(orpo_runs, formula):
    got = {}
    for backend in BACKENDS:
        r, cwd = orpo_runs["runs"][backend]
        assert r.code == 0, r.text[-4000:]
        steps = _steps(cwd)
        assert sorted(steps) == list(range(1, STEPS + 1))
        got[backend] = first = steps[1]
        assert math.isfinite(first["loss"]) and first["loss"] > 0
        # the loss is its logged parts, recombined (the formula on the backend's own forward)
        assert abs(first["loss"] - (first["orpo/nll"] - LAM * first["orpo/log_odds_ratio"])) < 1e-5, first
        assert "[ORPO] step: 1" in (_run_dir(cwd) / "train.log").read_text()
        assert "reference log-probs" not in (_run_dir(cwd) / "train.log").read_text()  # reference-free
    print({b: v["loss"] for b, v in got.items()}, "formula", formula)
    for backend, tolerance in STEP1_TOLERANCE.items():
        assert abs(got[backend]["loss"] - formula) < tolerance, (backend, got[backend]["loss"], formula)


def test_the_orpo_values_reach_the_stream_status_line_inspect_logs_and_tensorboard(orpo_runs, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trnqwen.contract.metrics_stream import read_stream

    for backend in BACKENDS:
        r, cwd = orpo_runs["runs"][backend]
        run_dir = _run_dir(cwd)
        records = read_stream(run_dir / "metrics.jsonl")
        assert records[0].kind == "header" and records[0].meta.get("method") == "orpo", records[0]
        assert records[0].meta.get("backend") == backend, records[0].meta
        steps = [rec for rec in records if rec.kind == "step"]
        assert len(steps) == STEPS and all({f"orpo/{k}" for k in METRICS} <= set(rec.values) for rec in steps), backend
        vals = [rec for rec in records if rec.kind == "validation" and rec.step == STEPS]
        assert vals and {f"orpo/{k}" for k in METRICS} <= set(vals[-1].values), backend
        status = [ln for ln in r.err.splitlines() if ln.startswith("step ")]
        assert status and all("  nll " in ln and "  margin " in ln for ln in status), r.err[-2000:]
        assert not any("log_odds" in ln or "rewards" in ln for ln in status), status[-1]  # only what ORPO marks

        shown = run_subprocess("inspect-logs", str(run_dir), "--json", "--csv", str(tmp_path / f"{backend}.csv"),
                               cwd=cwd, env=orpo_runs["env"], timeout=300)
        assert shown.code == 0, shown.text[-3000:]
        doc = json.loads(shown.out)
        first = doc["steps"][0]
        for k in METRICS:
            assert abs(first[k] - steps[0].values[f"orpo/{k}"]) < 1e-9, (backend, k, first)
        assert any(f["code"] == "orpo-step1" for f in doc["findings"]), doc["findings"]
        with open(tmp_path / f"{backend}.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == STEPS and all(k in rows[0] for k in METRICS), rows[:1]
        assert abs(float(rows[0]["nll"]) - steps[0].values["orpo/nll"]) < 1e-6

        if backend in ("native", "hf-trainer"):
            tags = set()
            for events in (run_dir / "tb").rglob("events.out.tfevents.*"):
                acc = EventAccumulator(str(events))
                acc.Reload()
                tags.update(acc.Tags()["scalars"])
            for k in METRICS:
                assert any(t.endswith(f"orpo/{k}") for t in tags), (backend, k, sorted(tags))


def test_held_out_preference_accuracy_rises(orpo_runs):
    _r, cwd = orpo_runs["runs"]["hf-trainer"]
    shown = run_subprocess("eval", str(_run_dir(cwd)), "--json", "--device", "cpu", cwd=cwd, env=orpo_runs["env"],
                           timeout=600)
    assert shown.code == 0, shown.text[-3000:]
    doc = json.loads(shown.out)
    assert doc["method"] == "orpo"
    base = next(r for r in doc["results"] if r["checkpoint"] == "base")
    tuned = [r for r in doc["results"] if r is not base][-1]
    print("held-out preference accuracy", base["preference_accuracy"], "->", tuned["preference_accuracy"],
          "margin", base["margin"], "->", tuned["margin"])
    assert tuned["pairs"] == base["pairs"] > 0
    assert tuned["preference_accuracy"] > base["preference_accuracy"], (base, tuned)
    assert tuned["margin"] > base["margin"] and tuned["orpo_loss"] < base["orpo_loss"], (base, tuned)


def test_a_preempted_run_resumes_exactly(orpo_runs):
    _r, reference_cwd = orpo_runs["runs"]["native"]
    cwd = orpo_runs["root"] / "resume"
    cwd.mkdir()
    args = ("train", "--model", "builtin:tiny-qwen3", "--assets", str(orpo_runs["assets"]), "--backend", "native", *TRAIN)
    stopped = run_subprocess(*args, cwd=cwd, env={**orpo_runs["env"], "TRNQWEN_FAULT_PREEMPT_AT_STEP": "3"}, timeout=900)
    assert stopped.code == 138, stopped.text[-3000:]
    changed = run_subprocess("train", "--resume", "--orpo-lambda", "0.5", cwd=cwd, env=orpo_runs["env"], timeout=300)
    assert changed.code == 2 and "orpo_lambda" in changed.text.replace("-", "_") and "Traceback" not in changed.text, changed.text
    resumed = run_subprocess("train", "--resume", "--json", cwd=cwd, env=orpo_runs["env"], timeout=900)
    assert resumed.code == 0, resumed.text[-3000:]
    got, want = _steps(cwd), _steps(reference_cwd)
    worst = 0.0
    for step in range(4, STEPS + 1):
        for name in ("loss", *(f"orpo/{k}" for k in METRICS)):
            worst = max(worst, abs(got[step][name] - want[step][name]))
            assert abs(got[step][name] - want[step][name]) < 1e-5, (step, name, got[step], want[step])
    print("resume: largest difference", worst)


@pytest.mark.parametrize("backend", ("hf-v5", "hf-trainer"))
def test_lora_orpo_starts_at_the_formula_and_exports_an_adapter(orpo_runs, formula, backend):
    """With LoRA every B starts at 0: step 1 is the base's forward, so the same formula."""
    cwd = orpo_runs["root"] / f"lora-{backend}"
    cwd.mkdir()
    r = run_subprocess("train", "--model", "builtin:tiny-qwen3", "--assets", str(orpo_runs["assets"]), "--backend", backend,
                       *COMMON, "--steps", "2", "--lr", "1e-3", "--lora", "--lora-rank", "8", cwd=cwd,
                       env=orpo_runs["env"], timeout=900)
    assert r.code == 0, r.text[-4000:]
    first = _steps(cwd)[1]
    print(backend, "LoRA step 1", first["loss"], "formula", formula)
    assert abs(first["loss"] - formula) < STEP1_TOLERANCE[backend], (first["loss"], formula)
    assert "[LoRA] trainable" in (_run_dir(cwd) / "train.log").read_text()
    exported = Path(json.loads(r.out)["exported"])
    assert (exported / "adapter_config.json").is_file() and not list(exported.glob("model*.safetensors"))
