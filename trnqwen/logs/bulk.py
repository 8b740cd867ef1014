"""The other ranks' step lines, read in bulk.

Once the primary rank is known, the other ranks' step lines are not decoded one by one: loss and
grad norm are global (all-reduced, identical on every rank), and what differs per rank is read
with byte-level passes over a whole region - the last step of each rank from the region's tail,
and memory above :data:`~trnqwen.logs.record.HIGH_MEMORY_PCT` from one regex over the region.
The per-line parser gives the same result (``tests/test_inspect_logs.py`` checks both agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from trnqwen.logs.patterns import B_PREFIX_RE
from trnqwen.logs.stepline import B_MEM, B_MEM_HIGH, B_STEP, to_number

if TYPE_CHECKING:
    from trnqwen.logs.engine import LogParser


def indices(values: list, value: object, out: set) -> None:
    """Add every index of ``value`` in ``values`` to ``out`` (list.index runs in C)."""
    i = -1
    index = values.index
    try:
        while True:
            i = index(value, i + 1)
            out.add(i)
    except ValueError:
        pass


def is_other_step(raw: bytes, prefix: bytes) -> bool:
    """A step line of a rank other than the one whose prefix is ``prefix``."""
    return b"loss:" in raw and b"step:" in raw and raw.startswith(b"[") and not raw.startswith(prefix)


def read_other_ranks(parser: "LogParser", buf: bytes, start: int, end: int, base: int, prefix: bytes) -> None:
    """Record, for the lines ``base``.. of ``buf[start:end]`` (the last one is
    ``parser.lineno``), each non-primary rank's last step and any memory above the threshold."""
    log = parser.log
    # Last step of each non-primary rank: walk back from the region's end.
    wanted = {r for r in log.ranks if parser.rank_prefix.get(r) != prefix}
    found: set = set()
    budget = 2 * len(wanted) + 64
    pos = end
    lineno = parser.lineno  # the region's last line
    while budget > 0 and pos >= start:
        ls = buf.rfind(b"\n", start, pos) + 1 or start
        raw = buf[ls:pos]
        if is_other_step(raw, prefix):
            rank = _step_rank(parser, raw, lineno, found)
            if rank is not None:
                found.add(rank)
        budget -= 1
        if wanted and wanted <= found:
            break
        pos = ls - 1
        lineno -= 1
    for rank in wanted - found:  # a rank quiet at the region's end: find its own last line
        pre = parser.rank_prefix.get(rank)
        if pre is None:
            continue
        needle = b"\n" + pre
        stop_at = end
        while True:
            hit = buf.rfind(needle, start, stop_at)
            ls = hit + 1 if hit >= 0 else (start if buf.startswith(pre, start) else -1)
            if ls < 0:
                break
            le = buf.find(b"\n", ls, end)
            raw = buf[ls: le if le >= 0 else end]
            if is_other_step(raw, prefix):
                _step_rank(parser, raw, base + buf.count(b"\n", start, ls), found)
                break
            if hit < 0:
                break
            stop_at = hit
    # Memory above the threshold on any rank.
    for m in B_MEM_HIGH.finditer(buf, start, end):
        ls = buf.rfind(b"\n", start, m.start()) + 1 or start
        le = buf.find(b"\n", m.end(), end)
        raw = buf[ls: le if le >= 0 else end]
        if not is_other_step(raw, prefix) or b"validate step:" in raw:
            continue
        pm = B_PREFIX_RE.match(raw)
        sm = B_STEP.search(raw)
        mm = B_MEM.search(raw)
        if pm and sm and mm:
            parser.note_memory(
                int(pm.group(2)), int(sm.group(1)), to_number(mm.group(1).decode()),
                to_number(mm.group(2).decode()), base + buf.count(b"\n", start, ls),
            )


def _step_rank(parser: "LogParser", raw: bytes, lineno: int, found: set) -> Optional[int]:
    pm = B_PREFIX_RE.match(raw)
    if pm is None:
        return None
    rank = int(pm.group(2))
    if rank in found:
        return rank
    sm = B_STEP.search(raw)
    if sm is None or b"validate step:" in raw:
        return None
    parser.note_rank(rank, raw[: pm.end()])
    parser.note_rank_step(rank, int(sm.group(1)), lineno)
    return rank
