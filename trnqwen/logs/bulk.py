"""Step lines read in bulk, once the primary rank is known.

* The primary rank's step lines of a region: one regex per line through C-level ``map``, columns
  built with ``zip`` and ``array`` (:func:`read_primary_steps`).  A line the bulk regex does not
  take exactly (another layout, a comma in a loss, non-ASCII) sends the whole region back to the
  per-line parser, which is the reference.
* The other ranks' step lines are not decoded at all: loss and grad norm are global
  (all-reduced, identical on every rank), and what differs per rank is read with byte-level
  passes over a whole region - the last step of each rank from the region's tail, and memory
  above :data:`~trnqwen.logs.record.HIGH_MEMORY_PCT` from one regex over the region
  (:func:`read_other_ranks`).

The per-line parser gives the same result (``tests/test_inspect_logs.py`` checks both agree).
"""

from __future__ import annotations

from array import array
from itertools import accumulate, compress, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Optional

from trnqwen.logs.patterns import B_PREFIX_RE
from trnqwen.logs.stepline import B_MEM, B_MEM_HIGH, B_STEP, step_key_glued_ok, to_number

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


def cut_region(buf: bytes, start: int, end: int, prefix: bytes) -> tuple[int, list, list, list, Optional[bytes]]:
    """The lines of ``buf[start:end]`` that need reading, found without splitting every line.

    The region is split at ``"\n" + prefix`` into pieces of one primary-rank line and the
    other ranks' lines after it (about ``ranks`` lines each).  Returns ``(lines in the region,
    indices of the primary step lines, their bodies without the prefix, [(index, raw line)]
    of the lines to read one by one, the bodies joined with newlines or None)``: the lines to
    read one by one are those without ``"loss:"`` (found in the few pieces where the counts of
    ``"loss:"`` and of lines differ) and the primary validation lines.
    """
    region = buf[start:end]
    pieces = region.split(b"\n" + prefix)
    newlines = list(map(bytes.count, pieces, repeat(b"\n")))
    firsts = list(accumulate(map((1).__add__, newlines[:-1]), initial=0))  # first line of each piece
    n = firsts[-1] + newlines[-1] + 1
    lead = region.startswith(prefix)
    if lead:
        pieces[0] = pieces[0][len(prefix):]
    # each piece's first line (a piece without a newline is one line: -1 -> None, the whole piece)
    cut = list(map(bytes.find, pieces, repeat(b"\n")))
    heads = list(map(bytes.__getitem__, pieces, map(slice, repeat(None), map({-1: None}.get, cut, cut))))
    single: list = []
    losses = list(map(bytes.count, pieces, repeat(b"loss:")))
    for k in compress(range(len(pieces)), map(int.__ne__, losses, map((1).__add__, newlines))):
        lines = pieces[k].split(b"\n")
        for j in range(1 if (k or lead) else 0, len(lines)):
            if b"loss:" not in lines[j]:
                single.append((firsts[k] + j, lines[j]))
    # the primary rank's lines: piece heads (piece 0's head is another rank's line unless lead)
    primary = firsts if lead else firsts[1:]
    bodies = heads if lead else heads[1:]
    joined = b"\n".join(bodies)
    if joined.count(b"loss:") != len(bodies) or b"validate step:" in joined:
        keep = [(i, body) for i, body in zip(primary, bodies) if b"loss:" in body and b"validate step:" not in body]
        single.extend((i, prefix + body) for i, body in zip(primary, bodies) if b"loss:" not in body or b"validate step:" in body)
        primary = [i for i, _ in keep]
        bodies = [body for _, body in keep]
        joined = None
    single.sort()
    return n, primary, bodies, single, joined


def read_primary_steps(parser: "LogParser", bodies: list, primary: list, base: int, joined: Optional[bytes] = None) -> bool:
    """Store the primary rank's step lines (``bodies``: the lines without the rank prefix, at
    region indices ``primary``, line ``base + i``) in one pass; False (nothing stored) when any
    of them is not torchtitan's exact layout.

    What :func:`~trnqwen.logs.stepline.fast_step` does per line, done per column: the lines are
    joined, decoded and split on whitespace once; with ``K`` tokens per line, ``tokens[j::K]`` is
    one column.  ``step:`` must occur once per line and each key sit at its place; every value
    must convert.  Otherwise the caller reads the lines one by one.
    """
    n = len(bodies)
    if not n:
        return True
    joined = joined if joined is not None else b"\n".join(bodies)
    if joined.count(b"step:") != n or max(map(len, bodies)) > parser.max_line - len(parser.primary_prefix_text):
        return False
    try:
        # "memory: 14.20GiB(59.20%)" -> two tokens, "14.20" and "59.20%)"
        tokens = joined.decode("utf-8").replace("GiB(", " GiB( ").split()
    except UnicodeDecodeError:
        return False
    first = bodies[0].decode("utf-8", "replace").split()
    head = next((j for j, t in enumerate(first) if t.endswith("step:")), None)
    if head is None:
        return False
    width = head + 16
    if len(tokens) != width * n:
        return False
    for offset, key in _KEYS:
        if not all(map(str.endswith, set(tokens[head + offset::width]), repeat(key))):
            return False
    if not all(map(step_key_ok, set(tokens[head::width]))):
        return False
    col = tokens.__getitem__
    pct = col(slice(head + 9, None, width))
    mfu = col(slice(head + 15, None, width))
    if set(tokens[head + 8::width]) != {"GiB("} or not all(map(str.endswith, pct, repeat("%)"))):
        return False
    missing: dict[str, list] = {}
    if any(map(str.startswith, mfu, repeat("N/A"))):
        na = [i for i, hit in enumerate(map(str.startswith, mfu, repeat("N/A"))) if hit]
        missing["mfu"] = na
        for i in na:
            mfu[i] = "nan%"
    if not all(map(str.__contains__, mfu, repeat("%"))):
        return False
    try:
        steps = array("q", map(int, col(slice(head + 1, None, width))))
        values = {
            "loss": array("d", map(float, col(slice(head + 3, None, width)))),
            "grad_norm": array("d", map(float, col(slice(head + 5, None, width)))),
            "memory_gib": array("d", map(float, col(slice(head + 7, None, width)))),
            "memory_pct": array("d", map(float, map(str.__getitem__, pct, repeat(slice(None, -2))))),
            "tps": array("d", map(float, map(str.replace, col(slice(head + 11, None, width)), repeat(","), repeat("")))),
            "tflops": array("d", map(float, map(str.replace, col(slice(head + 13, None, width)), repeat(","), repeat("")))),
            "mfu": array("d", map(float, map(itemgetter(0), map(str.partition, mfu, repeat("%"))))),
        }
    except ValueError:
        return False
    parser.log.recognized_lines += n
    parser.store_primary_steps(steps, array("q", map(base.__add__, primary)), values, missing)
    return True


# (offset from the step key, key) once "GiB(" is its own token
_KEYS = ((2, "loss:"), (4, "grad_norm:"), (6, "memory:"), (10, "tps:"), (12, "tflops:"), (14, "mfu:"))


def step_key_ok(token: str) -> bool:
    """The token that ends in ``step:`` passes fast_step's check of what is glued before it."""
    return step_key_glued_ok(token, len(token) - 5)


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
