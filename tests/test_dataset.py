"""trnqwen.dataset: formats, labels against independent renderings, packing invariants, the cache.

The labels are checked two independent ways against the tiny model's real ChatML template:
walking the token ids of ``apply_chat_template(tokenize=True)``, and transformers' own
assistant mask from a ``{% generation %}``-marked copy of the template.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from trnqwen.data import chat_recipe
from trnqwen.dataset import chat, packing
from trnqwen.dataset.cache import open_split
from trnqwen.dataset.prepare import REPORT_KEYS, DataSettings, prepare
from trnqwen.dataset.sources import Record, Source, bundled_chat_path, resolve_source
from trnqwen.errors import UsageError

CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
    {"role": "user", "content": "And times 4?"},
    {"role": "assistant", "content": "5 times 4 is 20."},
]
RECORDS = {
    "messages": {"messages": CONVERSATION},
    "sharegpt": {"conversations": [
        {"from": "system", "value": "You add numbers."}, {"from": "human", "value": "What is 2 plus 3?"},
        {"from": "gpt", "value": "2 plus 3 is 5."}, {"from": "human", "value": "And times 4?"},
        {"from": "gpt", "value": "5 times 4 is 20."},
    ]},
    "alpaca": {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    "prompt-completion": {"prompt": "What is 2 plus 3?", "completion": "5."},
    "text": {"text": "Two plus three is five."},
}
EXPECTED_MESSAGES = {
    "messages": CONVERSATION,
    "sharegpt": CONVERSATION,
    "alpaca": [{"role": "user", "content": "Add the numbers.\n\n2 and 3"}, {"role": "assistant", "content": "5"}],
    "prompt-completion": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}],
}
GENERATION_TEMPLATE = (  # the tiny model's ChatML with {% generation %} around each answer + <|im_end|>
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("dataset") / "tiny-qwen3")


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return chat.load_tokenizer(tiny)


def with_template(tiny: Path, dest: Path, template: str) -> Path:
    """A copy of the tiny snapshot's tokenizer files with another chat template."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, dest / name)
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def documents(split) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids, labels, positions) of every real document in a split, padding left out."""
    pad = split.meta["pad_id"]
    out = []
    for ids, labels, pos in zip(split.input_ids, split.labels, split.positions):
        starts = list(np.flatnonzero(pos == 0)) + [len(pos)]
        for a, b in zip(starts, starts[1:]):
            if np.all(ids[a:b] == pad) and np.all(labels[a:b] == -100):
                continue  # the padding "document"
            out.append((np.array(ids[a:b]), np.array(labels[a:b]), np.array(pos[a:b])))
    return out


def run(tmp_path, tiny, **kw):
    settings = DataSettings(**{"seq_len": 512, **kw})
    return prepare(settings, tiny, tmp_path / "cache")


# --- formats -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_each_format_is_detected_and_normalised(tmp_path, tiny, fmt):
    data = write_jsonl(tmp_path / f"{fmt}.jsonl", [RECORDS[fmt]] * 3)
    prepared = run(tmp_path, tiny, dataset=str(data))
    assert prepared.report["format"] == fmt and prepared.report["records"] == 3
    from trnqwen.dataset.formats import normalise

    (example,) = normalise([Record(RECORDS[fmt], "x")], fmt)
    if fmt == "text":
        assert example.text == RECORDS["text"]["text"] and example.messages is None
    else:
        assert example.messages == EXPECTED_MESSAGES[fmt]


def test_forced_format_overrides_detection(tmp_path, tiny):
    # A record with both 'text' and 'messages' is chat by detection, text when forced.
    data = write_jsonl(tmp_path / "both.jsonl", [{"messages": CONVERSATION, "text": "plain words"}])
    assert run(tmp_path, tiny, dataset=str(data)).report["format"] == "messages"
    forced = run(tmp_path, tiny, dataset=str(data), dataset_format="text")
    assert forced.report["format"] == "text"
    assert forced.report["sample"]["text"].startswith("plain words")


def test_sources_folder_json_parquet_and_text(tmp_path, tiny):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "chats"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [RECORDS["messages"]] * 2)
    write_jsonl(folder / "b.jsonl", [RECORDS["messages"]] * 3)
    assert run(tmp_path, tiny, dataset=str(folder)).report["records"] == 5
    (tmp_path / "list.json").write_text(json.dumps([RECORDS["alpaca"]] * 4))
    assert run(tmp_path, tiny, dataset=str(tmp_path / "list.json")).report["records"] == 4
    pq.write_table(pa.Table.from_pylist([RECORDS["messages"]] * 2), tmp_path / "chats.parquet")
    report = run(tmp_path, tiny, dataset=str(tmp_path / "chats.parquet")).report
    assert (report["format"], report["records"]) == ("messages", 2)
    (tmp_path / "doc.txt").write_text("first paragraph\n\nsecond one\n")
    assert run(tmp_path, tiny, dataset=str(tmp_path / "doc.txt")).report["records"] == 2


def test_hub_path_through_datasets_works_offline(tmp_path, tiny):
    # The Hub branch is load_dataset(name, split=...); a local dataset folder exercises it offline.
    folder = tmp_path / "hubish"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [RECORDS["sharegpt"]] * 4)
    source = Source(name="local/hubish", hub_name=str(folder), split="train")
    records = source.records()
    assert len(records) == 4 and records[0].where.endswith("(train) record 1")
    assert resolve_source("someorg/some-dataset", split="test").hub_name == "someorg/some-dataset"


def test_bundled_chat_set_matches_its_recipe_and_is_multi_turn():
    text = bundled_chat_path().read_text(encoding="utf-8")
    assert text == chat_recipe.render()
    rows = [json.loads(line)["messages"] for line in text.splitlines()]
    assert len(rows) >= 200
    assert sum(r[0]["role"] == "system" for r in rows) > len(rows) // 2
    assert sum(sum(m["role"] == "assistant" for m in r) > 1 for r in rows) > 50


# --- labels against independent renderings ------------------------------------------------------


def expected_targets_by_token_walk(tokenizer, ids: list[int]) -> np.ndarray:
    """Trained flags from the token ids alone: after '<|im_start|>' 'assistant' '\\n', up to and
    including the next '<|im_end|>'."""
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    header = tokenizer("assistant\n", add_special_tokens=False)["input_ids"]
    trained = np.zeros(len(ids), dtype=bool)
    i = 0
    while i < len(ids):
        if ids[i] == start and ids[i + 1 : i + 1 + len(header)] == header:
            j = i + 1 + len(header)
            while ids[j] != end:
                trained[j] = True
                j += 1
            trained[j] = True
            i = j
        i += 1
    return trained


def shifted(ids: np.ndarray, trained: np.ndarray) -> np.ndarray:
    labels = np.full(len(ids), -100)
    labels[:-1] = np.where(trained[1:], ids[1:], -100)
    return labels


def test_labels_match_token_walk_of_apply_chat_template(tmp_path, tiny, tokenizer):
    prepared = run(tmp_path, tiny, packing=False)  # the bundled multi-turn set with system prompts
    docs = documents(prepared.split("train"))
    conversations = [json.loads(line)["messages"] for line in bundled_chat_path().read_text().splitlines()]
    assert len(docs) == len(conversations) == prepared.report["kept"]
    for (ids, labels, positions), messages in zip(docs, conversations):
        reference = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert ids.tolist() == reference
        np.testing.assert_array_equal(labels, shifted(ids, expected_targets_by_token_walk(tokenizer, reference)))
        np.testing.assert_array_equal(positions, np.arange(len(ids)))


def test_labels_match_transformers_generation_mask(tmp_path, tiny):
    marked = with_template(tiny, tmp_path / "marked", GENERATION_TEMPLATE)
    tok = chat.load_tokenizer(marked)
    prepared = run(tmp_path, marked, packing=False)
    conversations = [json.loads(line)["messages"] for line in bundled_chat_path().read_text().splitlines()]
    plain = run(tmp_path, tiny, packing=False)
    for (ids, labels, _), (plain_ids, _, _), messages in zip(
        documents(prepared.split("train")), documents(plain.split("train")), conversations
    ):
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert ids.tolist() == out["input_ids"] == plain_ids.tolist()  # same text as the tiny template
        np.testing.assert_array_equal(labels, shifted(ids, np.array(out["assistant_masks"], dtype=bool)))


def test_newline_after_end_of_turn_and_headers_are_not_trained(tmp_path, tiny, tokenizer):
    data = write_jsonl(tmp_path / "one.jsonl", [RECORDS["messages"]])
    prepared = run(tmp_path, tiny, dataset=str(data), packing=False)
    ((ids, labels, _),) = documents(prepared.split("train"))
    targets = [tokenizer.decode([t]) for t in labels if t != -100]
    assert "".join(targets) == "2 plus 3 is 5.<|im_end|>5 times 4 is 20.<|im_end|>"
    sample = prepared.report["sample"]
    assert [sample["text"][s:e] for s, e in sample["trained_spans"]] == [
        "2 plus 3 is 5.<|im_end|>", "5 times 4 is 20.<|im_end|>"
    ]


def test_train_on_inputs_and_text_train_every_token(tmp_path, tiny, tokenizer):
    data = write_jsonl(tmp_path / "one.jsonl", [RECORDS["messages"]])
    ((ids, labels, _),) = documents(run(tmp_path, tiny, dataset=str(data), train_on_inputs=True).split("train"))
    np.testing.assert_array_equal(labels[:-1], ids[1:])
    assert labels[-1] == -100
    text = write_jsonl(tmp_path / "text.jsonl", [RECORDS["text"]])
    ((ids, labels, _),) = documents(run(tmp_path, tiny, dataset=str(text)).split("train"))
    assert tokenizer.decode(ids) == "Two plus three is five.<|endoftext|>"
    np.testing.assert_array_equal(labels[:-1], ids[1:])


# --- thinking templates: the prefix property ------------------------------------------------------

# Like Qwen3's hybrid templates: reasoning is stripped from earlier answers, and the last answer
# after the last user turn gets a (possibly empty) think block.
THINKING_TEMPLATE = (
    "{%- set ns = namespace(last_user=0) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set answer = m.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- set thought = m.content.split('</think>')[0].split('<think>')[-1].strip('\\n') if '</think>' in m.content else '' %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + thought + '\\n</think>\\n\\n' + answer + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + answer + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A template whose header depends on the whole conversation: no prefix is a prefix.
COUNTING_TEMPLATE = (
    "{{- '<|im_start|>system\\nturns: ' + (messages|length|string) + '<|im_end|>\\n' }}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_thinking_template_masks_what_the_full_rendering_shows(tmp_path, tiny):
    snapshot = with_template(tiny, tmp_path / "thinking", THINKING_TEMPLATE)
    record = {"messages": [
        {"role": "user", "content": "2 plus 3?"},
        {"role": "assistant", "content": "<think>add them</think>5."},
        {"role": "user", "content": "times 4?"},
        {"role": "assistant", "content": "20."},
    ]}
    data = write_jsonl(tmp_path / "think.jsonl", [record])
    sample = run(tmp_path, snapshot, dataset=str(data)).report["sample"]
    trained = [sample["text"][s:e] for s, e in sample["trained_spans"]]
    # The earlier answer's reasoning is gone from the full rendering, so it is not trained; the
    # last answer is trained with the think block the template writes for it.
    assert trained == ["5.<|im_end|>", "<think>\n\n</think>\n\n20.<|im_end|>"]


def test_template_that_breaks_the_prefix_property_is_refused_with_the_record(tmp_path, tiny):
    snapshot = with_template(tiny, tmp_path / "counting", COUNTING_TEMPLATE)
    data = write_jsonl(tmp_path / "c.jsonl", [RECORDS["messages"]] * 2)
    with pytest.raises(UsageError, match=r"c\.jsonl line 1: .*assistant turn 1") as err:
        run(tmp_path, snapshot, dataset=str(data))
    assert "--train-on-inputs" in err.value.hint
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # Training on everything needs no answer spans, so the same data is accepted then.
    assert run(tmp_path, snapshot, dataset=str(data), train_on_inputs=True).report["kept"] == 2


# --- packing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pack,strategy", [(True, "best-fit"), (True, "sequential"), (False, "best-fit")])
def test_row_invariants(tmp_path, tiny, pack, strategy):
    seq_len = 256
    prepared = run(tmp_path, tiny, seq_len=seq_len, packing=pack, packing_strategy=strategy)
    split = open_split(prepared.cache_dir, "train")
    pad = split.meta["pad_id"]
    assert split.input_ids.shape == split.labels.shape == split.positions.shape == (len(split), seq_len)
    docs = documents(split)
    assert len(docs) == prepared.report["kept"] == split.stats["documents"]
    assert sum(len(d[0]) for d in docs) == split.stats["tokens"] == prepared.report["tokens"]
    assert int((split.labels != -100).sum()) == prepared.report["trained_tokens"]
    for ids, labels, positions in docs:
        np.testing.assert_array_equal(positions, np.arange(len(ids)))  # one document, never split
        assert labels[-1] == -100  # never predict across documents
        targets = labels[:-1] != -100
        np.testing.assert_array_equal(labels[:-1][targets], ids[1:][targets])
    for ids, labels, positions in zip(split.input_ids, split.labels, split.positions):
        real = sum(len(d[0]) for d in documents(_one(split, ids, labels, positions)))
        assert np.all(ids[real:] == pad) and np.all(labels[real:] == -100)
        np.testing.assert_array_equal(positions[real:], np.arange(seq_len - real))
        if not pack:
            assert np.count_nonzero(positions[:real] == 0) == 1
    padding = split.stats["padding_tokens"] / (len(split) * seq_len)
    assert prepared.report["padding_fraction"] == round(padding, 4)


def _one(split, ids, labels, positions):
    class Row:
        meta = split.meta
        input_ids, labels_, positions_ = ids[None], labels[None], positions[None]

    row = Row()
    row.labels, row.positions = row.labels_, row.positions_
    return row


def test_sequential_packing_uses_fewer_rows_and_keeps_order(tmp_path, tiny):
    packed = run(tmp_path, tiny, seq_len=256, packing_strategy="sequential")
    single = run(tmp_path, tiny, seq_len=256, packing=False)
    assert packed.report["sequences"] < single.report["sequences"] == single.report["kept"]
    assert packed.report["padding_fraction"] < single.report["padding_fraction"]
    a = [d[0].tolist() for d in documents(packed.split())]
    b = [d[0].tolist() for d in documents(single.split())]
    assert a == b


def test_next_fit_rows():
    rows, cols = packing.assign_rows(np.array([3, 4, 2, 5, 1]), 8, True)
    assert rows.tolist() == [0, 0, 1, 1, 1] and cols.tolist() == [0, 3, 0, 2, 7]
    assert packing.assign_rows(np.array([3, 4]), 8, False)[0].tolist() == [0, 1]


def test_long_conversations_truncate_or_drop_are_counted(tmp_path, tiny):
    long = {"messages": [{"role": "user", "content": "Tell me."}, {"role": "assistant", "content": "word " * 300}]}
    late = {"messages": [{"role": "user", "content": "x " * 300}, {"role": "assistant", "content": "ok"}]}
    short = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    data = write_jsonl(tmp_path / "long.jsonl", [short, long, late])
    cut = run(tmp_path, tiny, dataset=str(data), seq_len=64)
    assert (cut.report["kept"], cut.report["truncated"], cut.report["dropped"]) == (2, 1, 1)
    assert cut.report["dropped_reasons"] == {"no trained tokens within 64 tokens": 1}
    assert any("long.jsonl line 3" in p for p in cut.report["problems"])
    dropped = run(tmp_path, tiny, dataset=str(data), seq_len=64, long_conversations="drop")
    assert (dropped.report["kept"], dropped.report["truncated"], dropped.report["dropped"]) == (1, 0, 2)
    assert any("long.jsonl line 2" in p for p in dropped.report["problems"])


# --- cache and validation ---------------------------------------------------------------------------


def test_second_run_reuses_the_cache_without_tokenizing(tmp_path, tiny, monkeypatch):
    first = run(tmp_path, tiny, seq_len=128, val_split=0.1)
    assert not first.reused and set(REPORT_KEYS) <= set(first.report)

    def no_tokenizing(*a, **k):
        raise AssertionError("a reused cache must not tokenize again")

    monkeypatch.setattr(chat, "tokenize", no_tokenizing)
    again = run(tmp_path, tiny, seq_len=128, val_split=0.1)
    assert again.reused and again.cache_dir == first.cache_dir and again.report == first.report
    monkeypatch.undo()
    assert run(tmp_path, tiny, seq_len=128, val_split=0.2).cache_dir != first.cache_dir
    assert run(tmp_path, tiny, seq_len=256, val_split=0.1).cache_dir != first.cache_dir


def test_changed_data_or_template_gives_a_new_key(tmp_path, tiny):
    data = write_jsonl(tmp_path / "d.jsonl", [RECORDS["messages"]])
    first = run(tmp_path, tiny, dataset=str(data))
    write_jsonl(data, [RECORDS["messages"], RECORDS["messages"]])
    assert run(tmp_path, tiny, dataset=str(data)).cache_dir != first.cache_dir
    other = with_template(tiny, tmp_path / "marked", GENERATION_TEMPLATE)
    assert run(tmp_path, other, dataset=str(data)).cache_dir != first.cache_dir


def test_val_split_is_seeded_and_disjoint(tmp_path, tiny, tokenizer):
    a = run(tmp_path, tiny, val_split=0.05, packing=False)
    val = [d[0].tolist() for d in documents(a.split("val"))]
    train = [d[0].tolist() for d in documents(a.split("train"))]
    assert a.report["val_records"] == len(val) == 15 and len(train) == 285
    # Exactly the records a seeded permutation picks, in file order; the rest train, in order.
    conversations = [json.loads(line)["messages"] for line in bundled_chat_path().read_text().splitlines()]
    picked = set(np.random.default_rng(42).permutation(300)[:15].tolist())
    encode = lambda m: tokenizer.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"]  # noqa: E731
    assert val == [encode(m) for i, m in enumerate(conversations) if i in picked]
    assert train == [encode(m) for i, m in enumerate(conversations) if i not in picked]
    shutil.rmtree(tmp_path / "cache")
    b = run(tmp_path, tiny, val_split=0.05, packing=False)
    assert [d[0].tolist() for d in documents(b.split("val"))] == val
    c = run(tmp_path, tiny, val_split=0.05, packing=False, seed=7)
    assert [d[0].tolist() for d in documents(c.split("val"))] != val


def test_val_dataset_becomes_the_val_split(tmp_path, tiny):
    val = write_jsonl(tmp_path / "val.jsonl", [RECORDS["messages"]] * 3)
    prepared = run(tmp_path, tiny, val_dataset=str(val))
    # records counts every record read, from both datasets, so kept + dropped == records holds
    report = prepared.report
    assert report["val_records"] == 3 and report["train_records"] == 300 and report["records"] == 303
    assert report["kept"] + report["dropped"] == report["records"] and report["warnings"] == []
    assert len(documents(prepared.split("val"))) == 3
    assert run(tmp_path, tiny).cache_dir != prepared.cache_dir


# --- encoding: pieces between special tokens, checked against whole-text encoding -------------------


def test_piece_encoding_equals_whole_text_encoding(tokenizer):
    from trnqwen.dataset import encode

    texts = [
        "<|im_start|>user\nCafe\u0301 na\u00efve  spaces\t\ttabs<|im_end|>\n<|im_start|>assistant\n\u0301combining<|im_end|>\n",
        "<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\n12+30?<|im_end|>\n",
        "no special tokens at all, just text  \n\n",
        "<|endoftext|><|im_end|><|im_start|>",
    ] * 3
    backend = tokenizer.backend_tokenizer
    ids, starts, lengths = encode._by_pieces(tokenizer, backend, texts)
    assert ids is not None  # the piece path was taken for the tiny (Qwen-style) tokenizer
    whole_ids, whole_starts, whole_lengths = encode._whole(backend, texts)
    np.testing.assert_array_equal(ids, whole_ids)
    np.testing.assert_array_equal(starts, whole_starts)
    np.testing.assert_array_equal(lengths, whole_lengths)


def test_ascii_pieces_starts_from_byte_lengths_are_rusts_offsets(tokenizer, monkeypatch):
    """ASCII pieces skip Rust's offsets (encode_batch_fast): their starts, counted in bytes, are
    the offsets encode_batch gives; a wrong count is caught by the sample and the chunk redone."""
    import random

    from trnqwen.dataset import encode

    rng = random.Random(0)
    alphabet = "ab xyz  \n\t\r0123456789.,;:!?'\"()[]{}-_=+*/\\<>|~`@#$%^&"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(200)]
    texts = [f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n{t[::-1]}<|im_end|>\n" for t in texts]
    texts += ["caf\u00e9 \u4e2d\u6587 mixed with ascii<|im_end|>", "emoji \U0001f600 x<|im_end|>"]
    backend = tokenizer.backend_tokenizer
    assert encode._byte_lengths(backend) is not None  # the tiny tokenizer is byte-level BPE
    whole = encode._whole(backend, texts)
    monkeypatch.setattr(encode, "STARTS", encode.StartCounts())
    fast = encode._by_pieces(tokenizer, backend, texts)
    assert (encode.STARTS.counted, encode.STARTS.redone) == (1, 0)  # the byte-counted path ran
    monkeypatch.setattr(encode, "_FAST", False)
    slow = encode._by_pieces(tokenizer, backend, texts)
    for got in (fast, slow):
        for a, b in zip(got, whole):
            np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(encode, "_FAST", True)
    wrong = encode._byte_lengths(backend) + 1  # every start off: the sampled documents disagree
    monkeypatch.setitem(encode._BYTE_LENGTHS, id(backend), (backend, wrong))
    for a, b in zip(encode._by_pieces(tokenizer, backend, texts), whole):
        np.testing.assert_array_equal(a, b)
    assert (encode.STARTS.counted, encode.STARTS.redone) == (1, 1)  # caught, counted, redone


def test_byte_counted_starts_only_for_tokenizers_that_keep_every_byte(tokenizer):
    """Refused from the tokenizer's description: anything that adds, drops or trims characters, or a
    vocabulary string that is not one character a byte."""
    import copy

    from trnqwen.dataset import encode

    backend = tokenizer.backend_tokenizer
    config, vocab = json.loads(backend.to_str()), backend.get_vocab(with_added_tokens=False)
    assert encode._counts_bytes(config, vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    changes = [
        ("model", lambda c: c["model"].update(byte_fallback=True)),
        ("model", lambda c: c["model"].update(continuing_subword_prefix="##")),
        ("normalizer", lambda c: c.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})),
        ("prefix space", lambda c: c["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True)),
        ("dropped", lambda c: c["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed")),
        ("whitespace", lambda c: c["pre_tokenizer"]["pretokenizers"].append({"type": "WhitespaceSplit"})),
        ("trimmed", lambda c: c.update(post_processor={"type": "Sequence", "processors": [
            {**byte_level, "trim_offsets": True}]})),
    ]
    for what, change in changes:
        changed = copy.deepcopy(config)
        change(changed)
        assert not encode._counts_bytes(changed, vocab), what
    assert encode._counts_bytes({**config, "post_processor": byte_level}, vocab)  # Qwen's own tokenizer.json
    assert not encode._counts_bytes(config, {**vocab, "\u2581word": len(vocab)})  # a sentencepiece-style string


def test_added_tokens_that_strip_spaces_fall_back_to_whole_text(tmp_path, tiny):
    snapshot = with_template(tiny, tmp_path / "lstrip", json.loads((tiny / "tokenizer_config.json").read_text())["chat_template"])
    cfg = json.loads((snapshot / "tokenizer_config.json").read_text())
    for token in cfg["added_tokens_decoder"].values():
        token["lstrip"] = True
    (snapshot / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = chat.load_tokenizer(snapshot)
    from trnqwen.dataset import encode

    assert encode._by_pieces(tok, tok.backend_tokenizer, ["a <|im_end|>"])[0] is None
    docs = encode.tokenize(tok, ["a <|im_end|>", "b"], [[(0, 1)], [(0, 1)]])
    assert docs.ids.tolist() == tok("a <|im_end|>", add_special_tokens=False)["input_ids"] + tok("b")["input_ids"]


def test_template_from_chat_template_jinja_and_missing_template(tmp_path, tiny):
    snapshot = tmp_path / "jinja"
    snapshot.mkdir()
    shutil.copy(tiny / "tokenizer.json", snapshot / "tokenizer.json")
    cfg = json.loads((tiny / "tokenizer_config.json").read_text())
    template = cfg.pop("chat_template")
    (snapshot / "tokenizer_config.json").write_text(json.dumps(cfg))
    data = write_jsonl(tmp_path / "d.jsonl", [RECORDS["messages"]])
    with pytest.raises(UsageError, match="no chat template"):
        run(tmp_path, snapshot, dataset=str(data))
    (snapshot / "chat_template.jinja").write_text(template)
    from_jinja = run(tmp_path, snapshot, dataset=str(data))
    assert from_jinja.report["sample"] == run(tmp_path, tiny, dataset=str(data)).report["sample"]
    changed = template.replace("'\\n' }}{%- endfor", "'\\n\\n' }}{%- endfor")
    assert changed != template
    (snapshot / "chat_template.jinja").write_text(changed)
    assert run(tmp_path, snapshot, dataset=str(data)).cache_dir != from_jinja.cache_dir


def test_a_cache_folder_as_dataset_is_used_as_it_is(tmp_path, tiny):
    first = run(tmp_path, tiny, seq_len=128)
    again = prepare(DataSettings(dataset=str(first.cache_dir)), tiny, tmp_path / "cache")  # seq_len left at its default
    assert again.reused and again.cache_dir == first.cache_dir and again.report == first.report
    # a setting given that the cache was not prepared with is refused, not silently unused (issue 28)
    with pytest.raises(UsageError, match="--seq-len 4096 \\(the cache holds 128-token sequences\\)"):
        run(tmp_path, tiny, dataset=str(first.cache_dir), seq_len=4096)


def test_auto_format_and_no_format_share_a_cache(tmp_path, tiny):
    data = write_jsonl(tmp_path / "d.jsonl", [RECORDS["messages"]])
    assert run(tmp_path, tiny, dataset=str(data)).cache_dir == run(tmp_path, tiny, dataset=str(data), dataset_format="auto").cache_dir
