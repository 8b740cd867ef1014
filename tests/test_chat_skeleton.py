"""Chat-template renders pasted from role skeletons (trnqwen.dataset.skeleton): taken for templates
that only paste contents, byte for byte jinja's text, refused (jinja renders, counted) otherwise."""

from __future__ import annotations

import json
import logging

import pytest

from trnqwen.dataset import bounded, chat, skeleton
from trnqwen.dataset.formats import Example, normalise
from trnqwen.dataset.sources import Record
from trnqwen.dataset.template import BUILTIN, ChatTemplate, use_template

TRICKY = ["{0} {1} {}", "}{", "\x00\x010\x01\x00", "\x00\x011\x01\x00 x", "tab\there\n\nnew lines  ", "ünïcødé ✓ 𝔘", "%s %d"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return chat.load_tokenizer(write_tiny_qwen3(tmp_path_factory.mktemp("skeleton") / "tiny"))


def _conversations() -> list[list[dict[str, str]]]:
    from trnqwen.data import chat_recipe

    chats = [json.loads(line)["messages"] for line in chat_recipe.chat_path().read_text().splitlines()[:200]]
    for i, text in enumerate(TRICKY):
        chats.append([{"role": "system", "content": text}, {"role": "user", "content": TRICKY[-1 - i]},
                      {"role": "assistant", "content": text + "!"}, {"role": "user", "content": "again " + text},
                      {"role": "assistant", "content": text}])
    return chats


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("context", [{}, {"enable_thinking": False}])
def test_skeletons_paste_exactly_what_jinja_renders(tokenizer, name, context):
    use_template(tokenizer, ChatTemplate(name, BUILTIN[name]))
    assert skeleton.pastes_content(BUILTIN[name]) is None
    chats = _conversations()
    examples = [Example(f"record {i}", messages=m) for i, m in enumerate(chats)]
    for gen in (False, True):
        before = skeleton.COUNTS.totals()
        texts = chat._render_batched(tokenizer, chats, examples, generation_prompt=gen, context=context)
        after = skeleton.COUNTS.totals()
        assert (after[0] - before[0], after[1] - before[1]) == (len(chats), 0)  # the fast path, every one
        assert texts == [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=gen, **context)
                         for m in chats]


def test_render_is_the_same_with_skeletons_refused(tokenizer, monkeypatch):
    use_template(tokenizer, ChatTemplate("chatml", BUILTIN["chatml"]))
    records = [Record({"messages": m}, f"r{i}") for i, m in enumerate(_conversations())]
    records.append(Record({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no", "weight": 0},
                                        {"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}]}, "w"))
    examples = normalise(records, "messages")
    fast = [chat.render(tokenizer, examples, train_on_inputs=inputs) for inputs in (False, True)]
    monkeypatch.setattr(skeleton, "pastes_content", lambda template: "refused here")
    before = skeleton.COUNTS.totals()
    slow = [chat.render(tokenizer, examples, train_on_inputs=inputs) for inputs in (False, True)]
    assert skeleton.COUNTS.totals()[0] == before[0] and skeleton.COUNTS.totals()[1] > before[1]
    assert fast == slow


QWEN3_LIKE = (  # Qwen3's templates test a content for </think> (and tool responses): not provable
    "{%- for message in messages %}{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
)
REFUSED = {
    "qwen3-like": QWEN3_LIKE,
    "content filtered": "{%- for m in messages %}{{ m['content'] | trim }}{%- endfor %}",
    "content tested": "{%- for m in messages %}{%- if m.content %}{{ m.content }}{%- endif %}{%- endfor %}",
    "content called": "{%- for m in messages %}{{ m.content.strip() }}{%- endfor %}",
    "message output whole": "{%- for m in messages %}{{ m }}{%- endfor %}",
    "message's other fields": "{%- for m in messages %}{{ m.content }}{{ m.get('x') }}{%- endfor %}",
    "messages filtered": "{%- for m in messages | reverse %}{{ m.content }}{%- endfor %}",
    "messages indexed": "{{ messages[0]['content'] }}{%- for m in messages %}{{ m.content }}{%- endfor %}",
    "next item": "{%- for m in messages %}{{ m.content }}{{ loop.nextitem }}{%- endfor %}",
    "captured": "{%- for m in messages %}{% set x %}{{ m.content }}{% endset %}{{ x | upper }}{%- endfor %}",
    "macro": "{% macro f(c) %}{{ c | upper }}{% endmacro %}{%- for m in messages %}{{ f(m.content) }}{%- endfor %}",
    "conditional": "{%- for m in messages %}{{ m.content if loop.first else '' }}{%- endfor %}",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_templates_that_do_more_than_paste_contents_are_refused(name):
    assert skeleton.pastes_content(REFUSED[name]) is not None


def test_a_refused_template_and_tool_conversations_are_rendered_by_jinja_and_counted(tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(skeleton, "COUNTS", skeleton.Counts())  # this process's counts and first-reason log lines, afresh
    use_template(tokenizer, ChatTemplate("qwen3-like", QWEN3_LIKE))
    chats = _conversations()[:20]
    examples = [Example(f"record {i}", messages=m) for i, m in enumerate(chats)]
    before = skeleton.COUNTS.totals()
    with caplog.at_level(logging.INFO, logger="trnqwen.dataset.skeleton"):
        texts = chat._render_batched(tokenizer, chats, examples, generation_prompt=False, context={})
    assert skeleton.COUNTS.totals() == (before[0], before[1] + 20)
    assert texts == [tokenizer.apply_chat_template(m, tokenize=False) for m in chats]
    reason = "a message's content used other than output as it is"
    assert skeleton.COUNTS.reasons == {reason: 20}
    assert [r.getMessage() for r in caplog.records] == [f"chat template rendered by jinja, not from role skeletons: {reason}"]

    use_template(tokenizer, ChatTemplate("chatml", BUILTIN["chatml"]))
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    with_tools = [Example("t", messages=chats[0], tools=tools), Example("c", messages=[*chats[1][:-1], {**chats[1][-1], "x": "1"}]),
                  Example("p", messages=chats[2])]
    before = skeleton.COUNTS.totals()
    texts = chat._render_batched(tokenizer, [e.messages for e in with_tools], with_tools, generation_prompt=False, context={})
    assert skeleton.COUNTS.totals() == (before[0] + 1, before[1] + 2)
    assert texts[2] == tokenizer.apply_chat_template(chats[2], tokenize=False)


def test_bounded_encoder_takes_the_fast_path_and_says_so(tokenizer):
    use_template(tokenizer, ChatTemplate("chatml", BUILTIN["chatml"]))
    chats = _conversations()[:50]
    records = [Record({"messages": m}, f"r{i}") for i, m in enumerate(chats)]
    answers = sum(1 for m in chats for message in m if message["role"] == "assistant")
    chunk = bounded.Encoder(tokenizer, 512, "truncate", False, {})(records, "messages")
    assert chunk.renders == (len(chats) + answers, 0)  # each conversation and each answer's prefix, none by jinja
    assert chunk.starts == (1, 0)  # its token starts counted from byte lengths (encode's ASCII fast path), none redone
