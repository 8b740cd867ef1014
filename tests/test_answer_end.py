"""``--answer-end``: which tokens of a preference answer are trained (issue 34 item 12).

trnqwen's rule trains each answer and the ``<|im_end|>`` closing it; TRL's DPOTrainer also trains
the newline the chat template writes after it (its completion is everything after the prompt).
The same run then differs from TRL's (0.4% at step 2, 38% by step 10).  ``--answer-end trl`` takes
TRL's convention: here the token cache ``trnqwen data`` writes is compared with TRL 1.16's own
DPO tokenization of the same records, token for token and mask for mask.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

SYSTEM = {"role": "system", "content": "You are a calculator."}
RECORDS = [
    {"prompt": "What is 2 plus 3?", "chosen": "5.", "rejected": "7."},
    {"prompt": [SYSTEM, {"role": "user", "content": "2 times 4?"}, {"role": "assistant", "content": "8."},
                {"role": "user", "content": "And plus 1?"}],
     "chosen": [{"role": "assistant", "content": "9."}], "rejected": [{"role": "assistant", "content": "It is 10."}]},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "tiny-qwen3")


def _trl(tiny: Path) -> list[dict]:
    """TRL's own DPO tokenization of RECORDS (DPOTrainer._prepare_dataset: prompt_ids, chosen_ids, rejected_ids)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    conversational = [{k: ([{"role": "user", "content": v}] if k == "prompt" else [{"role": "assistant", "content": v}])
                       if isinstance(v, str) else v for k, v in r.items()} for r in RECORDS]
    args = DPOConfig(output_dir=str(tiny.parent / "trl"), max_length=None, use_cpu=True, bf16=False, report_to=[])
    dataset = DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=tokenizer), Dataset.from_list(conversational),
                                          tokenizer, args, "train")
    return [dict(row) for row in dataset]


def _ours(cli, tiny: Path, tmp_path: Path, answer_end: str) -> list[dict]:
    """Each pair of the cache ``trnqwen data --method dpo`` writes: each side's tokens and its trained tokens."""
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    r = cli("data", str(data), "--method", "dpo", "--assets", str(tiny), "--seq-len", "128", "--no-packing",
            "--answer-end", answer_end, "--data-cache-dir", str(tmp_path / f"cache-{answer_end}"), "--json")
    assert r.code == 0, r.text
    cache = Path(json.loads(r.out)["cache_dir"])
    ids, labels, positions, segments = (np.load(cache / f"train.{name}.npy")
                                        for name in ("input_ids", "labels", "positions", "segments"))
    pairs = []
    for row in range(len(ids)):  # one pair per row: chosen, rejected, padding (positions restart at 0 at each)
        bounds = [*(int(i) for i in np.flatnonzero(positions[row] == 0)), len(ids[row])]
        side = {}
        for k, name in enumerate(("chosen", "rejected")):
            doc = ids[row][bounds[k]:bounds[k + 1]].tolist()
            trained = labels[row][segments[row] == k].tolist()  # the tokens predicted, in order
            side[name] = (doc, trained)
        pairs.append(side)
    return pairs


def test_with_trls_convention_the_trained_tokens_are_trls(cli, tiny, tmp_path):
    trl = _trl(tiny)
    ours = _ours(cli, tiny, tmp_path, "trl")
    assert len(ours) == len(trl) == len(RECORDS)
    for mine, theirs in zip(ours, trl):
        for side in ("chosen", "rejected"):
            doc, trained = mine[side]
            assert doc == theirs["prompt_ids"] + theirs[f"{side}_ids"]  # the same tokens
            assert trained == theirs[f"{side}_ids"]  # and exactly TRL's completion is trained


def test_by_default_the_newline_after_im_end_is_context(cli, tiny, tmp_path):
    from transformers import AutoTokenizer

    newline = AutoTokenizer.from_pretrained(str(tiny)).encode("\n")
    for mine, theirs in zip(_ours(cli, tiny, tmp_path, "im_end"), _trl(tiny)):
        for side in ("chosen", "rejected"):
            doc, trained = mine[side]
            assert doc == theirs["prompt_ids"] + theirs[f"{side}_ids"]
            assert theirs[f"{side}_ids"][-1:] == newline and trained == theirs[f"{side}_ids"][:-1]


def test_the_convention_is_part_of_the_cache_key_only_when_it_changes_the_tokens():
    from trnqwen.dataset.prepare import DataSettings

    default = DataSettings(method="dpo", data_kind="preference")
    assert "answer_end" not in default.key_fields()  # caches made before the setting keep their keys
    assert DataSettings(method="dpo", data_kind="preference", answer_end="trl").key_fields()["answer_end"] == "trl"
    assert "answer_end" not in DataSettings(answer_end="trl").key_fields()  # chat data does not read it
