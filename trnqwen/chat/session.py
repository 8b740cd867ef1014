"""The conversation and its loop, apart from any model: what ``trnqwen chat`` keeps and does per line.

A :class:`ChatSession` holds the system prompt and the turns so far; each question is sent with the
whole conversation (the engine renders it with the model's chat template, or the server does).
:func:`run_chat` reads a line, runs a command (``/reset``, ``/exit``, ``/help``) or asks the engine,
writes the answer piece by piece as it streams, and records the turn.  Ctrl-D or Ctrl-C at the
prompt leaves cleanly; Ctrl-C during an answer stops that answer (it is not kept) and the prompt
comes back.  An engine's error during a turn is one line; the conversation goes on without that turn.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Protocol

from trnqwen.errors import TrnqwenError

PROMPT = ">>> "
EXIT_COMMANDS = ("/exit", "/quit", "/bye")
RESET_COMMAND = "/reset"
HELP_COMMANDS = ("/help", "/?")
COMMANDS_LINE = "/reset starts the conversation over (the system prompt stays), /exit or Ctrl-D leaves"


class Reasoning(str):
    """A piece of the model's thinking, shown as it streams but not kept in the conversation (a server
    with a reasoning parser sends it apart from the answer: ``reasoning_content``)."""


@dataclass
class Sampling:
    """How answers are drawn.  ``temperature`` 0 is greedy decoding; None leaves the model's
    generation_config.json (or the server's default) in charge; likewise ``top_p``."""

    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_new_tokens: int = 512
    enable_thinking: Optional[bool] = None  # None: the chat template's own default

    @property
    def greedy(self) -> bool:
        return self.temperature is not None and self.temperature == 0

    def template_kwargs(self) -> dict[str, bool]:
        """What the chat template is rendered with (Qwen3's templates read ``enable_thinking``)."""
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}


class Engine(Protocol):
    """Something that answers a conversation: the pieces of the next assistant message, as they come."""

    description: str  # what the banner names: the model and where it runs

    def stream(self, messages: list[dict[str, str]], sampling: Sampling) -> Iterator[str]: ...


@dataclass
class ChatSession:
    system: Optional[str] = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, question: Optional[str] = None) -> list[dict[str, str]]:
        """The conversation as chat messages: the system prompt, every turn, then ``question``."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [dict(m) for m in self.turns]
        if question is not None:
            out.append({"role": "user", "content": question})
        return out

    def record(self, question: str, answer: str) -> None:
        self.turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        self.turns.clear()


@dataclass
class ChatIO:
    """Where the loop reads questions and writes answers (the terminal by default)."""

    read: Callable[[], str]  # one line; EOFError at the end (Ctrl-D), KeyboardInterrupt on Ctrl-C
    write: Callable[[str], None]  # a piece of an answer, shown at once
    note: Callable[[str], None]  # a line about the chat itself (reset, errors), apart from the answers


def terminal_io() -> ChatIO:
    """stdin/stdout with line editing where readline exists; the prompt only when stdin is a terminal
    (``echo hi | trnqwen chat`` prints the answer alone)."""
    try:
        import readline  # noqa: F401  (input() then edits lines and keeps their history)
    except ImportError:
        pass
    prompt = PROMPT if sys.stdin.isatty() else ""

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def note(text: str) -> None:
        from rich.markup import escape

        from trnqwen import output

        output.info(escape(text))  # a server's words or a path, never rich markup ("[/v1/models]")

    def read() -> str:
        try:
            return input(prompt)
        except (EOFError, KeyboardInterrupt):
            if prompt:
                write("\n")  # the shell's prompt on a line of its own
            raise

    return ChatIO(read=read, write=write, note=note)


def run_chat(engine: Engine, session: ChatSession, sampling: Sampling, io: ChatIO) -> int:
    """Read, answer, repeat until /exit, Ctrl-D or Ctrl-C at the prompt; returns the turns answered."""
    answered = 0
    while True:
        try:
            line = io.read()
        except (EOFError, KeyboardInterrupt):
            return answered
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command = text.split()[0].lower()
            if command in EXIT_COMMANDS:
                return answered
            if command == RESET_COMMAND:
                session.reset()
                io.note("the conversation starts over" + (" (the system prompt stays)" if session.system else ""))
            elif command in HELP_COMMANDS:
                io.note(COMMANDS_LINE)
            else:
                io.note(f"unknown command {command}: {COMMANDS_LINE}")
            continue
        answer = ask(engine, session, sampling, io, text)
        if answer is not None:
            session.record(text, answer)
            answered += 1


def ask(engine: Engine, session: ChatSession, sampling: Sampling, io: ChatIO, question: str) -> Optional[str]:
    """One turn: the answer streamed to ``io`` and returned (its thinking shown, not returned); None
    when it was stopped (Ctrl-C) or the engine failed, said in one line."""
    pieces = engine.stream(session.messages(question), sampling)
    kept: list[str] = []
    shown = ""
    try:
        for piece in pieces:
            if not piece:
                continue
            io.write(piece)
            shown = piece
            if not isinstance(piece, Reasoning):
                kept.append(str(piece))
    except KeyboardInterrupt:
        io.write("\n")
        io.note("answer stopped (Ctrl-C), not kept; Ctrl-C at the prompt leaves")
        return None
    except TrnqwenError as exc:
        if shown:
            io.write("\n")
        io.note(f"error: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        return None
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()  # a generator's cleanup: the generation thread stopped, the response closed
    if not shown.endswith("\n"):
        io.write("\n")
    return "".join(kept)


def assemble(pieces: Iterable[str]) -> str:
    """The answer a stream of pieces makes (its thinking left out), as :func:`ask` keeps it."""
    return "".join(str(p) for p in pieces if not isinstance(p, Reasoning))
