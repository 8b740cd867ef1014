"""Columns of number tokens converted at numpy speed, equal to ``float()`` / ``int()`` bit for bit.

A step column is thousands of short tokens like ``b"0.72448"`` or ``b"1,251"``; ``float()`` per
token costs about 0.2 us each, which was a third of the bulk reader's time.  Here a column is
joined into one byte string and every token's digits are summed at once (numpy, no object per
token).

Why the result is exactly ``float()``'s: a token of at most 15 digits, with one optional dot, is
``M / 10**f`` with ``M < 10**15 < 2**53`` and ``f <= 15``; both are exact doubles, and an IEEE
division is correctly rounded, as is ``float()`` (Clinger's fast path, the one strtod takes
first).  Any token outside that form (a sign, an exponent, ``nan``, more digits, another byte,
an empty token) sends the whole column to ``float()``/``int()`` itself, so errors are raised as
before.
"""

from __future__ import annotations

from array import array
from functools import cache
from itertools import repeat

MAX_DIGITS = 15  # M < 10**15 < 2**53: exact as a double
_DIGITS = b"0123456789"


def _decimal(joined: bytes, tokens: int, extra: bytes):
    """(M per token, digits after the dot per token) as numpy arrays for ``tokens`` tokens
    joined by single spaces, or None when any token is not digits with at most one dot
    (``extra``: other bytes to skip, e.g. thousands commas)."""
    import numpy as np

    if not tokens or joined.translate(None, _DIGITS + extra + b" ") or not joined or joined[:1] == b" " \
            or joined[-1:] == b" " or b"  " in joined:
        return None  # another byte, or an empty token
    p = np.frombuffer(joined, np.uint8)
    sep = np.flatnonzero(p == 32)
    if len(sep) != tokens - 1:  # pragma: no cover - the caller joined ``tokens`` tokens
        return None
    digit = p >= 48  # only digits, " ", "." and "," are left
    cum = np.cumsum(digit, dtype=np.int64)  # digits up to and including each byte
    at_end = np.empty(tokens, np.int64)  # digits up to each token's end
    at_end[:-1] = cum[sep]
    at_end[-1] = cum[-1]
    count = np.diff(at_end, prepend=0)
    if count.min() < 1 or count.max() > MAX_DIGITS:
        return None
    token = np.zeros(len(p), np.int32)
    token[sep] = 1
    np.cumsum(token, out=token)
    dots = np.flatnonzero(p == 46)
    frac = np.zeros(tokens, np.int64)
    if len(dots):
        owner = token[dots]
        if len(owner) > 1 and not (owner[1:] != owner[:-1]).all():  # two dots in one token
            return None
        frac[owner] = at_end[owner] - cum[dots]
    where = np.flatnonzero(digit)
    owner = token[where]
    weights = (p[where] - 48) * _pow10()[at_end[owner] - cum[where]]  # each digit times 10**(digits after it)
    value = np.bincount(owner, weights=weights, minlength=tokens)  # exact: every partial sum < 2**53
    return value, frac


def _uniform(col: list, extra: bytes):
    """(M per token as float64, digits after the dot) when every token has the same length and
    the same bytes that are not digits at the same places (``b"0.72448"``, ``b"1,251"``): the
    tokens are one byte matrix, and M one matrix-vector product (exact: integers < 2**53);
    else None."""
    import numpy as np

    n = len(col)
    width = len(col[0]) if n else 0
    if not 0 < width <= 2 * MAX_DIGITS:
        return None
    joined = b" ".join(col) + b" "
    if len(joined) != n * (width + 1):
        return None
    u = np.frombuffer(joined, np.uint8).reshape(n, width + 1)
    first = col[0]
    digits = [j for j in range(width) if 48 <= first[j] <= 57]
    others = [j for j in range(width) if j not in digits]
    if not 0 < len(digits) <= MAX_DIGITS or first.count(b".") > 1 or any(first[j] not in extra for j in others):
        return None
    if not (u[:, width] == 32).all() or any((u[:, j] != first[j]).any() for j in others):
        return None
    d = u[:, digits] - 48
    if (d > 9).any():  # uint8: below "0" wraps
        return None
    dot = first.find(b".")
    frac = sum(1 for j in digits if j > dot) if dot >= 0 else 0
    return d.astype(np.float64) @ _pow10()[len(digits) - 1::-1], frac


def floats(col: list, *, commas: bool = False) -> array:
    """``array("d", map(float, col))`` (commas removed first when ``commas``), vectorized when
    every token is plain decimal (digits, at most one dot)."""
    return float_columns([col], commas=commas)[0]


def float_columns(cols: list, *, commas: bool = False) -> list:
    """:func:`floats` of each column of ``cols``; columns of one fixed layout each through a
    byte matrix, the others together (numpy's cost per call paid once)."""
    extra = b".," if commas else b"."
    out: list = [None] * len(cols)
    rest = []
    for k, col in enumerate(cols):
        got = _uniform(col, extra)
        if got is None:
            rest.append(k)
        else:
            out[k] = array("d", (got[0] / _pow10()[got[1]]).tobytes())
    if not rest:
        return out
    todo = [cols[k] for k in rest]
    got = _decimal(b" ".join(map(b" ".join, todo)), sum(map(len, todo)), extra)
    if got is not None:
        value, frac = got
        flat = (value / _pow10()[frac]).tobytes()
        pos = 0
        for k in rest:
            out[k] = array("d", flat[pos: pos + 8 * len(cols[k])])
            pos += 8 * len(cols[k])
        return out
    for k in rest:
        col = cols[k]
        if commas:
            col = list(map(bytes.replace, col, repeat(b","), repeat(b"")))
        out[k] = array("d", map(float, col))
    return out


def ints(col: list) -> array:
    """``array("q", map(int, col))``, vectorized when every token is plain digits."""
    import numpy as np

    got = _uniform(col, b"")
    value = got[0] if got is not None else None
    if value is None:
        got = _decimal(b" ".join(col), len(col), b"")
        value = got[0] if got is not None else None
    if value is not None:
        return array("q", value.astype(np.int64).tobytes())
    return array("q", map(int, col))


@cache
def _pow10():
    """10**0 .. 10**MAX_DIGITS as doubles (all exact)."""
    import numpy as np

    return np.array([float(10**k) for k in range(MAX_DIGITS + 1)])
