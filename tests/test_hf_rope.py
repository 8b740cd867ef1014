"""The Transformers backend's rotary buffers after meta-device materialisation.

torchtitan 0.3.0 builds the HF model on meta, then ``to_empty()`` + ``init_states()``; with
transformers 5.x the Qwen3 rotary module has no ``rope_init_fn`` attribute, so torchtitan left
``inv_freq`` as uninitialised memory (step-1 loss changed from run to run; NaN about 1 run in 8).
"""

from __future__ import annotations

import torch


def _tiny_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=512, rope_theta=10000.0,
    )  # fmt: skip


def test_reinit_restores_the_frequencies_transformers_computes():
    from transformers import AutoModelForCausalLM

    from trnqwen.runtime.hf_rope import reinit_rotary_buffers

    config = _tiny_config()
    reference = AutoModelForCausalLM.from_config(config).model.rotary_emb.inv_freq.clone()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.to_empty(device="cpu")
    rope = model.model.rotary_emb
    rope.inv_freq.fill_(float("nan"))  # what uninitialised memory may hold
    rope.original_inv_freq.fill_(float("nan"))
    assert reinit_rotary_buffers(model) == 1
    assert torch.equal(rope.inv_freq, reference)
    assert torch.equal(rope.original_inv_freq, reference)


def test_torchtitans_own_reinit_misses_qwen3_with_this_transformers():
    """Why the fix exists: if this starts failing, torchtitan handles it and the fix can go."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_tiny_config())
    assert getattr(model.model.rotary_emb, "rope_init_fn", None) is None


def test_after_model_init_fixes_each_model_part_and_counts_it():
    """trnqwen's trainer calls this right after torchtitan's init (no class-level patch): every
    part's rotary buffers are recomputed, a part with none counts as a fallback."""
    from transformers import AutoModelForCausalLM

    from trnqwen.runtime import hf_rope

    config = _tiny_config()
    reference = AutoModelForCausalLM.from_config(config).model.rotary_emb.inv_freq.clone()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.to_empty(device="cpu")
    model.model.rotary_emb.inv_freq.fill_(float("nan"))

    class Part(torch.nn.Module):  # the Transformers backend's wrapper keeps the HF model as .model
        def __init__(self, inner):
            super().__init__()
            self.model = inner

    before = hf_rope.CALLS.totals()
    hf_rope.after_model_init([Part(model), Part(torch.nn.Linear(2, 2))])
    calls, fallbacks, modules = (a - b for a, b in zip(hf_rope.CALLS.totals(), before))
    assert torch.equal(model.model.rotary_emb.inv_freq, reference)
    assert (calls, fallbacks, modules) == (1, 1, 1)
