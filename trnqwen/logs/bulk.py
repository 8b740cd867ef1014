"""Step lines read in bulk, once the primary rank is known.

* :func:`line_table` classifies every line of a region with numpy, without splitting it, 2 MB
  at a time: where each line starts and ends, which contain both ``"step:"`` and ``"loss:"``
  (the only lines that can be step lines; each word tested with one 8-byte load per line at the
  offsets a sample of lines shows, the lines left searched whole: :func:`_lines_with`), which of
  those carry the primary rank's prefix.  The others are read one by one.
* The primary rank's step lines (:func:`primary_columns`, planned per region by
  :func:`plan_region`): cut at their first ``step:``,
  joined and split on whitespace once as bytes (no decoding); with 14 tokens per line (16 with the lr column trnqwen's ranks append),
  ``tokens[j::14]`` is one column, converted by :mod:`trnqwen.logs.numbers` (numpy, exactly
  ``float()``).  A line that is not torchtitan's exact layout (another layout, a comma in a
  loss, non-ASCII) sends the region back to the per-line parser, which is the reference.
* The other ranks' step lines are not decoded at all: loss and grad norm are global
  (all-reduced, identical on every rank), and what differs per rank is read with byte-level
  passes over a whole region - the last step of each rank from the region's tail
  (:func:`read_other_ranks`), and memory above :data:`~trnqwen.logs.record.HIGH_MEMORY_PCT`:
  the regex tried where numpy finds ``(9``/``(1`` (in :func:`plan_region`, so in the workers).

The per-line parser gives the same result (``tests/test_logs_fastpath.py`` checks both agree).
"""

from __future__ import annotations

import re
from array import array
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol

from trnqwen.logs import numbers
from trnqwen.logs.patterns import B_PREFIX_RE, HEADER_RE, INFO_LINES, TRACEBACK_START, info_candidates, split_prefix
from trnqwen.contract.stepline import B_MEM, B_MEM_HIGH, B_STEP, step_key_glued_ok, to_number

if TYPE_CHECKING:
    from trnqwen.logs.record import ParsedLog


class RankNotes(Protocol):
    """What the bulk reader needs from the engine's parser (``engine.LogParser``), named here so
    that bulk never imports the engine that imports it."""

    log: "ParsedLog"
    lineno: int
    rank_prefix: dict[int, bytes]

    def note_rank(self, rank: int, prefix: Optional[bytes]) -> Any: ...
    def note_rank_step(self, rank: int, step: int, lineno: int) -> Any: ...
    def note_memory(self, rank: int, step: int, gib: Optional[float], pct: Optional[float], lineno: int) -> Any: ...

_TB_START = TRACEBACK_START.encode()
_VALIDATE = b"validate step:"
# the key each even token of a step line (cut at its "step:") ends with
_KEYS = ((2, b"loss:"), (4, b"grad_norm:"), (6, b"memory:"), (8, b"tps:"), (10, b"tflops:"), (12, b"mfu:"))
WIDTH = 14  # tokens of a step line from its "step:" on
LR_WIDTH = WIDTH + 2  # trnqwen's ranks append "lr: <value>" (trnqwen.runtime.lr_log)


PIECE = 2 << 20  # bytes classified at a time: the passes over a piece stay in the core's cache


def line_table(buf: bytes, start: int, end: int, prefix: bytes):
    """The lines of ``buf[start:end]`` (newline-separated, none after the last), classified in
    a few numpy passes: ``(starts, ends, primary, steplike, parens)``: region-relative start and
    end offsets of each line, whether it contains both ``"loss:"`` and ``"step:"`` (only such
    lines can be step lines) and, among those (False elsewhere), whether it starts with
    ``prefix``; and the region-relative offset of every ``"("``.
    A big region is classified piece by piece (cut at newlines), each while it is in cache."""
    import numpy as np

    parts = []
    pos = start
    while True:
        stop = end if end - pos <= PIECE else buf.find(b"\n", pos + PIECE, end)
        stop = end if stop < 0 else stop
        starts, ends, primary, steplike, parens = _line_table(buf, pos, stop, prefix)
        if pos != start:
            starts += pos - start
            ends += pos - start
            parens += pos - start
        parts.append((starts, ends, primary, steplike, parens))
        if stop >= end:
            break
        pos = stop + 1
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(col) for col in zip(*parts))


def _line_table(buf: bytes, start: int, end: int, prefix: bytes):
    import numpy as np

    size = end - start
    arr = np.frombuffer(buf, np.uint8, count=size, offset=start)
    nl = np.flatnonzero(arr == 10)
    n = len(nl) + 1
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    ends = np.empty(n, np.int64)
    ends[:-1] = nl
    ends[-1] = size
    steplike = _lines_with(buf, start, size, starts, ends, b"step:", np.arange(n))
    steplike[np.flatnonzero(steplike)] = _lines_with(buf, start, size, starts, ends, b"loss:", np.flatnonzero(steplike))[steplike]
    cand = np.flatnonzero(steplike & ((ends - starts) >= len(prefix)))
    if 0 < len(prefix) <= 8:  # the prefix as one 8-byte load per line (lines this long end before the region)
        cand = cand[starts[cand] + 8 <= size]
        word = _words(buf, start, size)[starts[cand]] & ((1 << (8 * len(prefix))) - 1)
        cand = cand[word == int.from_bytes(prefix, "little")]
    else:  # checked from its end (a rank's digit comes first: few lines are left after it)
        for k in range(len(prefix) - 1, -1, -1):
            cand = cand[arr[starts[cand] + k] == prefix[k]]
    primary = np.zeros(n, dtype=bool)
    primary[cand] = True
    # every "(" too, for _high_memory_lines: found now, while the piece is in the core's cache
    return starts, ends, primary, steplike, np.flatnonzero(arr == 40)


RARE_PAIR = {b"step:": 3, b"loss:": 2}  # where the word's rarest two bytes sit ("p:", "ss")
SAMPLE = 16  # lines searched one by one to learn where a word sits in the lines around them
ROUNDS = 3  # times offsets are learned from the lines still unresolved


def _lines_with(buf: bytes, start: int, size: int, starts, ends, word: bytes, lines):
    """Boolean mask over all lines (``starts``/``ends`` relative to ``start``): which of
    ``lines`` contain ``word`` (at most 8 bytes).  A word sits at the same offset on most lines
    of a log (the same rank prefix and timestamp width before it), so the offsets are learned
    from a sample of lines (``bytes.find``, one by one), then every line is tested at each
    offset with one 8-byte load (numpy: a few numbers per line instead of a pass over every
    byte); the lines left are searched one by one.  Exact: a line is marked only where the word
    was seen, and every line not seen at a learned offset is searched whole (when many are left,
    a log mostly of other lines, by the byte-pair pass over the whole region instead)."""
    import numpy as np

    found = np.zeros(len(starts), bool)
    left = lines
    width = len(word)
    key = int.from_bytes(word, "little")
    mask = (1 << (8 * width)) - 1
    word8 = _words(buf, start, size)
    find = buf.find
    for _ in range(ROUNDS):
        if len(left) <= SAMPLE:
            break
        before = len(left)
        spread = range(0, len(left), max(1, len(left) // (SAMPLE // 2)))  # the first lines, and some spread out
        # (sorted(set()), not np.unique: a plain np.unique imports numpy.ma, 10 ms)
        picks = np.array(sorted({*left[:SAMPLE // 2].tolist(), *left[spread].tolist()}), np.int64)
        s, e = starts[picks] + start, ends[picks] + start
        at = np.array(list(map(find, repeat(word), s.tolist(), e.tolist())), np.int64)
        found[picks[at >= 0]] = True
        offsets, counts = np.unique((at - s)[at >= 0], return_counts=True)
        left = left[~found[left]]
        if not len(offsets):
            continue
        offsets = offsets[np.argsort(-counts, kind="stable")].tolist()
        probe = left[:: max(1, len(left) // 64)]  # are most lines of that kind? (else: the pass below)
        seen = np.zeros(len(probe), bool)
        for c in offsets:
            fits = (ends[probe] - starts[probe] >= c + width) & (starts[probe] + c + 8 <= size)
            seen[fits] |= (word8[starts[probe[fits]] + c] & mask) == key
        if 2 * int(seen.sum()) < len(probe):
            break
        for c in offsets:
            # an 8-byte load at starts + c must stay inside the region (word8 has size - 7 entries)
            fits = left[(ends[left] - starts[left] >= c + width) & (starts[left] + c + 8 <= size)]
            hit = fits[(word8[starts[fits] + c] & mask) == key]
            if len(hit):
                found[hit] = True
                left = left[~found[left]]
        if len(left) > before // 2:  # most lines are of another kind: learning more will not pay
            break
    # the lines left searched one by one cost about their bytes plus a call each; a pass over
    # every byte costs about a quarter of a byte each (two 16-bit compares per two bytes)
    if len(left) > SAMPLE and int((ends[left] - starts[left]).sum()) + 256 * len(left) > size // 4:
        arr = np.frombuffer(buf, np.uint8, count=size, offset=start)
        hit = np.zeros(len(starts), bool)
        hit[_word_lines(arr, ends[:-1], word, RARE_PAIR.get(word, 0))] = True
        found[left[hit[left]]] = True
    elif len(left):  # the few left: searched one by one
        at = map(find, repeat(word), (starts[left] + start).tolist(), (ends[left] + start).tolist())
        found[left[np.array(list(at), np.int64) >= 0]] = True
    return found


def _word_lines(arr, nl, word: bytes, j: int):
    """Indices of the lines (``nl``: newline offsets) of ``arr`` that contain ``word``: its two
    bytes at ``j`` found as 16-bit values at both byte parities (one compare per two bytes,
    few candidates), then the other bytes checked."""
    import numpy as np

    size = len(arr)
    key = np.array([word[j] | word[j + 1] << 8], "<u2")[0]
    found = []
    for parity in (0, 1):
        m = (size - parity) // 2
        if m > 0:
            pairs = arr[parity: parity + 2 * m].view("<u2")
            found.append(np.flatnonzero(pairs == key) * 2 + (parity - j))
    if not found:
        return np.zeros(0, np.int64)
    at = np.concatenate(found)
    at = at[(at >= 0) & (at <= size - len(word))]
    for k, c in enumerate(word):
        if k not in (j, j + 1):
            at = at[arr[at + k] == c]
    return np.searchsorted(nl, at)


class RegionPlan(NamedTuple):
    """What the engine does with one region (region-relative line indices): read ``single``
    (their bytes in ``raws``) one by one in order, and store ``steps`` (``(steps, lines,
    values, missing)`` from :func:`primary_columns`) in bulk, and look at the ``memory`` lines
    (:func:`read_other_ranks`); ``fallback``: read every line."""

    lines: int
    single: list
    raws: list
    steps: Optional[tuple]
    fallback: bool = False
    memory: list = []  # (line index, line) of the lines with memory above the threshold, in order
    quiet: tuple = ()  # positions in ``single`` of lines that only count (:func:`quiet_lines`)
    quiet_ranks: tuple = ()  # the rank of each (the engine skips only those of ranks it knows)


def plan_region(buf: bytes, start: int, end: int, prefix: bytes, max_line: int) -> RegionPlan:
    """Classify the lines of ``buf[start:end]`` and read the primary rank's step lines; pure
    (no parser state), so it can run in another process (:mod:`trnqwen.logs.parallel`)."""
    starts, ends, primary, steplike, parens = line_table(buf, start, end, prefix)
    n = len(starts)
    if int((ends - starts).max()) > max_line:  # overlong lines: truncated one by one
        return RegionPlan(n, [], [], None, True)
    piece = buf.__getitem__
    memory = _high_memory_lines(buf, start, end, starts, ends, steplike, primary, prefix, parens)
    single = (~steplike).nonzero()[0].tolist()
    raws = list(map(piece, map(slice, (starts[single] + start).tolist(), (ends[single] + start).tolist())))
    if any(map(bytes.__contains__, raws, repeat(_TB_START))):  # a crash: every line in order
        return RegionPlan(n, [], [], None, True)
    at = (primary & steplike).nonzero()[0]
    bodies = list(map(piece, map(slice, (starts[at] + (start + len(prefix))).tolist(), (ends[at] + start).tolist())))
    if not bodies:
        return _planned(n, single, raws, None, memory)
    at = at.tolist()
    cols = primary_columns(bodies, at, prefix)
    if cols is None:  # not the exact layout somewhere: every line that matters, in order
        todo = dict(zip(single, raws))
        todo.update(zip(at, map(prefix.__add__, bodies)))
        order = sorted(todo)
        return _planned(n, order, [todo[i] for i in order], None, memory)
    skip = cols[4]
    if skip:  # primary validation lines
        todo = dict(zip(single, raws))
        todo.update((at[k], prefix + bodies[k]) for k in skip)
        single = sorted(todo)
        raws = [todo[i] for i in single]
    return _planned(n, single, raws, cols[:4], memory)


def _planned(n: int, single: list, raws: list, steps: Optional[tuple], memory: list) -> RegionPlan:
    quiet, ranks = quiet_lines(raws)
    return RegionPlan(n, single, raws, steps, memory=memory, quiet=quiet, quiet_ranks=ranks)


# A line that only counts: torchtitan's header at DEBUG or INFO after a plain torchrun prefix
# (stricter than patterns.HEADER_RE: whatever this matches, HEADER_RE reads the same way), none
# of what the engine acts on in any message (_HARD: step lines, overrides, trnqwen's marks, colour
# codes, carriage returns; non-ASCII fails the pattern), and no info pattern that matches it: a
# message holding none of patterns.SCREEN's needles cannot match one, and one that holds some is
# tried against those needles' patterns, as the engine's read_info_line would.  The engine's _line
# would only count such a line as recognized (tests/test_logs_fastpath.py checks chatty logs with
# near misses against the reference).
_QUIET_RE = re.compile(rb"\[rank\d{1,6}\]:\[titan\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? - \S+ - (?:DEBUG|INFO) - [\x20-\x7e]*")
_HARD = (b"step:", b"[override]", b"override(s)", b"[trnqwen] ", b"\x1b", b"\r")
_ZEROED = bytes.maketrans(b"123456789", b"000000000")


def _template_verdict(template: bytes) -> Optional[list]:
    """None: the engine must read the lines of this template; []: they only count; [i, ...]:
    they only count unless one of these info patterns (those its needles name) matches the
    line's message (needles hold no digit, so a template names the same ones as its lines)."""
    if _QUIET_RE.fullmatch(template) is None:
        return None
    lowered = template.lower()
    if any(map(lowered.__contains__, _HARD)):
        return None
    return info_candidates(lowered.decode("ascii"))


def _matches_an_info_pattern(raw: bytes, candidates: list) -> bool:
    """Whether read_info_line could take this line: its message as the engine reads it (prefix
    split, header matched) against the patterns its needles name.  Their regexes alone decide
    (read_info_line's exact-case needle test cannot turn a match away: a regex never matches
    without its needle), and one per line is the cost of a chatty log's needle-holding lines."""
    _, body = split_prefix(raw.decode("ascii"))
    header = HEADER_RE.search(body)
    if header is None:  # (the template matched the stricter form: not expected)
        return True
    msg = header.group("msg")
    return any(INFO_LINES[i].regex.search(msg) is not None for i in candidates)


def quiet_lines(raws: list) -> tuple[tuple, tuple]:
    """(positions in ``raws`` of the lines that only count, the rank of each).  Decided once per
    template, the line with its digits zeroed (the rank, the time, the numbers of a message):
    neither the pattern nor any needle holds a digit, so the verdict is the same for every line
    of a template, and a chatty log has few; a template whose needles name info patterns has
    each line's message tried against those (here, in a worker, not in the engine).  A line
    without a needle costs a few C-level operations, not the engine's per-line reading (7 us)."""
    if len(raws) < 8:
        return (), ()
    templates = b"\n".join(raws).translate(_ZEROED).split(b"\n")
    verdict = {t: _template_verdict(t) for t in set(templates)}
    verdicts = list(map(verdict.__getitem__, templates))
    quiet = [k for k, v in enumerate(verdicts) if v == []]
    quiet += [k for k, v in enumerate(verdicts) if v and not _matches_an_info_pattern(raws[k], v)]
    if not quiet:
        return (), ()
    quiet.sort()
    heads = list(map(bytes.__getitem__, map(raws.__getitem__, quiet), repeat(slice(0, 14))))
    rank_of = {h: int(h[5:h.index(b"]")]) for h in set(heads)}
    return tuple(quiet), tuple(map(rank_of.__getitem__, heads))


def _high_memory_lines(buf, start: int, end: int, starts, ends, steplike=None, primary=None, prefix: bytes = b"",
                       parens=None) -> list:
    """(region line index, line) of the lines that matter among those where B_MEM_HIGH matches in
    ``buf[start:end]``, in order.  With ``steplike``/``primary`` (:func:`line_table`'s), only
    other ranks' step lines are kept (the primary rank's memory comes from its columns; other
    lines are not read for memory), and of those only the first line with the highest percentage
    per line head (the rank prefix: the line's first 16 bytes), since ``note_memory`` keeps each
    rank's first maximum.  A run near capacity has a match on most lines: reading each one back
    with three regexes cost four times the whole parse."""
    import numpy as np

    # every match begins "GiB(" then "9" or "1": its "(" (numpy) is where to try the regex;
    # matches cannot overlap, so these are finditer's matches (numpy's scan is faster than a
    # substring search here: "GiB(" is on every line)
    arr = np.frombuffer(buf, np.uint8, count=end - start, offset=start)
    size = len(arr)
    if parens is None:  # (line_table's: every "(" of the region)
        parens = np.flatnonzero(arr == 40)
    at = parens[(parens >= 3) & (parens < size - 1)]
    after = arr[at + 1]
    at = at[(after == 57) | (after == 49)] - 3
    if not len(at):
        return []
    # torchtitan's own form, "GiB(9d.dd%)", checked and read as two unaligned words per match
    # (d.dd / 100 is float()'s value: an exact integer over a power of ten, correctly rounded)
    fits = at[at + 16 <= size]
    word = _words(buf, start, size)
    w0, w1 = word[fits], word[fits + 8]
    d5, d7, d8 = (w0 >> 40) & 0xFF, w0 >> 56, w1 & 0xFF
    fixed = (((w0 & 0x00FF00FFFFFFFFFF) == _GIB9) & ((w1 & 0xFFFF00) == _PCT_CLOSE)
             & (d5 - 48 < 10) & (d7 - 48 < 10) & (d8 - 48 < 10))  # (unsigned: below "0" wraps)
    hits = [fits[fixed]]
    values = [(9000 + (d5[fixed] - 48).astype(np.int64) * 100 + (d7[fixed] - 48) * 10 + (d8[fixed] - 48)) / 100.0]
    match = B_MEM_HIGH.match
    rest = np.ones(len(at), bool)
    rest[np.searchsorted(at, hits[0])] = False
    found = [(p, m.group()) for p in at[rest].tolist() if (m := match(buf, start + p, end)) is not None]
    if found:
        hits.append(np.array([p for p, _ in found], np.int64))
        values.append(np.array([float(text[4:-2]) for _, text in found]))
    hits, values = np.concatenate(hits), np.concatenate(values)
    if not len(hits):
        return []
    if found:
        order = np.argsort(hits, kind="stable")
        hits, values = hits[order], values[order]
    rows = np.searchsorted(starts, hits, "right") - 1
    once = np.ones(len(rows), bool)  # a line once, with its first match
    once[1:] = rows[1:] != rows[:-1]
    rows, values = rows[once], values[once]
    line = buf.__getitem__
    if steplike is None:
        return [(i, line(slice(int(starts[i]) + start, int(ends[i]) + start))) for i in rows.tolist()]
    keep = steplike[rows] & ~primary[rows] & (ends[rows] - starts[rows] >= 16)
    rows, values = rows[keep], values[keep]
    if not len(rows):
        return []
    k0, k1 = word[starts[rows]], word[starts[rows] + 8]  # the line head as two numbers
    order = np.lexsort((rows, -values, k1, k0))  # by head, highest first, then first line
    k0, k1 = k0[order], k1[order]
    first = np.ones(len(order), bool)
    first[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
    group = np.cumsum(first) - 1
    kept: list = []
    for g, o in zip(np.flatnonzero(first).tolist(), order[first].tolist()):
        i = int(rows[o])
        note = other_rank_memory(line(slice(int(starts[i]) + start, int(ends[i]) + start)), prefix)
        if note is not None and note[3] == values[o]:
            kept.append(i)
        else:  # read_other_ranks would not take the group's maximum as it is: every line of the group
            kept += rows[order[group == group[g]]].tolist()
    return [(i, line(slice(int(starts[i]) + start, int(ends[i]) + start))) for i in sorted(set(kept))]


_GIB9 = int.from_bytes(b"GiB(9\x00.\x00", "little")
_PCT_CLOSE = int.from_bytes(b"\x00%)", "little")


def _words(buf, start: int, size: int):
    """Every 8 bytes of ``buf[start:start + size]`` as a little-endian uint64, one per byte
    offset (an unaligned, overlapping view: ``word[i]`` holds bytes i..i+7; no copy)."""
    import numpy as np

    return np.ndarray((max(0, size - 7),), dtype="<u8", buffer=buf, offset=start, strides=(1,))


def primary_columns(bodies: list, lines: list, prefix: bytes) -> Optional[tuple]:
    """The primary rank's step lines (``bodies``: the lines without the rank prefix ``prefix``,
    at ``lines``) as columns, in one pass: ``(steps, lines, values, missing, skip)``, ``skip``
    the positions (in ``bodies``) of lines that are not step lines after all and must be read
    one by one (validation lines); None when any line is not torchtitan's exact layout.

    What :func:`~trnqwen.contract.stepline.fast_step` does per line, done per column on bytes:
    ``step:`` must occur once per line, nothing but a colour code glued before it, each key at
    its place, and every value must convert.
    """
    n = len(bodies)
    skip: list = []
    if not n:
        return None
    joined = b"\n".join(bodies)
    if not joined.isascii():  # non-ASCII: the per-line parser decodes (and counts bad UTF-8)
        return None
    if prefix and any(map(bytes.startswith, bodies, repeat(prefix))):  # stacked prefixes
        return None
    at = list(map(bytes.find, bodies, repeat(b"step:")))
    if _VALIDATE in joined or -1 in at:  # (line_table already requires "step:")
        skip = [k for k, (body, i) in enumerate(zip(bodies, at)) if i < 0 or _VALIDATE in body]
        gone = set(skip)
        keep = [k for k in range(n) if k not in gone]
        bodies = [bodies[k] for k in keep]
        at = [at[k] for k in keep]
        lines = [lines[k] for k in keep]
        n = len(bodies)
        if not n:
            return None
    if b"validate" in joined or not _glue_ok(bodies, at, joined):
        # what is glued before "step:", line by line (fast_step looks 24 characters back)
        for head in set(map(bytes.__getitem__, bodies, map(slice, map(max, repeat(0), map((-24).__add__, at)), at))):
            text = head.decode("ascii")
            if not step_key_glued_ok(text + "step:", len(text)) or text[-12:].rstrip().endswith("validate"):
                return None
    parts = b"\n".join(map(bytes.__getitem__, bodies, map(slice, at, repeat(None))))
    if parts.count(b"step:") != n:
        return None
    tokens = parts.split()
    width = WIDTH if len(tokens) == WIDTH * n else LR_WIDTH if len(tokens) == LR_WIDTH * n else None
    if width is None:  # another layout, or lines with and without lr mixed: line by line
        return None
    keys = _KEYS + (((WIDTH, b"lr:"),) if width == LR_WIDTH else ())
    for offset, key in keys:
        col = tokens[offset::width]
        if not (col.count(col[0]) == n and col[0].endswith(key)):
            if not all(map(bytes.endswith, set(col), repeat(key))):
                return None
    memory = _memory_column(tokens[7::width], n)
    mfu, missing = _mfu_column(tokens[13::width], n)
    if memory is None or mfu is None:
        return None
    try:  # numbers.floats/ints: float()/int() per token, bit for bit, at numpy speed
        steps = numbers.ints(tokens[1::width])
        values = dict(zip(("loss", "grad_norm", "memory_gib", "memory_pct", "mfu"), numbers.float_columns(
            [tokens[3::width], tokens[5::width], memory[0], memory[1], mfu])))
        values["tps"], values["tflops"] = numbers.float_columns([tokens[9::width], tokens[11::width]], commas=True)
        if width == LR_WIDTH:
            (values["lr"],) = numbers.float_columns([tokens[WIDTH + 1::width]])
    except ValueError:
        return None
    if width == WIDTH:  # torchtitan's own layout has no lr column
        values["lr"] = array("d", [float("nan")]) * n
        missing["lr"] = list(range(n))
    return steps, lines, values, missing, skip


_ANSI_TAIL = re.compile(rb"\x1b\[[0-9;]*m$")
_NUMBER_BYTES = b"0123456789."


def _glue_ok(bodies: list, at: list, joined: bytes) -> bool:
    """Whole-column form of fast_step's check of what is glued before ``step:`` (True: every
    line passes; False: check line by line): the first line's colour code glued before
    ``step:`` on every line, or a space before it on every line."""
    n = len(bodies)
    m = _ANSI_TAIL.search(bodies[0], max(0, at[0] - 24), at[0])
    if m is not None:
        return joined.count(m.group() + b"step:") == n
    if min(at) == 0:
        return False
    return bytes(map(bytes.__getitem__, bodies, map((-1).__add__, at))).count(b" ") == n


def _memory_column(col: list, n: int) -> Optional[tuple]:
    """``14.20GiB(59.20%)`` tokens -> (GiB texts, percent texts); None: not the layout."""
    joined = b"\n".join(col) + b"\n"
    if joined.translate(None, _NUMBER_BYTES) == b"GiB(%)\n" * n:  # every token: digits GiB( digits %)
        nums = joined.replace(b"GiB(", b" ").replace(b"%)", b"").split()
        return (nums[0::2], nums[1::2]) if len(nums) == 2 * n else None
    # fast_step's own reading: the text before GiB(, and from there to the first %
    mem = list(map(bytes.partition, col, repeat(b"GiB(")))
    if set(map(itemgetter(1), mem)) != {b"GiB("}:
        return None
    pct = list(map(bytes.partition, map(itemgetter(2), mem), repeat(b"%")))
    if set(map(itemgetter(1), pct)) != {b"%"}:
        return None
    return list(map(itemgetter(0), mem)), list(map(itemgetter(0), pct))


def _mfu_column(col: list, n: int) -> tuple:
    """``7.48%`` tokens (a colour code may follow) -> (number texts, {"mfu": N/A rows}); (None, {})
    when not the layout."""
    first = col[0]
    cut = first.find(b"%")
    if cut > 0:
        tail = first[cut:] + b"\n"
        joined = b"\n".join(col) + b"\n"
        if joined.count(tail) == n:  # every token ends with the first one's tail
            nums = joined.replace(tail, b" ")
            if not nums.translate(None, _NUMBER_BYTES + b" "):
                nums = nums.split()
                if len(nums) == n:
                    return nums, {}
    # fast_step's own reading: N/A, else the text before the first %
    col = list(col)
    missing: dict[str, list] = {}
    if any(map(bytes.startswith, col, repeat(b"N/A"))):
        na = [i for i, hit in enumerate(map(bytes.startswith, col, repeat(b"N/A"))) if hit]
        missing["mfu"] = na
        for i in na:
            col[i] = b"nan%"
    parts = list(map(bytes.partition, col, repeat(b"%")))
    if set(map(itemgetter(1), parts)) != {b"%"}:
        return None, {}
    return list(map(itemgetter(0), parts)), missing


def is_other_step(raw: bytes, prefix: bytes) -> bool:
    """A step line of a rank other than the one whose prefix is ``prefix``."""
    return b"loss:" in raw and b"step:" in raw and raw.startswith(b"[") and not raw.startswith(prefix)


def read_other_ranks(parser: RankNotes, buf: bytes, start: int, end: int, base: int, prefix: bytes,
                     memory: list) -> None:
    """Record, for the lines ``base``.. of ``buf[start:end]`` (the last one is
    ``parser.lineno``), each non-primary rank's last step, and any memory above the threshold
    from ``memory`` (:attr:`RegionPlan.memory`)."""
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
    # Memory above the threshold on any rank (the lines found by plan_region).
    for i, raw in memory:
        note = other_rank_memory(raw, prefix)
        if note is not None:
            parser.note_memory(*note, base + i)


def other_rank_memory(raw: bytes, prefix: bytes) -> Optional[tuple]:
    """(rank, step, GiB, percent) of a step line of a rank other than ``prefix``'s, or None."""
    if not is_other_step(raw, prefix) or _VALIDATE in raw:
        return None
    pm = B_PREFIX_RE.match(raw)
    sm = B_STEP.search(raw)
    mm = B_MEM.search(raw)
    if not (pm and sm and mm):
        return None
    return int(pm.group(2)), int(sm.group(1)), to_number(mm.group(1).decode()), to_number(mm.group(2).decode())


def _step_rank(parser: RankNotes, raw: bytes, lineno: int, found: set) -> Optional[int]:
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
