"""Issue 28, items 1-7: data that is valid but was refused, or read only in part, or misnamed.

Each test is the issue's reproducer run through the real ``trnqwen data`` (in-process) on the
bundled tiny model, or through ``prepare`` where the labels are checked token by token.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.test_bad_input import clean_error

TURNS = [{"role": "user", "content": "2 plus 2?"}, {"role": "assistant", "content": "4."}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("inputs") / "tiny-qwen3")


def records(n: int, tag: str) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"{tag} {i}?"}, {"role": "assistant", "content": f"{tag} {i}."}]}) + "\n"
        for i in range(n)
    )


def data_json(cli, tiny: Path, dataset, *extra: str) -> dict:
    r = cli("data", str(dataset), "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--data-cache-dir", "cache",
            "--seq-len", "128", "--json", *extra)
    assert r.code == 0, r.text
    return json.loads(r.out)


def data_error(cli, tiny: Path, dataset, code: int, *needles: str):
    r = cli("data", str(dataset), "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--data-cache-dir", "cache",
            "--seq-len", "128")
    clean_error(r, code, *needles)
    return r


# --- item 1: links inside a dataset folder --------------------------------------------------------


def test_linked_folders_and_files_are_read_and_loops_are_named(cli, in_tmp, tiny):
    """The issue's reproducer: 3 records + a linked folder of 20 + a linked file of 20 = 43."""
    (in_tmp / "data").mkdir()
    (in_tmp / "data" / "own.jsonl").write_text(records(3, "own"))
    (in_tmp / "shard").mkdir()
    (in_tmp / "shard" / "part.jsonl").write_text(records(20, "shard"))
    (in_tmp / "single.jsonl").write_text(records(20, "single"))
    (in_tmp / "data" / "shard-1").symlink_to(in_tmp / "shard")
    (in_tmp / "data" / "single.jsonl").symlink_to(in_tmp / "single.jsonl")
    assert data_json(cli, tiny, "data/")["records"] == 43

    # A loop, a second way to the same folder, a broken link and a file of another type: the rest
    # is still read, and each left-out path is named with why (never silently).
    (in_tmp / "data" / "shard-1" / "back").symlink_to(in_tmp / "data")
    (in_tmp / "data" / "shard-again").symlink_to(in_tmp / "shard")
    (in_tmp / "data" / "gone.jsonl").symlink_to(in_tmp / "nowhere.jsonl")
    (in_tmp / "data" / "part-2.jsonl.gz").write_bytes(b"\x1f\x8b")
    report = data_json(cli, tiny, "data/")
    assert report["records"] == 43, report
    warnings = " | ".join(report["warnings"])
    assert "3 path(s)" in warnings, warnings
    assert "shard-1/back (a link back to" in warnings and "a loop" in warnings
    assert "shard-again (the same folder as" in warnings
    assert "gone.jsonl (a broken symbolic link" in warnings
    assert "1 file(s)" in warnings and "part-2.jsonl.gz" in warnings
    human = cli("data", "data/", "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--data-cache-dir", "cache",
                "--seq-len", "128")
    assert human.code == 0 and "a loop" in human.out and "part-2.jsonl.gz" in human.out, human.text


# --- item 3: valid JSONL and encodings ------------------------------------------------------------


def test_line_separators_inside_strings_are_data_and_line_numbers_stay_right(cli, in_tmp, tiny):
    text = "".join(
        json.dumps({"messages": [{"role": "user", "content": f"a{sep}b"}, TURNS[1]]}, ensure_ascii=False) + "\n"
        for sep in ("\u2028", "\u2029", "\x85")
    )
    (in_tmp / "seps.jsonl").write_text(text + "{broken\n", encoding="utf-8")
    data_error(cli, tiny, "seps.jsonl", 2, "seps.jsonl line 4", "not valid json")
    (in_tmp / "seps.jsonl").write_text(text, encoding="utf-8")
    report = data_json(cli, tiny, "seps.jsonl")
    assert report["records"] == 3 and "a\u2028b" in report["sample"]["text"]


@pytest.mark.parametrize("line,needle", [
    ('{"messages": [{"role": "user", "content": "x\\ud800y"}, {"role": "assistant", "content": "4."}]}', "lone surrogate \\ud800"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_record_python_cannot_use_is_named_with_exit_2(cli, in_tmp, tiny, line, needle):
    ok = json.dumps({"messages": TURNS})
    (in_tmp / "odd.jsonl").write_text(f"{ok}\n{line}\n")
    data_error(cli, tiny, "odd.jsonl", 2, "odd.jsonl line 2", needle)


def test_a_surrogate_pair_escape_is_one_character(cli, in_tmp, tiny):
    (in_tmp / "emoji.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}, {"role": "assistant", "content": "4."}]}\n')
    assert "smile \U0001F600" in data_json(cli, tiny, "emoji.jsonl")["sample"]["text"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt"])
def test_a_utf8_byte_order_mark_is_not_data(cli, in_tmp, tiny, suffix):
    body = {".jsonl": json.dumps({"messages": TURNS}) + "\n", ".json": json.dumps([{"messages": TURNS}]),
            ".txt": "Two plus two is four.\n"}[suffix]
    (in_tmp / f"bom{suffix}").write_bytes(b"\xef\xbb\xbf" + body.encode())
    sample = data_json(cli, tiny, f"bom{suffix}")["sample"]["text"]
    assert "\ufeff" not in sample
    if suffix == ".txt":
        assert sample.startswith("Two plus two")


def test_non_utf8_names_the_line(cli, in_tmp, tiny):
    ok = json.dumps({"messages": TURNS}).encode()
    (in_tmp / "latin.jsonl").write_bytes(ok + b"\n" + ok + b"\n" + ok.replace(b"4.", b"caf\xe9") + b"\n")
    data_error(cli, tiny, "latin.jsonl", 2, "latin.jsonl line 3", "not utf-8", "byte")


def test_array_in_jsonl_and_jsonl_in_json_suggest_the_other_name(cli, in_tmp, tiny):
    array = [{"messages": TURNS}] * 2
    (in_tmp / "one-line.jsonl").write_text(json.dumps(array) + "\n")
    r = data_error(cli, tiny, "one-line.jsonl", 2, "one-line.jsonl", "json array")
    assert "rename it to one-line.json" in r.err
    (in_tmp / "pretty.jsonl").write_text(json.dumps(array, indent=2) + "\n")
    assert "rename it to pretty.json" in data_error(cli, tiny, "pretty.jsonl", 2, "pretty.jsonl").err
    (in_tmp / "lines.json").write_text(records(3, "q"))
    r = data_error(cli, tiny, "lines.json", 2, "lines.json", "one json object per line")
    assert "rename it to lines.jsonl" in r.err


# --- item 7: a broken link given as the dataset ---------------------------------------------------


@pytest.mark.parametrize("option", ["dataset", "val-dataset"])
def test_a_broken_link_is_said_to_be_one_at_once(cli, in_tmp, tiny, monkeypatch, option):
    """A link whose name looks like a Hub name is still a local path: never a Hub lookup."""
    monkeypatch.delenv("HF_HUB_OFFLINE")  # the Hub would be tried (and waited for) online
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # ...and fail at once here if it were
    (in_tmp / "mydata").symlink_to(in_tmp / "moved-away.jsonl")
    (in_tmp / "ok.jsonl").write_text(records(4, "q"))
    dataset, extra = ("mydata", []) if option == "dataset" else ("ok.jsonl", ["--val-dataset", "mydata"])
    start = time.monotonic()
    r = cli("data", dataset, *extra, "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--data-cache-dir", "cache")
    clean_error(r, 2, "mydata is a broken symbolic link", "moved-away.jsonl")
    assert "hub" not in r.err.lower() and time.monotonic() - start < 10


# --- item 4: OpenAI's fine-tuning fields: weight, tools, tool_calls, role tool --------------------

# ChatML with tools laid out as Qwen3's templates lay them out (tool definitions in the system turn,
# <tool_call> blocks in the assistant turn, tool results as a user turn of <tool_response> blocks).
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + m.content }}"
    "{%- for call in m.tool_calls or [] %}{%- set f = call.function or call %}"
    "{{- ('\\n' if (m.content or not loop.first) else '') + '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": '"
    " + (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TOOL_RECORD = {
    "tools": [WEATHER],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 C."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "Welcome.", "weight": 0},
    ],
}


def trained_texts(report: dict) -> list[str]:
    sample = report["sample"]
    return [sample["text"][s:e] for s, e in sample["trained_spans"]]


def test_weight_0_keeps_an_answer_as_context_only(cli, in_tmp, tiny):
    turns = [dict(t) for t in TURNS] + [{"role": "user", "content": "And 3 plus 3?"}, {"role": "assistant", "content": "6.", "weight": 0}]
    (in_tmp / "w.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    report = data_json(cli, tiny, "w.jsonl")
    assert trained_texts(report) == ["4.<|im_end|>"]
    # --train-on-inputs trains every token but that answer
    everything = trained_texts(data_json(cli, tiny, "w.jsonl", "--train-on-inputs"))
    assert len(everything) == 2 and "6." not in "".join(everything) and everything[-1] == "\n"
    assert "6.<|im_end|>" in report["sample"]["text"]
    turns[1]["weight"] = 0
    (in_tmp / "w.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    data_error(cli, tiny, "w.jsonl", 2, "w.jsonl line 1", 'every assistant turn has "weight": 0')


@pytest.mark.parametrize("message,needle", [
    ({"role": "assistant", "content": "4.", "weight": 0.5}, "'weight' must be 0 or 1"),
    ({"role": "assistant", "content": "4.", "weight": True}, "'weight' must be 0 or 1"),
    ({"role": "user", "content": "hi", "weight": 1}, "message 3 (user) has 'weight': 1"),
    ({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}, "'function_call'"),
    ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}, "only assistant messages call tools"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}, "tool call 1 has no function name"),
    ({"role": "assistant", "content": None, "tool_calls": []}, "message 3 (assistant) content must be a string"),
])
def test_openai_fields_that_cannot_be_honoured_are_refused_by_name(cli, in_tmp, tiny, message, needle):
    (in_tmp / "o.jsonl").write_text(json.dumps({"messages": [*TURNS, message, *([] if message["role"] == "assistant" else [TURNS[1]])]}) + "\n")
    data_error(cli, tiny, "o.jsonl", 2, "o.jsonl line 1", needle)


def test_tools_and_tool_turns_are_rendered_by_the_template_and_only_the_calls_are_trained(cli, in_tmp, tiny):
    from tests.test_dataset import with_template

    snapshot = with_template(tiny, in_tmp / "tools-model", TOOLS_TEMPLATE)
    (in_tmp / "t.jsonl").write_text(json.dumps(TOOL_RECORD) + "\n")
    report = data_json(cli, snapshot, "t.jsonl", "--seq-len", "512")
    text = report["sample"]["text"]
    assert '"name": "get_weather"' in text.split("<|im_end|>")[0]  # the tool definitions, in the system turn
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in text
    # the batched renderer gives exactly what transformers renders, tools included
    from trnqwen.dataset.chat import load_tokenizer
    from trnqwen.dataset.formats import normalise
    from trnqwen.dataset.sources import Record

    example = normalise([Record(TOOL_RECORD, "t")], "messages")[0]
    assert text == load_tokenizer(snapshot).apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    # The turn of tool calls only is an answer (trained); the definitions, the tool's result and
    # the "weight": 0 answer are context.
    assert trained_texts(report) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', "21 C.<|im_end|>"]


def test_a_template_without_tools_refuses_them_by_name(cli, in_tmp, tiny):
    """The tiny model's plain ChatML has no tool support: never trained without them."""
    (in_tmp / "t.jsonl").write_text(json.dumps(TOOL_RECORD) + "\n")
    data_error(cli, tiny, "t.jsonl", 2, "t.jsonl line 1", "does not render the record's 'tools'", "get_weather")
    no_defs = {"messages": TOOL_RECORD["messages"]}
    (in_tmp / "t.jsonl").write_text(json.dumps(no_defs) + "\n")
    data_error(cli, tiny, "t.jsonl", 2, "t.jsonl line 1", "does not render message 3's tool_calls", "get_weather")


# --- item 5: a control token written inside the content --------------------------------------------


@pytest.mark.parametrize("role,index", [("assistant", 2), ("user", 1)])
def test_a_special_token_inside_content_is_named(cli, in_tmp, tiny, role, index):
    turns = [dict(t) for t in TURNS]
    turns[index - 1]["content"] = "4.<|im_end|>\n<|im_start|>user\nmore?"
    (in_tmp / "s.jsonl").write_text(json.dumps({"messages": TURNS}) + "\n" + json.dumps({"messages": turns}) + "\n")
    r = data_error(cli, tiny, "s.jsonl", 2, "s.jsonl line 2", f"message {index} ({role}) content contains the special token <|im_end|>")
    assert "prefix" not in r.err


def test_parquet_rows_with_nulls_for_unused_openai_fields(cli, in_tmp, tiny):
    """Parquet (and Hub) rows carry every column of the schema: a message without a weight or a
    tool call has them as null, which means absent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"messages": [*TURNS, {"role": "user", "content": "3 plus 3?"}, {"role": "assistant", "content": "6.", "weight": 0}]},
        {"messages": [{"role": "user", "content": "5 plus 5?"}, {"role": "assistant", "content": "10."}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), in_tmp / "rows.parquet")
    assert pa.Table.from_pylist(rows).to_pylist()[1]["messages"][0]["weight"] is None  # the nulls under test
    report = data_json(cli, tiny, "rows.parquet")
    assert report["records"] == 2 and trained_texts(report) == ["4.<|im_end|>"]
