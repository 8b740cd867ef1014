"""DPO's data, arithmetic and planning, without torchrun (the e2e runs are in test_dpo_e2e.py).

* every accepted record shape normalises to the same pair; each bad record is exit 2 with one
  line naming it (file and line), never a traceback;
* the cache keeps pairs whole (chosen and rejected in one row, never attending to each other),
  trains only the answers, truncates prompts first and counts what it cuts or drops;
* the loss: policy = reference gives ln 2 for every pair; rewards, margin and accuracy;
  one label per pair, so "valid tokens" count pairs;
* planning refuses what cannot be a DPO run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trnqwen.dataset.preference_formats import detect_preference_format, normalise_pairs
from trnqwen.dataset.sources import Record
from trnqwen.errors import UsageError

SYSTEM = {"role": "system", "content": "You are a calculator."}
USER = {"role": "user", "content": "What is 2 plus 3?"}
GOOD = {"role": "assistant", "content": "5."}
BAD = {"role": "assistant", "content": "7."}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("dpo-unit") / "tiny-qwen3")


def _pair(data: dict):
    record = Record(data, "prefs.jsonl line 1")
    return normalise_pairs([record], detect_preference_format(record))[0]


@pytest.mark.parametrize("data", [
    {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]},  # TRL, message lists
    {"prompt": [SYSTEM, USER], "chosen": "5.", "rejected": "7."},  # TRL, string answers
    {"prompt": "What is 2 plus 3?", "chosen": [SYSTEM, USER, GOOD], "rejected": [SYSTEM, USER, BAD]},  # UltraFeedback-binarized
    {"chosen": [SYSTEM, USER, GOOD], "rejected": [SYSTEM, USER, BAD]},  # implicit prompt
    {"messages": [SYSTEM, USER], "chosen": GOOD, "rejected": BAD},  # conversation + replies
    {"conversations": [{"from": "system", "value": SYSTEM["content"]}, {"from": "human", "value": USER["content"]}],
     "chosen": {"from": "gpt", "value": "5."}, "rejected": {"from": "gpt", "value": "7."}},  # sharegpt DPO
])
def test_every_accepted_shape_is_the_same_pair(data):
    pair = _pair(data)
    assert (pair.prompt, pair.chosen, pair.rejected) == ([SYSTEM, USER], [GOOD], [BAD])


def test_a_string_prompt_is_one_user_turn():
    pair = _pair({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go away."})
    assert pair.prompt == [{"role": "user", "content": "Hi?"}]


@pytest.mark.parametrize("data, words", [
    ({"prompt": "Hi?", "chosen": "Hello."}, "no 'rejected' answer"),
    ({"prompt": "Hi?", "chosen": "Hello.", "rejected": None}, "no 'rejected' answer"),
    ({"prompt": "Hi?", "chosen": "   ", "rejected": "Go away."}, "chosen answer is empty"),
    ({"prompt": "Hi?", "chosen": [], "rejected": "Go away."}, "chosen answer is empty"),
    ({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Hello."}, "the same answer"),
    ({"prompt": [SYSTEM], "chosen": "5.", "rejected": "7."}, "no user turn"),
    ({"prompt": [USER, GOOD], "chosen": "5.", "rejected": "7."}, "ends with a assistant turn"),
    ({"chosen": [USER, GOOD], "rejected": [SYSTEM, USER, BAD]}, "different conversations"),
    ({"prompt": "Hi?", "chosen": [{"role": "user", "content": "x"}], "rejected": "y"}, "chosen answer is empty"),
])
def test_a_bad_record_is_named(data, words):
    with pytest.raises(UsageError) as err:
        _pair(data)
    assert "prefs.jsonl line 1" in err.value.message and words in err.value.message, err.value.message


@pytest.mark.parametrize("bad, words", [
    ({"prompt": "Q?", "chosen": "A."}, "no 'rejected' answer"),
    ({"prompt": "Q?", "chosen": "", "rejected": "B."}, "chosen answer is empty"),
    ({"prompt": "Q?", "chosen": "A.", "rejected": "A."}, "the same answer"),
    ({"prompt": [{"role": "system", "content": "S"}], "chosen": "A.", "rejected": "B."}, "no user turn"),
])
def test_the_cli_exits_2_with_one_line_naming_the_record(tiny, tmp_path, cli, bad, words):
    data = tmp_path / "prefs.jsonl"
    good = {"prompt": "Q?", "chosen": "A.", "rejected": "B."}
    data.write_text("".join(json.dumps(r) + "\n" for r in (good, good, bad, good)))
    r = cli("data", str(data), "--method", "dpo", "--assets", str(tiny), "--seq-len", "128",
            "--data-cache-dir", str(tmp_path / "cache"))
    assert r.code == 2, r.text
    assert "Traceback" not in r.text and "prefs.jsonl line 3" in r.err and words in r.err, r.err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "nothing half-written"


def test_preference_data_under_sft_is_refused_with_the_way_out(tiny, tmp_path, cli):
    data = tmp_path / "prefs.jsonl"
    data.write_text(json.dumps({"prompt": "Q?", "chosen": "A.", "rejected": "B."}) + "\n")
    r = cli("data", str(data), "--assets", str(tiny), "--seq-len", "128", "--data-cache-dir", str(tmp_path / "c"))
    assert r.code == 2 and "--method dpo" in r.text and "--method orpo" in r.text, r.text  # every pair method


def _prepare(tiny: Path, tmp_path: Path, records: list[dict], **settings):
    from trnqwen.dataset.prepare import DataSettings, prepare

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    values = {"seq_len": 128, **settings}
    return prepare(DataSettings(dataset=str(data), method="dpo", data_kind="preference", **values), tiny, tmp_path / "cache")


def test_pairs_stay_whole_and_only_the_answers_are_targets(tiny, tmp_path):
    from trnqwen.dataset.chat import load_tokenizer

    records = [{"prompt": [SYSTEM, {"role": "user", "content": f"What is {i} plus 1?"}],
                "chosen": f"{i + 1}.", "rejected": f"{i + 2}."} for i in range(10)]
    prepared = _prepare(tiny, tmp_path, records, seq_len=512)
    split = prepared.split("train")
    segments = split.extra["segments"]
    per_row = split.meta["pairs_per_row"]["train"]
    assert per_row >= 2 and split.meta["method"] == "dpo"  # packed: several whole pairs in a row
    tok = load_tokenizer(tiny)
    pairs = 0
    for row in range(len(split)):
        labels, seg, pos = np.asarray(split.labels[row]), np.asarray(segments[row]), np.asarray(split.positions[row])
        assert np.array_equal(labels != -100, seg >= 0)  # every target belongs to a segment
        present = sorted(set(seg[seg >= 0].tolist()))
        assert present == list(range(len(present))) and len(present) % 2 == 0  # chosen AND rejected of each slot
        pairs += len(present) // 2
        for s in range(0, len(present), 2):
            chosen = tok.decode(labels[seg == s].tolist())
            rejected = tok.decode(labels[seg == s + 1].tolist())
            assert chosen.endswith("<|im_end|>") and rejected.endswith("<|im_end|>")
            assert "What is" not in chosen + rejected  # the prompt is never a target
            # the rejected document starts where positions restart, after the chosen one
            first_rej = int(np.flatnonzero(seg == s + 1)[0])
            assert 0 in pos[int(np.flatnonzero(seg == s)[-1]) + 1 : first_rej + 1]
    assert pairs == 10 == prepared.report["pairs"]
    assert prepared.report["chosen_tokens"] > 0 and prepared.report["prompt_tokens"] > prepared.report["chosen_tokens"]


def test_long_pairs_cut_the_prompt_first_or_are_dropped_and_counted(tiny, tmp_path):
    long_prompt = "Please compute this. " * 40
    records = [{"prompt": long_prompt + "What is 1 plus 1?", "chosen": "2.", "rejected": "3."},
               {"prompt": "Q?", "chosen": "A." * 200, "rejected": "B." * 200},
               {"prompt": "What is 2 plus 2?", "chosen": "4.", "rejected": "5."}]
    cut = _prepare(tiny, tmp_path / "t", records)
    assert cut.report["truncated"] == 1 and cut.report["dropped"] == 1 and cut.report["pairs"] == 2
    assert any("prompts cut" in p and "line 1" in p for p in cut.report["problems"]), cut.report["problems"]
    assert any("answers alone" in p and "line 2" in p for p in cut.report["problems"]), cut.report["problems"]
    dropped = _prepare(tiny, tmp_path / "d", records, long_conversations="drop")
    assert dropped.report["truncated"] == 0 and dropped.report["dropped"] == 2 and dropped.report["pairs"] == 1


def test_policy_equal_to_reference_is_ln2_and_the_metrics_follow():
    import torch

    from trnqwen.methods.dpo.loss import TERMS, pair_terms
    from trnqwen.methods.pairs import PairMeter
    from trnqwen.methods.dpo.plan import initial_loss

    policy = torch.tensor([[[-5.0, -7.0], [-3.0, -3.5]]])
    counts = torch.ones_like(policy) * 2
    same = pair_terms(policy, policy.clone(), counts, beta=0.1, loss_type="sigmoid")
    assert torch.allclose(same.losses, torch.full((2,), math.log(2)))
    assert initial_loss("sigmoid", 0.1) == pytest.approx(0.693147, abs=1e-6)
    assert initial_loss("ipo", 0.1) == pytest.approx(25.0)
    ipo = pair_terms(policy, policy.clone(), counts, beta=0.1, loss_type="ipo")
    assert torch.allclose(ipo.losses, torch.full((2,), 25.0))
    moved = policy + torch.tensor([[[1.0, -1.0], [-1.0, 0.0]]])
    terms = pair_terms(moved, policy, counts, beta=0.5, loss_type="sigmoid")
    assert torch.allclose(terms.chosen_rewards, torch.tensor([0.5, -0.5]))
    assert torch.allclose(terms.rejected_rewards, torch.tensor([-0.5, 0.0]))
    assert torch.allclose(terms.losses, -torch.nn.functional.logsigmoid(torch.tensor([1.0, -0.5])))
    meter = PairMeter(TERMS)
    meter.add(terms)
    values = meter.reduce()
    assert values["accuracy"] == 0.5 and values["pairs"] == 2
    assert values["margin"] == pytest.approx(values["rewards_chosen"] - values["rewards_rejected"])
    absent = pair_terms(moved, policy, torch.tensor([[[2.0, 2.0], [0.0, 0.0]]]), beta=0.5, loss_type="sigmoid")
    assert absent.losses.numel() == 1  # an empty slot is no pair


def test_segment_sums_are_the_tokens_log_probs_and_one_label_marks_each_pair():
    import torch

    from trnqwen.methods.pairs import pair_markers, segment_logps

    torch.manual_seed(0)
    logits = torch.randn(1, 8, 11)
    targets = torch.tensor([[-100, 3, 4, -100, 5, -100, 6, 7]])
    segments = torch.tensor([[-1, 0, 0, -1, 1, -1, 2, 3]])
    sums, counts = segment_logps(logits, targets, segments, 2)
    logp = torch.log_softmax(logits, -1)[0]
    want = [logp[1, 3] + logp[2, 4], logp[4, 5], logp[6, 6], logp[7, 7]]
    assert torch.allclose(sums.reshape(-1), torch.stack(want))
    assert counts.reshape(-1).tolist() == [2, 1, 1, 1]
    markers = pair_markers(segments.numpy())
    assert (markers != -100).sum() == 2 and markers[0, 1] == 0 and markers[0, 6] == 0


def test_planning_refuses_what_cannot_be_a_dpo_run():
    from trnqwen.config import RunConfig
    from trnqwen.methods.dpo import plan as dpo

    with pytest.raises(UsageError, match="nki-moe"):
        dpo.check(RunConfig(method="dpo", backend="nki-moe"))
    with pytest.raises(UsageError, match="train-on-inputs"):
        dpo.check(RunConfig(method="dpo", train_on_inputs=True))
    assert dpo.spec_from_config(RunConfig()) is None
    assert dpo.spec_from_config(RunConfig(method="dpo", beta=0.2, dpo_loss="ipo")).initial_loss == pytest.approx(6.25)


def test_the_reference_key_names_the_weights(tiny, tmp_path):
    import shutil

    from trnqwen.config import RunConfig
    from trnqwen.methods.dpo.plan import reference_key

    cfg = RunConfig(method="dpo", finetune=True)
    key = reference_key(cfg, tiny, device_type="cpu", versions={"torch": "x"})
    assert key == reference_key(cfg, tiny, device_type="cpu", versions={"torch": "x"})
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    shard = next(other.glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))  # same size, other bytes, a new mtime
    assert reference_key(cfg, other, device_type="cpu", versions={"torch": "x"}) != key
    assert reference_key(cfg.model_copy(update={"backend": "native"}), tiny, device_type="cpu", versions={"torch": "x"}) != key


def test_the_bundled_set_is_its_recipe_and_reads_as_pairs():
    from trnqwen.data import preference_recipe
    from trnqwen.dataset.sources import resolve_source

    path = preference_recipe.prefs_path()
    assert path.read_text(encoding="utf-8") == preference_recipe.render()
    records = resolve_source(str(path)).records()
    pairs = normalise_pairs(records, detect_preference_format(records[0]))
    assert len(pairs) == 300 and all(p.chosen != p.rejected for p in pairs)
    shapes = {"prompt-list" if isinstance(r.data["prompt"], list) else "ultrafeedback" for r in records}
    assert shapes == {"prompt-list", "ultrafeedback"}


def test_the_reference_pass_computes_a_prefix_and_a_longer_run_extends_it(tiny, tmp_path):
    """run_pass in one process with a small real model: the rows a run reads, then more, never
    recomputing (or changing) the rows already there, and a resumed run never computing any."""
    import torch

    from trnqwen.dataset import reference as store
    from trnqwen.methods.dpo.reference_pass import run_pass

    records = [{"prompt": f"What is {i} plus 1?", "chosen": f"{i + 1}.", "rejected": f"{i + 3}."} for i in range(12)]
    prepared = _prepare(tiny, tmp_path, records, seq_len=64, packing=False, val_split=0.25, seed=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 16), torch.nn.Linear(16, 4096))
    calls = []

    def forward(ids, positions, markers):
        calls.append(len(ids))
        return model(torch.from_numpy(ids))

    directory = tmp_path / "ref" / "k"
    common = dict(model=model, forward=forward, rank=0, world=1, batch_size=2, resumed_at=0, log=lambda _m: None)
    run_pass(directory, str(prepared.cache_dir), {"train": 4, "val": 3}, **common)
    assert store.computed_rows(directory) == {"train": 4, "val": 3} and sum(calls) == 4 + 4  # val: 3 rows + 1 fill
    first = np.array(store.open_reference(directory, "train"))
    assert np.isfinite(first[:4]).all() and np.isnan(first[4:]).all() and (first[:4] != 0).all()
    calls.clear()
    run_pass(directory, str(prepared.cache_dir), {"train": 8, "val": 3}, **common)
    assert store.computed_rows(directory) == {"train": 8, "val": 3}
    longer = np.array(store.open_reference(directory, "train"))
    assert np.array_equal(longer[:4], first[:4]) and np.isfinite(longer[:8]).all() and sum(calls) == 4
    calls.clear()
    run_pass(directory, str(prepared.cache_dir), {"train": 8, "val": 3}, **common)
    assert calls == []  # reused
    run_pass(directory, str(prepared.cache_dir), {"train": 9}, **common)
    assert store.computed_rows(directory) == {"train": 9, "val": 3}  # val kept though this run does not read it
    with pytest.raises(RuntimeError, match="resumes at step 5"):
        run_pass(directory, str(prepared.cache_dir), {"train": 10}, **{**common, "resumed_at": 5})
