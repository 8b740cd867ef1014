"""Rendered texts -> token ids and per-token "trained" flags, fast and exactly as transformers does.

A fast tokenizer cuts the text at its added tokens (``<|im_start|>``, ``<|im_end|>``, ...) before
normalising and running BPE, so the text between two special tokens is always tokenized on its
own.  Chat data repeats those pieces a lot (the same system prompt, the same ``\\n`` between
turns), so each distinct piece is encoded once, in one batched Rust call, and documents are
assembled from pieces with numpy index arithmetic.  A sample of documents is re-encoded whole
and compared, and any difference (a tokenizer whose added tokens strip spaces, say) switches to
encoding every document whole: the ids are always those of ``apply_chat_template(tokenize=True)``.

Character offsets come along, and the trained character spans become token flags with one
``searchsorted`` (a token is trained when it starts inside a span).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_CHECKED_DOCS = 32


@dataclass
class TokenizedDocs:
    """Documents tokenized back to back: ``ids``/``trained``/``char_starts`` are flat, per token;
    document ``d`` is ``[bounds[d], bounds[d + 1])``.  ``trained`` = the token is a target."""

    ids: np.ndarray
    trained: np.ndarray
    char_starts: np.ndarray
    bounds: np.ndarray
    texts: list[str]
    spans: list[list[tuple[int, int]]]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)


def tokenize(tokenizer, texts: list[str], spans: list[list[tuple[int, int]]]) -> TokenizedDocs:
    """Token ids of ``texts`` (no added BOS/EOS, as ``apply_chat_template`` encodes) and which
    tokens fall inside ``spans``."""
    backend = tokenizer.backend_tokenizer
    ids, starts, lengths = _by_pieces(tokenizer, backend, texts)
    if ids is None:
        ids, starts, lengths = _whole(backend, texts)
    bounds = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    trained = _trained(texts, spans, starts, lengths)
    return TokenizedDocs(ids=ids, trained=trained, char_starts=starts.astype(np.int32), bounds=bounds,
                         texts=texts, spans=spans)


def _trained(texts, spans, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Put every document on one global character axis so one searchsorted serves them all."""
    text_base = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), out=text_base[1:])
    global_starts = starts + np.repeat(text_base[:-1], lengths)
    flat = np.array([(text_base[d] + s, text_base[d] + e) for d, doc in enumerate(spans) for s, e in doc],
                    dtype=np.int64).reshape(-1, 2)
    if not len(flat):
        return np.zeros(len(global_starts), dtype=bool)
    which = np.searchsorted(flat[:, 0], global_starts, side="right") - 1
    return (which >= 0) & (global_starts < flat[np.maximum(which, 0), 1])


def _flatten(encodings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    total = int(lengths.sum())
    ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=total)
    starts = np.fromiter((s for e in encodings for s, _ in e.offsets), dtype=np.int64, count=total)
    return ids, starts, lengths


def _whole(backend, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _flatten(backend.encode_batch(texts, add_special_tokens=False))


def _splitter(tokenizer):
    """A regex matching the added tokens, or None when pieces would not tokenize independently."""
    added = list(getattr(tokenizer, "added_tokens_decoder", {}).items())
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for _, t in added):
        return None, {}
    contents = sorted((t.content for _, t in added), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")"), {t.content: i for i, t in added}


def _by_pieces(tokenizer, backend, texts: list[str]):
    splitter, special_ids = _splitter(tokenizer)
    if splitter is None or not texts:
        return None, None, None
    piece_index: dict[str, int] = {}
    seg_piece: list[int] = []  # per segment: index into the piece table
    seg_char: list[int] = []  # per segment: where it starts in its document
    doc_segments = np.zeros(len(texts), dtype=np.int64)
    for d, text in enumerate(texts):
        position = 0
        parts = splitter.split(text)
        for part in parts:
            if part:
                seg_piece.append(piece_index.setdefault(part, len(piece_index)))
                seg_char.append(position)
                position += len(part)
        doc_segments[d] = sum(1 for p in parts if p)
    pieces = list(piece_index)
    plain = [p for p in pieces if p not in special_ids]
    encoded = dict(zip(plain, backend.encode_batch(plain, add_special_tokens=False)))
    table_ids, table_starts, table_len = [], [], np.zeros(len(pieces), dtype=np.int64)
    for k, piece in enumerate(pieces):
        if piece in special_ids:
            table_ids.append([special_ids[piece]])
            table_starts.append([0])
        else:
            table_ids.append(encoded[piece].ids)
            table_starts.append([s for s, _ in encoded[piece].offsets])
        table_len[k] = len(table_ids[-1])
    flat_ids = np.fromiter((i for row in table_ids for i in row), dtype=np.int32, count=int(table_len.sum()))
    flat_starts = np.fromiter((s for row in table_starts for s in row), dtype=np.int64, count=len(flat_ids))
    table_off = np.cumsum(table_len) - table_len
    # Gather: segment s contributes table rows [table_off[p], +table_len[p]) of its piece p.
    seg_piece_a = np.asarray(seg_piece, dtype=np.int64)
    seg_len = table_len[seg_piece_a]
    within = np.arange(int(seg_len.sum())) - np.repeat(np.cumsum(seg_len) - seg_len, seg_len)
    src = np.repeat(table_off[seg_piece_a], seg_len) + within
    ids = flat_ids[src]
    starts = flat_starts[src] + np.repeat(np.asarray(seg_char, dtype=np.int64), seg_len)
    if not np.all(doc_segments > 0):  # an empty document: let the plain path handle it
        return None, None, None
    lengths = np.add.reduceat(seg_len, np.cumsum(doc_segments) - doc_segments)
    if not _same_as_whole(backend, texts, ids, lengths):
        return None, None, None
    return ids, starts, lengths


def _same_as_whole(backend, texts, ids, lengths) -> bool:
    """Re-encode a spread sample of documents whole; any difference disables the piece path."""
    pick = np.unique(np.linspace(0, len(texts) - 1, num=min(_CHECKED_DOCS, len(texts))).astype(int))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for d, enc in zip(pick, backend.encode_batch([texts[d] for d in pick], add_special_tokens=False)):
        if enc.ids != ids[bounds[d] : bounds[d + 1]].tolist():
            return False
    return True
