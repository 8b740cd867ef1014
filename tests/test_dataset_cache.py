"""The tokenized dataset cache: layout, atomic build, reuse, memory-mapped reading, keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trnqwen.dataset.cache import (
    ContentKey,
    SplitArrays,
    default_cache_root,
    has_split,
    lookup,
    open_split,
    write_cache,
)


def _split(rows: int, seq_len: int, seed: int = 0) -> SplitArrays:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, size=(rows, seq_len), dtype=np.int64)
    labels = np.where(rng.random((rows, seq_len)) < 0.5, -100, ids)
    positions = np.tile(np.arange(seq_len), (rows, 1))
    ids[:, -2:] = 7  # two pad positions per row
    labels[:, -2:] = -100
    return SplitArrays(ids, labels, positions, documents=rows, padding_tokens=2 * rows)


def _write(root: Path, key: str = "k" * 64, **splits: SplitArrays) -> Path:
    return write_cache(
        root, key, splits or {"train": _split(3, 8)}, seq_len=8, packing=True, pad_id=7,
        eos_id=5, extra_meta={"format": "messages", "source": "x.jsonl"},
    )


def test_write_then_open_round_trips_arrays_as_int32_memmaps(tmp_path):
    train, val = _split(4, 8, seed=1), _split(2, 8, seed=2)
    directory = _write(tmp_path, train=train, val=val)
    assert directory == tmp_path / ("k" * 64)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        ["meta.json"] + [f"{s}.{a}.npy" for s in ("train", "val") for a in ("input_ids", "labels", "positions")]
    )
    split = open_split(directory, "train")
    assert len(split) == 4 and split.seq_len == 8
    for name in ("input_ids", "labels", "positions"):
        array = getattr(split, name)
        assert isinstance(array, np.memmap) and array.dtype == np.int32
        np.testing.assert_array_equal(array, getattr(train, name))
    np.testing.assert_array_equal(open_split(directory, "val").labels, val.labels)


def test_meta_carries_the_contract_fields_and_counts(tmp_path):
    train = _split(3, 8)
    meta = json.loads((_write(tmp_path, train=train) / "meta.json").read_text())
    assert meta["version"] == 1 and meta["key"] == "k" * 64
    assert (meta["seq_len"], meta["packing"], meta["pad_id"], meta["eos_id"]) == (8, True, 7, 5)
    assert meta["format"] == "messages" and meta["source"] == "x.jsonl"
    stats = meta["splits"]["train"]
    assert stats == {
        "sequences": 3,
        "documents": 3,
        "tokens": 3 * 8 - 6,
        "trained_tokens": int((train.labels != -100).sum()),
        "padding_tokens": 6,
    }
    assert open_split(tmp_path / ("k" * 64)).stats == stats


def test_missing_split_raises_file_not_found(tmp_path):
    directory = _write(tmp_path)
    assert has_split(directory, "train") and not has_split(directory, "val")
    with pytest.raises(FileNotFoundError, match="val"):
        open_split(directory, "val")
    with pytest.raises(FileNotFoundError):
        open_split(tmp_path / "nope", "train")


def test_lookup_finds_only_complete_caches(tmp_path):
    key = "a" * 64
    assert lookup(tmp_path, key) is None
    (tmp_path / key).mkdir()  # a directory with no meta.json is not a cache
    assert lookup(tmp_path, key) is None
    directory = _write(tmp_path, key)
    assert lookup(tmp_path, key) == directory


def test_failed_write_leaves_nothing_behind(tmp_path):
    bad = SplitArrays(np.zeros((2, 8)), np.zeros((2, 8)), np.zeros((2, 7)), documents=2, padding_tokens=0)
    with pytest.raises(ValueError, match="positions"):
        _write(tmp_path, train=bad)
    # A crash after some arrays were written (labels that are not integers) removes the
    # temporary folder: no partial cache appears.
    good = _split(2, 8)
    crashing = SplitArrays(good.input_ids, np.full((2, 8), "x"), good.positions, 2, 0)
    with pytest.raises(ValueError):
        _write(tmp_path, train=crashing)
    assert list(tmp_path.iterdir()) == []


def test_second_writer_of_the_same_key_keeps_the_first(tmp_path):
    first = _write(tmp_path, train=_split(3, 8, seed=1))
    second = _write(tmp_path, train=_split(3, 8, seed=1))
    assert first == second
    assert [p.name for p in tmp_path.iterdir()] == ["k" * 64]  # no stray temp folder


def test_stale_incomplete_directory_is_replaced(tmp_path):
    key = "b" * 64
    (tmp_path / key).mkdir()
    (tmp_path / key / "train.labels.npy").write_bytes(b"junk")
    directory = _write(tmp_path, key)
    assert len(open_split(directory)) == 3


def test_only_known_splits_and_train_is_required(tmp_path):
    with pytest.raises(ValueError, match="train"):
        _write(tmp_path, val=_split(1, 8))
    with pytest.raises(ValueError, match="unknown split"):
        _write(tmp_path, train=_split(1, 8), test=_split(1, 8))


def test_content_key_depends_on_every_part_and_is_framed(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')

    def key(settings=None, text="tmpl", path=data):
        return ContentKey().add_file("data", path).add_text("template", text).add_settings(
            settings or {"seq_len": 8, "packing": True}
        ).hexdigest()

    base = key()
    assert base == key(settings={"packing": True, "seq_len": 8})  # order-independent
    assert base != key(settings={"seq_len": 16, "packing": True})
    assert base != key(text="tmpl2")
    data.write_text('{"text": "ho"}\n')
    assert base != key()
    # Framing: the split between two parts matters.
    a = ContentKey().add_text("x", "ab").add_text("x", "c").hexdigest()
    b = ContentKey().add_text("x", "a").add_text("x", "bc").hexdigest()
    assert a != b and len(a) == 64


def test_default_root_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_root() == tmp_path / "trnqwen" / "datasets"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_root() == Path.home() / ".cache" / "trnqwen" / "datasets"
