"""``--chat-template``: a chat template of one's own for the data, the training, eval and the export.

The model snapshot's template is the default.  ``--chat-template FILE.jinja`` (or a built-in
name) replaces it: the data is rendered with it (``chat.py``; its text is hashed into the cache
key), so training and eval (which reads the run's cache) use it, and the launcher writes it into
the export's tokenizer folder (``chat_template.jinja``), so the served model is prompted as it
was trained.  ``--enable-thinking`` / ``--no-enable-thinking`` is handed to the template as
Qwen3's hybrid templates read it.

Built-in names:

* ``chatml``: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, the assistant header as
  the generation prompt (Qwen's layout; a template for a base model that has none);
* ``chatml-think``: the same, but with ``enable_thinking`` false every assistant turn (and the
  generation prompt) opens with an empty ``<think>\\n\\n</think>\\n\\n`` block, as Qwen3's hybrid
  models answer without thinking.  The block is context, never trained.

A template must let trnqwen find the assistant's tokens: :func:`check_template` renders a probe
conversation before any data, and a template that hides the answer (leaves it out, renders it
differently after its own prefix, or never closes the turn with the end-of-turn token) is refused
with that reason.  The per-record checks of ``chat.py`` still run on every conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trnqwen.errors import UsageError
from trnqwen.fsutil import expand_user

_TURN = "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
_NO_THINK = "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
BUILTIN = {
    "chatml": (
        "{%- for message in messages %}" + _TURN + "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    "chatml-think": (
        "{%- for message in messages %}"
        "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}" + _NO_THINK
        + "{{- message['content'] + '<|im_end|>' + '\\n' }}"
        "{%- else %}" + _TURN + "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}" + _NO_THINK + "{%- endif %}"
    ),
}
EXPORT_FILE = "chat_template.jinja"  # where transformers reads a tokenizer folder's template first
_PROBE = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "2 plus 3 is 5."}]


@dataclass(frozen=True)
class ChatTemplate:
    """A chosen template: its name (a built-in's, or the file as given) and its text."""

    name: str
    text: str


def resolve_template(choice: Optional[str]) -> Optional[ChatTemplate]:
    """``--chat-template``: a built-in name or a template file; None keeps the snapshot's."""
    if not choice:
        return None
    if choice in BUILTIN:
        return ChatTemplate(choice, BUILTIN[choice])
    path = expand_user(choice)
    if not path.is_file():
        known = ", ".join(BUILTIN)
        raise UsageError(
            f"--chat-template {choice}: {'not a file' if path.exists() else 'no such file'}, nor a built-in name ({known})",
            hint="pass a Jinja chat template file (like a model's chat_template.jinja) or a built-in name",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--chat-template {choice}: cannot be read ({exc})", hint="save it as UTF-8 text") from None
    if not text.strip():
        raise UsageError(f"--chat-template {choice} is empty", hint="pass a Jinja chat template file")
    return ChatTemplate(str(choice), text)


def use_template(tokenizer, template: Optional[ChatTemplate]) -> None:
    """Render with ``template`` instead of the snapshot's (its compiled form is transformers')."""
    if template is not None:
        tokenizer.chat_template = template.text


def template_context(enable_thinking: Optional[bool]) -> dict[str, Any]:
    """The extra variables a template is rendered with (``enable_thinking`` only when set)."""
    return {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}


def check_template(tokenizer, name: str, context: dict[str, Any], marker: str) -> None:
    """Refuse a template that hides which tokens are the assistant's, with the reason (see the module)."""
    def refuse(reason: str) -> UsageError:
        return UsageError(
            f"the chat template {name} hides which tokens are the assistant's answer: {reason}",
            hint="fix the template (each answer written as it is, after the prefix the generation prompt "
            f"renders, closed by {marker}), or pick another one",
        )

    try:
        full = tokenizer.apply_chat_template(_PROBE, tokenize=False, **context)
        prefix = tokenizer.apply_chat_template(_PROBE[:1], tokenize=False, add_generation_prompt=True, **context)
    except Exception as exc:  # jinja2 errors, raise_exception() in the template
        raise UsageError(f"the chat template {name} does not render a plain user/assistant conversation "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                         hint="check the template's syntax and the roles it accepts") from None
    answer = _PROBE[1]["content"]
    if answer not in full:
        raise refuse("it leaves the answer's text out of the conversation")
    if not full.startswith(prefix):
        raise refuse("the conversation does not start with what the generation prompt renders "
                     "(the answer's first token cannot be found)")
    rest = full[len(prefix):]
    if answer not in rest:
        raise refuse("the answer is not after the generation prompt")
    if marker not in rest[rest.index(answer) + len(answer):]:
        raise refuse(f"the answer's turn is not closed by {marker} (the model would not learn to stop)")


def export_template(folder: Path, text: str) -> list[str]:
    """Write the trained template into an export's tokenizer folder: ``chat_template.jinja`` (which
    transformers reads first) and tokenizer_config.json's ``chat_template`` where it has one (for
    readers of that file alone); the names written."""
    import json

    from trnqwen.fsutil import write_text_atomic

    written = []
    path = Path(folder) / EXPORT_FILE
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text_atomic(path, text)
        written.append(EXPORT_FILE)
    config_path = Path(folder) / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if isinstance(config.get("chat_template"), str) and config["chat_template"] != text:
            config["chat_template"] = text
            write_text_atomic(config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
            written.append(config_path.name)
    return written
