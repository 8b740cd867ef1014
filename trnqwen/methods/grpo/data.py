"""GRPO's data: prompts in TRL's GRPO format, rendered for the model, and the preview ``trnqwen
data --method grpo`` shows.

Public API (names are stable; the rank integration builds on them):

* :func:`load_prompts` (a .jsonl/.json/.parquet file, a folder of them or a Hub dataset, read by
  :mod:`trnqwen.dataset.sources`) -> ``[PromptRecord]``: each record's ``prompt`` (TRL's format:
  a string, used as it is, or a message list, rendered with the chat template and the generation
  prompt) and every other column, kept unchanged for the rewards.  A bad record is a
  ``UsageError`` naming its file and line;
* :func:`encode_prompts` (tokenizer, records, ``seq_len``, ``max_completion_length``,
  ``enable_thinking``) -> :class:`PromptSet`: the rendered texts and token ids of the prompts that
  leave room for a whole completion (``prompt tokens <= seq_len - max_completion_length``; TRL
  1.16 never cuts a prompt, nor does trnqwen), and the ones dropped, named;
* :func:`render_prompts`: the texts alone (``enable_thinking``: Qwen3's thinking switch, passed to
  the template; None leaves the template's default);
* :func:`column_names`; :func:`reward_columns`: the columns a batch's reward functions receive, one value per
  completion (each record's value repeated for its ``num_generations`` completions; a column a
  record lacks is None, as in a ``datasets`` table);
* :func:`preview`: plain data for ``trnqwen data --method grpo``: records kept and dropped (why,
  where), prompt token lengths against the room left for completions, the columns the rewards
  get, one rendered prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from trnqwen.dataset.formats import ROLES, Example
from trnqwen.dataset.sources import Record, resolve_source
from trnqwen.errors import UsageError

Prompt = Union[str, list]  # TRL's "prompt": a string, or a list of {"role", "content"} messages
_HINT = ('each record needs a "prompt": a string, or a list of {"role": ..., "content": ...} messages ending '
         'with a user turn; other fields (answer, solution, tests...) go to the reward functions')


@dataclass
class PromptRecord:
    where: str  # "prompts.jsonl line 7"
    prompt: Prompt
    columns: dict[str, Any] = field(default_factory=dict)  # every other field, unchanged

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)


def load_prompts(dataset: Union[str, Path], *, split: str = "train", prompt_column: str = "prompt") -> list[PromptRecord]:
    """Every record of ``dataset`` as a :class:`PromptRecord`; the first bad one raises, named."""
    source = resolve_source(dataset, split=split)
    records = [_record(r, prompt_column) for r in source.records()]
    if not records:
        raise UsageError(f"dataset {source.name} has no records", hint=_HINT)
    kinds = {r.conversational for r in records}
    if len(kinds) > 1:
        first = records[0]
        odd = next(r for r in records if r.conversational != first.conversational)
        what = {True: "a message list", False: "a string"}
        raise UsageError(f"{odd.where}: the prompt is {what[odd.conversational]}, but {first.where}'s is "
                         f"{what[first.conversational]}", hint="use one prompt shape for the whole dataset")
    return records


def _bad(record: Record, what: str) -> UsageError:
    return UsageError(f"{record.where}: {what}", hint=_HINT)


def _record(record: Record, prompt_column: str) -> PromptRecord:
    data = record.data
    if not isinstance(data, dict):
        raise _bad(record, f"a prompt record must be a JSON object, not {type(data).__name__}")
    if prompt_column not in data:
        found = ", ".join(map(str, data)) or "none"
        raise _bad(record, f"no {prompt_column!r} field (found: {found})")
    raw = data[prompt_column]
    columns = {k: v for k, v in data.items() if k != prompt_column}
    if isinstance(raw, str):
        if not raw.strip():
            raise _bad(record, "the prompt is empty")
        return PromptRecord(record.where, raw, columns)
    if not isinstance(raw, list) or not raw:
        kind = "an empty list" if isinstance(raw, list) else type(raw).__name__
        raise _bad(record, f"the prompt must be a string or a list of messages, not {kind}")
    messages = []
    for i, message in enumerate(raw, start=1):
        if not isinstance(message, dict):
            raise _bad(record, f"prompt message {i} must be an object, not {type(message).__name__}")
        role, text = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _bad(record, f"prompt message {i}: unknown role {role!r} (expected {', '.join(ROLES)})")
        if not isinstance(text, str):
            raise _bad(record, f"prompt message {i} ({role}) content must be a string, not {type(text).__name__}")
        messages.append({**message, "role": role, "content": text})
    if messages[-1]["role"] != "user":
        role = messages[-1]["role"]
        raise _bad(record, f"the prompt ends with {'an' if role[0] in 'aeiou' else 'a'} {role} turn, not a user "
                           "turn (the model answers after it)")
    return PromptRecord(record.where, messages, columns)


def render_prompts(tokenizer, records: Sequence[PromptRecord], *, enable_thinking: Optional[bool] = None) -> list[str]:
    """Each prompt as the model reads it: a conversation through the chat template with the
    generation prompt; a string as it is (TRL's rule for standard prompts)."""
    from trnqwen.dataset.chat import check_special_tokens

    conversations = [r for r in records if r.conversational]
    if conversations:
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError("the model's tokenizer has no chat template, so message-list prompts cannot be rendered",
                             hint="use a model snapshot with a chat template, or plain string prompts")
        check_special_tokens(tokenizer, [Example(r.where, messages=r.prompt) for r in conversations])
    extra = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    texts = []
    for r in records:
        if not r.conversational:
            texts.append(r.prompt)
            continue
        try:
            texts.append(tokenizer.apply_chat_template(r.prompt, tokenize=False, add_generation_prompt=True, **extra))
        except Exception as exc:  # jinja errors, raise_exception() in the template
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"{r.where}: the model's chat template does not render this prompt ({detail})",
                             hint="check the roles and order of its messages") from None
    return texts


@dataclass
class EncodedPrompt:
    record: PromptRecord
    text: str  # what the model reads
    ids: list[int]


@dataclass
class PromptSet:
    prompts: list[EncodedPrompt]  # kept, in the data's order
    dropped: list[tuple[str, int]]  # (where, prompt tokens) of the prompts that leave no room
    room: int  # the most prompt tokens a kept prompt may have (seq_len - max_completion_length)


def encode_prompts(tokenizer, records: Sequence[PromptRecord], *, seq_len: int, max_completion_length: int,
                   enable_thinking: Optional[bool] = None) -> PromptSet:
    """Rendered and tokenized prompts; those longer than the room a whole completion leaves are
    dropped (counted, named).  Every prompt dropped is a ``UsageError``."""
    room = int(seq_len) - int(max_completion_length)
    if room <= 0:
        raise UsageError(f"--max-completion-length {max_completion_length} leaves no room for a prompt in "
                         f"--seq-len {seq_len}", hint="raise --seq-len or lower --max-completion-length")
    texts = render_prompts(tokenizer, records, enable_thinking=enable_thinking)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    kept, dropped = [], []
    for record, text, tokens in zip(records, texts, ids):
        if len(tokens) > room:
            dropped.append((record.where, len(tokens)))
        else:
            kept.append(EncodedPrompt(record, text, list(tokens)))
    if records and not kept:
        longest = max(n for _, n in dropped)
        raise UsageError(f"every prompt is longer than the {room} tokens left for it ({seq_len} - {max_completion_length} "
                         f"for the completion; the shortest has {min(n for _, n in dropped)}, the longest {longest})",
                         hint="raise --seq-len or lower --max-completion-length")
    return PromptSet(kept, dropped, room)


def reward_columns(records: Sequence[PromptRecord], num_generations: int = 1) -> dict[str, list]:
    """``{column: [value per completion]}`` for a batch of ``records`` (prompt-major, each repeated
    ``num_generations`` times); a column some record lacks is None there."""
    return {k: [r.columns.get(k) for r in records for _ in range(num_generations)] for k in column_names(records)}


def column_names(records: Sequence[PromptRecord]) -> list[str]:
    """Every column beside the prompt, in first-seen order."""
    names: dict[str, None] = {}
    for r in records:
        names.update(dict.fromkeys(r.columns))
    return list(names)


def preview(tokenizer, records: Sequence[PromptRecord], *, seq_len: int, max_completion_length: int,
            enable_thinking: Optional[bool] = None, shown: int = 5) -> dict[str, Any]:
    """What ``trnqwen data --method grpo`` reports, as plain data."""
    encoded = encode_prompts(tokenizer, records, seq_len=seq_len, max_completion_length=max_completion_length,
                             enable_thinking=enable_thinking)
    lengths = sorted(len(p.ids) for p in encoded.prompts)
    sample = encoded.prompts[0]
    return {
        "format": "prompt (messages)" if records[0].conversational else "prompt (text)",
        "records": len(records),
        "kept": len(encoded.prompts),
        "dropped": len(encoded.dropped),
        "dropped_reasons": {"longer than the room left for a completion": len(encoded.dropped)} if encoded.dropped else {},
        "dropped_records": [f"{where} ({n} tokens)" for where, n in encoded.dropped[:shown]],
        "seq_len": int(seq_len),
        "max_completion_length": int(max_completion_length),
        "room": encoded.room,
        "prompt_tokens": {"min": lengths[0], "mean": round(sum(lengths) / len(lengths), 1),
                          "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))], "max": lengths[-1]},
        "columns": column_names(records),
        "enable_thinking": enable_thinking,
        "sample": {"where": sample.record.where, "text": sample.text, "tokens": len(sample.ids)},
    }
