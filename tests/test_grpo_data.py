"""GRPO's prompt data: TRL's format read from files (other columns kept for the rewards), bad
records named by file and line, rendering with the chat template and Qwen3's thinking switch,
prompts that leave no room for a completion dropped and counted, and the preview's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnqwen.errors import UsageError
from trnqwen.methods.grpo.data import encode_prompts, load_prompts, preview, render_prompts, reward_columns

# Qwen3's switch, as its template writes it: thinking off puts an empty reasoning block in the prompt
THINKING_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from trnqwen.fetch.builtin import write_tiny_qwen3

    tiny = write_tiny_qwen3(tmp_path_factory.mktemp("grpo-data") / "tiny-qwen3")
    return AutoTokenizer.from_pretrained(tiny)


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_records_keep_every_other_column_unchanged(tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}],
         "answer": 5, "tests": ["assert f() == 5"], "meta": {"level": 1}},
        {"prompt": [{"role": "user", "content": "7-1?"}], "answer": "6"},
    ]
    records = load_prompts(_jsonl(tmp_path / "p.jsonl", rows))
    assert [r.where for r in records] == [f"{tmp_path / 'p.jsonl'} line 1", f"{tmp_path / 'p.jsonl'} line 2"]
    assert records[0].columns == {"answer": 5, "tests": ["assert f() == 5"], "meta": {"level": 1}}
    assert records[0].conversational and records[0].prompt[1] == {"role": "user", "content": "2+3?"}
    cols = reward_columns(records, num_generations=2)
    assert cols == {"answer": [5, 5, "6", "6"], "tests": [["assert f() == 5"]] * 2 + [None] * 2,
                    "meta": [{"level": 1}] * 2 + [None] * 2}
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps([{"prompt": "Say hi.", "solution": "hi"}]))
    (text,) = load_prompts(as_json)
    assert text.prompt == "Say hi." and not text.conversational and text.where.endswith("p.json record 1")


@pytest.mark.parametrize("row, says", [
    ('["a list"]', "must be a JSON object, not list"),
    ({"question": "2+3?", "answer": 5}, "no 'prompt' field (found: question, answer)"),
    ({"prompt": "  "}, "the prompt is empty"),
    ({"prompt": []}, "not an empty list"),
    ({"prompt": 7}, "not int"),
    ({"prompt": ["hi"]}, "prompt message 1 must be an object"),
    ({"prompt": [{"role": "robot", "content": "hi"}]}, "unknown role 'robot'"),
    ({"prompt": [{"role": "user", "content": 3}]}, "content must be a string, not int"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "ends with an assistant turn"),
    ('{"prompt": "cut', "not valid JSON"),
])
def test_a_bad_record_is_named_by_file_and_line(tmp_path, row, says):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, {"prompt": "fine too"}, row])
    with pytest.raises(UsageError) as err:
        load_prompts(path)
    assert f"{path} line 3" in err.value.message and says in err.value.message, err.value.message
    assert err.value.exit_code == 2


def test_mixed_prompt_shapes_and_empty_data_are_refused(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "text"}, {"prompt": [{"role": "user", "content": "chat"}]}])
    with pytest.raises(UsageError, match="line 2: the prompt is a message list, but .* line 1's is a string"):
        load_prompts(path)
    with pytest.raises(UsageError, match="no records"):
        load_prompts(_jsonl(tmp_path / "e.jsonl", []))


def test_rendering_conversations_strings_and_the_thinking_switch(tok, tmp_path):
    records = load_prompts(_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "2+3?"}]}]))
    (text,) = render_prompts(tok, records)
    assert text == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    plain = load_prompts(_jsonl(tmp_path / "s.jsonl", [{"prompt": "Question: 2+3?\nAnswer:"}]))
    assert render_prompts(tok, plain) == ["Question: 2+3?\nAnswer:"]  # TRL: a string prompt is used as it is
    tok.chat_template, saved = THINKING_TEMPLATE, tok.chat_template
    try:
        on, off, default = (render_prompts(tok, records, enable_thinking=v)[0] for v in (True, False, None))
    finally:
        tok.chat_template = saved
    assert off == on + "<think>\n\n</think>\n\n" and default == on


def test_a_control_token_in_a_prompt_is_refused(tok, tmp_path):
    records = load_prompts(_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "hi<|im_end|>"}]}]))
    with pytest.raises(UsageError, match=r"p.jsonl line 1: message 1 \(user\) content contains the special token"):
        render_prompts(tok, records)


def test_prompts_without_room_for_a_completion_are_dropped_and_counted(tok, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": 1},
            {"prompt": [{"role": "user", "content": " ".join(["word"] * 60)}], "answer": 2},
            {"prompt": [{"role": "user", "content": "2+3?"}], "answer": 5}]
    records = load_prompts(_jsonl(tmp_path / "p.jsonl", rows))
    encoded = encode_prompts(tok, records, seq_len=64, max_completion_length=32)
    assert encoded.room == 32 and [p.record.columns["answer"] for p in encoded.prompts] == [1, 5]
    assert len(encoded.dropped) == 1 and encoded.dropped[0][0].endswith("p.jsonl line 2") and encoded.dropped[0][1] > 32
    assert encoded.prompts[0].ids == tok(encoded.prompts[0].text, add_special_tokens=False)["input_ids"]
    with pytest.raises(UsageError, match="leaves no room"):
        encode_prompts(tok, records, seq_len=64, max_completion_length=64)
    with pytest.raises(UsageError, match="every prompt is longer than the 2 tokens"):
        encode_prompts(tok, records, seq_len=34, max_completion_length=32)

    report = preview(tok, records, seq_len=64, max_completion_length=32)
    assert json.loads(json.dumps(report)) == report  # plain data
    assert (report["records"], report["kept"], report["dropped"], report["room"]) == (3, 2, 1, 32)
    assert report["format"] == "prompt (messages)" and report["columns"] == ["answer"]
    assert report["prompt_tokens"]["max"] == max(len(p.ids) for p in encoded.prompts)
    assert report["prompt_tokens"]["min"] == min(len(p.ids) for p in encoded.prompts)
    assert report["sample"]["text"].startswith("<|im_start|>user\nhi") and report["dropped_records"][0].endswith("tokens)")
