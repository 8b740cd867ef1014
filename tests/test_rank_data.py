"""The ranks' side of the token cache: sharding, exact resume, batches for torchtitan and the
Trainer, block-causal masks on every backend, and the generated config / spec that select them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trnqwen.dataset.cache import SplitArrays, write_cache
from trnqwen.runtime.token_stream import RankStream, StreamStateError

SEQ = 16
PAD = 0


def _rows(n: int, seed: int, docs_per_row: int = 3) -> SplitArrays:
    """``n`` packed rows: ``docs_per_row`` documents each (positions restart at 0), ids unique per row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 2000, size=(n, SEQ))
    ids[:, 0] = np.arange(n) + 3  # row r is recognisable by its first token
    positions = np.zeros((n, SEQ), dtype=np.int64)
    labels = np.full((n, SEQ), -100, dtype=np.int64)
    cuts = np.linspace(0, SEQ, docs_per_row + 1).astype(int)
    for a, b in zip(cuts[:-1], cuts[1:]):
        positions[:, a:b] = np.arange(b - a)
        labels[:, a:b - 1] = ids[:, a + 1:b]  # already shifted, last token of a document untrained
    return SplitArrays(ids, labels, positions, documents=n * docs_per_row, padding_tokens=0)


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return write_cache(tmp_path / "cache", "a" * 64, {"train": _rows(7, 1), "val": _rows(5, 2)},
                       seq_len=SEQ, packing=True, pad_id=PAD, eos_id=1)


# --- the sharding rule ------------------------------------------------------------------------


@pytest.mark.parametrize("n_rows,world", [(7, 2), (8, 4), (3, 5), (1, 1)])
def test_training_stream_covers_every_row_once_per_epoch_and_ranks_never_overlap(n_rows, world):
    streams = [RankStream(n_rows, rank=r, world=world, seed=3) for r in range(world)]
    epochs = 3
    seen: dict[int, list[int]] = {}
    for k in range(epochs * n_rows):  # item k*W+r of the stream: enough for 3 epochs
        for r, s in enumerate(streams):
            item = k * world + r
            if item < epochs * n_rows:
                seen.setdefault(item // n_rows, []).append(s.row_at(k))
    for epoch in range(epochs):
        assert sorted(seen[epoch]) == list(range(n_rows))  # a permutation: nothing dropped or doubled
    assert [streams[0].row_at(k) for k in range(min(3, n_rows))][:1] == [0]  # epoch 0 is cache order


def test_later_epochs_are_seeded_permutations():
    a, b, c = (RankStream(50, seed=s) for s in (1, 1, 2))
    epoch1 = [a.row_at(k) for k in range(50, 100)]
    assert epoch1 == [b.row_at(k) for k in range(50, 100)]
    assert epoch1 != [c.row_at(k) for k in range(50, 100)] and epoch1 != list(range(50))
    assert [a.row_at(k) for k in range(50)] == list(range(50))


def test_one_pass_gives_every_row_once_and_equal_whole_batches_per_rank():
    n, world, batch = 11, 3, 2
    per_rank = []
    for r in range(world):
        s = RankStream(n, rank=r, world=world, infinite=False, batch_size=batch)
        rows = []
        while not s.exhausted():
            rows.append(s.advance())
        per_rank.append(rows)
        with pytest.raises(StopIteration):
            s.advance()
    assert {len(rows) for rows in per_rank} == {4}  # ceil(ceil(11/3)/2)*2: same whole batches everywhere
    real = sorted(row for rows in per_rank for row in rows if row is not None)
    assert real == list(range(n))


def test_state_round_trips_and_refuses_another_layout():
    s = RankStream(9, rank=1, world=2, seed=5)
    for _ in range(13):
        s.advance()
    state = s.state_dict()
    t = RankStream(9, rank=1, world=2, seed=5)
    t.load_state_dict(state)
    assert [t.advance() for _ in range(20)] == [s.advance() for _ in range(20)]
    for other in (RankStream(9, rank=0, world=2, seed=5), RankStream(9, rank=1, world=4, seed=5),
                  RankStream(10, rank=1, world=2, seed=5), RankStream(9, rank=1, world=2, seed=6)):
        with pytest.raises(StreamStateError):
            other.load_state_dict(state)


# --- torchtitan's dataloader ------------------------------------------------------------------


def _titan_loader(cache_dir, *, rank=0, world=2, batch=2, split="train", one_pass=False, snapshot=1):
    from trnqwen.runtime.titan_data import TokenCacheDataLoader

    cfg = TokenCacheDataLoader.Config(cache_dir=str(cache_dir), split=split, seed=7, one_pass=one_pass)
    return cfg.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=SEQ, local_batch_size=batch,
                     snapshot_every_n_steps=snapshot)


def test_titan_batches_are_the_cache_rows_with_static_shapes(cache_dir):
    from trnqwen.dataset.cache import open_split

    split = open_split(cache_dir, "train")
    it = iter(_titan_loader(cache_dir, rank=1))
    for step in range(6):  # past the end of epoch 0: shapes never change
        inputs, labels = next(it)
        assert set(inputs) == {"input", "positions"}
        assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (2, SEQ)
        assert str(inputs["input"].dtype) == str(labels.dtype) == "torch.int64"
        if step == 0:  # rank 1 of 2 reads rows 1 and 3 first
            assert inputs["input"].tolist() == np.asarray(split.input_ids[[1, 3]]).tolist()
            assert labels.tolist() == np.asarray(split.labels[[1, 3]]).tolist()
            assert inputs["positions"].tolist() == np.asarray(split.positions[[1, 3]]).tolist()


def test_titan_loader_resumes_exactly_from_its_state(cache_dir):
    loader = _titan_loader(cache_dir, snapshot=5)  # as torchtitan builds it with checkpoint.interval 5
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [next(it)[0]["input"].tolist() for _ in range(5)]
    resumed = _titan_loader(cache_dir, snapshot=5)
    resumed.load_state_dict(state)
    it2 = iter(resumed)
    assert [next(it2)[0]["input"].tolist() for _ in range(5)] == expected


def test_titan_loader_refuses_a_cache_of_another_shape_or_key(cache_dir, tmp_path):
    from trnqwen.runtime.titan_data import TokenCacheDataLoader

    cfg = TokenCacheDataLoader.Config(cache_dir=str(cache_dir))
    with pytest.raises(ValueError, match="seq_len 16.*training.seq_len is 32"):
        cfg.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=32, local_batch_size=1)
    loader = _titan_loader(cache_dir)
    next(iter(loader))
    other = write_cache(tmp_path / "other", "b" * 64, {"train": _rows(7, 1)}, seq_len=SEQ, packing=True,
                        pad_id=PAD, eos_id=1)
    resumed = _titan_loader(other)
    resumed.load_state_dict(loader.state_dict())
    with pytest.raises(StreamStateError, match="another dataset cache"):
        next(iter(resumed))  # the StatefulDataLoader hands the state to the dataset when iterated


def test_validation_pass_counts_every_val_token_once(cache_dir):
    """The validator's view: one pass, fill rows train nothing, same batch count on every rank."""
    from trnqwen.dataset.cache import open_split

    val = open_split(cache_dir, "val")
    trained, batches = 0, set()
    for rank in range(2):
        loader = _titan_loader(cache_dir, rank=rank, split="val", one_pass=True)
        n = 0
        for inputs, labels in loader:
            assert labels.shape == (2, SEQ)
            trained += int((labels != -100).sum())
            n += 1
        batches.add(n)
    assert batches == {2}  # ceil(ceil(5/2)/2)
    assert trained == int((np.asarray(val.labels) != -100).sum())


def test_trainer_rows_equal_titan_rows(cache_dir):
    """hf-trainer reads the same rows, in the same order, as torchtitan's ranks."""
    from trnqwen.runtime.hf_trainer_data import CacheRows, rank_loader

    for rank in range(2):
        titan = iter(_titan_loader(cache_dir, rank=rank))
        trainer = iter(rank_loader(CacheRows(str(cache_dir), "train", seq_len=SEQ, rank=rank, world=2, batch_size=2,
                                             infinite=True, seed=7), 2))
        for _ in range(5):
            (t_in, t_labels), h = next(titan), next(trainer)
            assert h["input_ids"].tolist() == t_in["input"].tolist()
            assert h["position_ids"].tolist() == t_in["positions"].tolist()
            assert h["shift_labels"].tolist() == h["labels"].tolist() == t_labels.tolist()


# --- block-causal attention on every backend ----------------------------------------------------


def _block_causal(positions: np.ndarray) -> np.ndarray:
    doc = np.cumsum(positions == 0) - 1
    q, k = np.meshgrid(np.arange(len(positions)), np.arange(len(positions)), indexing="ij")
    return (k <= q) & (doc[q] == doc[k])


def test_torchtitan_masks_come_from_the_cache_positions(cache_dir):
    """native: causal AND same-document from positions; hf-v5 with block_causal: the same mask."""
    import torch
    from torch.nn.attention.flex_attention import and_masks, create_mask
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
    from torchtitan.models.common.attention import (
        get_causal_mask_mod,
        get_efficient_causal_mask_mod_for_packed_document,
    )

    from trnqwen.dataset.cache import open_split

    positions = torch.from_numpy(np.asarray(open_split(cache_dir).positions[:2], dtype=np.int64))
    expected = np.stack([_block_causal(p) for p in positions.numpy()])
    native = and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))
    assert (create_mask(native, 2, 1, SEQ, SEQ, device="cpu")[:, 0].numpy() == expected).all()

    class Fake:  # get_attention_masks reads only self.model.config
        def __init__(self, kind):
            self.model = type("M", (), {"config": type("C", (), {"attn_mask_type": kind, "index_topk": None})()})()

    for kind, block in (("block_causal", True), ("causal", False)):
        mask = HFTransformerModel.get_attention_masks(Fake(kind), positions)
        dense = create_mask(mask.mask_mod, 2, 1, SEQ, SEQ, device="cpu")[:, 0].numpy()
        assert (dense == expected).all() == block  # plain causal attends across documents


def test_transformers_packed_rows_never_attend_across_documents(tiny_assets):
    """hf-trainer: position_ids restarting at 0 and no attention_mask -> each document's logits
    equal the logits of that document run alone."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_assets, dtype=torch.float32).eval()
    model.config.use_cache = False  # as runtime.hf_trainer sets it
    ids = torch.randint(5, 2000, (1, 24))
    positions = torch.tensor([list(range(10)) + list(range(8)) + list(range(6))])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).logits
        alone = model(input_ids=ids[:, 10:18]).logits
        causal = model(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids)).logits
    assert torch.allclose(packed[:, 10:18], alone, atol=1e-5)
    assert not torch.allclose(causal[:, 10:18], alone, atol=1e-3)  # the test can tell the difference


# --- the launcher: config module and spec ------------------------------------------------------


def _cfg(tiny_assets, backend, dataset, **extra):
    from trnqwen.config import RunConfig

    return RunConfig(model="builtin:tiny-qwen3", assets_dir=tiny_assets, backend=backend, device="cpu",
                     nproc_per_node=2, steps=3, seq_len=SEQ, finetune=True, dataset=str(dataset), **extra)


@pytest.mark.parametrize("backend", ["native", "hf-v5"])
def test_config_module_reads_the_cache_and_validates(tiny_assets, cache_dir, backend, in_tmp):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.train.recipes import build_job

    job = build_job(_cfg(tiny_assets, backend, cache_dir, val_every=2, local_batch_size=2), DeviceInfo(type="cpu", count=1),
                    in_tmp / "run")
    text = job.config_module_text
    assert f"TokenCacheDataLoader.Config(cache_dir={str(cache_dir)!r}, split=\"train\", seed=42)" in text
    assert "config.validator.enable = True" in text and "config.validator.freq = 2" in text
    assert "config.validator.steps = 2" in text  # ceil(ceil(5 val rows / 2 ranks) / batch 2)
    assert "split=\"val\", one_pass=True" in text
    assert ('attn_mask_type = "block_causal"' in text) == (backend == "hf-v5")
    assert job.env["HF_DATASETS_OFFLINE"] == "1"


def test_hf_trainer_spec_names_the_cache(tiny_assets, cache_dir, in_tmp):
    from trnqwen.env.device import DeviceInfo
    from trnqwen.runtime.hf_trainer import spec_from_argv
    from trnqwen.train.recipes import build_job

    job = build_job(_cfg(tiny_assets, "hf-trainer", cache_dir, val_every=3), DeviceInfo(type="cpu", count=1), in_tmp / "run")
    spec = spec_from_argv(job.entry_args)
    assert spec.cache_dir == str(cache_dir) and spec.val_every == 3 and spec.dataset is None
    assert not any("pads/truncates" in n for n in job.notes)


@pytest.mark.parametrize("backend", ["native", "hf-trainer"])
def test_val_every_without_validation_data_stops_before_any_rank(cli, in_tmp, tiny_assets, tmp_path, backend):
    from tests.helpers import assert_clean_error

    no_val = write_cache(tmp_path / "c", "c" * 64, {"train": _rows(4, 1)}, seq_len=SEQ, packing=True, pad_id=PAD, eos_id=1)
    r = cli("train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "cpu",
            "--backend", backend, "--seq-len", str(SEQ), "--dataset", str(no_val), "--val-every", "2", "--dry-run")
    assert_clean_error(r, code=2, contains="--val-every needs a validation split")
    r = cli("train", "--model", "builtin:tiny-qwen3", "--assets", str(tiny_assets), "--device", "cpu",
            "--backend", backend, "--seq-len", "32", "--dataset", str(no_val), "--dry-run")
    assert_clean_error(r, code=2, contains="holds 16-token sequences")


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    from trnqwen.fetch.builtin import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "assets" / "hf" / "tiny-qwen3")


def test_json_meta_is_what_the_launcher_reads(cache_dir):
    from trnqwen.dataset.cache import RankData

    data = RankData.from_cache(cache_dir)
    assert (data.seq_len, data.train_rows, data.val_rows) == (SEQ, 7, 5)
    assert json.loads((cache_dir / "meta.json").read_text())["key"] == "a" * 64


# --- validation loss in inspect-logs and the status line ---------------------------------------


def test_validation_loss_reaches_inspect_logs_json_and_csv(cli, tmp_path):
    """torchtitan's validator lines and hf-trainer's (same format) -> --json "validation" and the CSV."""
    from trnqwen.runtime.hf_trainer_data import format_validation_line

    titan = ("[rank0]:[titan] 2026-11-30 20:01:44,135 - root - INFO - \x1b[31mstep:  {s}  \x1b[32mloss:  {l}  "
             "\x1b[38;2;180;60;0mgrad_norm:  5.4627  \x1b[38;2;54;234;195mmemory:  0.94GiB(3.97%)  \x1b[34mtps: 13  "
             "\x1b[36mtflops: 0.00  \x1b[35mmfu: 0.00%\x1b[39m")
    lines = [titan.format(s=1, l="7.63950"), "[rank0]:" + format_validation_line(1, 7.3848, 0.97, 4.11, 115),
             titan.format(s=2, l="7.39079"), titan.format(s=3, l="7.14057"),
             "[rank0]:" + format_validation_line(3, 7.1879, 0.97, 4.11, 869)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    r = cli("inspect-logs", str(log), "--json", "--csv", str(tmp_path / "steps.csv"))
    assert r.code == 0, r.text
    out = json.loads(r.out)
    assert [(v["step"], v["loss"]) for v in out["validation"]] == [(1, 7.3848), (3, 7.1879)]
    assert out["summary"]["last_validation_loss"] == 7.1879
    rows = (tmp_path / "steps.csv").read_text().splitlines()
    header = rows[0].split(",")
    val = [row.split(",")[header.index("val_loss")] for row in rows[1:]]
    assert val == ["7.3848", "", "7.1879"]


def test_status_line_shows_the_last_validation_loss():
    import io

    from trnqwen.train.status import StatusLine

    out = io.StringIO()
    line = StatusLine(stream=out, total_steps=4)
    line.update({"step": 1, "loss": 7.5, "tps": 100, "mfu": None})
    line.update_validation({"step": 1, "loss": 7.25})
    line.update({"step": 2, "loss": 7.1, "tps": 100, "mfu": None})
    assert "step 1/4  loss 7.5000  tok/s" in out.getvalue().splitlines()[0]
    # issue 28 #12: the validation loss beside step 2 is step 1's: the line says so
    assert "step 2/4  loss 7.1000  val 7.2500 (step 1)" in out.getvalue().splitlines()[1]


def test_model_card_says_which_step_its_validation_loss_is_from(tmp_path):
    """issue 28 #12: the card showed the last validation loss (step 3) as if it were the last step's (step 5)."""
    from trnqwen.ckpt.model_folder import card_info, render_card
    from trnqwen.rundir import RunRecord
    from trnqwen.runtime.hf_trainer_data import format_validation_line

    log = tmp_path / "train.log"
    log.write_text("\n".join("[rank0]:" + format_validation_line(s, loss, 0.97, 4.11, 115)
                             for s, loss in ((1, 7.3848), (3, 7.1879))) + "\n")
    record = RunRecord(run_id="r1", run_dir=str(tmp_path), config={"model": "builtin:tiny-qwen3"}, log_path=str(log),
                       backend="native", steps=5, extra={"summary": {"last_step": {"step": 5, "loss": 6.5}}})
    info = card_info(record)
    assert (info.validation_loss, info.validation_step, info.steps) == (7.1879, 3, 5)
    assert "| validation loss | 7.1879 (after step 3) |" in render_card(info)
