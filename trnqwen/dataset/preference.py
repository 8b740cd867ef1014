"""Preference pairs (a ``--method`` whose data is ``preference``) -> a token cache the ranks read.

Each pair is two documents rendered with the model's chat template: prompt + chosen and
prompt + rejected.  Only the answers' tokens (and the end-of-turn token closing them) are
targets; the shared prompt is context only, on both sides.  **A pair is never split**: chosen
and rejected are placed side by side in the same row (``positions`` restart at 0 at each, so
they never attend to each other), which is what keeps them in one batch on one rank.  Rows are
packed with whole pairs (next-fit, in order), or one pair per row with ``--no-packing``.

The cache is the SFT cache (``cache.py``) plus one array, ``segments`` (int32 [N, S]): for every
target position, ``2 * slot + side`` (slot = the pair's place in its row, side 0 chosen /
1 rejected), -1 elsewhere.  A preference loss sums each segment's token log-probabilities with it.
``meta.json`` names the method (``"method"``) and the most pairs any row holds (``pairs_per_row``).

Over-long pairs (chosen + rejected beyond ``--seq-len``): ``--long-conversations truncate`` cuts
the same number of tokens from the start of both prompts (the end of the prompt, the question
being answered, is kept), or drops the pair when the answers alone do not fit; ``drop`` drops it.
Both are counted with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trnqwen.dataset import cache
from trnqwen.dataset.cache import IGNORE_INDEX, SplitArrays
from trnqwen.dataset.encode import TokenizedDocs
from trnqwen.dataset.packing import fit_problems
from trnqwen.dataset.preference_formats import (
    PREFERENCE_FORMATS,
    PreferencePair,
    detect_preference_format,
    normalise_pairs,
)
from trnqwen.dataset.mixture import Part
from trnqwen.dataset.sources import Source
from trnqwen.errors import UsageError

SEGMENTS = "segments"


@dataclass
class FittedPairs:
    """Pairs cut to fit ``seq_len``: per kept pair, the token range of each side."""

    keep: np.ndarray  # pair indices kept, in order
    starts: np.ndarray  # [n_pairs, 2] first token (after any prompt cut) of chosen / rejected, in docs.ids
    truncated: list[int] = field(default_factory=list)
    dropped: dict[str, list[int]] = field(default_factory=dict)


def bundled_pairs_path() -> Path:
    """The bundled preference set (calculator chats: the right result chosen, a wrong one rejected);
    what a preference method trains on without ``--dataset``."""
    from trnqwen.data import preference_recipe

    return preference_recipe.prefs_path()


def load_pairs(source: Source, forced: Optional[str], *, method: str) -> tuple[list[PreferencePair], str, int]:
    """The pairs of ``source`` (``method``: the run's method, named in the hints)."""
    records = source.records()
    if not records:
        raise UsageError(f"dataset {source.name} has no records", hint="point --dataset at data with records in it")
    fmt = forced if forced not in (None, "auto") else detect_preference_format(records[0], method=method)
    if fmt not in PREFERENCE_FORMATS:
        raise UsageError(
            f"--dataset-format {fmt} is not a preference format",
            hint=f"--method {method} reads: {', '.join(PREFERENCE_FORMATS)} (or leave --dataset-format auto)",
        )
    return normalise_pairs(records, fmt), fmt, len(records)


def render_pairs(tokenizer, pairs: list[PreferencePair], context: Optional[dict[str, Any]] = None, *,
                 answer_end: str = "im_end") -> TokenizedDocs:
    """Documents 2i (chosen) and 2i+1 (rejected): texts, answer-only trained flags, token ids.

    ``answer_end="im_end"``: each answer turn and the ``<|im_end|>`` closing it (the chat rule,
    ``dataset/chat.py``); ``"trl"``: TRL's convention for a pair, everything the template writes after
    the prompt (its generation prompt) to the end: the answer, ``<|im_end|>`` and the newline after it."""
    from trnqwen.dataset import chat
    from trnqwen.dataset.formats import Example

    examples = [Example(p.where, messages=p.conversation(side)) for p in pairs for side in ("chosen", "rejected")]
    texts, spans = chat.render(tokenizer, examples, train_on_inputs=False, context=context)
    # The prompt's own earlier assistant turns are context: keep only the answers' spans.
    for i, pair in enumerate(pairs):
        in_prompt = sum(1 for m in pair.prompt if m["role"] == "assistant")
        for d in (2 * i, 2 * i + 1):
            spans[d] = spans[d][in_prompt:]
            if answer_end == "trl" and spans[d]:
                spans[d] = [(spans[d][0][0], len(texts[d]))]
    return chat.tokenize(tokenizer, texts, spans)


def fit_pairs(docs: TokenizedDocs, seq_len: int, policy: str) -> FittedPairs:
    """Apply ``--long-conversations`` to whole pairs (see the module rule)."""
    n_pairs = len(docs) // 2
    starts = docs.bounds[:-1].reshape(n_pairs, 2).copy()
    lengths = docs.lengths.reshape(n_pairs, 2)
    prompt = np.array([_first_trained(docs, d) for d in range(len(docs))], dtype=np.int64).reshape(n_pairs, 2)
    keep = np.ones(n_pairs, dtype=bool)
    truncated: list[int] = []
    dropped: dict[str, list[int]] = {}
    for i in np.flatnonzero(lengths.sum(axis=1) > seq_len).tolist():
        over = int(lengths[i].sum()) - seq_len
        cut = (over + 1) // 2
        if policy == "drop":
            dropped.setdefault(f"chosen + rejected longer than {seq_len} tokens", []).append(i)
            keep[i] = False
        elif cut >= int(prompt[i].min()):  # at least one prompt token must stay to predict the answer from
            dropped.setdefault(f"answers alone longer than {seq_len} tokens", []).append(i)
            keep[i] = False
        else:
            starts[i] += cut
            truncated.append(i)
    return FittedPairs(keep=np.flatnonzero(keep), starts=starts, truncated=truncated, dropped=dropped)


def _first_trained(docs: TokenizedDocs, d: int) -> int:
    flags = docs.trained[docs.bounds[d] : docs.bounds[d + 1]]
    hits = np.flatnonzero(flags)
    return int(hits[0]) if len(hits) else int(len(flags))


def build_pair_rows(docs: TokenizedDocs, fitted: FittedPairs, pair_indices: np.ndarray, *, seq_len: int,
                    packing: bool, pad_id: int, strategy: str = "sequential", seed: int = 0) -> tuple[SplitArrays, int]:
    """The split made of pairs ``pair_indices`` (kept, in order) and the most pairs in a row.
    Whole pairs are packed as documents are (``packing.assign_rows``: best-fit or sequential)."""
    from trnqwen.dataset.packing import assign_rows

    ends = docs.bounds[1:].reshape(-1, 2)[pair_indices]
    starts = fitted.starts[pair_indices]
    lengths = (ends - starts).astype(np.int64)  # [n, 2]
    pair_len = lengths.sum(axis=1)
    rows, cols = assign_rows(pair_len, seq_len, packing, strategy, seed)
    slots = np.zeros(len(pair_indices), dtype=np.int64)  # a pair's place in its row, by column
    by_place = np.lexsort((cols, rows))
    first = np.searchsorted(rows[by_place], rows[by_place], side="left")
    slots[by_place] = np.arange(len(by_place)) - first
    n_rows = int(rows.max()) + 1 if len(rows) else 0

    # Flatten to documents: chosen then rejected of each pair.
    doc_start = starts.reshape(-1)
    doc_len = lengths.reshape(-1)
    doc_row = np.repeat(rows, 2)
    doc_col = np.stack([cols, cols + lengths[:, 0]], axis=1).reshape(-1)
    doc_segment = (2 * np.repeat(slots, 2) + np.tile([0, 1], len(pair_indices))).astype(np.int64)
    owner = np.repeat(np.arange(len(doc_len)), doc_len)
    position = np.arange(int(doc_len.sum())) - np.repeat(np.cumsum(doc_len) - doc_len, doc_len)
    src = doc_start[owner] + position
    nxt = np.minimum(src + 1, len(docs.ids) - 1)
    target = (position < doc_len[owner] - 1) & docs.trained[nxt]
    labels = np.where(target, docs.ids[nxt], IGNORE_INDEX)
    segments = np.where(target, doc_segment[owner], -1)

    input_ids = np.full((n_rows, seq_len), pad_id, dtype=np.int32)
    label_rows = np.full((n_rows, seq_len), IGNORE_INDEX, dtype=np.int32)
    segment_rows = np.full((n_rows, seq_len), -1, dtype=np.int32)
    used = np.zeros(n_rows, dtype=np.int64)
    np.maximum.at(used, rows, cols + pair_len)
    positions = np.maximum(np.arange(seq_len)[None, :] - used[:, None], 0).astype(np.int32)
    dst_row, dst_col = doc_row[owner], doc_col[owner] + position
    input_ids[dst_row, dst_col] = docs.ids[src]
    label_rows[dst_row, dst_col] = labels
    segment_rows[dst_row, dst_col] = segments
    positions[dst_row, dst_col] = position
    split = SplitArrays(input_ids, label_rows, positions, documents=len(doc_len),
                        padding_tokens=int(n_rows * seq_len - len(src)), extra={SEGMENTS: segment_rows})
    return split, int(slots.max()) + 1 if len(slots) else 0


def write_pairs(settings, assets_dir: Path, cache_root: Path, key: str, parts: list[Part],
                val_source: Optional[Source], template=None) -> Any:
    """Read (every part of a mixture: :mod:`trnqwen.dataset.mixture`), render, fit, pack and write;
    returns (the cache folder, its report)."""
    from trnqwen.dataset import chat, mixture
    from trnqwen.dataset.template import template_context

    loaded = mixture.load_parts(parts, val_source, lambda source, fmt: load_pairs(source, fmt, method=settings.method),
                                forced=settings.dataset_format, val_split=settings.val_split, seed=settings.seed)
    n_records, val_idx, everything = loaded.records, loaded.val_idx, loaded.units  # records: kept + dropped, as SFT's
    context = template_context(settings.enable_thinking)
    tokenizer = chat.load_tokenizer(assets_dir, template, context)
    docs = render_pairs(tokenizer, everything, context, answer_end=settings.answer_end)
    fitted = fit_pairs(docs, settings.seq_len, settings.long_conversations)
    kept = np.zeros(len(everything), dtype=bool)
    kept[fitted.keep] = True
    pair_lengths = docs.lengths.reshape(-1, 2) - (fitted.starts - docs.bounds[:-1].reshape(-1, 2))
    trained = np.add.reduceat(docs.trained.astype(np.int64), docs.bounds[:-1]).reshape(-1, 2).sum(axis=1)
    train_pairs = mixture.select(parts, loaded, loaded.train_idx[kept[loaded.train_idx]], trained, settings.seed)
    val_kept = val_idx[kept[val_idx]]
    fmt, name = loaded.format, " + ".join(part.name for part in parts)
    if not len(train_pairs):
        raise UsageError(
            f"dataset {name}: no preference pair fits in --seq-len {settings.seq_len}",
            hint="raise --seq-len, or shorten the prompts",
        )
    if len(val_idx) and not len(val_kept):
        raise UsageError("every validation pair was dropped", hint="raise --seq-len or pick other validation data")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    build = dict(seq_len=settings.seq_len, packing=settings.packing, pad_id=int(pad_id),
                 strategy=settings.packing_strategy, seed=settings.seed)
    splits, per_row = {}, {}
    for name, idx in (("train", train_pairs), ("val", val_kept)):
        if len(idx):
            splits[name], per_row[name] = build_pair_rows(docs, fitted, idx, **build)
    report = pair_report(settings, fmt, n_records, docs, everything, fitted, splits, train_pairs, len(val_kept))
    report.update(mixture.report(parts, loaded, train_pairs, pair_lengths.sum(axis=1), trained, packing=settings.packing,
                                 strategy=settings.packing_strategy, seq_len=settings.seq_len, template=template))
    report["source"] = name
    directory = cache.write_cache(
        cache_root, key, splits, seq_len=settings.seq_len, packing=settings.packing, pad_id=int(pad_id),
        eos_id=tokenizer.convert_tokens_to_ids(chat.end_of_turn(tokenizer)),
        extra_meta={"format": fmt, "source": name, "report": report, "method": settings.method,
                    "chat_template": template.text if template else None,
                    "pairs": {name: int(len(idx)) for name, idx in (("train", train_pairs), ("val", val_kept)) if len(idx)},
                    "pairs_per_row": per_row, "settings": {**settings.__dict__}},
    )
    return directory, report


def pair_report(settings, fmt, n_records, docs, pairs, fitted, splits, train_pairs, n_val) -> dict[str, Any]:
    train = splits["train"].stats()
    seq_len = settings.seq_len
    problems = fit_problems("pair", f"longer than {seq_len} tokens: their prompts cut from the start",
                            fitted.truncated, fitted.dropped, lambda i: pairs[i].where)
    lengths = docs.lengths.reshape(-1, 2)[train_pairs]
    trained = np.add.reduceat(docs.trained.astype(np.int64), docs.bounds[:-1]).reshape(-1, 2)[train_pairs]
    return {
        "method": settings.method,
        "format": fmt,
        "records": int(n_records),
        "kept": int(len(fitted.keep)),
        "dropped": int(sum(len(v) for v in fitted.dropped.values())),
        "dropped_reasons": {reason: len(v) for reason, v in fitted.dropped.items()},
        "truncated": len(fitted.truncated),
        "pairs": int(len(train_pairs)),
        "tokens": train["tokens"],
        "trained_tokens": train["trained_tokens"],
        "prompt_tokens": int((lengths - trained).sum()),
        "chosen_tokens": int(trained[:, 0].sum()),
        "rejected_tokens": int(trained[:, 1].sum()),
        "sequences": train["sequences"],
        "seq_len": seq_len,
        "packing": settings.packing,
        "padding_fraction": round(train["padding_tokens"] / max(1, train["sequences"] * seq_len), 4),
        "val_records": int(n_val),
        "val_sequences": splits["val"].stats()["sequences"] if "val" in splits else 0,
        "problems": problems,
        "sample": {side: _side_sample(docs, 2 * int(train_pairs[0]) + k) for k, side in enumerate(("chosen", "rejected"))},
    }


def _side_sample(docs: TokenizedDocs, d: int) -> dict[str, Any]:
    return {"text": docs.texts[d], "trained_spans": [[int(s), int(e)] for s, e in docs.spans[d] if e > s]}
