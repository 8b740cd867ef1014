"""``trnqwen data``: the JSON keys, the human report with the trained spans, reuse, Hub offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import run_subprocess

KEYS = {"format", "records", "kept", "dropped", "truncated", "tokens", "trained_tokens", "sequences",
        "padding_fraction", "val_records", "problems", "sample"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("data-cli") / "tiny-qwen3")


def args(tiny: Path, cache: Path, *extra: str) -> list[str]:
    return ["data", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--data-cache-dir", str(cache), *extra]


def test_json_report_of_the_bundled_chat_set(cli, in_tmp, tiny):
    r = cli(*args(tiny, in_tmp / "cache", "--seq-len", "256", "--val-split", "0.05", "--json"))
    assert r.code == 0, r.text
    report = json.loads(r.out)
    assert KEYS <= set(report)
    assert report["format"] == "messages" and report["records"] == 300 and report["val_records"] == 15
    assert report["kept"] + report["dropped"] == 300
    assert 0 < report["trained_tokens"] < report["tokens"]
    assert 0 <= report["padding_fraction"] < 1 and report["sequences"] > 0
    sample = report["sample"]
    assert all(sample["text"][s:e].endswith("<|im_end|>") for s, e in sample["trained_spans"])
    assert report["reused"] is False and Path(report["cache_dir"]).parent == in_tmp / "cache"
    again = json.loads(cli(*args(tiny, in_tmp / "cache", "--seq-len", "256", "--val-split", "0.05", "--json")).out)
    assert again["reused"] is True and again["cache_dir"] == report["cache_dir"]
    # issue 28 #15: docs/data.md lists every key --json prints, and no other
    from tests.helpers import REPO_ROOT

    text = (REPO_ROOT / "docs" / "data.md").read_text().split("`--json` prints one object with these keys:", 1)[1]
    block = text.split("\n\n", 2)[1].replace("\n  ", " ")  # bullets joined with their continuation lines
    documented = {k for k in re.findall(r"^- (.*)$", block, re.M) for k in re.findall(r"`(\w+)`", k.split(":")[0] if "sample" in k else k)}
    assert documented == set(report), (sorted(set(report) - documented), sorted(documented - set(report)))


def test_human_report_shows_counts_and_marks_trained_text(cli, in_tmp, tiny):
    data = in_tmp / "chat.jsonl"
    data.write_text(json.dumps({"conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "2 plus 2?"}, {"from": "gpt", "value": "4."},
    ]}) + "\n")
    r = cli(*args(tiny, in_tmp / "cache", str(data), "--seq-len", "64", "--no-packing"))
    assert r.code == 0, r.text
    for needle in ("sharegpt", "trained tokens", "one conversation per row", "padding", "written"):
        assert needle in r.out, r.out
    assert "<|im_start|>assistant\n[[4.<|im_end|>]]" in r.out


def test_one_validation_record_is_not_records(cli, in_tmp, tiny):
    """issue 28 #12: "1 records"."""
    data = in_tmp / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i} plus 1?"},
                                                     {"role": "assistant", "content": f"{i + 1}."}]}) + "\n" for i in range(20)))
    r = cli(*args(tiny, in_tmp / "cache", str(data), "--seq-len", "64", "--val-split", "0.05"))
    assert r.code == 0, r.text
    row = next(line for line in r.out.splitlines() if line.lstrip("│ ").startswith("validation"))
    assert "1 record " in row + " " and "1 records" not in r.out, row
    assert r.out.count("[[") == 2  # the legend and the one answer: system/user text is not marked


def test_flags_come_from_config_and_env_too(cli, in_tmp, tiny, monkeypatch):
    monkeypatch.setenv("TRNQWEN_TRAIN_ON_INPUTS", "1")
    (in_tmp / "trnqwen.toml").write_text('seq_len = 128\nlong_conversations = "drop"\n')
    report = json.loads(cli(*args(tiny, in_tmp / "cache", "--json")).out)
    assert report["seq_len"] == 128 and report["truncated"] == 0
    assert report["sample"]["trained_spans"][0][0] > 0  # everything but the very first token
    assert report["sample"]["trained_spans"][-1][1] == len(report["sample"]["text"])


def test_hub_dataset_offline_is_one_clear_line(in_tmp, tiny):
    r = run_subprocess(*args(tiny, in_tmp / "cache", "someorg/not-downloaded"), env={"HF_HUB_OFFLINE": "1"},
                       cwd=in_tmp, timeout=120)
    assert r.code == 2, r.text
    assert "Traceback" not in r.text and "someorg/not-downloaded" in r.err and "offline" in r.err.lower()
