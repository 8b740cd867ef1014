"""Chat-template renders without jinja, where the template provably only pastes each message's content.

``chat.render`` renders every conversation once and, to locate the answers, once more per
answer (the messages before it with the generation prompt): about 2.5 jinja renders a
conversation, a quarter of bounded preparation's per-record work.  Most conversations of a
dataset share a few role sequences (system, user, assistant, ...), so when the template's output
depends on the messages only through their roles and, verbatim, their contents, a conversation's
rendering is its role sequence's rendering with sentinels in place of the contents
(:class:`Skeletons`: rendered once per role sequence), the contents pasted back in.

That property is decided from the template's syntax tree (:func:`pastes_content`), conservatively:
``messages`` is only looped over (``for m in messages``) or measured (``messages|length``); the
loop variable is only subscripted with ``role`` or ``content``; every ``content`` is output as
it is (alone or joined by ``+`` / ``~`` in a ``{{ }}``: never tested, filtered, called, assigned or
passed on); no blocks that capture or transform output (macros, call/filter/set blocks,
autoescape, includes); ``loop.previtem`` / ``nextitem`` never used.  Control flow can then
depend only on the roles and the fixed variables, so the skeleton with contents pasted back is
byte for byte jinja's text.  A conversation whose messages carry more than ``role`` and
``content`` (tool calls, a tool message's name), or a record with tools, is rendered by jinja;
so is every conversation of a template that fails the test (Qwen3's own templates test their
contents for ``</think>`` and tool responses): :data:`COUNTS` says how many went each way.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

_SENTINEL = "\x00\x01{}\x01\x00"
_SENTINEL_SPLIT = re.compile("\x00\x01([0-9]+)\x01\x00")
_FIELDS = frozenset(("role", "content"))
Message = dict[str, str]  # {"role", "content"}: what the fast path takes
# (conversations, generation prompt?, each one's tools or None) -> texts: jinja's own render of each
RenderMany = Callable[[list[list[Message]], bool, list[Optional[list[dict]]]], list[str]]


@dataclass
class Counts:
    """Conversations rendered from skeletons and by jinja in this process, and why jinja was used."""

    skeleton: int = 0
    jinja: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def fell_back(self, reason: str, n: int) -> None:
        if reason not in self.reasons:  # once a reason per process: the totals come with the chunks
            _log.info("chat template rendered by jinja, not from role skeletons: %s", reason)
        self.jinja += n
        self.reasons[reason] = self.reasons.get(reason, 0) + n

    def totals(self) -> tuple[int, int]:
        return self.skeleton, self.jinja


COUNTS = Counts()
_log = logging.getLogger(__name__)


def _content_key(node) -> bool:
    """``x['content']`` or ``x.content``."""
    from jinja2 import nodes

    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    return isinstance(node, nodes.Getattr) and node.attr == "content"


def _key(node) -> Optional[str]:
    from jinja2 import nodes

    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return node.arg.value
    if isinstance(node, nodes.Getattr):
        return node.attr
    return None


@functools.lru_cache(maxsize=16)
def pastes_content(template: str) -> Optional[str]:
    """None when ``template`` only pastes message contents (the module's rule), else why not."""
    try:
        from jinja2 import nodes
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(template).environment
        tree = environment.parse(template)
    except Exception as exc:  # noqa: BLE001 - any failure means: not provable, use jinja
        return f"template not parsed ({type(exc).__name__})"
    if environment.autoescape or environment.finalize is not None:
        return "output is escaped or finalised"
    forbidden = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock, nodes.Include, nodes.Import,
                 nodes.FromImport, nodes.Extends, nodes.Block, nodes.ScopedEvalContextModifier, nodes.EvalContextModifier)
    parent: dict[int, object] = {}
    for node in tree.find_all(nodes.Node):
        for child in node.iter_child_nodes():
            parent[id(child)] = node
    loop_vars = set()
    for loop in tree.find_all(nodes.For):
        if isinstance(loop.iter, nodes.Name) and loop.iter.name == "messages":
            if not isinstance(loop.target, nodes.Name):
                return "messages unpacked in a loop"
            loop_vars.add(loop.target.name)
    for node in tree.find_all(nodes.Node):
        if isinstance(node, forbidden):
            return f"a {type(node).__name__} block"
        if isinstance(node, nodes.Getattr) and node.attr in ("previtem", "nextitem"):
            return f"loop.{node.attr}"
        if not isinstance(node, nodes.Name):
            continue
        up = parent.get(id(node))
        if node.name == "messages":
            if isinstance(up, nodes.For) and up.iter is node:
                continue
            if isinstance(up, nodes.Filter) and up.name == "length" and up.node is node and not up.args:
                continue
            return "messages used other than looped over or measured"
        if node.name in loop_vars:
            if isinstance(up, nodes.For) and up.target is node:
                continue
            if _key(up) not in _FIELDS or getattr(up, "node", None) is not node:
                return f"a message ({node.name}) used other than by its role or content"
            if _content_key(up) and not _pasted(up, parent):
                return "a message's content used other than output as it is"
    return None


def _pasted(node, parent: dict[int, object]) -> bool:
    """``node`` reaches a ``{{ }}`` output only through string concatenation."""
    from jinja2 import nodes

    while True:
        up = parent.get(id(node))
        if isinstance(up, nodes.Output):
            return True
        if isinstance(up, nodes.Add) or (isinstance(up, nodes.Concat) and node in up.nodes):
            node = up
            continue
        return False


class Skeletons:
    """Conversations of plain ``{role, content}`` messages rendered from their role sequence's
    skeleton (the module); the others, and any batch a skeleton fails on, by ``render_many``."""

    def __init__(self, template: str, render_many: RenderMany) -> None:
        self.render_many = render_many
        self.refused = pastes_content(template)
        self._cache: dict[tuple[bool, tuple[str, ...]], Optional[str]] = {}

    def render(self, conversations: list[list[Message]], generation_prompt: bool,
               tools: list[Optional[list[dict]]]) -> list[str]:
        if self.refused is not None:
            COUNTS.fell_back(self.refused, len(conversations))
            return self.render_many(conversations, generation_prompt, tools)
        out: list[Optional[str]] = [None] * len(conversations)
        missing: list[int] = []
        for i, (messages, defined) in enumerate(zip(conversations, tools)):
            text = None if defined is not None else self._paste(messages, generation_prompt)
            if text is None:
                missing.append(i)
            else:
                out[i] = text
        COUNTS.skeleton += len(conversations) - len(missing)
        if missing:
            COUNTS.fell_back("tools, message fields beyond role and content, or roles the template refuses", len(missing))
            rendered = self.render_many([conversations[i] for i in missing], generation_prompt, [tools[i] for i in missing])
            for i, text in zip(missing, rendered):
                out[i] = text
        return out  # type: ignore[return-value]  (every one filled)

    def _paste(self, messages: list[Message], generation_prompt: bool) -> Optional[str]:
        # {role, content} only: every message has both (else KeyError) and they have 2 keys a message in all
        try:
            key = (generation_prompt, tuple([message["role"] for message in messages]))
            contents = [message["content"] for message in messages]
        except KeyError:
            return None
        if sum(map(len, messages)) != 2 * len(messages):
            return None
        if key not in self._cache:
            self._cache[key] = self._skeleton(list(key[1]), generation_prompt)
        skeleton = self._cache[key]
        return None if skeleton is None else skeleton.format(*contents)

    def _skeleton(self, roles: list[str], generation_prompt: bool) -> Optional[str]:
        """The role sequence's rendering as a ``str.format`` pattern: its literal text, ``{m}`` where
        message ``m``'s content goes."""
        fake = [{"role": role, "content": _SENTINEL.format(m)} for m, role in enumerate(roles)]
        try:
            [text] = self.render_many([fake], generation_prompt, [None])
        except Exception:  # noqa: BLE001 - the real conversations are rendered by jinja, which says what is wrong
            return None
        parts = _SENTINEL_SPLIT.split(text)
        pieces, order = parts[0::2], [int(m) for m in parts[1::2]]
        if any("\x00" in piece for piece in pieces) or any(m >= len(roles) for m in order):
            return None
        escaped = [piece.replace("{", "{{").replace("}", "}}") for piece in pieces]
        return escaped[0] + "".join(f"{{{m}}}{piece}" for m, piece in zip(order, escaped[1:]))
