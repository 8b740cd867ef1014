"""A user's mistake found inside the ranks (a reward function that raised, a bad record only the
model's output reveals): the ranks write it as two lines and exit; the launcher reads them and
ends the run with exit 2 and that one line, as for any usage error (no traceback).

    [trnqwen] usage error: reward function 'brevity' raised ZeroDivisionError: ... on prompts.jsonl line 3 ...
    [trnqwen] usage hint: fix the function or the record; ...
"""

from __future__ import annotations

from typing import Iterable, Optional

USAGE_MARK = "[trnqwen] usage error:"
HINT_MARK = "[trnqwen] usage hint:"


def usage_lines(message: str, hint: Optional[str] = None) -> list[str]:
    """The lines a rank writes (each one line: newlines in the message become spaces)."""
    lines = [f"{USAGE_MARK} {' '.join(message.split())}"]
    if hint:
        lines.append(f"{HINT_MARK} {' '.join(hint.split())}")
    return lines


def find_usage_error(lines: Iterable[str]) -> Optional[tuple[str, Optional[str]]]:
    """(message, hint) of the first usage error a rank wrote, else None."""
    message: Optional[str] = None
    for line in lines:
        if message is None:
            at = line.find(USAGE_MARK)
            if at >= 0:
                message = line[at + len(USAGE_MARK):].strip()
        else:
            at = line.find(HINT_MARK)
            if at >= 0:
                return message, line[at + len(HINT_MARK):].strip()
    return (message, None) if message is not None else None
