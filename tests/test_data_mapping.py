"""Data the way people have it (issue 37): a dataset's own column, key and role names mapped.

Real files through the real pipeline and the tiny model's real tokenizer: a ShareGPT-style set
with ``conversations``/``from``/``value`` and ``human``/``gpt`` roles, read through a mapping,
gives the same cache (ids, labels, positions) as the same records written as ``messages``; a
mapping that names what a record lacks stops the run naming that record.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trnqwen.dataset.cache import open_split
from trnqwen.dataset.prepare import DataSettings, prepare
from trnqwen.errors import UsageError

SPEAKERS = {"system": "system", "user": "human", "assistant": "gpt"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("mapping") / "tiny-qwen3")


@pytest.fixture(scope="module")
def chats() -> list[dict]:
    """The bundled calculator conversations (system prompts, several turns), first 60."""
    from trnqwen.data import chat_recipe

    lines = chat_recipe.chat_path().read_text().splitlines()[:60]
    return [json.loads(line) for line in lines]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def sharegpt(record: dict, *, column="conversations", role="from", content="value", speakers=SPEAKERS) -> dict:
    turns = [{role: speakers[m["role"]], content: m["content"], "id": i} for i, m in enumerate(record["messages"])]
    return {"id": "x", column: turns, "source": "web"}


def prepared(tmp_path: Path, tiny: Path, data: Path, **kw):
    return prepare(DataSettings(dataset=str(data), seq_len=256, **kw), tiny, tmp_path / "cache")


def arrays(result) -> list[np.ndarray]:
    split = open_split(result.cache_dir, "train")
    return [np.asarray(a) for a in (split.input_ids, split.labels, split.positions)]


def assert_same_tokens(a, b) -> None:
    for x, y in zip(arrays(a), arrays(b)):
        np.testing.assert_array_equal(x, y)
    assert a.report["trained_tokens"] == b.report["trained_tokens"] > 0
    assert a.cache_dir != b.cache_dir  # two caches: the mapping is in the key, the tokens are the same


def test_sharegpt_through_a_mapping_trains_the_messages_tokens(tmp_path, tiny, chats):
    """Issue 37's done-when: conversations/from/value with human/gpt roles, through axolotl's keys."""
    messages = prepared(tmp_path, tiny, write_jsonl(tmp_path / "messages.jsonl", chats))
    data = write_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt(r) for r in chats])
    mapping = {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
               "roles": {"user": ["human"], "assistant": ["gpt"]}}
    mapped = prepared(tmp_path, tiny, data, mapping=mapping)
    assert_same_tokens(mapped, messages)
    assert mapped.report["format"] == "messages"
    (shown,) = mapped.report["mapping"]
    assert shown["applied"] == ["messages <- column 'conversations' (field_messages)",
                                "each message: role <- 'from', content <- 'value'", "roles: human -> user, gpt -> assistant"]
    assert shown["before"]["conversations"][1] == {"from": "human", "value": chats[0]["messages"][1]["content"], "id": 1}
    assert shown["after"]["messages"][1] == {"role": "user", "content": chats[0]["messages"][1]["content"], "id": 1}
    assert "conversations" not in shown["after"] and shown["after"]["source"] == "web"


def test_own_names_and_several_names_per_role(tmp_path, tiny, chats):
    """A set nobody reads by default: a 'dialog' column, speaker/text keys, person/bot/model names."""
    messages = prepared(tmp_path, tiny, write_jsonl(tmp_path / "messages.jsonl", chats))
    records = []
    for n, record in enumerate(chats):
        names = {"system": "instructions", "user": "person", "assistant": "bot" if n % 2 else "model"}
        records.append(sharegpt(record, column="dialog", role="speaker", content="text", speakers=names))
    mapping = {"field_messages": "dialog", "message_property_mappings": {"role": "speaker", "content": "text"},
               "roles": {"system": ["instructions"], "user": ["person"], "assistant": ["bot", "model"]}}
    assert_same_tokens(prepared(tmp_path, tiny, write_jsonl(tmp_path / "own.jsonl", records), mapping=mapping), messages)


def test_prompt_answer_and_alpaca_columns(tmp_path, tiny):
    standard = [{"prompt": f"What is {i} plus {i}?", "completion": f"{i} plus {i} is {2 * i}."} for i in range(20)]
    own = [{"question": r["prompt"], "answer": r["completion"], "prompt": "not this one"} for r in standard]
    mapped = prepared(tmp_path, tiny, write_jsonl(tmp_path / "qa.jsonl", own),
                      mapping={"field_prompt": "question", "field_completion": "answer"})
    assert_same_tokens(mapped, prepared(tmp_path, tiny, write_jsonl(tmp_path / "pc.jsonl", standard)))
    alpaca = [{"instruction": "Add.", "input": f"{i} and {i}", "output": str(2 * i)} for i in range(20)]
    renamed = [{"task": r["instruction"], "args": r["input"], "result": r["output"]} for r in alpaca]
    mapped = prepared(tmp_path, tiny, write_jsonl(tmp_path / "renamed.jsonl", renamed),
                      mapping={"field_instruction": "task", "field_input": "args", "field_output": "result"})
    assert mapped.report["format"] == "alpaca"
    assert_same_tokens(mapped, prepared(tmp_path, tiny, write_jsonl(tmp_path / "alpaca.jsonl", alpaca)))


def test_removed_columns_change_what_is_detected(tmp_path, tiny, chats):
    """A stale 'messages' column beside the real conversation: without remove_columns it is read (and
    refused); removed, the ShareGPT conversations are."""
    records = [{**sharegpt(r), "messages": "see conversations"} for r in chats]
    data = write_jsonl(tmp_path / "both.jsonl", records)
    with pytest.raises(UsageError, match="line 1: 'messages' must be a non-empty list"):
        prepared(tmp_path, tiny, data)
    result = prepared(tmp_path, tiny, data, mapping={"remove_columns": ["messages"]})
    assert result.report["format"] == "sharegpt"
    assert_same_tokens(result, prepared(tmp_path, tiny, write_jsonl(tmp_path / "messages.jsonl", chats)))


@pytest.mark.parametrize("case,mapping,message", [
    ("missing column", {"field_messages": "dialog", "message_property_mappings": {"role": "from", "content": "value"}},
     r"bad\.jsonl line 3: no column 'dialog', which field_messages = 'dialog' names \(the record has: id, conversations"),
    ("missing key", {"field_messages": "conversations", "message_property_mappings": {"role": "speaker", "content": "value"}},
     r"bad\.jsonl line 1: messages message 1 has no 'speaker', which message_property_mappings role = 'speaker' names "
     r"\(it has: from, value, id\)"),
    ("unknown role", {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
                      "roles": {"user": ["human"], "assistant": ["gpt"]}},
     r"bad\.jsonl line 2: messages message 3 has role 'bot', which the roles mapping does not name"),
])
def test_a_mapping_naming_what_a_record_lacks_is_refused_naming_it(tmp_path, tiny, chats, case, mapping, message):
    records = [sharegpt(r) for r in chats[:4]]
    records[1]["conversations"][2]["from"] = "bot"
    if case == "missing column":
        records = [{**r, "dialog": r["conversations"]} for r in records[:2]] + records[2:]
    with pytest.raises(UsageError, match=message) as caught:
        prepared(tmp_path, tiny, write_jsonl(tmp_path / "bad.jsonl", records), mapping=mapping)
    assert caught.value.hint  # says what to change
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing written


def test_preference_pairs_through_a_mapping(tmp_path, tiny):
    pairs = [{"prompt": f"What is {i} plus 2?", "chosen": f"{i} plus 2 is {i + 2}.", "rejected": f"{i} plus 2 is {i + 3}."}
             for i in range(12)]
    own = [{"q": p["prompt"], "good": p["chosen"], "bad": p["rejected"]} for p in pairs]
    settings = dict(method="dpo", data_kind="preference")
    mapped = prepared(tmp_path, tiny, write_jsonl(tmp_path / "own.jsonl", own), **settings,
                      mapping={"field_prompt": "q", "field_chosen": "good", "field_rejected": "bad"})
    assert_same_tokens(mapped, prepared(tmp_path, tiny, write_jsonl(tmp_path / "pairs.jsonl", pairs), **settings))
    np.testing.assert_array_equal(open_split(mapped.cache_dir).extra["segments"], open_split(
        prepared(tmp_path, tiny, tmp_path / "pairs.jsonl", **settings).cache_dir).extra["segments"])


# --- the settings: flags, variables, trnqwen.toml ---------------------------------------------


def test_flags_variables_and_toml_use_axolotls_names(tmp_path):
    from trnqwen.config import resolve_config

    flags = resolve_config({"field_messages": "conversations", "message_property_mappings": "role=from,content=value",
                            "roles": "user=human,assistant=gpt,assistant=bot", "remove_columns": "id,source"}).config
    assert flags.message_property_mappings == {"role": "from", "content": "value"}
    assert flags.roles == {"user": ["human"], "assistant": ["gpt", "bot"]} and flags.remove_columns == ["id", "source"]
    env = resolve_config(environ={"TRNQWEN_ROLES": "user=human", "TRNQWEN_FIELD_MESSAGES": "dialog"}).config
    assert env.roles == {"user": ["human"]} and env.field_messages == "dialog"
    toml = tmp_path / "trnqwen.toml"
    toml.write_text('field_messages = "conversations"\nmessage_property_mappings = { role = "from", content = "value" }\n'
                    'roles = { user = ["human"], assistant = "gpt" }\n')
    cfg = resolve_config(config_file=toml).config
    assert cfg.roles == {"user": ["human"], "assistant": ["gpt"]} and cfg.message_property_mappings["content"] == "value"


@pytest.mark.parametrize("values,message", [
    ({"roles": "speaker=human"}, "unknown role 'speaker': map names onto system, user, assistant, tool"),
    ({"roles": "user"}, "'user' is not ROLE=NAME"),
    ({"message_property_mappings": "name=from"}, "unknown message property 'name'"),
])
def test_bad_mappings_are_config_errors(values, message):
    from trnqwen.config import resolve_config
    from trnqwen.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        resolve_config(values)
    assert message in str(caught.value.problems)


def test_trnqwen_data_shows_the_mapping_and_a_record_before_and_after(cli, in_tmp, tiny, chats):
    data = write_jsonl(in_tmp / "sharegpt.jsonl", [sharegpt(r) for r in chats])
    base = ["data", str(data), "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--seq-len", "256",
            "--data-cache-dir", str(in_tmp / "cache"), "--field-messages", "conversations",
            "--message-property-mappings", "role=from,content=value", "--roles", "user=human,assistant=gpt"]
    r = cli(*base)
    assert r.code == 0, r.text
    assert "Mapping of" in r.out and "messages <- column 'conversations' (field_messages)" in r.out
    before = next(line for line in r.out.splitlines() if line.strip().startswith("before:"))
    after = next(line for line in r.out.splitlines() if line.strip().startswith("after:"))
    assert '"from": "system"' in before and '"role": "system"' in after and '"role": "user"' in after
    report = json.loads(cli(*base, "--json").out)
    assert report["reused"] and report["mapping"][0]["after"]["messages"][0]["role"] == "system"
    bad = cli(*base[:-2], "--roles", "user=human")
    assert bad.code == 2 and "has role 'gpt', which the roles mapping does not name" in bad.err
    assert "Traceback" not in bad.text
