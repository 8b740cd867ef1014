"""Tiny Qwen3-MoE models made by transformers 5 itself (``save_pretrained``), in both config-key
forms: ``num_local_experts`` (what transformers 5 writes) and ``num_experts`` (what the Hub's
Qwen3-30B-A3B/235B-A22B config.json carry).  The tokenizer is trnqwen's builtin tiny model's."""

from __future__ import annotations

import json
from pathlib import Path

# 2 layers, 8 experts, top-2; dims multiples of 8 (torch._grouped_mm on CPU needs 16-byte strides).
TINY_MOE = dict(
    vocab_size=2048, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
    max_position_embeddings=512, tie_word_embeddings=False, norm_topk_prob=True, rope_theta=1000000.0,
)


def hf_config(**over) -> dict:
    """The config dict in the Hub form (num_experts), with transformers' fields."""
    return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], **TINY_MOE, **over}


def write_tiny_moe(dest: Path, *, key_form: str = "local", seed: int = 0, tokenizer: bool = True, **over) -> Path:
    """A tiny Qwen3-MoE made with transformers 5 (random bf16 weights, ``save_pretrained``).
    ``key_form``: "local" keeps transformers 5's ``num_local_experts``; "hub" rewrites the key to
    the Hub's ``num_experts``."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from trnqwen.fetch import builtin

    eot, _, im_end = builtin._special_ids()
    fields = {**TINY_MOE, "bos_token_id": eot, "eos_token_id": im_end, "pad_token_id": eot, **over}
    rope_theta = fields.pop("rope_theta")
    cfg = Qwen3MoeConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():  # the router starts at zeros in transformers: give it something to route by
        for name, p in model.named_parameters():
            if p.dim() >= 2 or "norm" not in name:
                p.normal_(0.0, 0.05)
    model = model.to(torch.bfloat16)
    dest = Path(dest)
    model.save_pretrained(dest)
    config = json.loads((dest / "config.json").read_text())
    if key_form == "hub":
        config["num_experts"] = config.pop("num_local_experts")
        (dest / "config.json").write_text(json.dumps(config, indent=2))
    else:
        assert "num_local_experts" in config and "num_experts" not in config, "transformers changed its key"
    if tokenizer:
        copy_builtin_tokenizer(dest)
    return dest


def copy_builtin_tokenizer(dest: Path) -> None:
    """The tokenizer files of trnqwen's builtin tiny model (vocab 2048, ChatML template)."""
    from trnqwen.fetch import builtin

    tok = builtin.train_tokenizer()
    (Path(dest) / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    (Path(dest) / "tokenizer_config.json").write_text(json.dumps(builtin._tokenizer_config(), indent=2))
