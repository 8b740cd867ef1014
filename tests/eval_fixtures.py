"""Chat data tokenized for eval tests, by an independent rendering with ``apply_chat_template``.

Rows follow the cache contract: documents packed back to back, labels already shifted (the target
of input position t; -100 where untrained), each answer's tokens plus its ``<|im_end|>`` trained,
positions restarting at 0 per document, padding as one extra document.  Written with the
dataset cache's own writer so eval reads it exactly as it reads a training cache.
"""

from __future__ import annotations

import json
from pathlib import Path

IGNORE = -100


def render(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(input ids, trained flags per token) of one conversation: answers + their <|im_end|>."""
    ids: list[int] = []
    trained: list[int] = []
    for i, message in enumerate(messages):
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False) if i else ""
        full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if message["role"] == "assistant":
            header = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            answer = full[len(header):].rstrip("\n")  # content + <|im_end|>
            parts = [(header[len(before):], 0), (answer, 1), (full[len(header) + len(answer):], 0)]
        else:
            parts = [(full[len(before):], 0)]
        for text, flag in parts:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            trained += [flag] * len(piece)
    return ids, trained


def pack(tokenizer, records: list[dict], seq_len: int):
    """SplitArrays of ``records`` packed into ``seq_len`` rows (too-long ones dropped)."""
    import numpy as np

    from trnqwen.dataset.cache import SplitArrays

    pad = tokenizer.pad_token_id
    rows: list[tuple[list[int], list[int], list[int]]] = []
    cur: tuple[list[int], list[int], list[int]] = ([], [], [])
    documents = 0

    def flush():
        n = seq_len - len(cur[0])
        rows.append((cur[0] + [pad] * n, cur[1] + [IGNORE] * n, cur[2] + list(range(n))))

    for record in records:
        ids, trained = render(tokenizer, record["messages"])
        if len(ids) > seq_len:
            continue
        labels = [ids[t + 1] if t + 1 < len(ids) and trained[t + 1] else IGNORE for t in range(len(ids))]
        if len(cur[0]) + len(ids) > seq_len:
            flush()
            cur = ([], [], [])
        cur[0].extend(ids)
        cur[1].extend(labels)
        cur[2].extend(range(len(ids)))
        documents += 1
    if cur[0]:
        flush()
    ids, labels, positions = (np.array([r[k] for r in rows], dtype=np.int32) for k in range(3))
    return SplitArrays(ids, labels, positions, documents, int((ids == pad).sum()))


def write_chat_cache(root: Path, assets: Path, records: list[dict], *, val: int, seq_len: int = 128, key: str = "eval-test"):
    """A cache with ``train`` = all but the last ``val`` records and ``val`` = the last ``val``."""
    from transformers import AutoTokenizer

    from trnqwen.dataset.cache import write_cache

    tokenizer = AutoTokenizer.from_pretrained(str(assets))
    splits = {"train": pack(tokenizer, records[:-val], seq_len), "val": pack(tokenizer, records[-val:], seq_len)}
    return write_cache(
        root, key, splits, seq_len=seq_len, packing=True, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id
    )


def chat_records() -> list[dict]:
    from trnqwen.fetch.builtin import chat_path

    return [json.loads(line) for line in chat_path().read_text(encoding="utf-8").splitlines()]
