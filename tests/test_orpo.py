"""ORPO's arithmetic, settings, planning, judge and eval numbers, without torchrun (the e2e runs are
in test_orpo_e2e.py).

* the loss equals an independent computation written here (plain log_softmax/gather per sequence,
  TRL's ORPOTrainer formula) within 1e-6; log(1 - e^x) stays finite and exact near 0;
* the meter's means, margin and accuracy; one label per pair;
* ``orpo_lambda`` is a setting like any other (flag, env var, TOML key, ``config show``) with no
  line in config.py; a new method's settings come from the registry;
* planning refuses what cannot be an ORPO run and plans no reference;
* bad preference records are exit 2 naming FILE line N, as for DPO.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trnqwen.errors import UsageError

LAM = 0.1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("orpo-unit") / "tiny-qwen3")


def reference_orpo(logits, targets, segments, lam: float):
    """TRL's ORPO per pair, computed plainly: per sequence, log_softmax + gather, a mean over each
    answer's targets, then log odds with log1p(-exp(.)) (float64 throughout).  Returns a list of
    (loss, nll, log_odds, ratio, logp_chosen, logp_rejected), in (row, slot) order."""
    import torch

    out = []
    logits = logits.double()
    for b in range(logits.shape[0]):
        logp = torch.log_softmax(logits[b], dim=-1)
        seg = segments[b].tolist()
        for slot in range(max(seg) // 2 + 1):
            sides = []
            for side in (0, 1):
                positions = [i for i, s in enumerate(seg) if s == 2 * slot + side]
                if not positions:
                    break
                sides.append(sum(float(logp[i, int(targets[b, i])]) for i in positions) / len(positions))
            if len(sides) < 2:
                continue
            c, r = sides
            log_odds = (c - r) - (math.log1p(-math.exp(c)) - math.log1p(-math.exp(r)))
            ratio = -math.log1p(math.exp(-log_odds))  # log sigmoid
            out.append((-c - lam * ratio, -c, log_odds, ratio, c, r))
    return out


def _batch(seed: int = 0, vocab: int = 13):
    import torch

    torch.manual_seed(seed)
    segments = torch.tensor([
        [-1, -1, 0, 0, 0, -1, 1, 1, -1, 2, 2, -1, 3, 3, 3, 3],
        [-1, 0, 0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1],  # one pair, one slot unused
    ])
    targets = torch.where(segments >= 0, torch.randint(0, vocab, segments.shape), torch.full_like(segments, -100))
    logits = torch.randn(2, 16, vocab) * 2
    return logits, targets, segments


def test_the_loss_is_trls_formula_on_a_plain_computation():
    import torch

    from trnqwen.methods.orpo.loss import orpo_terms
    from trnqwen.methods.pairs import segment_logps

    logits, targets, segments = _batch()
    sums, counts = segment_logps(logits, targets, segments, 2)
    terms = orpo_terms(sums, counts, lam=LAM)
    want = reference_orpo(logits, targets, segments, LAM)
    assert len(want) == terms.losses.numel() == 3  # the unused slot is not a pair
    got = torch.stack([terms.losses.detach(), terms.nll, terms.log_odds, terms.log_odds_ratio,
                       terms.chosen_rewards / LAM, terms.rejected_rewards / LAM], dim=1).double()
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0), (got, want)
    # exact in float64 from the same sums: the formula itself, not only float32 rounding
    t64 = orpo_terms(sums.double(), counts.double(), lam=LAM)
    assert torch.allclose(t64.losses, torch.tensor([w[0] for w in want], dtype=torch.float64), atol=1e-6, rtol=0)


def test_the_loss_has_a_gradient_through_both_answers():
    import torch

    from trnqwen.methods.orpo.loss import orpo_terms
    from trnqwen.methods.pairs import segment_logps

    logits, targets, segments = _batch(1)
    logits.requires_grad_(True)
    sums, counts = segment_logps(logits, targets, segments, 2)
    orpo_terms(sums, counts, lam=LAM).losses.sum().backward()
    grad = logits.grad.abs().sum(-1)
    assert (grad[segments >= 0] > 0).all() and (grad[segments < 0] == 0).all()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_log1mexp_is_finite_and_exact_at_both_ends(dtype):
    import torch

    from trnqwen.methods.orpo.loss import log1mexp

    xs = [-1e-30, -1e-12, -1e-7, -1e-3, -0.3, -0.69, -0.7, -2.0, -20.0, -80.0]
    got = log1mexp(torch.tensor(xs, dtype=getattr(torch, dtype)))
    assert torch.isfinite(got).all(), got
    for x, g in zip(xs, got.tolist()):
        want = math.log(-math.expm1(x))  # exact in double
        assert abs(g - want) <= 1e-6 * max(1.0, abs(want)), (x, g, want)
    naive = torch.log1p(-torch.exp(torch.tensor([-1e-12], dtype=torch.float32)))
    assert not torch.isfinite(naive).all()  # what the stable form avoids
    # the loss stays finite when an answer is nearly certain (mean log-prob just below 0)
    from trnqwen.methods.orpo.loss import orpo_terms

    sums = torch.tensor([[[-1e-9, -5.0]]], dtype=getattr(torch, dtype))
    counts = torch.ones_like(sums)
    terms = orpo_terms(sums, counts, lam=LAM)
    assert torch.isfinite(terms.losses).all() and torch.isfinite(terms.log_odds).all()


def test_the_meter_gives_means_margin_and_accuracy_over_the_pairs():
    import torch

    from trnqwen.methods.orpo.loss import METRICS, TERMS, orpo_terms
    from trnqwen.methods.pairs import PairMeter

    meter = PairMeter(TERMS)
    a = orpo_terms(torch.tensor([[[-1.0, -3.0], [-2.0, -1.0]]]), torch.ones(1, 2, 2), lam=0.5)
    b = orpo_terms(torch.tensor([[[-4.0, -6.0]]]), torch.tensor([[[2.0, 2.0]]]), lam=0.5)
    meter.add(a)
    meter.add(b)
    values = meter.reduce()
    chosen = torch.tensor([-1.0, -2.0, -2.0])
    rejected = torch.tensor([-3.0, -1.0, -3.0])
    assert values["pairs"] == 3 and set(METRICS) <= set(values)
    assert values["nll"] == pytest.approx(float(-chosen.mean()))
    assert values["rewards_chosen"] == pytest.approx(0.5 * float(chosen.mean()))
    assert values["rewards_rejected"] == pytest.approx(0.5 * float(rejected.mean()))
    assert values["margin"] == pytest.approx(values["rewards_chosen"] - values["rewards_rejected"])
    assert values["accuracy"] == pytest.approx(2 / 3)
    all_losses = torch.cat([a.losses, b.losses])
    assert values["loss"] == pytest.approx(float(all_losses.mean()), abs=1e-6)
    assert values["log_odds_ratio"] == pytest.approx(float(torch.cat([a.log_odds_ratio, b.log_odds_ratio]).mean()), abs=1e-6)
    assert meter.reduce() is None  # reset after each reduction


def test_one_label_marks_each_pair_so_valid_tokens_count_pairs(tiny, tmp_path):
    from trnqwen.dataset.prepare import DataSettings, prepare
    from trnqwen.methods.pairs import pair_markers

    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} plus 1?", "chosen": f"{i + 1}.", "rejected": "0."}) + "\n"
                            for i in range(6)))
    prepared = prepare(DataSettings(dataset=str(data), method="orpo", data_kind="preference", seq_len=128), tiny,
                       tmp_path / "cache")
    from trnqwen.dataset.cache import open_split

    split = open_split(prepared.cache_dir, "train")
    assert split.meta["method"] == "orpo"
    segments = np.stack([np.asarray(split.extra["segments"][r]) for r in range(len(split))])
    pairs = sum(len(set(s[s >= 0] // 2)) for s in segments)
    assert pairs == 6 and int((pair_markers(segments) != -100).sum()) == 6


def test_the_method_is_registered_with_its_metrics_and_a_setting_like_any_other():
    from trnqwen import config
    from trnqwen.config import RunConfig
    from trnqwen.methods import registry

    method = registry.get("orpo")
    assert method.data == "preference" and not method.token_loss
    names = [m.name for m in method.metrics]
    assert names == ["orpo/nll", "orpo/log_odds_ratio", "orpo/log_odds", "orpo/rewards_chosen",
                     "orpo/rewards_rejected", "orpo/margin", "orpo/accuracy"]
    assert all(m.label and m.fmt for m in method.metrics) and any(m.status for m in method.metrics)
    row = config.BY_NAME["orpo_lambda"]
    assert (row.flag, row.env, row.default) == ("--orpo-lambda", "TRNQWEN_ORPO_LAMBDA", 0.1)
    assert RunConfig(method="orpo", orpo_lambda=0.25).orpo_lambda == 0.25
    with pytest.raises(Exception):
        RunConfig(method="orpo", orpo_lambda=0)
    # config.py declares no method setting by hand: every one comes from the registry
    source = Path(config.__file__).read_text()
    assert "orpo" not in source.lower() and "beta:" not in source


def test_env_toml_and_config_show_carry_orpo_lambda(tmp_path, cli, monkeypatch):
    toml = tmp_path / "trnqwen.toml"
    toml.write_text('method = "orpo"\norpo_lambda = 0.3\n')
    monkeypatch.chdir(tmp_path)
    r = cli("config", "show", "--json")
    assert r.code == 0, r.text
    assert "orpo_lambda" in r.out and "0.3" in r.out, r.out[-2000:]
    monkeypatch.setenv("TRNQWEN_ORPO_LAMBDA", "0.4")
    r = cli("config", "show", "--json")
    assert r.code == 0 and "0.4" in r.out and "TRNQWEN_ORPO_LAMBDA" in r.out, r.out[-2000:]
    # the old flat DPO settings still load from a trnqwen.toml
    toml.write_text('method = "dpo"\nbeta = 0.2\ndpo_loss = "ipo"\n')
    monkeypatch.delenv("TRNQWEN_ORPO_LAMBDA")
    r = cli("config", "show", "--json")
    assert r.code == 0 and '"ipo"' in r.out, r.out[-2000:]


def test_planning_refuses_what_cannot_be_an_orpo_run_and_plans_no_reference():
    from types import SimpleNamespace

    from trnqwen.config import RunConfig
    from trnqwen.methods.orpo import plan as orpo

    with pytest.raises(UsageError, match="nki-moe"):
        orpo.check(RunConfig(method="orpo", backend="nki-moe"))
    with pytest.raises(UsageError, match="train-on-inputs"):
        orpo.check(RunConfig(method="orpo", train_on_inputs=True))
    assert orpo.spec_from_config(RunConfig()) is None
    assert orpo.spec_from_config(RunConfig(method="dpo")) is None
    planned = orpo.plan(RunConfig(method="orpo", orpo_lambda=0.2), Path("/nowhere"),
                        SimpleNamespace(cache_dir="/c", meta={"method": "orpo"}), device_type="cpu", dp_degree=2,
                        steps=3, validates=True)
    assert planned.hooks == ["ORPOHook()"] and planned.settings == {"lam": 0.2}
    text = "\n".join(planned.imports + planned.config_lines)
    assert "orpo_loss_config(lam=0.2)" in text and "reference_dir" not in text
    assert text.count("trnqwen.methods.orpo.loss:titan_rows") == 2  # train and validation rows


def test_the_judge_wants_a_finite_positive_step_one_loss():
    from trnqwen.methods.orpo.judge import rules

    first = {"step": 1, "loss": 2.5, "line": 10}
    config = {"method": "orpo", "orpo_lambda": 0.1}
    assert rules({"first_step": first, "start_step": None, "lines": {}, "run_config": config})[0][:2] == ("info", "orpo-step1")
    bad = rules({"first_step": {**first, "loss": float("nan")}, "start_step": None, "lines": {}, "run_config": config})
    assert bad[0][:2] == ("error", "orpo-step1-invalid")
    assert rules({"first_step": first, "start_step": None, "lines": {}, "run_config": {"method": "dpo"}}) == []
    assert rules({"first_step": {**first, "step": 5}, "start_step": 5, "lines": {}, "run_config": config}) == []


def test_eval_numbers_compare_mean_log_probs():
    from trnqwen.methods.orpo.eval_report import numbers
    from trnqwen.methods.pair_scores import PairScores

    # pair 1: summed chosen lower but per-token mean higher (a longer chosen answer)
    scores = PairScores(logps=np.array([[-4.0, -3.0], [-1.0, -2.0], [-6.0, -2.0]]),
                        counts=np.array([[4, 1], [1, 1], [2, 2]]))
    out = numbers(scores, None, {"orpo_lambda": 0.1})
    assert out["pairs"] == 3 and out["preference_accuracy"] == pytest.approx(2 / 3)
    assert out["margin"] == pytest.approx(((-1 + 3) + (-1 + 2) + (-3 + 1)) / 3)
    assert out["orpo_loss"] > 0 and out["log_odds_ratio"] < 0 and out["reward_accuracy"] is None


@pytest.mark.parametrize("bad, words", [
    ({"prompt": "Q?", "chosen": "A."}, "no 'rejected' answer"),
    ({"prompt": "Q?", "chosen": "A.", "rejected": "A."}, "the same answer"),
])
def test_bad_records_exit_2_naming_the_file_and_line(tiny, tmp_path, cli, bad, words):
    data = tmp_path / "prefs.jsonl"
    good = {"prompt": "Q?", "chosen": "A.", "rejected": "B."}
    data.write_text("".join(json.dumps(r) + "\n" for r in (good, bad, good)))
    r = cli("data", str(data), "--method", "orpo", "--assets", str(tiny), "--seq-len", "128",
            "--data-cache-dir", str(tmp_path / "cache"))
    assert r.code == 2, r.text
    assert "Traceback" not in r.text and "prefs.jsonl line 2" in r.err and words in r.err, r.err
    r = cli("train", "--method", "orpo", "--dataset", str(data), "--assets", str(tiny), "--model", "builtin:tiny-qwen3",
            "--device", "cpu", "--seq-len", "128", "--data-cache-dir", str(tmp_path / "cache"), "--dry-run")
    assert r.code == 2, r.text
    assert "Traceback" not in r.text and "prefs.jsonl line 2" in r.text and words in r.text, r.text


def test_records_that_are_not_pairs_get_a_hint_naming_the_runs_method(tiny, tmp_path, cli):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Q?"},
                                             {"role": "assistant", "content": "A."}]}) + "\n")
    r = cli("data", str(data), "--method", "orpo", "--assets", str(tiny), "--seq-len", "128",
            "--data-cache-dir", str(tmp_path / "cache"))
    assert r.code == 2 and "not a preference record" in r.err, r.text
    assert "--method orpo reads prompt/chosen/rejected" in r.err and "dpo" not in r.err, r.err
    r = cli("data", str(data), "--method", "orpo", "--dataset-format", "messages", "--assets", str(tiny),
            "--seq-len", "128", "--data-cache-dir", str(tmp_path / "cache"))
    assert r.code == 2 and "--method orpo reads: prompt-chosen-rejected" in r.err, r.text


def test_evals_table_for_an_orpo_run_says_lambda_and_shows_orpos_numbers(capsys):
    from trnqwen.evaluate.report import EvalReport, EvalResult, render

    numbers = {"pairs": 30, "preference_accuracy": 0.7, "margin": 0.06, "log_odds_ratio": -0.66, "orpo_loss": 6.9,
               "reward_accuracy": None, "reward_margin": None}
    report = EvalReport(dataset="prefs.jsonl", method="orpo", method_settings={"orpo_lambda": 0.5},
                        results=[EvalResult("step-16", 100, 6.2, 492.7, preference=numbers)])
    render(report)
    out = capsys.readouterr().out
    assert "lambda 0.5" in out and "beta" not in out and "rewards against the base" not in out, out
    assert "log odds ratio" in out and "-0.6600" in out and "6.9000" in out and "reward" not in out, out


def test_the_model_card_section_shows_the_held_out_numbers():
    from trnqwen.methods import registry

    card = registry.hook(registry.get("orpo"), "card")
    rows = [{"checkpoint": "base", "pairs": 30, "preference_accuracy": 0.6, "margin": 0.01, "log_odds_ratio": -0.68,
             "orpo_loss": 8.2, "loss": 7.5},
            {"checkpoint": "step-16", "pairs": 30, "preference_accuracy": 0.7, "margin": 0.06, "log_odds_ratio": -0.66,
             "orpo_loss": 6.9, "loss": 6.2, "delta_vs_base": -1.3}]
    lines = card(rows, "prefs.jsonl", lambda x: None if x is None else f"{x:.4f}")
    text = "\n".join(lines)
    assert "ORPO" in text and "| step-16 | 30 | 0.7000 | 0.0600 | -0.6600 | 6.9000 | 6.2000 | -1.3000 |" in text, text
