"""Record shapes trnqwen understands, detected from the records, normalised to one form.

Every chat format becomes a list of ``{"role": system|user|assistant|tool, "content": str}``
messages; ``text`` stays text (every token trained).  A record that does not fit stops the
whole run with one line naming the file and the record: training on half-understood data is
worse than not starting.

The ``messages`` format reads OpenAI's fine-tuning fields too, and never drops one quietly:
``"weight": 0`` on an assistant message keeps that answer as context only; ``tool_calls`` on an
assistant message, ``role: "tool"`` results and the record's ``tools`` are handed to the model's
chat template (``chat.py`` refuses a record whose template leaves them out); the legacy
``function_call`` / ``functions`` are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trnqwen.dataset.sources import Record
from trnqwen.errors import UsageError

FORMATS = ("messages", "sharegpt", "alpaca", "prompt-completion", "text")
ROLES = ("system", "user", "assistant", "tool")
_PLAIN_ROLES = ("system", "user", "assistant")  # a message of these with only role and non-blank content is taken as is
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
# Field(s) that identify each format, in detection order.
_SIGNATURES = (
    ("messages", ("messages",)),
    ("sharegpt", ("conversations",)),
    ("alpaca", ("instruction", "output")),
    ("prompt-completion", ("prompt", "completion")),
    ("text", ("text",)),
)
_EXPECTED = "messages, conversations, instruction+output, prompt+completion or text"


@dataclass
class Example:
    """One normalised record: ``messages`` for chat formats, ``text`` for plain text."""

    where: str
    messages: Optional[list[dict[str, Any]]] = None
    text: Optional[str] = None
    tools: Optional[list[Any]] = None  # the record's tool definitions, for the chat template
    untrained: tuple[int, ...] = ()  # message indices of assistant answers with "weight": 0

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in self.messages or [])


def detect_format(record: Record, *, columns: Optional[list[str]] = None) -> str:
    """The format of ``record`` (the first one), or a UsageError naming the fields found."""
    if isinstance(record.data, dict):
        for name, fields in _SIGNATURES:
            if all(f in record.data for f in fields):
                return name
        found = list(columns) if columns is not None else list(record.data)
        what = "columns" if columns is not None else "fields"
        raise UsageError(
            f"{record.where}: no recognised {what} (found: {', '.join(map(str, found)) or 'none'})",
            hint=f"records need one of: {_EXPECTED}; or force one with --dataset-format",
        )
    raise UsageError(f"{record.where}: a record must be a JSON object, not {_type(record.data)}")


def normalise(records: list[Record], fmt: str) -> list[Example]:
    """Every record as an :class:`Example` in format ``fmt``; the first bad one raises."""
    convert = _CONVERTERS[fmt]
    return [convert(record) for record in records]


# --- per format ------------------------------------------------------------------------


def _bad(record: Record, what: str, hint: Optional[str] = None) -> UsageError:
    return UsageError(f"{record.where}: {what}", hint=hint or "fix or remove that record")


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _object(record: Record, fmt: str) -> dict[str, Any]:
    if not isinstance(record.data, dict):
        raise _bad(record, f"a record must be a JSON object, not {_type(record.data)}")
    return record.data


def _field(record: Record, data: dict[str, Any], name: str, fmt: str) -> Any:
    if name not in data:
        found = ", ".join(map(str, data)) or "none"
        raise _bad(record, f"no '{name}' field for format {fmt} (found: {found})", "every record needs the same fields")
    return data[name]


def _text(record: Record, value: Any, what: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _bad(record, f"{what} must be a string, not {_type(value)}")
    if not allow_empty and not value.strip():
        raise _bad(record, f"{what} is empty")
    return value


def _check_conversation(record: Record, messages: list[dict[str, Any]], untrained: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    if not any(m["role"] == "assistant" for m in messages):
        raise _bad(record, "conversation has no assistant turn (nothing to learn from)")
    if untrained and all(i in untrained for i, m in enumerate(messages) if m["role"] == "assistant"):
        raise _bad(record, 'every assistant turn has "weight": 0 (nothing to learn from)')
    if messages[0]["role"] == "assistant":
        raise _bad(record, "conversation starts with an assistant turn", "put the user's turn (or a system prompt) first")
    return messages


def _messages(record: Record) -> Example:
    data = _object(record, "messages")
    raw = _field(record, data, "messages", "messages")
    if not isinstance(raw, list) or not raw:
        raise _bad(record, f"'messages' must be a non-empty list, not {_type(raw) if raw != [] else 'an empty list'}")
    if data.get("functions") is not None:  # (Parquet / Hub rows carry every column, null where unused)
        raise _bad(record, "'functions' is OpenAI's legacy form of tool definitions", "write them as 'tools'")
    tools = data.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _bad(record, f"'tools' must be a list of objects, not {_type(tools)}")
    messages, untrained = [], []
    for i, message in enumerate(raw, start=1):
        if type(message) is dict and len(message) == 2:  # the common case, {role, content}: what the checks below pass as is
            role, content = message.get("role"), message.get("content")
            if type(role) is str and role in _PLAIN_ROLES and type(content) is str and content and not content.isspace():
                messages.append({"role": role, "content": content})
                continue
        if not isinstance(message, dict):
            raise _bad(record, f"message {i} must be an object, not {_type(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(record, f"message {i}: unknown role {role!r} (expected {', '.join(ROLES)})")
        if message.get("function_call") is not None:
            raise _bad(record, f"message {i} ({role}) has 'function_call', OpenAI's legacy form of a tool call",
                       "write it as 'tool_calls'")
        out: dict[str, Any] = {"role": role}
        calls = message.get("tool_calls")
        if calls and role != "assistant":  # (an empty list or null, as some exporters write, says nothing)
            raise _bad(record, f"message {i} ({role}) has 'tool_calls': only assistant messages call tools")
        if calls:
            out["tool_calls"] = _tool_calls(record, i, calls)
        content = message.get("content")
        if calls and content is None:  # a turn of tool calls only: no text, and that is fine
            content = ""
        out["content"] = _text(record, content, f"message {i} ({role}) content", allow_empty=bool(calls) or role == "tool")
        if role == "tool":
            out.update({k: message[k] for k in ("tool_call_id", "name") if isinstance(message.get(k), str)})
        if _weight(record, i, role, message) == 0 and role == "assistant":
            untrained.append(len(messages))
        messages.append(out)
    untrained_turns = tuple(untrained)
    return Example(record.where, messages=_check_conversation(record, messages, untrained_turns), tools=tools or None,
                   untrained=untrained_turns)


def _weight(record: Record, i: int, role: str, message: dict[str, Any]) -> int:
    """OpenAI's per-message ``weight``: 1 trains an assistant answer (the default), 0 keeps it as
    context only.  Other turns are never trained, so only 0 fits them."""
    weight = message.get("weight")
    if weight is None:  # absent, or null in a Parquet / Hub row whose other messages have one
        return 1
    if isinstance(weight, bool) or weight not in (0, 1):
        raise _bad(record, f"message {i} ({role}): 'weight' must be 0 or 1, not {weight!r}")
    if weight == 1 and role != "assistant":
        raise _bad(record, f"message {i} ({role}) has 'weight': 1, but only assistant answers are trained",
                   "drop the weight, or use --train-on-inputs to train every token")
    return int(weight)


def _tool_calls(record: Record, i: int, calls: Any) -> list[dict[str, Any]]:
    """OpenAI's ``[{"type": "function", "function": {"name", "arguments"}}]``, checked and kept as is."""
    if not isinstance(calls, list):
        raise _bad(record, f"message {i} (assistant): 'tool_calls' must be a list, not {_type(calls)}")
    for n, call in enumerate(calls, start=1):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(record, f"message {i} (assistant): tool call {n} has no function name",
                       'write each call as {"type": "function", "function": {"name": ..., "arguments": ...}}')
    return calls


def _sharegpt(record: Record) -> Example:
    data = _object(record, "sharegpt")
    raw = _field(record, data, "conversations", "sharegpt")
    if not isinstance(raw, list) or not raw:
        raise _bad(record, f"'conversations' must be a non-empty list, not {_type(raw)}")
    messages = []
    for i, turn in enumerate(raw, start=1):
        if not isinstance(turn, dict):
            raise _bad(record, f"turn {i} must be an object, not {_type(turn)}")
        speaker = turn.get("from")
        if speaker not in SHAREGPT_ROLES:
            raise _bad(record, f"turn {i}: unknown role {speaker!r} in 'from' (expected system, human or gpt)")
        content = _text(record, turn.get("value"), f"turn {i} ({speaker}) value")
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": content})
    return Example(record.where, messages=_check_conversation(record, messages))


def _alpaca(record: Record) -> Example:
    data = _object(record, "alpaca")
    instruction = _text(record, _field(record, data, "instruction", "alpaca"), "'instruction'")
    extra = data.get("input")
    extra = "" if extra is None else _text(record, extra, "'input'", allow_empty=True)
    output = _text(record, _field(record, data, "output", "alpaca"), "'output'")
    user = instruction if not extra.strip() else f"{instruction}\n\n{extra}"
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    system = data.get("system")
    if system is not None and _text(record, system, "'system'", allow_empty=True).strip():
        messages.insert(0, {"role": "system", "content": system})
    return Example(record.where, messages=messages)


def _prompt_completion(record: Record) -> Example:
    data = _object(record, "prompt-completion")
    prompt = _text(record, _field(record, data, "prompt", "prompt-completion"), "'prompt'")
    completion = _text(record, _field(record, data, "completion", "prompt-completion"), "'completion'")
    return Example(record.where, messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}])


def _plain_text(record: Record) -> Example:
    data = _object(record, "text")
    return Example(record.where, text=_text(record, _field(record, data, "text", "text"), "'text'"))


_CONVERTERS = {
    "messages": _messages,
    "sharegpt": _sharegpt,
    "alpaca": _alpaca,
    "prompt-completion": _prompt_completion,
    "text": _plain_text,
}
