"""Rendered texts -> token ids and per-token "trained" flags, fast and exactly as transformers does.

A fast tokenizer cuts the text at its added tokens (``<|im_start|>``, ``<|im_end|>``, ...) before
normalising and running BPE, so the text between two special tokens is always tokenized on its
own.  Chat data repeats those pieces a lot (the same system prompt, the same ``\\n`` between
turns), so each distinct piece is encoded once, in one batched Rust call, and documents are
assembled from pieces with numpy index arithmetic.  A sample of documents is re-encoded whole
and compared, and any difference (a tokenizer whose added tokens strip spaces, say) switches to
encoding every document whole: the ids are always those of ``apply_chat_template(tokenize=True)``.

Character offsets come along, and the trained character spans become token flags with one
``searchsorted`` (a token is trained when it starts inside a span).  For a byte-level BPE
tokenizer an ASCII piece's offsets are its tokens' byte lengths added up (one character a byte,
the vocabulary's strings one character a byte): those pieces go through ``encode_batch_fast``,
which skips the offsets (~30% of the Rust call), and the sampled whole documents check the starts
too; any difference, and the chunk is encoded as before, offsets from Rust.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Optional

import numpy as np

_CHECKED_DOCS = 32
_first = itemgetter(0)
_FAST = True  # ASCII pieces' offsets from the tokens' byte lengths (see the module); off: every offset from Rust
_BYTE_LENGTHS: dict[int, tuple[object, Optional[np.ndarray]]] = {}  # id(backend) -> (backend, bytes per token id)
_log = logging.getLogger(__name__)


@dataclass
class StartCounts:
    """How the ASCII fast path went in this process: chunks whose starts were counted from byte
    lengths, and chunks redone with Rust's offsets because the sampled documents disagreed."""

    counted: int = 0
    redone: int = 0


STARTS = StartCounts()


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
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=text_base[1:])
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


def _byte_lengths(backend) -> Optional[np.ndarray]:
    """Bytes per token id when an ASCII piece's token starts are its tokens' byte lengths added up,
    decided from the tokenizer's own description (:func:`_counts_bytes`); else None."""
    import json

    if id(backend) in _BYTE_LENGTHS:
        return _BYTE_LENGTHS[id(backend)][1]
    lengths = None
    vocab = backend.get_vocab(with_added_tokens=False)
    if hasattr(backend, "encode_batch_fast") and _counts_bytes(json.loads(backend.to_str()), vocab):
        lengths = np.zeros(max(backend.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=0) + 1),
                           dtype=np.int64)
        lengths[np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))] = np.fromiter(map(len, vocab),
                                                                                               dtype=np.int64, count=len(vocab))
    _BYTE_LENGTHS[id(backend)] = (backend, lengths)
    return lengths


_KEEPS_TEXT = {"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}  # Split behaviours that drop nothing


def _counts_bytes(config: dict, vocab: dict[str, int]) -> bool:
    """Whether a piece of ASCII text comes out of this tokenizer as tokens whose byte lengths add up
    to where each starts: byte-level BPE (every vocabulary string one character a byte of ByteLevel's
    alphabet, no prefixes or suffixes, no byte fallback), a normaliser that leaves ASCII alone, a
    pre-tokenizer that only splits (no added prefix space), no trimmed offsets afterwards."""
    from tokenizers.pre_tokenizers import ByteLevel

    def steps(node, key):
        node = node or {}
        return [s for n in node.get(key, []) for s in steps(n, key)] if node.get("type") == "Sequence" else [node] if node else []

    model = config.get("model") or {}
    if (model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")):
        return False
    if any(n.get("type") not in ("NFC", "NFD", "NFKC", "NFKD") for n in steps(config.get("normalizer"), "normalizers")):
        return False
    pre = steps(config.get("pre_tokenizer"), "pretokenizers")
    if not any(n.get("type") == "ByteLevel" for n in pre) or not all(
            (n.get("type") == "ByteLevel" and not n.get("add_prefix_space"))
            or (n.get("type") == "Split" and n.get("behavior") in _KEEPS_TEXT and not n.get("invert"))
            or n.get("type") in ("Digits", "Punctuation") for n in pre):
        return False
    if not all(n.get("type") == "TemplateProcessing" or (n.get("type") == "ByteLevel" and not n.get("trim_offsets"))
               for n in steps(config.get("post_processor"), "processors")):
        return False
    alphabet = set(ByteLevel.alphabet())
    return all(alphabet.issuperset(token) for token in vocab)


def _by_pieces(tokenizer, backend, texts: list[str], fast: bool = True):
    splitter, special_ids = _splitter(tokenizer)
    if splitter is None or not texts:
        return None, None, None
    # every document's non-empty parts (pieces between added tokens, and the added tokens), in order
    split = [list(filter(None, splitter.split(text))) for text in texts]
    doc_segments = np.fromiter(map(len, split), dtype=np.int64, count=len(texts))
    if not np.all(doc_segments > 0):  # an empty document: let the plain path handle it
        return None, None, None
    segments = list(chain.from_iterable(split))
    piece_index = {piece: k for k, piece in enumerate(dict.fromkeys(segments))}  # distinct, first seen first
    seg_piece_a = np.fromiter(map(piece_index.__getitem__, segments), dtype=np.int64, count=len(segments))
    seg_chars = np.fromiter(map(len, segments), dtype=np.int64, count=len(segments))
    seg_end = np.cumsum(seg_chars)
    first_seg = np.cumsum(doc_segments) - doc_segments
    # where each segment starts in its document: its start on one axis of all of them, less its document's
    seg_char = seg_end - seg_chars - np.repeat(seg_end[first_seg] - seg_chars[first_seg], doc_segments)
    pieces = list(piece_index)
    byte_lengths = _byte_lengths(backend) if fast and _FAST else None
    # with byte_lengths: the ASCII pieces without their offsets (start = the bytes of the tokens before)
    by_bytes = [False] * len(pieces) if byte_lengths is None else [p.isascii() and p not in special_ids for p in pieces]
    plain = [p for p, b in zip(pieces, by_bytes) if not b and p not in special_ids]
    encodings = iter(backend.encode_batch(plain, add_special_tokens=False))
    fast_encodings = iter(backend.encode_batch_fast([p for p, b in zip(pieces, by_bytes) if b], add_special_tokens=False)
                          if byte_lengths is not None else ())
    table_ids, table_starts = [], []
    for piece, b in zip(pieces, by_bytes):
        special = special_ids.get(piece)
        if special is not None:
            table_ids.append([special])
            table_starts.append([0])
        elif b:
            table_ids.append(next(fast_encodings).ids)
            table_starts.append(())
        else:
            encoding = next(encodings)
            table_ids.append(encoding.ids)
            table_starts.append(list(map(_first, encoding.offsets)))
    table_len = np.fromiter(map(len, table_ids), dtype=np.int64, count=len(pieces))
    flat_ids = np.fromiter(chain.from_iterable(table_ids), dtype=np.int32, count=int(table_len.sum()))
    table_off = np.cumsum(table_len) - table_len
    if byte_lengths is None or not any(by_bytes):
        flat_starts = np.fromiter(chain.from_iterable(table_starts), dtype=np.int64, count=len(flat_ids))
    else:
        token_bytes = byte_lengths[flat_ids]
        before = np.cumsum(token_bytes) - token_bytes  # bytes of every token before, on one axis
        flat_starts = before - np.repeat(before[table_off], table_len)  # ... less its piece's first
        from_rust = np.flatnonzero(~np.fromiter(by_bytes, dtype=bool, count=len(pieces)))
        if len(from_rust):  # the other pieces' offsets, as Rust gave them
            n = table_len[from_rust]
            at = np.repeat(table_off[from_rust], n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
            flat_starts[at] = np.fromiter(chain.from_iterable(table_starts[k] for k in from_rust.tolist()), dtype=np.int64,
                                          count=len(at))
    # Gather: segment s contributes table rows [table_off[p], +table_len[p]) of its piece p.
    seg_len = table_len[seg_piece_a]
    within = np.arange(int(seg_len.sum())) - np.repeat(np.cumsum(seg_len) - seg_len, seg_len)
    src = np.repeat(table_off[seg_piece_a], seg_len) + within
    ids = flat_ids[src]
    starts = flat_starts[src] + np.repeat(seg_char, seg_len)
    lengths = np.add.reduceat(seg_len, np.cumsum(doc_segments) - doc_segments)
    same = _same_as_whole(backend, texts, ids, lengths, starts if byte_lengths is not None else None)
    if same is None:  # starts counted in bytes differ from Rust's: this chunk as before
        STARTS.redone += 1
        if STARTS.redone == 1:
            _log.warning("token starts counted from byte lengths differ from the tokenizer's offsets; "
                         "such chunks are encoded again with the offsets")
        return _by_pieces(tokenizer, backend, texts, fast=False)
    if not same:
        return None, None, None
    if byte_lengths is not None and any(by_bytes):
        STARTS.counted += 1
    return ids, starts, lengths


def _same_as_whole(backend, texts, ids, lengths, starts: Optional[np.ndarray] = None) -> Optional[bool]:
    """Re-encode a spread sample of documents whole; any difference in the ids disables the piece
    path (False); with ``starts``, any difference in the tokens' first characters gives None."""
    pick = np.unique(np.linspace(0, len(texts) - 1, num=min(_CHECKED_DOCS, len(texts))).astype(int))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for d, enc in zip(pick, backend.encode_batch([texts[d] for d in pick], add_special_tokens=False)):
        if enc.ids != ids[bounds[d] : bounds[d + 1]].tolist():
            return False
        if starts is not None and list(map(_first, enc.offsets)) != starts[bounds[d] : bounds[d + 1]].tolist():
            return None
    return True
