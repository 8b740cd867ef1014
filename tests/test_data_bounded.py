"""Bounded-memory preparation (issue 37 item 5, trnqwen.dataset.bounded) writes the cache the
in-memory path writes, byte for byte: records read one at a time, documents kept on disk, rows
written block by block.  Chunks and blocks are made tiny here so that every boundary is crossed.
How its memory behaves with the file's size is measured, not asserted: benchmarks/data_prep.py."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.test_data_mapping import write_jsonl
from tests.test_data_mixture import SHAREGPT_MAPPING, entry, mixed_lengths
from trnqwen.dataset import bounded, sources
from trnqwen.dataset.cache import ARRAY_NAMES, open_split, read_meta
from trnqwen.dataset.prepare import DataSettings, prepare
from trnqwen.dataset.sources import resolve_source
from trnqwen.errors import UsageError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("bounded") / "tiny-qwen3")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from trnqwen.data import chat_recipe

    folder = tmp_path_factory.mktemp("data")
    chats = [json.loads(line) for line in chat_recipe.chat_path().read_text().splitlines()]
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [{"conversations": [{"from": speakers[m["role"]], "value": m["content"]} for m in r["messages"]]} for r in chats]
    return {"chats": chat_recipe.chat_path(), "sharegpt": write_jsonl(folder / "sharegpt.jsonl", sharegpt),
            "texts": write_jsonl(folder / "texts.jsonl", mixed_lengths(300))}


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(bounded, "CHUNK_RECORDS", 37)
    monkeypatch.setattr(bounded, "ROW_BLOCK_TOKENS", 1000)


def _both(tmp_path, tiny, settings: DataSettings, workers: int = 1):
    memory = prepare(settings, tiny, tmp_path / "in-memory", bounded_memory=False)
    seen = []
    disk = prepare(settings, tiny, tmp_path / "bounded", bounded_memory=True, workers=workers,
                   progress=lambda done, total: seen.append((done, total)))
    return memory, disk, seen


CASES = {
    "one chat file, validation": dict(seq_len=256, val_split=0.1),
    "long conversations dropped, sequential": dict(seq_len=96, long_conversations="drop", packing_strategy="sequential"),
    "truncated, one per row, inputs trained": dict(seq_len=96, packing=False, train_on_inputs=True),
}


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_the_same_cache_as_in_memory(tmp_path, tiny, data, small_pieces, case, workers):
    memory, disk, seen = _both(tmp_path, tiny, DataSettings(dataset=str(data["chats"]), **CASES[case]), workers)
    _same(memory, disk)
    assert seen and seen[-1][0] == seen[-1][1] == data["chats"].stat().st_size
    assert [done for done, _ in seen] == sorted(done for done, _ in seen) and len(seen) > 2  # a chunk at a time


def test_the_workers_fast_paths_are_summed_in_the_log(tmp_path, tiny, data, small_pieces, caplog):
    """Each chunk's renders and token starts are counted in the worker that made it and summed
    here: a fast path that fell back in a worker shows in the parent's log."""
    import logging
    import math

    with caplog.at_level(logging.INFO, logger="trnqwen.dataset.prepare"):
        prepare(DataSettings(dataset=str(data["chats"]), seq_len=256), tiny, tmp_path / "c", bounded_memory=True, workers=2)
    chunks = math.ceil(len(data["chats"].read_text().splitlines()) / bounded.CHUNK_RECORDS)
    assert f"token starts: {chunks} chunks counted from byte lengths, 0 redone with the tokenizer's offsets" in caplog.messages


def test_a_weighted_mixture_through_a_mapping_is_the_same_too(tmp_path, tiny, data, small_pieces):
    settings = DataSettings(seq_len=128, val_split=0.05, datasets=[
        entry(data["sharegpt"], weight=3, **SHAREGPT_MAPPING), entry(data["texts"], weight=1, type="prompt-completion")])
    memory, disk, _ = _both(tmp_path, tiny, settings, workers=2)
    _same(memory, disk)
    assert disk.report["problems"] and all(abs(s["share"] - w) < 0.01 for s, w in zip(disk.report["sources"], (0.75, 0.25)))
    assert disk.report["mapping"][0]["before"] == memory.report["mapping"][0]["before"]


def test_a_folder_of_jsonl_files_is_the_same_too(tmp_path, tiny, data, small_pieces):
    """Lines go to the workers unparsed, file by file: each file's first record checked here, the
    blank lines (leading ones too) skipped, the records counted from what the workers send back."""
    lines = data["chats"].read_text().splitlines()
    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(lines[:100]) + "\n")
    (folder / "b.jsonl").write_text("\n \n\u3000\n" + "\n".join(lines[100:]) + "\n\n")
    memory, disk, _ = _both(tmp_path, tiny, DataSettings(dataset=str(folder), seq_len=256, val_split=0.1), workers=2)
    _same(memory, disk)
    assert disk.report["records"] == 300


def _same(memory, disk) -> None:
    assert memory.key == disk.key and memory.cache_dir != disk.cache_dir
    assert disk.report == memory.report
    assert read_meta(disk.cache_dir)["splits"] == read_meta(memory.cache_dir)["splits"]
    for split in read_meta(memory.cache_dir)["splits"]:
        a, b = open_split(memory.cache_dir, split), open_split(disk.cache_dir, split)
        for name in ARRAY_NAMES:
            np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=f"{split}.{name}")
    assert not [p for p in disk.cache_dir.parent.iterdir() if p.name.startswith(".")]  # the scratch files are gone


@pytest.mark.parametrize("content", [
    codecs.BOM_UTF8 + b'{"text": "a"}\r\n\n{"text": "b\xe2\x80\xa8c"}\n',  # BOM, CRLF, a blank line, U+2028 inside
    b'{"text": "a"}\n{"text": "\xff"}\n',  # not UTF-8 on line 2
    b'{"text": "a"}\n{"text": \n',  # not JSON on line 2
    b'[{"text": "a"},\n {"text": "b"}]\n',  # one JSON array: rename to .json
    b'["a", "b"]\n',
    b'{"text": "\\ud800"}\n',  # a lone surrogate
    b'\n\xe3\x80\x80\n{"text": "a"}\n \t\n\x1c\n{"text": "b"}',  # blank lines, ASCII or not (U+3000, U+001C), no last newline
])
def test_the_jsonl_stream_reads_what_the_whole_file_reader_reads(tmp_path, content, monkeypatch):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)

    def outcome(read):
        try:
            return [(r.data, r.where) for r in read()]
        except UsageError as exc:
            return f"{exc} | {exc.hint}"

    source = resolve_source(str(path))
    assert outcome(lambda: list(source.iter_records())) == outcome(source.records)
    for size, buffer in [(1, 1 << 20), (2, 1 << 20), (3, 5), (2, 1)]:  # the lines a worker is sent, parsed there:
        monkeypatch.setattr(sources, "_BLOCK_BYTES", buffer)  # (lines ending in another read buffer than they start)
        assert outcome(lambda: [r for _, lines in source.line_chunks(size) for r in lines.records()]) == outcome(source.records)
        if isinstance(outcome(source.records), list):
            chunks = [c for _, c in source.line_chunks(size)]
            assert [(c.start, c.length) for c in chunks] == list(zip(_starts(chunks), [c.length for c in chunks]))
            assert sum(c.length for c in chunks) == len(content)  # every byte in one chunk, in order
            assert all(c.number - 1 == content[:c.start].count(b"\n") for c in chunks)  # lines named as the file numbers them


def _starts(chunks) -> list[int]:
    return [sum(c.length for c in chunks[:i]) for i in range(len(chunks))]


def test_large_data_takes_the_bounded_path_by_itself(tmp_path, tiny, data, monkeypatch):
    monkeypatch.setattr(bounded, "BOUNDED_FROM_BYTES", data["chats"].stat().st_size)
    seen = []
    prepare(DataSettings(dataset=str(data["chats"]), seq_len=256), tiny, tmp_path / "c", progress=lambda *a: seen.append(a))
    assert seen  # only bounded preparation reports progress
    monkeypatch.setattr(bounded, "BOUNDED_FROM_BYTES", data["chats"].stat().st_size + 1)
    seen.clear()
    prepare(DataSettings(dataset=str(data["chats"]), seq_len=512), tiny, tmp_path / "c", progress=lambda *a: seen.append(a))
    assert not seen


def test_the_progress_bar_shows_on_a_terminal_only_and_never_with_json():
    import io

    from rich.console import Console

    from trnqwen import output

    def shown(**kw) -> str:
        buffer = io.StringIO()
        con = Console(file=buffer, width=120, **kw)
        with output.work_progress("Reading and tokenizing the dataset", con=con) as report:
            for done in (0, 40 << 20, 100 << 20):
                report(done, 100 << 20)
        return buffer.getvalue()

    bar = shown(force_terminal=True)
    assert "Reading and tokenizing the dataset" in bar and "104.9 MB" in bar  # rich's decimal units
    assert shown(force_terminal=False) == ""  # a log or a pipe
    buffer = io.StringIO()
    with output.work_progress("x", quiet=True, con=Console(file=buffer, force_terminal=True)) as report:
        report(1, 2)
    assert buffer.getvalue() == ""  # --json


def test_trnqwen_data_json_stays_one_document_on_the_bounded_path(cli, in_tmp, tiny, data, monkeypatch):
    monkeypatch.setattr(bounded, "BOUNDED_FROM_BYTES", 1)
    r = cli("data", str(data["chats"]), "--model", "builtin:tiny-qwen3", "--assets", str(tiny), "--seq-len", "256",
            "--data-cache-dir", str(in_tmp / "cache"), "--json")
    assert r.code == 0, r.text
    report = json.loads(r.out)
    assert report["records"] == 300 and report["sample"]["trained_spans"] and r.err == ""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_refused_record_is_named_before_a_later_unreadable_line_with_any_number_of_workers(tmp_path, tiny, small_pieces,
                                                                                           workers):
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]})
             for i in range(200)]
    lines[80] = json.dumps({"messages": [{"role": "wizard", "content": "?"}]})  # refused by the format (3rd chunk)
    lines[190] = '{"messages": '  # not JSON, read (by this process) before the 3rd chunk comes back
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as refused:
        prepare(DataSettings(dataset=str(path), seq_len=128), tiny, tmp_path / "c", bounded_memory=True, workers=workers)
    assert "line 81" in str(refused.value) and refused.value.hint
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]  # the scratch files are gone


def test_the_per_document_numbers_are_fixed_width_memory_maps_not_lists(tmp_path, tiny, data, small_pieces, monkeypatch):
    """Memory flat in the file's size: what DocStore keeps per document lives in scratch files, read
    back as maps; only counts and each problem's first record stay in the process."""
    from trnqwen.dataset.template import template_context

    from trnqwen.dataset import chat

    class Seen(bounded.Encoder):  # where each chunk was encoded (the workers are forked: they know tmp_path)
        def __call__(self, records, fmt):
            with open(tmp_path / "pids", "a") as fh:
                fh.write(f"{os.getpid()}\n")
            return super().__call__(records, fmt)

    tokenizer = chat.load_tokenizer(tiny)
    (tmp_path / "store").mkdir()
    store = bounded.DocStore(tmp_path / "store")
    encoder = Seen(tokenizer, 96, "drop", False, template_context(None))
    source = resolve_source(str(data["chats"]))
    loaded = bounded.read_documents([bounded.mixture.Part(source)], None, store, encoder,
                                    detect=lambda s, r, f: "messages", forced=None, val_split=0.0, seed=0, workers=2)
    for array in (loaded.part_of, loaded.train_idx):  # the split's per-document arrays: scratch maps too
        assert isinstance(array, np.memmap) and len(array) == 300 and array.dtype in (np.int16, np.int32)
    assert store.count == 300 and not any(isinstance(v, (list, np.ndarray)) and len(v) >= store.count // 37
                                          for v in vars(store).values())
    bounds, cut, targets, kept = store.arrays()
    for array in (bounds, cut, targets, kept):
        assert isinstance(array, np.memmap) and not array.flags.writeable
    assert bounds.dtype == np.int64 and cut.dtype == targets.dtype == np.int32 and kept.dtype == bool
    assert len(bounds) == 301 and bounds[-1] == store.tokens and kept.sum() == 300 - store.dropped_counts().get(
        "longer than 96 tokens", 0) - store.dropped_counts().get("no trained tokens within 96 tokens", 0)
    pids = (tmp_path / "pids").read_text().split()
    assert len(pids) == 9 and os.getpid() not in map(int, pids) and len(set(pids)) <= 2  # 300 records, 37 a chunk
    assert {p.name for p in (tmp_path / "store").iterdir()} >= {"ids.bin", "trained.bin", "lengths.bin", "cut.bin", "targets.bin"}


@pytest.mark.parametrize("json_out", [False, True])
def test_trnqwen_train_shows_the_preparations_progress_bar_as_data_does(cli, in_tmp, tiny, data, monkeypatch, json_out):
    """The bar `trnqwen data` shows, through `trnqwen train` (its dry run prepares the cache too):
    on a terminal (stderr made one here), nothing with --json."""
    import io

    from rich.console import Console

    from trnqwen import output

    monkeypatch.setattr(bounded, "BOUNDED_FROM_BYTES", 1)
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=120)
    monkeypatch.setattr(output, "work_progress", lambda description, quiet=False, con=None, _real=output.work_progress:
                        _real(description, quiet=quiet, con=terminal))
    r = cli("train", "--model", "builtin:tiny-qwen3", "--device", "cpu", "--assets", str(tiny), "--dataset",
            str(data["chats"]), "--seq-len", "256", "--data-cache-dir", str(in_tmp / "cache"), "--dry-run",
            *(["--json"] if json_out else []))
    assert r.code == 0, r.text
    shown = screen.getvalue()
    size = f"{data['chats'].stat().st_size / 1000:.1f}/{data['chats'].stat().st_size / 1000:.1f} kB"  # rich: decimal units
    assert ("Reading and tokenizing the dataset" in shown) != json_out and (size in shown) != json_out, shown


def test_rows_written_by_several_processes_are_the_same_files(tmp_path, tiny, data, small_pieces, monkeypatch):
    """With workers, each forked writer puts its blocks at their place in the cache's files
    (cache.StreamedSplit.write_rows): the same bytes, header included, as the in-memory path."""
    used = []
    real = bounded._write_in_parallel
    monkeypatch.setattr(bounded, "_write_in_parallel", lambda *a: used.append(len(a[1])) or real(*a))
    memory, disk, _ = _both(tmp_path, tiny, DataSettings(dataset=str(data["chats"]), seq_len=128, val_split=0.1), workers=2)
    assert used and max(used) > 2  # several blocks, shared out
    files = sorted(p.name for p in memory.cache_dir.glob("*.npy"))
    assert files == sorted(p.name for p in disk.cache_dir.glob("*.npy")) and len(files) == 6
    for name in files:
        assert (disk.cache_dir / name).read_bytes() == (memory.cache_dir / name).read_bytes(), name


def test_a_writer_that_fails_leaves_no_cache_and_no_scratch(tmp_path, tiny, data, small_pieces, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a block went wrong")

    monkeypatch.setattr(bounded, "_block", broken)  # in the forked writers too
    with pytest.raises(ValueError, match="a block went wrong"):
        prepare(DataSettings(dataset=str(data["chats"]), seq_len=128), tiny, tmp_path / "c", bounded_memory=True, workers=2)
    assert not list((tmp_path / "c").iterdir())  # no cache, no half-written folder, no scratch files


def _scratch(folder: Path):
    folder.mkdir(exist_ok=True)
    return bounded.DocStore(folder).scratch_array


@pytest.mark.parametrize("n,fraction,seed", [(10, 0.1, 0), (1000, 0.05, 3), (77, 0.5, 1), (5, 0.0, 0), (3_000_017, 0.02, 7)])
def test_hold_out_in_scratch_maps_is_the_in_memory_split(tmp_path, n, fraction, seed):
    """Bounded preparation holds out validation in int32 memory maps: ``rng.shuffle`` of an int32
    ``arange`` draws what ``permutation(n)`` (int64) draws, so both splits are the same indices."""
    if fraction:
        rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
        shuffled = np.arange(n, dtype=np.int32)
        rng_b.shuffle(shuffled)
        np.testing.assert_array_equal(shuffled, rng_a.permutation(n))
    train, val = bounded.mixture.hold_out(n, fraction, seed, alloc=_scratch(tmp_path / "s"))
    want_train, want_val = bounded.mixture.hold_out(n, fraction, seed)
    assert train.dtype == np.int32 and isinstance(train, np.memmap) and val.dtype in (np.int32, np.int64)
    np.testing.assert_array_equal(train, want_train)
    np.testing.assert_array_equal(val, want_val)


def test_the_sliced_index_helpers_are_their_whole_set_forms(tmp_path, monkeypatch):
    mixture = bounded.mixture
    monkeypatch.setattr(mixture, "_STEP", 7)  # every slice boundary crossed
    rng = np.random.default_rng(0)
    kept = rng.random(100) < 0.7
    indices = np.sort(rng.choice(100, 60, replace=False))
    values = rng.integers(0, 50, 100).astype(np.int32)
    got = mixture.take_kept(indices, kept, _scratch(tmp_path / "s"))
    np.testing.assert_array_equal(got, indices[kept[indices]])
    np.testing.assert_array_equal(mixture.take_kept(indices, kept), indices[kept[indices]])
    assert mixture.sum_at(values, indices) == int(values[indices].sum())
    part_of = np.array([1] * 9 + [0] * 30 + [2] * 20, dtype=np.int16)
    assert [mixture.first_of_part(part_of, i) for i in (0, 1, 2)] == [int(np.argmax(part_of == i)) for i in (0, 1, 2)]
    from trnqwen.dataset.bestfit import next_fit_count

    assert next_fit_count(values, 60, indices) == next_fit_count(values[indices], 60)
    assert next_fit_count(values, 60, indices[:0]) == 0


@pytest.mark.parametrize("asked", [
    dict(weights=(3, 1)), dict(weights=(1, 1, 2)), dict(records=(50, 400)), dict(records=(7, 3, 1000)), dict(records=(40,))])
def test_the_mixture_choice_in_scratch_maps_is_the_in_memory_one(tmp_path, monkeypatch, asked):
    """Weights and record counts (passes over a part that has fewer) pick the same units when every
    per-unit array is a scratch map, shuffled in place, handled a slice at a time."""
    from trnqwen.dataset.mixture import Loaded, Part, select

    mixture = bounded.mixture
    monkeypatch.setattr(mixture, "_STEP", 7)  # every slice boundary crossed
    rng = np.random.default_rng(5)
    shape = asked.get("weights") or asked["records"]
    part_of = rng.integers(0, len(shape), 600).astype(np.int16)
    trained = rng.integers(0, 40, 600).astype(np.int32)
    kept = np.flatnonzero(rng.random(600) < 0.8)
    parts = [Part(source=None, weight=asked["weights"][i] if "weights" in asked else None,
                  records=asked["records"][i] if "records" in asked else None) for i in range(len(shape))]
    loaded = Loaded(units=[], part_of=part_of, train_idx=kept, val_idx=kept[:0], formats=["messages"] * len(shape), records=600)
    alloc = _scratch(tmp_path / "s")
    before = len(list((tmp_path / "s").iterdir()))
    got = select(parts, loaded, kept, trained, 42, alloc)
    want = select(parts, loaded, kept, trained, 42)
    np.testing.assert_array_equal(got, want)
    assert len(want) and len(list((tmp_path / "s").iterdir())) > before  # (the per-unit arrays went to the scratch folder)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_the_closest_trained_token_count_is_found_across_slices(tmp_path, monkeypatch, step):
    """A weight's target met where the running sum crosses it, rounding to the nearer side, when the
    crossing is at a slice's first unit too."""
    mixture = bounded.mixture
    units = np.arange(12, dtype=np.int32)
    trained = np.random.default_rng(1).integers(1, 9, 12).astype(np.int32)
    for target in np.arange(0.0, float(trained.sum()) + 2, 0.5):
        want = mixture._down_to(units, target, trained, np.random.default_rng(3))
        monkeypatch.setattr(mixture, "_STEP", step)
        got = mixture._down_to(units, target, trained, np.random.default_rng(3), _scratch(tmp_path / "s"))
        monkeypatch.setattr(mixture, "_STEP", 1 << 20)
        np.testing.assert_array_equal(got, want, err_msg=f"target {target}")


def test_load_parts_with_scratch_maps_gives_the_same_split(tmp_path):
    """Several parts, one with its own validation source, one with --val-dataset: the arrays are the
    in-memory ones (values), kept in the scratch folder."""
    from trnqwen.dataset.mixture import Part, load_parts

    class FakeSource:
        def __init__(self, name, n):
            self.name, self.n, self.hub_name, self.mapping = name, n, None, None

    counts = {"a": 50, "b": 31, "b-val": 7, "v": 9}
    parts = [Part(FakeSource("a", 0), val_split=0.2), Part(FakeSource("b", 0), val_source=FakeSource("b-val", 0))]

    def read(source, fmt):
        return counts[source.name], "messages", counts[source.name]

    kwargs = dict(forced=None, val_split=0.1, seed=5)
    memory = load_parts(parts, FakeSource("v", 0), read, **kwargs)
    disk = load_parts(parts, FakeSource("v", 0), read, alloc=_scratch(tmp_path / "s"), **kwargs)
    for name in ("part_of", "train_idx", "val_idx"):
        np.testing.assert_array_equal(getattr(disk, name), getattr(memory, name), err_msg=name)
        assert isinstance(getattr(disk, name), np.memmap), name
    assert disk.read == memory.read and disk.records == memory.records
