"""A training method's own text lines (a ``[<METHOD>] step: ...`` line after each step): how the
method reads one, and what the log parser keeps of it.

A method declares its readers in its folder (``Method.log_lines``: a module whose ``READERS``
is a tuple of :class:`LineReader`); ``inspect-logs`` (:mod:`trnqwen.logs.patterns`) tries them on
the primary rank's messages like its own line kinds and keeps each :class:`MethodLine` a reader
returns: a step's values by step, a validation's joined to that step's validation record, a note
(e.g. a reference pass's line) by its name.  The method never sees the parser's types, and the
parser never names a method.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional

LineKind = Literal["step", "validation", "note"]


@dataclass(frozen=True)
class MethodLine:
    """What one of a method's lines says."""

    kind: LineKind
    values: dict = field(default_factory=dict)  # plain values by name (numbers, short strings)
    step: Optional[int] = None  # a step's or a validation's step
    name: str = ""  # a note's name ("reference")
    # a validation line's loss: the loss of the validation record made from this line when the
    # log has no validation line of its own for that step
    loss: Optional[float] = None


@dataclass(frozen=True)
class LineReader:
    """``regex`` is searched in a message (ANSI codes and torchrun prefix removed); on a match
    ``read(match)`` says what the line is (None: not this line after all).  ``needle``:
    substrings one of which the regex cannot match without (the parser tries a message only
    against the readers whose needles it holds)."""

    name: str
    regex: "re.Pattern[str]"
    read: Callable[["re.Match[str]"], Optional[MethodLine]]
    needle: tuple[str, ...]
