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


def test_table_is_narrow_labels_each_scope_and_shows_the_validation_split(cli, in_tmp, tiny):
    """Issue 28 item 27: the cache key is cut in the table (whole in --json); the record counts
    cover every record, the token counts one split each, and the validation split has its rows."""
    base = args(tiny, in_tmp / "cache", "--seq-len", "256", "--val-split", "0.05")
    report = json.loads(cli(*base, "--json").out)
    key = Path(report["cache_dir"]).name
    assert len(key) == 64 and report["train_records"] + report["val_records"] == report["kept"] == 300
    assert report["val_tokens"] > report["val_trained_tokens"] > 0 and report["val_sequences"] > 0
    r = cli(*base)
    assert r.code == 0, r.text
    table = r.out.split("\nSample")[0]
    assert key not in table and key[:12] + "…" in table
    width = max(len(line) for line in table.splitlines())
    assert width <= 60 + len(str(in_tmp / "cache")), table
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in table.splitlines() if line.count("│") == 3}
    assert rows["records"] == "300 read (all splits)"
    assert rows["kept"] == f"300: {report['train_records']} training, {report['val_records']} validation"
    assert rows["training split"] == f"{report['train_records']} records"
    assert rows["validation split"] == f"{report['val_records']} records"
    # each split's token rows sit under its own heading
    lines = [line.split("│")[1].strip() for line in table.splitlines() if line.count("│") == 3]
    val_at = lines.index("validation split")
    assert lines[lines.index("training split") + 1 : val_at] == ["tokens", "trained tokens", "sequences", "padding"]
    assert lines[val_at + 1 : val_at + 5] == ["tokens", "trained tokens", "sequences", "padding"]
    assert f"{report['val_tokens']:,}" in table.splitlines()[[i for i, line in enumerate(table.splitlines())
                                                              if "validation split" in line][0] + 1]


def test_val_dataset_that_is_the_training_file_warns_and_counts_add_up(cli, in_tmp, tiny):
    """Issue 28 item 6: the same file as --dataset and --val-dataset (or a copy of it)."""
    from trnqwen.dataset.sources import bundled_chat_path

    (in_tmp / "train.jsonl").write_bytes(bundled_chat_path().read_bytes())
    (in_tmp / "copy.jsonl").write_bytes(bundled_chat_path().read_bytes())
    for val in ("train.jsonl", "copy.jsonl"):
        r = cli(*args(tiny, in_tmp / "cache", "train.jsonl", "--seq-len", "256", "--val-dataset", val, "--json"))
        assert r.code == 0, r.text
        report = json.loads(r.out)
        assert report["records"] == 600 and report["kept"] + report["dropped"] == 600
        assert report["train_records"] == 300 and report["val_records"] == 300
        assert any(f"--val-dataset {val} is training data too" in w for w in report["warnings"]), report["warnings"]
    other = in_tmp / "other.jsonl"
    other.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n")
    report = json.loads(cli(*args(tiny, in_tmp / "cache", "train.jsonl", "--seq-len", "256", "--val-dataset", str(other), "--json")).out)
    assert report["warnings"] == [] and report["records"] == 301
    # train says it too, before any rank starts
    r = cli("train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--assets", str(tiny), "--dataset", "train.jsonl",
            "--val-dataset", "train.jsonl", "--seq-len", "256", "--data-cache-dir", str(in_tmp / "cache"), "--dry-run")
    assert "--val-dataset train.jsonl is training data too" in r.text, r.text


def test_a_token_cache_as_dataset_refuses_data_settings_it_was_not_prepared_with(cli, in_tmp, tiny):
    """Issue 28 item 2: --dataset <cache folder> trains on the cache as it is, so every data
    setting that disagrees with it is refused by name (train and data alike), and --val-every's
    hint does not ask for a --val-split that was given."""
    report = json.loads(cli(*args(tiny, in_tmp / "cache", "--seq-len", "256", "--json")).out)
    cache = report["cache_dir"]
    train = ["train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--assets", str(tiny), "--dataset", cache,
             "--seq-len", "256", "--dry-run"]
    r = cli(*train, "--val-split", "0.05", "--no-packing", "--train-on-inputs", "--val-every", "5")
    clean = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert r.code == 2 and len(clean) == 1 and "Traceback" not in r.text, r.text
    for needle in ("is a token cache", "--val-split 0.05 (the cache: 0.0)", "--no-packing (the cache: --packing)",
                   "--train-on-inputs (the cache: --no-train-on-inputs)"):
        assert needle in clean[0], clean[0]
    r = cli(*train, "--long-conversations", "drop", "--dataset-format", "sharegpt")
    assert r.code == 2 and "--long-conversations drop (the cache: truncate)" in r.err and "--dataset-format sharegpt" in r.err
    r = cli(*args(tiny, in_tmp / "cache", cache, "--no-packing"))
    assert r.code == 2 and "--no-packing (the cache: --packing)" in r.err, r.text
    # what agrees with the cache (or is left at its default) is fine
    assert cli(*train, "--dataset-format", "messages").code == 0
    assert cli(*args(tiny, in_tmp / "cache", cache, "--seq-len", "256", "--packing")).code == 0
    # no validation split in the cache: the hint names the original data, not a flag to add
    r = cli(*train, "--val-every", "5")
    assert r.code == 2 and "has none" in r.err and "calculator.jsonl" in r.err and "add --val-split" not in r.err, r.text


def test_a_reused_cache_reports_the_file_named_not_the_one_that_built_it(cli, in_tmp, tiny):
    """Two copies of one file in two folders share one cache entry (the key is the name and the
    bytes, not the folder); --json's source is the file this call named."""
    record = json.dumps({"messages": [{"role": "user", "content": "2 plus 2?"}, {"role": "assistant", "content": "4."}]})
    first, second = in_tmp / "a" / "chat.jsonl", in_tmp / "b" / "chat.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text(record + "\n")
    built = json.loads(cli(*args(tiny, in_tmp / "cache", str(first), "--seq-len", "64", "--json")).out)
    again = json.loads(cli(*args(tiny, in_tmp / "cache", str(second), "--seq-len", "64", "--json")).out)
    assert again["reused"] is True and again["cache_dir"] == built["cache_dir"]
    assert built["source"] == str(first) and again["source"] == str(second)
