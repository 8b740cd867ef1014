"""The CPU shims of trnqwen.runtime.cpu that save start-up time in every rank, in-process: the
eager block mask equals torchtitan's compiled one without compiling, and rank 0's final 2 s
sleep is gone while the trainer's timing still works."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")


def test_eager_block_masks_replace_torchtitans_compiled_call_with_the_same_mask(monkeypatch):
    import torch
    import torchtitan.models.common.attention as attention
    import torchtitan.models.common.decoder as decoder
    from torch.nn.attention.flex_attention import create_block_mask

    from trnqwen.runtime import cpu

    compiled = attention.create_attention_mask
    for module in (attention, decoder):
        monkeypatch.setattr(module, "create_attention_mask", module.create_attention_mask)  # undone after the test
    cpu.install_eager_block_masks()
    assert attention.create_attention_mask is decoder.create_attention_mask is cpu.eager_attention_mask
    assert compiled is not cpu.eager_attention_mask

    starts = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 1, 1, 1]])

    def document_causal(b, h, q, kv):
        return (q >= kv) & (starts[b, q] == starts[b, kv])

    got = decoder.create_attention_mask(document_causal, 2, None, 8, 8, device="cpu")
    want = create_block_mask(document_causal, 2, None, 8, 8, device="cpu")
    assert torch.equal(got.to_dense(), want.to_dense()) and torch.equal(
        cpu.dense_mask_from_block_mask(got, 2, 8, 8, "cpu"), cpu.dense_mask_from_block_mask(want, 2, 8, 8, "cpu"))


def test_rank_zero_no_longer_sleeps_after_the_last_step(monkeypatch):
    import torchtitan.trainer as trainer

    from trnqwen.runtime import cpu

    monkeypatch.setattr(trainer, "time", trainer.time)  # undone after the test
    cpu.skip_final_sleep()
    t0 = time.perf_counter()
    trainer.time.sleep(2)  # what Trainer.train does on rank 0 after the last step
    assert time.perf_counter() - t0 < 0.5
    assert trainer.time.perf_counter() > 0 and trainer.time.monotonic() > 0  # the rest of `time` is still there
