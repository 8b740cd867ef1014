"""PEFT LoRA adapter folders for a tiny Qwen3 base, written by trnqwen.contract.peft_adapter.write_adapter."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ckpt_fixtures import tiny_config, write_tokenizer

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_base(folder: Path, *, tokenizer: bool = False, **over) -> Path:
    """A tiny Qwen3 snapshot (config.json, + tokenizer); weights only where a test loads them."""
    config = tiny_config(True, **over)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(folder))
    if tokenizer:
        write_tokenizer(folder, config.vocab_size)
    return folder


def module_shapes(base: Path, targets=ALL) -> dict[str, tuple[int, int]]:
    """HF module path -> (out, in) of the base's targeted Linear layers."""
    c = json.loads((base / "config.json").read_text())
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv, ffn = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    dims = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (ffn, h), "up_proj": (ffn, h), "down_proj": (h, ffn)}
    out = {}
    for i in range(c["num_hidden_layers"]):
        for t in targets:
            where = "self_attn" if t in ALL[:4] else "mlp"
            out[f"model.layers.{i}.{where}.{t}"] = dims[t]
    return out


def make_adapter(folder: Path, base: Path, *, rank: int = 8, trained: bool = True, targets=ALL, seed: int = 0) -> Path:
    """A PEFT adapter folder for ``base`` (adapter_config names it by path): A random, B random
    (trained) or zero (untrained)."""
    import torch

    from trnqwen.contract.peft_adapter import write_adapter
    from trnqwen.contract.lora import LoraSpec

    gen = torch.Generator().manual_seed(seed)
    modules = {}
    for path, (out_f, in_f) in module_shapes(base, targets).items():
        a = torch.randn(rank, in_f, generator=gen) * 0.1
        b = torch.randn(out_f, rank, generator=gen) * 0.1 if trained else torch.zeros(out_f, rank)
        modules[path] = (a, b)
    spec = LoraSpec(rank=rank, alpha=2.0 * rank, dropout=0.0, targets=tuple(targets), seed=seed, base_model=str(base))
    write_adapter(folder, modules, spec)
    return folder


def rewrite_tensors(folder: Path, edit) -> None:
    """Apply ``edit(dict of tensors)`` to adapter_model.safetensors in place."""
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
