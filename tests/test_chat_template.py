"""``--chat-template`` (issue 37): a template of one's own for the data, training, eval and the export.

Rendered with the tiny model's real tokenizer: the tokens and labels of a chosen template are
those of ``apply_chat_template`` with it (``enable_thinking`` passed), the mask check runs
against it, and a template that hides which tokens are the assistant's is refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_clean_error
from tests.test_data_mapping import write_jsonl
from trnqwen.dataset import chat
from trnqwen.dataset.prepare import DataSettings, prepare
from trnqwen.dataset.template import BUILTIN, EXPORT_FILE, resolve_template
from trnqwen.errors import UsageError

CONVERSATION = [
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
    {"role": "user", "content": "And times 4?"},
    {"role": "assistant", "content": "5 times 4 is 20."},
]
# A template of one's own: a fixed system prompt when the record has none (ChatML otherwise).
SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are terse.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
HIDING = {  # templates that hide which tokens are the assistant's, and the reason trnqwen gives
    "answer left out": (
        "{%- for m in messages %}{%- if m['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
        "it leaves the answer's text out of the conversation"),
    "another generation prompt": (
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>bot\\n' }}{%- endif %}",
        "does not start with what the generation prompt renders"),
    "turn never closed": (
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
        "the answer's turn is not closed by <|im_end|>"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("template") / "tiny-qwen3")


def one_document(tmp_path, tiny, **kw):
    data = write_jsonl(tmp_path / "one.jsonl", [{"messages": CONVERSATION}])
    result = prepare(DataSettings(dataset=str(data), seq_len=256, packing=False, **kw), tiny, tmp_path / "cache")
    split = result.split()
    n = int(np.count_nonzero(np.asarray(split.input_ids[0]) != split.meta["pad_id"]))
    return result, np.asarray(split.input_ids[0][:n]), np.asarray(split.labels[0][:n])


def trained_text(tokenizer, labels) -> str:
    return tokenizer.decode([t for t in labels.tolist() if t != -100])


@pytest.mark.parametrize("thinking", [False, True, None])
def test_builtin_thinking_template_and_enable_thinking(tmp_path, tiny, thinking):
    result, ids, labels = one_document(tmp_path, tiny, chat_template="chatml-think", enable_thinking=thinking)
    tok = chat.load_tokenizer(tiny)
    tok.chat_template = BUILTIN["chatml-think"]
    extra = {} if thinking is None else {"enable_thinking": thinking}
    assert ids.tolist() == tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True, **extra)["input_ids"]
    empty_think = "<think>\n\n</think>\n\n"
    text = tok.decode(ids.tolist())
    assert text.count(empty_think) == (2 if thinking is False else 0)
    # the think block opens the answer's turn, as the generation prompt renders it: context, never trained
    assert trained_text(tok, labels) == "2 plus 3 is 5.<|im_end|>5 times 4 is 20.<|im_end|>"
    assert result.report["chat_template"] == "chatml-think"


def test_a_template_file_replaces_the_snapshots(tmp_path, tiny):
    path = tmp_path / "terse.jinja"
    path.write_text(SYSTEM_TEMPLATE)
    result, ids, labels = one_document(tmp_path, tiny, chat_template=str(path))
    tok = chat.load_tokenizer(tiny)
    assert tok.decode(ids.tolist()).startswith("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n")
    assert trained_text(tok, labels) == "2 plus 3 is 5.<|im_end|>5 times 4 is 20.<|im_end|>"
    stock, stock_ids, _ = one_document(tmp_path, tiny)
    assert stock.key != result.key and len(stock_ids) < len(ids)
    path.write_text(SYSTEM_TEMPLATE.replace("terse", "brief"))  # the template's text is in the key, not its name
    assert one_document(tmp_path, tiny, chat_template=str(path))[0].key not in (result.key, stock.key)
    from trnqwen.dataset.cache import read_meta

    assert read_meta(result.cache_dir)["chat_template"] == SYSTEM_TEMPLATE


@pytest.mark.parametrize("case", sorted(HIDING))
def test_a_template_that_hides_the_answers_is_refused_with_the_reason(tmp_path, tiny, case, cli):
    template, reason = HIDING[case]
    path = tmp_path / "bad.jinja"
    path.write_text(template)
    with pytest.raises(UsageError) as caught:
        one_document(tmp_path, tiny, chat_template=str(path))
    assert f"the chat template {path} hides which tokens are the assistant's answer: " in caught.value.message
    assert reason in caught.value.message
    r = cli("data", str(write_jsonl(tmp_path / "d.jsonl", [{"messages": CONVERSATION}])), "--model", "builtin:tiny-qwen3",
            "--assets", str(tiny), "--chat-template", str(path), "--data-cache-dir", str(tmp_path / "c"))
    assert_clean_error(r, code=2, contains=reason)


def test_unknown_names_and_files_are_refused(tmp_path):
    with pytest.raises(UsageError, match="no such file, nor a built-in name \\(chatml, chatml-think\\)"):
        resolve_template("chatml-thinking")
    (tmp_path / "empty.jinja").write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        resolve_template(str(tmp_path / "empty.jinja"))
    assert resolve_template(None) is None and resolve_template("chatml").text == BUILTIN["chatml"]


def test_the_export_carries_the_trained_template(tmp_path, tiny):
    """The launcher completes the export with the template the cache was rendered with."""
    import shutil

    from transformers import AutoTokenizer

    from trnqwen.ckpt.model_folder import complete_run_export
    from trnqwen.rundir import RunRecord

    path = tmp_path / "terse.jinja"
    path.write_text(SYSTEM_TEMPLATE)
    result, _, _ = one_document(tmp_path, tiny, chat_template=str(path))
    path.write_text("changed since")  # the export takes what was trained: the cache's copy
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(tiny / "model-00001-of-00001.safetensors", export)
    record = RunRecord(run_id="r1", run_dir=str(tmp_path / "run"), status="succeeded", assets_dir=str(tiny),
                       config={"model": "builtin:tiny-qwen3", "backend": "native", "chat_template": str(path)},
                       extra={"dataset_cache": str(result.cache_dir)})
    written = complete_run_export(record, export)
    assert EXPORT_FILE in written and "tokenizer_config.json" in written
    assert (export / EXPORT_FILE).read_text() == SYSTEM_TEMPLATE
    assert json.loads((export / "tokenizer_config.json").read_text())["chat_template"] == SYSTEM_TEMPLATE
    loaded = AutoTokenizer.from_pretrained(str(export))
    prompt = loaded.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    again = complete_run_export(record, export)  # already there: not rewritten
    assert EXPORT_FILE not in again and "tokenizer_config.json" not in again


def test_settings_reach_the_config(tmp_path):
    from trnqwen.config import resolve_config

    cfg = resolve_config({"chat_template": "chatml-think", "enable_thinking": False}, environ={}).config
    assert (cfg.chat_template, cfg.enable_thinking) == ("chatml-think", False)
    env = resolve_config(environ={"TRNQWEN_ENABLE_THINKING": "false", "TRNQWEN_PACKING_STRATEGY": "sequential"}).config
    assert env.enable_thinking is False and env.packing_strategy == "sequential"
