"""Preference records in the shapes people have, normalised to one form.

Accepted, detected from the first record:

* **TRL's** ``prompt`` / ``chosen`` / ``rejected``, each a string or a message list.  A string
  prompt is one user turn; a string side is one assistant turn.
* **Implicit prompt** (TRL's other shape, and UltraFeedback-binarized's ``chosen``/``rejected``):
  each side is the whole conversation; the prompt is what both share up to the last non-assistant
  turn (a ``prompt`` string beside them is then only a label).
* **Conversation + replies** (UltraFeedback-style and LLaMA-Factory's sharegpt preference sets):
  ``messages`` or ``conversations`` (``from``/``value`` turns) with ``chosen`` / ``rejected`` as a
  string, one message, or a list of assistant messages.

Every pair becomes a :class:`PreferencePair`: the prompt's messages (ending with a user turn) and
each side's assistant messages.  A record that cannot be one stops the run with one line naming
it (missing side, empty answer, chosen identical to rejected, a prompt with no user turn...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trnqwen.dataset.formats import ROLES, SHAREGPT_ROLES
from trnqwen.dataset.sources import Record
from trnqwen.errors import UsageError

PREFERENCE_FORMATS = ("prompt-chosen-rejected", "conversation-chosen-rejected")
_SIDES = ("chosen", "rejected")


@dataclass
class PreferencePair:
    """One normalised preference record."""

    where: str
    prompt: list[dict[str, str]]
    chosen: list[dict[str, str]]
    rejected: list[dict[str, str]]

    def conversation(self, side: str) -> list[dict[str, str]]:
        return self.prompt + (self.chosen if side == "chosen" else self.rejected)


def detect_preference_format(record: Record, *, method: Optional[str] = None) -> str:
    """The preference format of ``record`` (``method``: the run's method, named in the hint)."""
    data = record.data
    if not isinstance(data, dict):
        raise _bad(record, f"a preference record must be a JSON object, not {type(data).__name__}")
    if any(k in data for k in ("messages", "conversations")) and any(s in data for s in _SIDES):
        return "conversation-chosen-rejected"
    if any(s in data for s in _SIDES):
        return "prompt-chosen-rejected"
    found = ", ".join(map(str, data)) or "none"
    raise UsageError(
        f"{record.where}: not a preference record (found: {found})",
        hint=f"{f'--method {method}' if method else 'a preference method'} reads prompt/chosen/rejected records, "
             "or messages (or conversations) with chosen/rejected",
    )


def normalise_pairs(records: list[Record], fmt: str) -> list[PreferencePair]:
    """Every record as a :class:`PreferencePair`; the first bad one raises (exit 2, named)."""
    if fmt not in PREFERENCE_FORMATS:
        raise UsageError(f"unknown preference format {fmt!r}", hint=f"one of: {', '.join(PREFERENCE_FORMATS)}")
    return [_pair(record, fmt) for record in records]


# --- one record -----------------------------------------------------------------------------


def _bad(record: Record, what: str, hint: str = "fix or remove that record") -> UsageError:
    return UsageError(f"{record.where}: {what}", hint=hint)


def _message(record: Record, raw: Any, what: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise _bad(record, f"{what} must be an object, not {type(raw).__name__}")
    if "from" in raw and "role" not in raw:
        role = SHAREGPT_ROLES.get(raw.get("from"))
        content = raw.get("value")
    else:
        role, content = raw.get("role"), raw.get("content")
    if role not in ROLES:
        raise _bad(record, f"{what}: unknown role {raw.get('role', raw.get('from'))!r} (expected {', '.join(ROLES)})")
    if not isinstance(content, str):
        raise _bad(record, f"{what} ({role}) content must be a string, not {type(content).__name__}")
    return {"role": role, "content": content}


def _messages(record: Record, raw: Any, what: str) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise _bad(record, f"{what} must be a list of messages, not {type(raw).__name__}")
    return [_message(record, m, f"{what} message {i}") for i, m in enumerate(raw, start=1)]


def _side(record: Record, data: dict, name: str) -> list[dict[str, str]]:
    if name not in data or data[name] is None:
        raise _bad(record, f"no '{name}' answer (a preference pair needs both chosen and rejected)")
    raw = data[name]
    if isinstance(raw, str):
        return [{"role": "assistant", "content": raw}]
    if isinstance(raw, dict):
        return [_message(record, raw, f"'{name}'")]
    return _messages(record, raw, f"'{name}'")


def _split_conversation(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(everything up to the last non-assistant turn, the assistant turns after it)."""
    last = max((i for i, m in enumerate(messages) if m["role"] != "assistant"), default=-1)
    return messages[: last + 1], messages[last + 1 :]


def _pair(record: Record, fmt: str) -> PreferencePair:
    data = record.data
    if not isinstance(data, dict):
        raise _bad(record, f"a preference record must be a JSON object, not {type(data).__name__}")
    sides = {name: _side(record, data, name) for name in _SIDES}
    if fmt == "conversation-chosen-rejected":
        key = "messages" if "messages" in data else "conversations"
        prompt = _messages(record, data.get(key), f"'{key}'")
    else:
        if "prompt" not in data and not any(m["role"] != "assistant" for m in sides["chosen"]):
            raise _bad(record, "no 'prompt' (and chosen/rejected do not carry the conversation)")
        raw = data.get("prompt")
        prompt = [{"role": "user", "content": raw}] if isinstance(raw, str) else (
            _messages(record, raw, "'prompt'") if raw is not None else [])
    # Sides that carry the conversation themselves (implicit prompt, UltraFeedback-binarized).
    carried = {}
    for name in _SIDES:
        head, tail = _split_conversation(sides[name])
        if not tail:
            raise _bad(record, f"the {name} answer is empty (no assistant turn)")
        if head:
            carried[name] = head
            sides[name] = tail
    if carried:
        if len(carried) == 1 or carried["chosen"] != carried["rejected"]:
            raise _bad(record, "chosen and rejected continue different conversations (their turns before the answer differ)")
        if isinstance(data.get("prompt"), list) and prompt and prompt != carried["chosen"]:
            raise _bad(record, "'prompt' differs from the conversation that chosen and rejected carry")
        prompt = carried["chosen"]
    return _checked(record, PreferencePair(record.where, prompt, sides["chosen"], sides["rejected"]))


def _checked(record: Record, pair: PreferencePair) -> PreferencePair:
    if not any(m["role"] == "user" for m in pair.prompt):
        raise _bad(record, "the prompt has no user turn (there is nothing for the answers to answer)")
    if pair.prompt[-1]["role"] != "user":
        raise _bad(record, f"the prompt ends with a {pair.prompt[-1]['role']} turn, not a user turn")
    if pair.prompt[0]["role"] == "assistant":
        raise _bad(record, "the prompt starts with an assistant turn", "put the user's turn (or a system prompt) first")
    for name in _SIDES:
        side = getattr(pair, name)
        if not side:
            raise _bad(record, f"the {name} answer is empty")
        if any(m["role"] != "assistant" for m in side):
            raise _bad(record, f"the {name} answer has a {side[0]['role']} turn; answers are assistant turns only")
        if not all(m["content"].strip() for m in side):
            raise _bad(record, f"the {name} answer is empty")
    if pair.chosen == pair.rejected:
        raise _bad(record, "chosen and rejected are the same answer (there is nothing to prefer)")
    return pair
