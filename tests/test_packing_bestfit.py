"""Best-fit-decreasing packing (issue 37): fewer padded positions, the same documents, seeded rows.

The algorithm against a plain reference (every open row scanned), its invariants on random
lengths, and the measured padding before (sequential) and after (best-fit) on the bundled chat
set and a set of mixed lengths, through the real pipeline with the tiny model's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_data_mapping import write_jsonl
from tests.test_data_mixture import mixed_lengths
from trnqwen.dataset.bestfit import best_fit_rows, next_fit_count, next_fit_rows, padding_fraction
from trnqwen.dataset.prepare import DataSettings, prepare


def reference_fills(lengths: list[int], seq_len: int) -> list[int]:
    """Best-fit decreasing the obvious way: scan every open row for the least room that fits."""
    rooms: list[int] = []
    for n in sorted(lengths, reverse=True):
        fits = [i for i, room in enumerate(rooms) if room >= n]
        if fits:
            best = min(fits, key=lambda i: rooms[i])
            rooms[best] -= n
        else:
            rooms.append(seq_len - n)
    return sorted(seq_len - room for room in rooms)


def fills(lengths: np.ndarray, rows: np.ndarray) -> list[int]:
    return sorted(np.bincount(rows, weights=lengths).astype(int).tolist())


@settings(max_examples=150, deadline=None)
@given(st.integers(8, 300).flatmap(lambda s: st.tuples(st.just(s), st.lists(st.integers(1, s), max_size=120))),
       st.integers(0, 2**31 - 1))
def test_rows_are_best_fit_decreasing_and_never_overlap(case, seed):
    seq_len, lengths = case
    lengths = np.array(lengths, dtype=np.int64)
    rows, cols = best_fit_rows(lengths, seq_len, seed)
    assert fills(lengths, rows) == reference_fills(lengths.tolist(), seq_len)  # the same rows as the plain algorithm
    if len(lengths):
        assert sorted(set(rows.tolist())) == list(range(int(rows.max()) + 1))
        assert int(rows.max()) + 1 <= int(next_fit_rows(lengths, seq_len)[0].max()) + 1  # never more rows
    for row in set(rows.tolist()):
        mine = np.flatnonzero(rows == row)
        assert cols[mine].tolist() == sorted(cols[mine].tolist())  # a row keeps its documents' order
        spans = sorted(zip(cols[mine].tolist(), (cols[mine] + lengths[mine]).tolist()))
        assert spans[0][0] == 0 and spans[-1][1] <= seq_len
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # back to back, padding only at the end


def one_at_a_time(lengths: list[int], seq_len: int) -> tuple[list[int], list[int]]:
    """(creation row, first column) of each document placed one at a time, longest first (ties in
    order), into the least room that fits; among rows of equal room the one that got that room
    last; a document of no tokens always opens a row."""
    rooms: list[int] = []
    since: list[int] = []  # when each row got its present room
    rows = [0] * len(lengths)
    for clock, d in enumerate(sorted(range(len(lengths)), key=lambda i: -lengths[i])):
        need = lengths[d]
        fits = [r for r in range(len(rooms)) if rooms[r] >= need] if need else []
        row = min(fits, key=lambda r: (rooms[r], -since[r])) if fits else len(rooms)
        if not fits:
            rooms.append(seq_len)
            since.append(0)
        rooms[row] -= need
        since[row] = clock
        rows[d] = row
    cols, fill = [], [0] * len(rooms)
    for d, row in enumerate(rows):
        cols.append(fill[row])
        fill[row] += lengths[d]
    return rows, cols


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda s: st.tuples(st.just(s), st.lists(st.integers(0, s), max_size=150))),
       st.sampled_from([1 << 16, 5, 3]))
def test_a_length_at_a_time_places_every_document_where_one_at_a_time_would(case, step):
    """The batched placement (a row takes ``room // length`` documents at once) is the plain
    algorithm's answer document for document, row order and columns included, also when the
    work is cut into slices smaller than a length's documents."""
    from trnqwen.dataset import bestfit

    seq_len, lengths = case
    saved = bestfit._STEP
    bestfit._STEP = step
    try:
        rows, cols = best_fit_rows(np.array(lengths, dtype=np.int64), seq_len, 0)
    finally:
        bestfit._STEP = saved
    want_rows, want_cols = one_at_a_time(lengths, seq_len)
    n_rows = max(want_rows) + 1 if lengths else 0
    place = np.empty(n_rows, dtype=np.int64)
    place[np.random.default_rng(0).permutation(n_rows)] = np.arange(n_rows)
    assert rows.tolist() == place[want_rows].tolist() and cols.tolist() == want_cols


def test_the_row_order_is_drawn_from_the_seed():
    lengths = np.random.default_rng(3).integers(5, 200, size=400)
    a, b, c = (best_fit_rows(lengths, 256, seed)[0] for seed in (42, 42, 43))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and fills(lengths, a) == fills(lengths, c)
    fill_by_row = np.bincount(a, weights=lengths)
    assert not np.all(np.diff(fill_by_row) <= 0)  # not the creation order (fullest rows, longest documents, first)


def test_a_known_instance_packs_without_padding():
    rows, cols = best_fit_rows(np.array([5, 3, 2, 5, 3, 2]), 10, 0)
    assert fills(np.array([5, 3, 2, 5, 3, 2]), rows) == [10, 10]
    assert padding_fraction(np.array([5, 3, 2, 5, 3, 2]), int(rows.max()) + 1, 10) == 0.0
    assert int(next_fit_rows(np.array([5, 3, 2, 5, 3, 2]), 10)[0].max()) + 1 == 2  # (this order suits next-fit too)
    assert next_fit_count(np.array([5, 3, 2, 5, 3, 2]), 10) == 2 and next_fit_count(np.array([6, 6, 4, 4]), 10) == 3
    rows, _ = best_fit_rows(np.array([6, 6, 4, 4]), 10, 0)
    assert fills(np.array([6, 6, 4, 4]), rows) == [10, 10] and next_fit_rows(np.array([6, 6, 4, 4]), 10)[0].max() == 2


# --- measured on real data through the pipeline ------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("bestfit") / "tiny-qwen3")


def mixed_lengths_set(path: Path, n: int = 400) -> Path:
    return write_jsonl(path, mixed_lengths(n))


@pytest.mark.parametrize("which,seq_len", [("bundled", 256), ("bundled", 512), ("mixed", 256), ("mixed", 512)])
def test_best_fit_pads_less_than_sequential_on_the_same_documents(tmp_path, tiny, which, seq_len):
    dataset = None if which == "bundled" else str(mixed_lengths_set(tmp_path / "mixed.jsonl"))
    runs = {s: prepare(DataSettings(dataset=dataset, seq_len=seq_len, packing_strategy=s), tiny, tmp_path / "cache")
            for s in ("sequential", "best-fit")}
    seq, best = runs["sequential"].report, runs["best-fit"].report
    assert best["sequential_padding_fraction"] == seq["padding_fraction"]  # the report's "before" is the real one
    assert best["padding_fraction"] < seq["padding_fraction"] and best["sequences"] < seq["sequences"]
    assert (best["tokens"], best["trained_tokens"]) == (seq["tokens"], seq["trained_tokens"])
    print(f"\n{which} set at --seq-len {seq_len}: padding {seq['padding_fraction']:.1%} sequential "
          f"({seq['sequences']} rows) -> {best['padding_fraction']:.1%} best-fit ({best['sequences']} rows)")
    docs = {s: sorted(_documents(r)) for s, r in runs.items()}
    assert docs["sequential"] == docs["best-fit"]  # the same documents, only placed differently


def _documents(prepared) -> list[tuple[int, ...]]:
    split = prepared.split()
    out = []
    for ids, labels, pos in zip(np.asarray(split.input_ids), np.asarray(split.labels), np.asarray(split.positions)):
        starts = list(np.flatnonzero(pos == 0)) + [len(pos)]
        for a, b in zip(starts, starts[1:]):
            if not np.all(labels[a:b] == -100) or not np.all(ids[a:b] == split.meta["pad_id"]):
                out.append(tuple(ids[a:b].tolist()) + tuple(labels[a:b].tolist()))
    return out


def test_the_same_data_and_seed_give_the_same_rows(tmp_path, tiny):
    """Every backend memory-maps the one cache; two preparations of it (another folder) are identical."""
    a = prepare(DataSettings(seq_len=256), tiny, tmp_path / "a")
    b = prepare(DataSettings(seq_len=256), tiny, tmp_path / "b")
    c = prepare(DataSettings(seq_len=256, seed=5), tiny, tmp_path / "b")
    for name in ("input_ids", "labels", "positions"):
        np.testing.assert_array_equal(np.asarray(getattr(a.split(), name)), np.asarray(getattr(b.split(), name)))
    assert c.key != a.key and not np.array_equal(np.asarray(a.split().input_ids), np.asarray(c.split().input_ids))
    assert sorted(_documents(a)) == sorted(_documents(c))


@pytest.mark.parametrize("descending", [False, True])
def test_counting_order_is_the_stable_argsort_across_its_slices(monkeypatch, descending):
    from trnqwen.dataset import bestfit

    monkeypatch.setattr(bestfit, "_STEP", 7)  # many slices, runs of one key across them
    keys = np.random.default_rng(3).integers(0, 9, size=200).astype(np.int32)
    out = bestfit.counting_order(keys, 9, np.empty(200, dtype=np.int32), descending=descending)
    assert out.tolist() == np.argsort(-keys if descending else keys, kind="stable").tolist()
