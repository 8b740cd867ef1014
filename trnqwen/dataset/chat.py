"""The model's own chat template, rendered by transformers, and which tokens are trained.

The rule (the one axolotl, LLaMA-Factory and TRL follow, written down):

* each assistant answer is trained: its content and the end-of-turn token ``<|im_end|>`` that
  closes it, so the model learns to answer *and* to stop;
* everything else is context only: the system prompt, the user turns, every role header
  including ``<|im_start|>assistant\\n``, and the newline the template writes after
  ``<|im_end|>`` (it belongs to the layout between turns, not to the answer; at inference
  generation stops at ``<|im_end|>`` and never produces it);
* an answer marked ``"weight": 0`` (OpenAI's fine-tuning format) is context only, like a prompt;
* a turn of tool calls is an answer like any other (the calls as the template writes them, and
  ``<|im_end|>``); tool definitions and tool results are context;
* ``--train-on-inputs`` trains every token but the ``"weight": 0`` answers; ``text`` records train
  every token, each document ending with ``<|endoftext|>``.

A message whose content holds a control token as text (``<|im_end|>``) is refused: the tokenizer
would read it as that token.

Qwen3's templates have no ``{% generation %}`` markers, so the answer spans come from prefix
rendering: the text up to assistant turn *i* is the template applied to the messages before it
with the generation prompt.  That is only right when each such prefix is literally the start of
the whole conversation's rendering (thinking templates rewrite earlier turns), so the property
is checked for every turn of every conversation, and a conversation that breaks it stops the run
with its record named: a silently wrong mask is never produced.

Rendering uses transformers' compiled template in batches, or, for a template that provably
only pastes the messages' contents, one skeleton per role sequence (``skeleton.py``: the same
texts without a jinja render per conversation); ``encode.py`` turns the
texts and spans into token ids and trained flags.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from trnqwen.dataset.encode import TokenizedDocs, tokenize  # noqa: F401  (the pipeline's next step)
from trnqwen.assets import TOKENIZER_FILES, has_tokenizer
from trnqwen.dataset.formats import Example
from trnqwen.dataset.skeleton import Skeletons
from trnqwen.errors import EnvironmentProblem, UsageError

END_OF_TURN = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
_BATCH = 512


def tokenizer_files(assets_dir: Path) -> list[Path]:
    """The snapshot files that decide tokens and template (hashed into the cache key)."""
    return [Path(assets_dir) / name for name in TOKENIZER_FILES if (Path(assets_dir) / name).is_file()]


def load_tokenizer(assets_dir: Path, template=None, context: Optional[dict[str, Any]] = None):
    """The snapshot's fast tokenizer (its chat template comes with it, unless ``template``, a
    :class:`trnqwen.dataset.template.ChatTemplate`, replaces it: checked first that it shows which
    tokens are the answers, rendered with ``context``)."""
    assets_dir = Path(assets_dir)
    if not has_tokenizer(assets_dir):
        raise UsageError(
            f"no tokenizer in {assets_dir}",
            hint="fetch the model first (trnqwen fetch <model>) or point --assets at its snapshot",
        )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise EnvironmentProblem("tokenizing needs transformers", hint="pip install 'trnqwen[train]'") from None
    # A fast tokenizer is data (tokenizer.json + template): no remote code is ever needed for it.
    tokenizer = AutoTokenizer.from_pretrained(str(assets_dir), trust_remote_code=False)
    if not getattr(tokenizer, "is_fast", False):
        raise EnvironmentProblem(f"the tokenizer in {assets_dir} is not a fast tokenizer", hint="the snapshot needs tokenizer.json")
    if template is not None:
        from trnqwen.dataset.template import check_template, use_template

        use_template(tokenizer, template)
        check_template(tokenizer, template.name, context or {}, end_of_turn(tokenizer))
    return tokenizer


def end_of_turn(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    return END_OF_TURN if END_OF_TURN in vocab else (tokenizer.eos_token or END_OF_TURN)


def end_of_text(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    return END_OF_TEXT if END_OF_TEXT in vocab else (tokenizer.eos_token or "")


# --- rendering --------------------------------------------------------------------------


def render(tokenizer, examples: list[Example], *, train_on_inputs: bool,
           context: Optional[dict[str, Any]] = None) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """Each example's text and its trained character spans (see the module rule); ``context``:
    extra template variables (``enable_thinking``)."""
    if examples and examples[0].text is not None:
        tail = end_of_text(tokenizer)
        texts = [ex.text + tail for ex in examples]
        return texts, [[(0, len(t))] for t in texts]
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(
            "the model's tokenizer has no chat template, so chat records cannot be rendered",
            hint="use a model snapshot with a chat template (tokenizer_config.json or chat_template.jinja), "
            "or 'text' records",
        )
    check_special_tokens(tokenizer, examples)
    conversations = [ex.messages for ex in examples]
    context = dict(context or {})
    texts = _render_batched(tokenizer, conversations, examples, generation_prompt=False, context=context)
    for example, text in zip(examples, texts):
        if example.uses_tools:
            _check_tools_rendered(example, text)
    # One prefix per assistant turn located: the messages before it plus the generation prompt.
    # Normally every trained answer; with --train-on-inputs only the "weight": 0 answers, which are
    # then cut out of the whole text.
    owners: list[tuple[int, int]] = []  # (example index, message index of the assistant turn)
    prefixes = []
    for e, messages in enumerate(conversations):
        if train_on_inputs and not examples[e].untrained:
            continue
        for m, message in enumerate(messages):
            if message["role"] == "assistant" and (m in examples[e].untrained) == train_on_inputs:
                owners.append((e, m))
                prefixes.append(messages[:m])
    prefix_texts = _render_batched(tokenizer, prefixes, [examples[e] for e, _ in owners], generation_prompt=True,
                                   context=context)
    marker = end_of_turn(tokenizer)
    located: list[list[tuple[int, int]]] = [[] for _ in examples]
    for (e, m), prefix in zip(owners, prefix_texts):
        located[e].append(_answer_span(examples[e], m, texts[e], prefix, marker, located[e]))
    if not train_on_inputs:
        return texts, located
    return texts, [_outside(spans, len(text)) for spans, text in zip(located, texts)]


def _outside(cut: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """``[0, length)`` without the ``cut`` spans (sorted, disjoint)."""
    out, cursor = [], 0
    for start, end in cut:
        if start > cursor:
            out.append((cursor, start))
        cursor = end
    if cursor < length:
        out.append((cursor, length))
    return out


def check_special_tokens(tokenizer, examples: list[Example]) -> None:
    """A control token written as text inside a message (``<|im_end|>`` in an answer) would be
    read as that token and change the conversation's layout: refused, naming the record."""
    specials = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special]
    if not specials:
        return
    pattern = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))
    if not any("\x00" in s for s in specials):  # one search of every content, "\x00" between them: none found, none there
        joined = "\x00".join(message["content"] for example in examples for message in example.messages or ())
        if not pattern.search(joined):
            return
    for example in examples:
        for i, message in enumerate(example.messages or (), start=1):
            found = pattern.search(message["content"])
            if found:
                raise UsageError(
                    f"{example.where}: message {i} ({message['role']}) content contains the special token "
                    f"{found.group()}, which the tokenizer reads as a control token, not as text",
                    hint="remove or escape it in the data (the chat template writes every control token itself)",
                )


def _check_tools_rendered(example: Example, text: str) -> None:
    """Tool definitions, tool calls and tool results must all reach the rendered text: a template
    that leaves them out would train the answers without the context they depend on."""
    def missing(what: str, needle: str) -> UsageError:
        return UsageError(
            f"{example.where}: the model's chat template does not render {what} ({needle!r} is not in its rendering)",
            hint="use a model whose chat template renders tools (Qwen3's does), or remove the tool parts of the record",
        )

    for tool in example.tools or ():
        spec = tool.get("function", tool)
        name = spec.get("name") if isinstance(spec, dict) else None
        if isinstance(name, str) and name not in text:
            raise missing("the record's 'tools'", name)
    for i, message in enumerate(example.messages, start=1):
        for call in message.get("tool_calls") or ():
            name = call.get("function", call)["name"]
            if name not in text:
                raise missing(f"message {i}'s tool_calls", name)
        if message["role"] == "tool" and message["content"].strip() and message["content"] not in text:
            raise missing(f"message {i} (tool)", message["content"][:40])


def _answer_span(example: Example, m: int, full: str, prefix: str, marker: str, before: list[tuple[int, int]]) -> tuple[int, int]:
    hint = ("use a template that renders earlier turns the same way whatever follows them "
            "(e.g. the model's non-thinking template), or --train-on-inputs")
    if not full.startswith(prefix) or (before and len(prefix) < before[-1][1]):
        raise UsageError(
            f"{example.where}: the chat template renders assistant turn {_turn(example, m)} differently inside the "
            "whole conversation than after its own prefix, so its answer cannot be located exactly",
            hint=hint,
        )
    start = len(prefix)
    end = full.find(marker, start)
    if end < 0:
        raise UsageError(
            f"{example.where}: assistant turn {_turn(example, m)} is not closed by {marker} in the rendered template",
            hint="the model's chat template must end each turn with its end-of-turn token",
        )
    end += len(marker)
    visible = example.messages[m]["content"].split("</think>")[-1].strip()
    if visible and visible not in full[start:end]:
        raise UsageError(
            f"{example.where}: assistant turn {_turn(example, m)}'s text is not where the template's prefix says it is",
            hint=hint,
        )
    return start, end


def _turn(example: Example, m: int) -> int:
    """Which assistant turn (1-based) message ``m`` is (an error's wording)."""
    return sum(1 for msg in example.messages[: m + 1] if msg["role"] == "assistant")


def _render_batched(tokenizer, conversations: list, examples: list[Example], *, generation_prompt: bool,
                    context: dict[str, Any]) -> list[str]:
    skeletons = Skeletons(tokenizer.get_chat_template(), _batch_renderer(tokenizer, context))
    out: list[str] = []
    for lo in range(0, len(conversations), _BATCH):
        chunk = conversations[lo : lo + _BATCH]
        chunk_examples = examples[lo : lo + _BATCH]
        try:
            out.extend(skeletons.render(chunk, generation_prompt, [ex.tools for ex in chunk_examples]))
        except Exception:  # find the record that breaks the template, one by one
            for conversation, example in zip(chunk, chunk_examples):
                out.append(_render_one(tokenizer, conversation, example, generation_prompt, context))
    return out


def _batch_renderer(tokenizer, context: dict[str, Any]):
    """transformers' compiled template (the object ``apply_chat_template`` renders with) called
    directly.  Our messages are already plain ``{role, content}`` string dicts, so its per-call
    copying is not needed, and the template's globals are merged into the context once instead
    of on every render (jinja's ``shared`` context): about twice as fast on chat data.  Any
    failure re-renders that batch through ``apply_chat_template`` itself, one conversation at a
    time, for the error message; the labels tests compare the texts with ``apply_chat_template``."""
    template = tokenizer.get_chat_template()
    extra = dict(tokenizer.special_tokens_map)
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        compiled = _compile_jinja_template(template)
        base = dict(compiled.globals)
        concat = compiled.environment.concat
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other transformers versions
        return lambda chunk, gen, tools: [
            tokenizer.apply_chat_template(c, tools=t, tokenize=False, add_generation_prompt=gen, **context)
            for c, t in zip(chunk, tools)
        ]

    def render_many(chunk, generation_prompt, tools):
        fixed = {**base, "tools": None, "documents": None, "add_generation_prompt": generation_prompt, **extra, **context}
        return [
            concat(compiled.root_render_func(compiled.new_context({**fixed, "messages": messages, "tools": t}, shared=True)))
            for messages, t in zip(chunk, tools)
        ]

    return render_many


def _render_one(tokenizer, conversation, example: Example, generation_prompt: bool, context: dict[str, Any]) -> str:
    try:
        return tokenizer.apply_chat_template(conversation, tools=example.tools, tokenize=False,
                                             add_generation_prompt=generation_prompt, **context)
    except Exception as exc:  # jinja2 errors, raise_exception() in the template, type errors
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(
            f"{example.where}: the model's chat template does not render this conversation ({detail})",
            hint="check the roles and order of its messages against what the model's template accepts",
        ) from None
